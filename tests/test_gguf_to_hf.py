"""``ieconv gguf-to-hf``: a GGUF comes back as the Hugging Face checkpoint it
was made from. Every architecture it writes is checked against the original
checkpoint itself (the golden toys, exported with iebin-to-gguf and
converted back: the same tensors, value for value, and the same logits);
a quantized file's blocks are dequantized as gguf.quants dequantizes them;
what it cannot write is one line and nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import GOLDEN, GOLDEN_HF, GOLDEN_IEBIN, assert_one_line_error, max_rel, run_tool
from gguf_build import gguf_from_hf, hf_tensors
from llamacpp_models import falcon_h1_stored, llamacpp_models

from iekit.convert.gguf_names import DECAY_RATES
from iekit.formats.delta_net import decay_rate
from iekit.formats.gguf_file import open_gguf
from iekit.runtime.decoder import Decoder

IDS = [5, 17, 42, 99, 3, 250, 7, 8, 1, 64, 200, 31]
MIXED = GOLDEN / "gguf" / "tiny-llama.mixed.gguf"


def _to_hf(gguf: Path, out: Path, *args):
    return run_tool("ieconv", "gguf-to-hf", "-q", "--gguf", gguf, "--out-dir", out, *args)


def _ie(hf: Path, out: Path) -> Path:
    res = run_tool("ieconv", "hf-to-iebin", "-q", "--hf-dir", hf, "--out-dir", out)
    assert res.returncode == 0, res.stderr
    return out


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    return llamacpp_models(tmp_path_factory.mktemp("models"))


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-llama3", "tiny-qwen2", "tiny-qwen3", "tiny-mixtral",
                                  "tiny-qwen3-moe", "tiny-gemma3", "tiny-gemma2", "tiny-gemma", "tiny-arcee",
                                  "tiny-stablelm", "tiny-starcoder2",
                                  "tiny-nemotron", "tiny-phi", "tiny-phi3",
                                  "tiny-smollm3", "tiny-granite", "tiny-olmo2",
                                  "tiny-olmo3", "tiny-ministral3", "tiny-exaone4",
                                  "tiny-olmoe", "tiny-qwen2-moe", "tiny-glm4-moe", "tiny-minimax-m2", "tiny-seed-oss", "tiny-apertus", "tiny-afmoe", "tiny-dots1",
                                  "tiny-solar-open", "tiny-youtu", "tiny-jais2", "tiny-exaone-moe", "tiny-mamba2", "tiny-falcon-h1", "tiny-mamba", "tiny-falcon-mamba", "tiny-olmo", "tiny-granite-swa", "tiny-granite-moe-swa",
                                  "tiny-deepseek-v3", "tiny-deepseek-v2", "tiny-glm4-moe-lite",
                                  "tiny-mistral4",
                                  "tiny-llama4", "tiny-ernie4-5", "tiny-ernie4-5-moe", "tiny-glm4", "tiny-cohere2",
                                  "tiny-cohere", "tiny-qwen3-5", "tiny-qwen3-5-moe",
                                  "tiny-qwen3-next", "tiny-lfm2", "tiny-lfm2-moe", "tiny-granite4",
                                  "tiny-granite4-dense", "tiny-granite-moe", "tiny-granite-moe-shared",
                                  "tiny-nemotron-h", "tiny-nemotron-h-moe", "tiny-hunyuan-dense",
                                  "tiny-hunyuan-moe", "tiny-hy-v3"])
def test_a_gguf_comes_back_as_its_checkpoint(tmp_path, models, name):
    g = tmp_path / "m.gguf"
    res = run_tool("ieconv", "iebin-to-gguf", "-q", "--model-dir", models[name], "--out", g)
    assert res.returncode == 0, res.stderr
    res = _to_hf(g, tmp_path / "hf")
    assert res.returncode == 0, res.stderr
    # against the checkpoint the artifact came from: every tensor, value for value
    # (tiny-phi3's: fused again into qkv_proj and gate_up_proj; its window is the variant's: none; tiny-llama4's
    # expert stacks transposed back to [experts, in, out])
    variants = ("tiny-qwen3-moe", "tiny-phi3", "tiny-deepseek-v3", "tiny-llama4", "tiny-ernie4-5-moe", "tiny-qwen3-5-moe",
                "tiny-qwen3-next")
    source = GOLDEN_HF / name if name not in variants else models[name].parent / f"hf-{name}"
    want, got = hf_tensors(source), hf_tensors(tmp_path / "hf")
    assert sorted(got) == sorted(want)  # a tied head stays tied
    falcon = name == "tiny-falcon-h1"  # (its matrices come back times the muP multipliers, as llama.cpp stores them)
    cfg = json.loads((source / "config.json").read_text())
    for k in want:
        if falcon and want[k].ndim == 2:
            want[k] = falcon_h1_stored(cfg, k, want[k])
        if k.endswith(DECAY_RATES):  # (llama.cpp stores its rate: A_log comes back a float32 of that rate)
            assert got[k].shape == want[k].shape and np.array_equal(decay_rate(got[k]), decay_rate(want[k])), k
            continue
        assert got[k].shape == want[k].shape and np.array_equal(got[k], want[k]), k
    # and it is the same model: the same logits, bit for bit
    ref = Decoder(models[name]).logits(IDS)
    got = Decoder(_ie(tmp_path / "hf", tmp_path / "ie")).logits(IDS)
    assert max_rel(got, ref) < 1.2e-2 if falcon else np.array_equal(got, ref)  # (falcon: bf16 rounding, 0.0093)


def test_blocks_are_dequantized_as_gguf_quants_does(tmp_path):
    """A quantized file gives its quantized values (f32 by default), and the
    same artifact as gguf-to-iebin --dequantize, tensor for tensor."""
    import gguf
    from safetensors import safe_open

    res = _to_hf(MIXED, tmp_path / "hf")
    assert res.returncode == 0, res.stderr
    r = gguf.GGUFReader(str(MIXED))
    t = next(t for t in r.tensors if t.name == "blk.1.ffn_down.weight")
    assert t.tensor_type != gguf.GGMLQuantizationType.F32
    want = gguf.quants.dequantize(t.data, t.tensor_type).reshape(t.shape[::-1].tolist())
    with safe_open(tmp_path / "hf" / "model.safetensors", framework="np") as f:
        got = f.get_tensor("model.layers.1.mlp.down_proj.weight")
    assert got.dtype == np.float32 and np.array_equal(got, want)
    a = json.loads((_ie(tmp_path / "hf", tmp_path / "a") / "model.ie.json").read_text())
    res = run_tool("ieconv", "gguf-to-iebin", "-q", "--gguf", MIXED, "--out-dir", tmp_path / "b", "--dequantize")
    assert res.returncode == 0, res.stderr
    b = json.loads((tmp_path / "b" / "model.ie.json").read_text())
    assert [(t["name"], t["dtype"], t["xxh3_128"]) for t in a["tensors"]] == \
           [(t["name"], t["dtype"], t["xxh3_128"]) for t in b["tensors"]]
    assert a["config"] == b["config"]


def test_dtype_casts_every_tensor(tmp_path):
    res = _to_hf(MIXED, tmp_path / "hf", "--dtype", "bf16")
    assert res.returncode == 0, res.stderr
    raw = (tmp_path / "hf" / "model.safetensors").read_bytes()
    header = json.loads(raw[8:8 + int.from_bytes(raw[:8], "little")])
    assert {v["dtype"] for k, v in header.items() if k != "__metadata__"} == {"BF16"}
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["torch_dtype"] == "bfloat16"


def test_gpt_oss_is_refused(tmp_path, models):
    g = tmp_path / "oss.gguf"
    assert run_tool("ieconv", "iebin-to-gguf", "-q", "--model-dir", models["tiny-gpt-oss"], "--out", g).returncode == 0
    assert_one_line_error(_to_hf(g, tmp_path / "hf"), "oss.gguf", "general.architecture", "gpt_oss",
                          "gguf-to-iebin")
    assert not (tmp_path / "hf").exists()


def test_a_nonfinite_float_tensor_is_refused_unless_allowed(tmp_path):
    good = gguf_from_hf(GOLDEN_HF / "tiny-llama", tmp_path / "good.gguf")
    t = next(t for t in open_gguf(good).tensors if t.name == "output_norm.weight")
    data = bytearray(good.read_bytes())
    data[t.offset + 4 * 3:t.offset + 4 * 4] = np.array([np.inf], np.float32).tobytes()
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(bytes(data))
    assert_one_line_error(_to_hf(bad, tmp_path / "hf"), "bad.gguf", "output_norm.weight", "element 3 is inf")
    assert not (tmp_path / "hf").exists()
    assert _to_hf(bad, tmp_path / "hf", "--allow-nonfinite").returncode == 0


def test_the_output_directory_rules(tmp_path):
    out = tmp_path / "hf"
    assert _to_hf(MIXED, out).returncode == 0
    before = (out / "model.safetensors").read_bytes()
    assert_one_line_error(_to_hf(MIXED, out), "model.safetensors", "--overwrite")
    assert (out / "model.safetensors").read_bytes() == before
    assert _to_hf(MIXED, out, "--overwrite").returncode == 0
    assert (out / "model.safetensors").read_bytes() == before  # the same file, byte for byte
    other = tmp_path / "other"
    other.mkdir()
    (other / "model-00001-of-00002.safetensors").write_bytes(b"x")
    assert_one_line_error(_to_hf(MIXED, other), "model-00001-of-00002.safetensors", "another checkpoint")
    assert sorted(p.name for p in other.iterdir()) == ["model-00001-of-00002.safetensors"]
