"""``ierun eval`` / ``ierun verify model``: the figures against an independent
float64 computation (scipy) over ``ierun logits`` output, the exact cases
(a model against itself, constant logits), and every bad input as one line."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from scipy import special, stats

from conftest import GOLDEN_HF, GOLDEN_IEBIN, assert_one_line_error, run_tool

F32 = GOLDEN_IEBIN / "tiny-llama"
MIXED = GOLDEN_IEBIN / "tiny-llama-mixedq"  # the same model, q4_1/q8_0/int4w for most matrices
VOCAB = 320
CTX = 32  # ctx/2 is a multiple of the decoder's batch (8): eval's and `ierun logits`' batches line up, so logits are bit-equal


def _ids(n: int, seed: int = 0) -> list[int]:
    return [int(i) for i in np.random.default_rng(seed).integers(0, VOCAB, n)]


def _ids_file(tmp_path: Path, ids: list[int], name: str = "ids.txt") -> Path:
    p = tmp_path / name
    # Both separators the option documents: commas and whitespace (newlines).
    p.write_text("\n".join(", ".join(map(str, ids[i:i + 10])) for i in range(0, len(ids), 10)) + "\n")
    return p


def _eval(*args) -> dict:
    res = run_tool("ierun", "eval", *map(str, args), "--json")
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def _logits(tmp_path: Path, model: Path, ids: list[int], tag: str) -> np.ndarray:
    out = tmp_path / f"{tag}.npy"
    res = run_tool("ierun", "logits", "--model-dir", model, "--ids", ",".join(map(str, ids)), "--out", out, "--overwrite")
    assert res.returncode == 0, res.stderr
    return np.load(out)


def _independent(tmp_path: Path, ids: list[int], ctx: int, model: Path, ref: Path) -> dict:
    """The figures from `ierun logits` of every chunk, with scipy in float64."""
    first = ctx // 2
    nll, nll_ref, kld, top1, dp = [], [], [], [], []
    for c in range(len(ids) // ctx):
        chunk = ids[c * ctx:(c + 1) * ctx]
        lp = special.log_softmax(_logits(tmp_path, model, chunk[:-1], "m").astype(np.float64), axis=1)[first:]
        lq = special.log_softmax(_logits(tmp_path, ref, chunk[:-1], "r").astype(np.float64), axis=1)[first:]
        tgt = np.array(chunk[first + 1:])
        r = np.arange(len(tgt))
        nll.append(-lp[r, tgt])
        nll_ref.append(-lq[r, tgt])
        kld.append(special.rel_entr(np.exp(lq), np.exp(lp)).sum(axis=1))
        top = lq.argmax(axis=1)
        top1.append(lp.argmax(axis=1) == top)
        dp.append(np.exp(lp[r, top]) - np.exp(lq[r, top]))
    nll, nll_ref, kld, top1, dp = map(np.concatenate, (nll, nll_ref, kld, top1, dp))
    n = len(nll)
    p = top1.mean()
    return {"tokens_scored": n, "ppl": np.exp(nll.mean()), "ppl_se": np.exp(nll.mean()) * stats.sem(nll),
            "ppl_ref": np.exp(nll_ref.mean()), "ppl_ref_se": np.exp(nll_ref.mean()) * stats.sem(nll_ref),
            "ln_ppl_ratio": np.log(np.exp(nll.mean()) / np.exp(nll_ref.mean())), "ln_ppl_ratio_se": stats.sem(nll - nll_ref),
            "kld_mean": kld.mean(), "kld_se": stats.sem(kld), "kld_median": np.median(kld),
            "kld_p90": np.quantile(kld, 0.9), "kld_p99": np.quantile(kld, 0.99), "kld_max": kld.max(),
            "top1_agree": p, "top1_agree_se": np.sqrt(p * (1 - p) / (n - 1)),
            "dp_mean": dp.mean(), "dp_rms": np.sqrt((dp ** 2).mean()), "dp_p1": np.quantile(dp, 0.01),
            "dp_p99": np.quantile(dp, 0.99)}


def test_figures_equal_float64_over_ierun_logits(tmp_path):
    ids = _ids(3 * CTX + 7)  # three chunks and a tail that is left out
    got = _eval("--model-dir", MIXED, "--ref-dir", F32, "--ids-file", _ids_file(tmp_path, ids), "--ctx", CTX)
    want = _independent(tmp_path, ids, CTX, MIXED, F32)
    assert got["chunks"] == 3 and got["ctx"] == CTX and got["tokens_in"] == len(ids)
    assert got["tokens_scored"] == 3 * (CTX - 1 - CTX // 2)
    for k, v in want.items():
        assert got[k] == pytest.approx(v, rel=1e-9, abs=1e-12), k
    assert 0 < got["kld_mean"] and got["kld_median"] <= got["kld_p90"] <= got["kld_p99"] <= got["kld_max"]


def test_int8_activations_against_ierun_logits_with_int8(tmp_path):
    """--act int8 applies to the evaluated model (and only to it): its figures
    equal the independent computation over `ierun logits --act int8`."""
    ids = _ids(2 * CTX, seed=1)
    got = _eval("--model-dir", MIXED, "--ref-dir", F32, "--ids-file", _ids_file(tmp_path, ids), "--ctx", CTX,
                "--act", "int8")
    first = CTX // 2
    kld = []
    for c in range(2):
        chunk = ids[c * CTX:(c + 1) * CTX]
        out = tmp_path / "m8.npy"
        assert run_tool("ierun", "logits", "--model-dir", MIXED, "--ids", ",".join(map(str, chunk[:-1])),
                        "--act", "int8", "--out", out, "--overwrite").returncode == 0
        lp = special.log_softmax(np.load(out).astype(np.float64), axis=1)[first:]
        lq = special.log_softmax(_logits(tmp_path, F32, chunk[:-1], "r").astype(np.float64), axis=1)[first:]
        kld.append(special.rel_entr(np.exp(lq), np.exp(lp)).sum(axis=1))
    assert got["kld_mean"] == pytest.approx(np.concatenate(kld).mean(), rel=1e-9)
    assert got["act"] == "int8"


def test_model_against_itself_is_exactly_zero(tmp_path):
    ids_file = _ids_file(tmp_path, _ids(2 * CTX, seed=2))
    s = _eval("--model-dir", MIXED, "--ref-dir", MIXED, "--ids-file", ids_file, "--ctx", CTX, "--act", "f32")
    assert s["act"] == "f32" and s["kld_mean"] == 0.0 and s["kld_max"] == 0.0 and s["kld_p99"] == 0.0
    assert s["top1_agree"] == 1.0 and s["top1_agree_se"] == 0.0
    assert s["dp_mean"] == 0.0 and s["dp_rms"] == 0.0 and s["ln_ppl_ratio"] == 0.0
    assert s["ppl"] == s["ppl_ref"]


def _hf_variant(tmp_path: Path, name: str, edit) -> Path:
    """tiny-llama's checkpoint with ``edit(tensors, config)`` applied, converted to IEBIN."""
    from safetensors.numpy import load_file, save_file

    src, hf = GOLDEN_HF / "tiny-llama", tmp_path / f"{name}-hf"
    hf.mkdir()
    tensors = {}
    for shard in sorted(src.glob("model-*.safetensors")):
        tensors.update(load_file(shard))
    config = json.loads((src / "config.json").read_text())
    keep_tokenizer = edit(tensors, config)
    save_file(tensors, str(hf / "model.safetensors"))
    (hf / "config.json").write_text(json.dumps(config))
    if keep_tokenizer:
        shutil.copy(src / "tokenizer.json", hf / "tokenizer.json")
    out = tmp_path / name
    res = run_tool("ieconv", "hf-to-iebin", "-q", "--hf-dir", hf, "--out-dir", out)
    assert res.returncode == 0, res.stderr
    return out


