"""The CUDA decoder (``--device cuda``): without a CUDA build or a GPU, one
clear error line from every command that takes the option; with both
(tests marked ``gpu``), logits within 1e-3 relative of the CPU f32 decoder
on the golden models and quantized conversions of them, prefix reuse, and
``ierun bench --device cuda`` reporting the CPU run's JSON fields.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from conftest import GOLDEN_HF, GOLDEN_IEBIN, GOLDEN_REF, assert_one_line_error, run_tool
from iekit.formats.errors import IEError
from iekit.runtime.decoder import Decoder, device_act
from iekit.runtime import cuda
from iekit.runtime.native import _native

REL_TOL = 1e-3
SMALL_BW_MB = 4


NO_GPU = cuda.unavailable()
needs_gpu = pytest.mark.skipif(NO_GPU is not None, reason=NO_GPU or "")


def _rel(got: np.ndarray, ref: np.ndarray) -> float:
    """‖got − ref‖ / ‖ref‖ in float64."""
    ref = ref.astype(np.float64)
    return float(np.linalg.norm(got.astype(np.float64) - ref) / np.linalg.norm(ref))


def _ids(model: str = "tiny-llama") -> list[int]:
    return json.loads((GOLDEN_REF / model / "ids.json").read_text())


# ------------------------------------------------------ without a device

@pytest.mark.skipif(NO_GPU is None, reason="a GPU is visible: the gpu tests run the commands")
@pytest.mark.parametrize("command", ["generate", "logits", "bench"])
def test_device_cuda_without_one_is_one_error_line(tmp_path, command):
    needle = NO_GPU
    model = GOLDEN_IEBIN / "tiny-llama"
    out = tmp_path / "l.npy"
    args = {"generate": ["--ids", "1,2,3", "--max-new", "2"],
            "logits": ["--ids", "1,2,3", "--out", out],
            "bench": ["--rounds", "1", "--warmup", "0", "--max-new", "2", "--bandwidth-mb", str(SMALL_BW_MB)]}[command]
    res = run_tool("ierun", command, "--model-dir", model, *args, "--device", "cuda")
    assert_one_line_error(res, "--device cuda", needle)
    assert not res.stdout and not out.exists()


def test_unknown_device_is_a_usage_error():
    res = run_tool("ierun", "generate", "--model-dir", GOLDEN_IEBIN / "tiny-llama", "--ids", "1", "--device", "tpu")
    assert res.returncode == 2 and "--device" in res.stderr
    with pytest.raises(IEError, match="not a device"):
        Decoder(GOLDEN_IEBIN / "tiny-llama", device="tpu")


def test_cuda_activations_are_f32():
    """The CUDA decoder multiplies f32 activations only: auto is f32 there
    (int8 on the CPU for 4-bit layers), int8 is refused in one line."""
    assert device_act("cuda", "auto", {"int4w"}) == "f32" and device_act("cpu", "auto", {"int4w"}) == "int8"
    assert device_act("cuda", "f32", {"f32"}) == "f32"
    with pytest.raises(IEError, match="--act int8: the CUDA decoder runs f32 activations only"):
        device_act("cuda", "int8", {"int4w"})


# ------------------------------------------------------ on a device

@pytest.fixture(scope="module")
def quantized(tmp_path_factory):
    """Quantized embeddings, which the device widens to f32 once: tiny-qwen2
    at q4_0 (its tied embedding, the head too, becomes q8_0) and tiny-llama
    at q4_1 with its untied embedding q4_1 too."""
    root = tmp_path_factory.mktemp("cuda-quant")
    out = {}
    for tag, hf, extra in (("qwen2-q4_0", "tiny-qwen2", ["--scheme", "q4_0"]),
                           ("llama-q4_1", "tiny-llama", ["--scheme", "q4_1", "--embedding-scheme", "q4_1"])):
        man = root / f"{tag}.json"
        res = run_tool("ieconv", "q4-manifest", "--hf-dir", GOLDEN_HF / hf, "-o", man, *extra)
        assert res.returncode == 0, res.stderr
        out[tag] = root / tag
        res = run_tool("ieconv", "hf-to-iebin", "-q", "--hf-dir", GOLDEN_HF / hf, "--out-dir", out[tag], "--q4-map", man)
        assert res.returncode == 0, res.stderr
    return out


def _models(quantized) -> dict[str, os.PathLike]:
    # tiny-mistral: sliding window 4; tiny-qwen2: q/k/v biases, tied head;
    # tiny-llama3: llama3 RoPE scaling; mixedq: int4w, q4_0, q4_1 layers and a q8_0 head.
    golden = {m: GOLDEN_IEBIN / m for m in ("tiny-llama", "tiny-qwen2", "tiny-mistral", "tiny-llama3",
                                             "tiny-llama-mixedq")}
    return {**golden, **quantized}


MODEL_NAMES = ["tiny-llama", "tiny-qwen2", "tiny-mistral", "tiny-llama3", "tiny-llama-mixedq", "qwen2-q4_0",
               "llama-q4_1"]


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_prefill_and_steps_match_the_cpu(quantized, name):
    """A 12-token prefill, then single-token steps (the graph-replayed path),
    each step's logits within 1e-3 relative of the CPU f32 decoder."""
    model = _models(quantized)[name]
    cpu, gpu = Decoder(model, act="f32"), Decoder(model, device="cuda")
    assert gpu.act == "f32" and gpu.device_bytes > 0 and gpu.rows8_bytes == 0
    ids = _ids()
    ref, got = cpu.prefill(ids), gpu.prefill(ids)
    assert got.dtype == np.float32 and got.shape == ref.shape
    errs = [_rel(got, ref)]
    for _ in range(8):
        tok = int(np.argmax(ref))
        ref, got = cpu.step(tok), gpu.step(tok)
        errs.append(_rel(got, ref))
    assert max(errs) <= REL_TOL, errs
    assert gpu.n_past == cpu.n_past == len(ids) + 8
    assert gpu._dec.step_graph, "single-token steps did not replay a CUDA graph (its capture was refused)"


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("name", ["tiny-llama", "tiny-mistral", "tiny-llama-mixedq"])
def test_all_logits_over_several_chunks_match_the_cpu(quantized, name):
    """`ierun logits`' path: every row of a 20-token sequence (three chunks
    of at most 8), into the caller's buffer as well as a new array."""
    model = _models(quantized)[name]
    cpu, gpu = Decoder(model, act="f32"), Decoder(model, device="cuda")
    ids = (_ids() * 2)[:20]
    ref = cpu.logits(ids)
    got = gpu.logits(ids)
    assert got.shape == (20, ref.shape[1])
    assert max(_rel(g, r) for g, r in zip(got, ref)) <= REL_TOL
    buf = np.empty((17, ref.shape[1]), np.float32)
    assert gpu.logits(ids, start=3, out=buf) is not None
    assert max(_rel(g, r) for g, r in zip(buf, ref[3:])) <= REL_TOL


