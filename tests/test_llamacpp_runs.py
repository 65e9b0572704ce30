"""llama.cpp itself loads and runs what ``ieconv iebin-to-gguf`` writes, for
every architecture (skipped unless ``make llamacpp`` built its tools, or
they are on PATH): ``llama-bench`` processes a prompt and generates tokens
with each exported model, which fails on any tensor name, shape, type or
hyperparameter llama.cpp does not accept; ``llama-quantize`` quantizes it
with the GGUF imatrix ``ieconv imatrix`` writes, using every entry (it
checks each one's size against its tensor, an expert stack's too);
``llama-gguf-split`` splits it, and the first file imports to the bytes of
the whole; and llama-bench runs an export split by ``--split-max-tensors``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO
from test_gguf_export import ARCH_OF, _export, models  # noqa: F401  (the fixture)

sys.path.insert(0, str(REPO / "benchmarks"))
from llamacpp import tool  # noqa: E402

BENCH = tool("llama-bench")
QUANTIZE = tool("llama-quantize")
GGUF_SPLIT = tool("llama-gguf-split")


@pytest.mark.skipif(BENCH is None, reason="llama.cpp's llama-bench is not built (make llamacpp)")
@pytest.mark.parametrize("name", sorted(ARCH_OF))
def test_llamacpp_runs_the_export(tmp_path, models, name):  # noqa: F811
    out = tmp_path / f"{name}.gguf"
    assert _export(models[name], out).returncode == 0
    res = subprocess.run([BENCH, "-m", str(out), "-p", "8", "-n", "4", "-r", "1", "-t", "1", "-o", "json"],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert '"n_gen": 4' in res.stdout and '"avg_ts"' in res.stdout, res.stdout[-2000:]


@pytest.mark.skipif(QUANTIZE is None, reason="llama.cpp's llama-quantize is not built (make llamacpp)")
@pytest.mark.parametrize("name", sorted(ARCH_OF))
def test_llama_quantize_takes_our_gguf_imatrix(tmp_path, models, name):  # noqa: F811
    from conftest import run_tool

    out, im = tmp_path / f"{name}.gguf", tmp_path / "imatrix.gguf"
    assert _export(models[name], out).returncode == 0
    (tmp_path / "ids.txt").write_text(" ".join(str(i) for i in range(3, 99)))
    res = run_tool("ieconv", "imatrix", "-q", "--model-dir", models[name], "--ids-file", tmp_path / "ids.txt",
                   "--ctx", "32", "-o", im)
    assert res.returncode == 0, res.stderr
    from gguf import GGUFReader

    n = sum(t.name.endswith(".counts") for t in GGUFReader(im).tensors)
    res = subprocess.run([QUANTIZE, "--allow-requantize", "--imatrix", str(im), str(out), str(tmp_path / "q.gguf"),
                          "Q4_K_M"], capture_output=True, text=True, timeout=300)
    log = res.stdout + res.stderr
    assert res.returncode == 0, log[-2000:]
    assert f"loaded {n} importance matrix entries from {im} computed on 3 chunks" in log, log[-2000:]
    assert "imatrix size" not in log, log[-2000:]
    import re

    # the input embedding is a lookup, never a product: no imatrix has it (a tied head is written under it); nor
    # has GLM-4.5's multi-token prediction layer, which llama-imatrix does not run either; nor latent attention's
    # attn_k_b and attn_v_b, whose inputs (per-head q_nope, the attention's latent outputs) ierun does not collect
    kv = {k: f.contents() for k, f in GGUFReader(out).fields.items()}
    a = kv["general.architecture"]
    trunk = kv[f"{a}.block_count"] - kv.get(f"{a}.nextn_predict_layers", 0)
    missed = {n for n in re.findall(r"did not find weights for (\S+)", log)
              if not (a in ("deepseek2", "mistral4") and n.endswith(("attn_k_b.weight", "attn_v_b.weight")))}
    assert {n for n in missed if not re.match(rf"blk\.(\d+)\.", n) or int(n.split(".")[1]) < trunk} <= \
        {"token_embd.weight"}, log[-2000:]


@pytest.mark.skipif(GGUF_SPLIT is None, reason="llama.cpp's llama-gguf-split is not built (make llamacpp)")
@pytest.mark.parametrize("name", ["tiny-mixtral", "tiny-gpt-oss"])
def test_a_model_split_by_llama_gguf_split_imports_as_the_whole(tmp_path, models, name):  # noqa: F811
    from conftest import run_tool

    whole = tmp_path / f"{name}.gguf"
    assert _export(models[name], whole).returncode == 0
    res = subprocess.run([GGUF_SPLIT, "--split", "--split-max-tensors", "9", str(whole), str(tmp_path / "s")],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    firsts = sorted(tmp_path.glob("s-00001-of-*.gguf"))
    assert len(firsts) == 1 and int(firsts[0].name[-10:-5]) >= 3, sorted(p.name for p in tmp_path.iterdir())
    for label, src in (("whole", whole), ("split", firsts[0])):
        res = run_tool("ieconv", "gguf-to-iebin", "-q", "--gguf", src, "--out-dir", tmp_path / label)
        assert res.returncode == 0, res.stderr
    assert (tmp_path / "whole" / "model.ie.bin").read_bytes() == (tmp_path / "split" / "model.ie.bin").read_bytes()


@pytest.mark.skipif(BENCH is None, reason="llama.cpp's llama-bench is not built (make llamacpp)")
def test_llamacpp_runs_a_split_export(tmp_path, models):  # noqa: F811
    out = tmp_path / "m.gguf"
    assert _export(models["tiny-qwen3-moe"], out, "--split-max-tensors", "5").returncode == 0
    first = sorted(tmp_path.glob("m-00001-of-*.gguf"))
    assert len(first) == 1 and int(first[0].name[-10:-5]) > 2
    res = subprocess.run([BENCH, "-m", str(first[0]), "-p", "8", "-n", "4", "-r", "1", "-t", "1", "-o", "json"],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert '"n_gen": 4' in res.stdout, res.stdout[-2000:]