def test_constant_logits_have_perplexity_equal_to_the_vocabulary(tmp_path):
    def zero_head(t, c):
        t["lm_head.weight"] = np.zeros_like(t["lm_head.weight"])
        return True

    model = _hf_variant(tmp_path, "flat", zero_head)
    s = _eval("--model-dir", model, "--ids-file", _ids_file(tmp_path, _ids(3 * CTX)), "--ctx", CTX)
    assert s["ppl"] == pytest.approx(VOCAB, rel=1e-12)
    assert s["ppl_se"] == pytest.approx(0, abs=1e-9)
    assert "kld_mean" not in s and s["ref_dir"] is None


def test_text_is_tokenized_with_the_models_tokenizer(tmp_path):
    """--text-file gives the same figures as --ids-file with the ids the
    model's tokenizer.json makes of it."""
    from tokenizers import Tokenizer

    text = "The quick brown fox jumps over the lazy dog. " * 40
    (tmp_path / "t.txt").write_text(text)
    ids = Tokenizer.from_file(str(F32 / "tokenizer.json")).encode(text).ids
    a = _eval("--model-dir", MIXED, "--ref-dir", F32, "--text-file", tmp_path / "t.txt", "--ctx", CTX)
    b = _eval("--model-dir", MIXED, "--ref-dir", F32, "--ids-file", _ids_file(tmp_path, ids), "--ctx", CTX)
    c = _eval("-m", MIXED, "--ref-dir", F32, "-f", tmp_path / "t.txt", "-c", CTX)  # llama-perplexity's flags
    assert a["tokens_in"] == len(ids)
    for k in ("ppl", "ppl_ref", "kld_mean", "top1_agree", "tokens_scored"):
        assert a[k] == b[k] == c[k], k