@pytest.mark.gpu
@needs_gpu
def test_truncate_reuses_the_cached_prefix():
    """A second prompt sharing 8 tokens with the first runs only its new
    ones (kv_hits) and gives the logits of a fresh run."""
    model = GOLDEN_IEBIN / "tiny-qwen2"
    gpu, fresh = Decoder(model, device="cuda"), Decoder(model, act="f32")
    ids = _ids("tiny-qwen2")
    gpu.prefill(ids)
    gpu.step(5)
    other = ids[:8] + [7, 9, 11]
    got = gpu.prefill(other)
    assert gpu.kv_hits == 8 and gpu.n_past == len(other)
    assert _rel(got, fresh.prefill(other)) <= REL_TOL
    gpu._dec.truncate(0)
    assert gpu._dec.n_past == 0
    with pytest.raises(ValueError, match="truncate"):
        gpu._dec.truncate(1)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("scheme", [None, "int4w"])
def test_dedup_members_are_rebuilt_and_uploaded(request, monkeypatch, scheme):
    """With IE_DEDUP=1 the matrices come as dedup members, which the device
    decoder has its store rebuild whole before uploading: the same bytes on
    the device, so the logits of the plain model.ie.bin (to float rounding,
    should the GEMV's summation order vary between runs)."""
    model = request.getfixturevalue(f"nearcopy_{scheme or 'f32'}")
    ids = _ids()[:7]
    plain = Decoder(model, device="cuda").logits(ids)
    monkeypatch.setenv("IE_DEDUP", "1")
    monkeypatch.setenv("IE_DEDUP_STRICT", "1")
    d = Decoder(model, device="cuda")
    assert any(d.source.source_of(t["name"]) == "dedup" for t in d.model.tensors)
    assert max(_rel(g, r) for g, r in zip(d.logits(ids), plain)) <= 1e-6


@pytest.mark.gpu
@needs_gpu
def test_generate_and_logits_commands_on_the_device(tmp_path):
    """Greedy ids as transformers' (golden/ref), and `ierun logits` within
    the tolerance of the CPU's file; --act int8 is refused in one line."""
    ref = json.loads((GOLDEN_REF / "tiny-llama" / "greedy.json").read_text())
    model = GOLDEN_IEBIN / "tiny-llama"
    res = run_tool("ierun", "generate", "--model-dir", model, "--ids", ",".join(map(str, ref["prompt_ids"])),
                   "--max-new", str(ref["max_new_tokens"]), "--json", "--device", "cuda")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["generated_ids"] == ref["generated_ids"]
    ids = ",".join(map(str, _ids()))
    for dev in ("cpu", "cuda"):
        res = run_tool("ierun", "logits", "--model-dir", model, "--ids", ids, "--out", tmp_path / f"{dev}.npy",
                       "--act", "f32", "--device", dev)
        assert res.returncode == 0, res.stderr
    got, cpu = np.load(tmp_path / "cuda.npy"), np.load(tmp_path / "cpu.npy")
    assert max(_rel(g, r) for g, r in zip(got, cpu)) <= REL_TOL
    res = run_tool("ierun", "generate", "--model-dir", model, "--ids", ids, "--act", "int8", "--device", "cuda")
    assert_one_line_error(res, "--act int8")


@pytest.mark.gpu
@needs_gpu
def test_bench_reports_the_cpu_fields():
    """`ierun bench --device cuda`: the same JSON fields as the CPU run, the
    yardstick being the device's copy bandwidth."""
    recs = {}
    for dev in ("cpu", "cuda"):
        res = run_tool("ierun", "bench", "--model-dir", GOLDEN_IEBIN / "tiny-llama", "--rounds", "2", "--warmup", "1",
                       "--max-new", "4", "--bandwidth-mb", "64", "--device", dev, "--act", "f32")
        assert res.returncode == 0, res.stderr
        recs[dev] = [json.loads(ln) for ln in res.stdout.splitlines()]
    cpu, gpu = recs["cpu"], recs["cuda"]
    assert [r["round"] for r in gpu] == [1, 2]
    assert all(set(g) == set(c) for g, c in zip(gpu, cpu))
    assert all(r["device"] == "cuda" and r["act"] == "f32" and r["read_bw_gbps"] > 0 and r["tokens_generated"] > 0
               for r in gpu)
    # the CPU decoder splits its steps, the CUDA one does not (ierun bench --help)
    assert all(c["decode_matmul_ms"] > 0 and g["decode_matmul_ms"] is None and g["matmul_roofline_fraction"] is None
               for g, c in zip(gpu, cpu))
    res = run_tool("ierun", "bench", "--model-dir", GOLDEN_IEBIN / "tiny-llama", "--device", "cuda", "--act", "int8")
    assert_one_line_error(res, "--act int8: the CUDA decoder runs f32 activations only")