def test_chunks_limits_the_work_and_ctx_defaults_to_the_models_context(tmp_path):
    ids_file = _ids_file(tmp_path, _ids(300))
    s = _eval("--model-dir", F32, "--ids-file", ids_file)
    assert s["ctx"] == 128 and s["chunks"] == 2  # max_position_embeddings 128 < 512
    s = _eval("--model-dir", F32, "--ids-file", ids_file, "--ctx", CTX, "--chunks", 4)
    assert s["chunks"] == 4 and s["tokens_scored"] == 4 * 15


def test_table_output_names_every_figure(tmp_path):
    res = run_tool("ierun", "eval", "--model-dir", MIXED, "--ref-dir", F32, "--ids-file",
                   _ids_file(tmp_path, _ids(CTX)), "--ctx", CTX)
    assert res.returncode == 0, res.stderr
    for words in ("perplexity", "KL(ref ‖ model) mean", "p99", "top-1 agreement", "Δp", "tokens/s"):
        assert words in res.stdout, words


def test_progress_line_figures_equal_the_summarys():
    """The running sums the progress bar shows are the summary's figures."""
    from iekit.runtime.evaluation import Scores, score_rows

    rng = np.random.default_rng(0)
    s = Scores(ctx=32, with_ref=True)
    for _ in range(3):
        s.add(score_rows(rng.standard_normal((15, 50)).astype(np.float32), rng.integers(0, 50, 15),
                         rng.standard_normal((15, 50)).astype(np.float32)))
    running, summary = s.running(), s.summary()
    for k in ("ppl", "kld_mean", "top1_agree"):
        assert running[k] == pytest.approx(summary[k], rel=1e-12), k


# ------------------------------------------------------------ verify model

def test_verify_model_passes_and_fails_on_the_kl_limit(tmp_path):
    ids_file = _ids_file(tmp_path, _ids(2 * CTX))
    common = ("--model-dir", MIXED, "--ref-dir", F32, "--ids-file", ids_file, "--ctx", CTX)
    s = _eval(*common)
    ok = run_tool("ierun", "verify", "model", *map(str, common), "--max-kld", str(s["kld_mean"] * 1.01))
    assert ok.returncode == 0, ok.stderr
    assert "OK: mean KL divergence" in ok.stdout
    bad = run_tool("ierun", "verify", "model", *map(str, common), "--max-kld", str(s["kld_mean"] * 0.99))
    assert_one_line_error(bad, "verify model", "mean KL divergence", "--max-kld")
    bad = run_tool("ierun", "verify", "model", *map(str, common), "--max-kld", "10", "--min-top1", "1", "--json")
    assert_one_line_error(bad, "top-1 agreement", "--min-top1")
    assert json.loads(bad.stdout)["ok"] is False


# ------------------------------------------------------------ pictures

def test_plots_are_pngs(tmp_path):
    ids_file = _ids_file(tmp_path, _ids(2 * CTX))
    png = tmp_path / "eval.png"
    res = run_tool("ierun", "eval", "--model-dir", MIXED, "--ref-dir", F32, "--ids-file", ids_file, "--ctx", CTX,
                   "--plot", png)
    assert res.returncode == 0, res.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # Never replaced without --overwrite; refused before any model runs.
    assert_one_line_error(run_tool("ierun", "eval", "--model-dir", MIXED, "--ref-dir", F32, "--ids-file", ids_file,
                                   "--ctx", CTX, "--plot", png), str(png), "exists", "--overwrite")
    png2 = tmp_path / "int4.png"
    res = run_tool("ierun", "verify", "quant", "--model-dir", MIXED, "--hf-dir", GOLDEN_HF / "tiny-llama",
                   "--plot", png2)
    assert res.returncode == 0, res.stderr
    assert png2.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_without_matplotlib_is_one_clear_line(tmp_path):
    blocker = tmp_path / "site"
    blocker.mkdir()
    (blocker / "matplotlib.py").write_text("raise ImportError('blocked for the test')\n")
    env = dict(os.environ, PYTHONPATH=str(blocker))
    res = run_tool("ierun", "eval", "--model-dir", MIXED, "--ref-dir", F32, "--ids-file",
                   _ids_file(tmp_path, _ids(CTX)), "--ctx", CTX, "--plot", tmp_path / "x.png", env=env,
                   real_process=True)
    assert_one_line_error(res, "--plot needs matplotlib", "iekit[plot]")
    res = run_tool("ierun", "verify", "quant", "--model-dir", MIXED, "--hf-dir", GOLDEN_HF / "tiny-llama",
                   "--plot", tmp_path / "y.png", env=env, real_process=True)
    assert_one_line_error(res, "--plot needs matplotlib")


# ------------------------------------------------------------ bad input, one line each

def test_bad_inputs(tmp_path):
    def ev(*args):
        return run_tool("ierun", "eval", "--model-dir", F32, *map(str, args))

    (tmp_path / "empty.txt").write_text("")
    assert_one_line_error(ev("--text-file", tmp_path / "empty.txt"), "empty.txt", "no text")
    (tmp_path / "blank.txt").write_text("  \n\n")
    assert_one_line_error(ev("--text-file", tmp_path / "blank.txt"), "no text")
    (tmp_path / "latin1.txt").write_bytes("café".encode("latin-1"))
    assert_one_line_error(ev("--text-file", tmp_path / "latin1.txt"), "latin1.txt", "not UTF-8")
    assert_one_line_error(ev("--ids-file", _ids_file(tmp_path, _ids(20)), "--ctx", CTX),
                          "20 tokens", "fewer than one chunk", f"--ctx {CTX}")
    assert_one_line_error(ev("--ids-file", _ids_file(tmp_path, _ids(300)), "--ctx", 129),
                          "--ctx", "129", "max_position_embeddings (128)")
    assert_one_line_error(ev("--ids-file", _ids_file(tmp_path, _ids(CTX) + [VOCAB]), "--ctx", CTX),
                          f"token id {VOCAB}", f"0..{VOCAB - 1}")
    (tmp_path / "words.txt").write_text("1, 2, three")
    assert_one_line_error(ev("--ids-file", tmp_path / "words.txt"), "words.txt", "'three'")
    (tmp_path / "neg.txt").write_text("1 -2 3")
    assert_one_line_error(ev("--ids-file", tmp_path / "neg.txt"), "neg.txt", ">= 0")
    assert_one_line_error(ev("--ids-file", tmp_path / "missing.txt"), "missing.txt", "no such file")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert_one_line_error(ev("--text-file", fifo), "fifo", "FIFO")
    res = ev("--ids-file", tmp_path / "neg.txt", "--text-file", tmp_path / "blank.txt")
    assert res.returncode == 2 and "exactly one of --text-file and --ids-file" in res.stderr
    res = ev("--ids-file", tmp_path / "neg.txt", "--plot", tmp_path / "p.png")
    assert res.returncode == 2 and "--ref-dir" in res.stderr


def test_reference_must_be_the_same_model_family(tmp_path):
    ids_file = _ids_file(tmp_path, _ids(CTX))

    def ev(ref):
        return run_tool("ierun", "eval", "--model-dir", F32, "--ref-dir", ref, "--ids-file", ids_file, "--ctx", CTX)

    assert_one_line_error(ev(GOLDEN_IEBIN / "tiny-qwen2"), "model.architecture", "Qwen2ForCausalLM",
                          "LlamaForCausalLM")

    def smaller_vocab(t, c):
        for k in ("model.embed_tokens.weight", "lm_head.weight"):
            t[k] = np.ascontiguousarray(t[k][:300])
        c["vocab_size"] = 300
        return False

    assert_one_line_error(ev(_hf_variant(tmp_path, "v300", smaller_vocab)), "model.vocab_size", "300", "320")
    other = tmp_path / "other-tok"
    shutil.copytree(F32, other)
    tok = json.loads((other / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    a, b = list(vocab)[10:12]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (other / "tokenizer.json").write_text(json.dumps(tok))
    meta = json.loads((other / "model.ie.json").read_text())
    from iekit.formats import checksums

    for f in meta["aux_files"]:
        if f["name"] == "tokenizer.json":
            data = (other / "tokenizer.json").read_bytes()
            f.update({meta["checksum"]: checksums.digest(meta["checksum"], data), "nbytes": len(data)})
    (other / "model.ie.json").write_text(json.dumps(meta))
    assert_one_line_error(ev(other), "tokenizer.json", "do not share a tokenizer")
