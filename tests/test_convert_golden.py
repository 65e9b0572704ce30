"""hf-to-iebin on the golden checkpoints: byte-exact against committed outputs,
against the source shards, and (for --dtype) against torch's own casts."""

from __future__ import annotations

import hashlib
import json
import shutil

import numpy as np
import pytest
import safetensors
import xxhash

from conftest import GOLDEN, GOLDEN_HF, GOLDEN_IEBIN, GOLDEN_REF, run_tool
from iekit.formats.hf_config import model_summary
from iekit.convert.hf_to_iebin import convert
from iekit.formats import iebin
from iekit.formats.hf_checkpoint import from_dir
from iekit.formats.jsonio import dumps_canonical, load_json

MODELS = ["tiny-llama", "tiny-qwen2", "tiny-mistral", "tiny-llama3"]


def st_tensors(path) -> dict[str, dict]:
    """Independent reader: the safetensors library's own deserializer."""
    return {name: info for name, info in safetensors.deserialize(path.read_bytes())}


def source_tensors(model: str) -> dict[str, dict]:
    out = {}
    for shard in sorted((GOLDEN_HF / model).glob("*.safetensors")):
        out.update(st_tensors(shard))
    return out


def payload(m: iebin.IebinModel, t: dict) -> bytes:
    with open(m.path_of(t), "rb") as f:
        f.seek(t["file_data_offset"])
        return f.read(t["nbytes"])


@pytest.mark.parametrize("model,golden_name,extra", [
    ("tiny-llama", "tiny-llama", []),
    ("tiny-qwen2", "tiny-qwen2", []),
    ("tiny-mistral", "tiny-mistral", []),
    ("tiny-llama3", "tiny-llama3", []),
    ("tiny-gemma3", "tiny-gemma3", []),
    ("tiny-gemma2", "tiny-gemma2", []),
    ("tiny-gemma", "tiny-gemma", []),
    ("tiny-arcee", "tiny-arcee", []),
    ("tiny-stablelm", "tiny-stablelm", []),
    ("tiny-starcoder2", "tiny-starcoder2", []),
    ("tiny-nemotron", "tiny-nemotron", []),
    ("tiny-phi", "tiny-phi", []),
    ("tiny-phi3", "tiny-phi3", []),
    ("tiny-smollm3", "tiny-smollm3", []),
    ("tiny-granite", "tiny-granite", []),
    ("tiny-olmo2", "tiny-olmo2", []),
    ("tiny-olmo3", "tiny-olmo3", []),
    ("tiny-ministral3", "tiny-ministral3", []),
    ("tiny-exaone4", "tiny-exaone4", []),
    ("tiny-olmoe", "tiny-olmoe", []),
    ("tiny-qwen2-moe", "tiny-qwen2-moe", []),
    ("tiny-glm4-moe", "tiny-glm4-moe", []),
    ("tiny-minimax-m2", "tiny-minimax-m2", []),
    ("tiny-deepseek-v3", "tiny-deepseek-v3", []),
    ("tiny-deepseek-v2", "tiny-deepseek-v2", []),
    ("tiny-glm4-moe-lite", "tiny-glm4-moe-lite", []),
    ("tiny-mistral4", "tiny-mistral4", []),
    ("tiny-llama4", "tiny-llama4", []),
    ("tiny-ernie4-5", "tiny-ernie4-5", []),
    ("tiny-ernie4-5-moe", "tiny-ernie4-5-moe", []),
    ("tiny-seed-oss", "tiny-seed-oss", []),
    ("tiny-apertus", "tiny-apertus", []),
    ("tiny-afmoe", "tiny-afmoe", []),
    ("tiny-dots1", "tiny-dots1", []),
    ("tiny-solar-open", "tiny-solar-open", []),
    ("tiny-youtu", "tiny-youtu", []),
    ("tiny-jais2", "tiny-jais2", []),
    ("tiny-exaone-moe", "tiny-exaone-moe", []),
    ("tiny-mamba2", "tiny-mamba2", []),
    ("tiny-falcon-h1", "tiny-falcon-h1", []),
    ("tiny-mamba", "tiny-mamba", []),
    ("tiny-falcon-mamba", "tiny-falcon-mamba", []),
    ("tiny-olmo", "tiny-olmo", []),
    ("tiny-granite-swa", "tiny-granite-swa", []),
    ("tiny-granite-moe-swa", "tiny-granite-moe-swa", []),
    ("tiny-hunyuan-dense", "tiny-hunyuan-dense", []),
    ("tiny-hunyuan-moe", "tiny-hunyuan-moe", []),
    ("tiny-hy-v3", "tiny-hy-v3", []),
    ("tiny-glm4", "tiny-glm4", []),
    ("tiny-cohere2", "tiny-cohere2", []),
    ("tiny-cohere", "tiny-cohere", []),
    ("tiny-qwen3-5", "tiny-qwen3-5", []),
    ("tiny-qwen3-5-moe", "tiny-qwen3-5-moe", []),
    ("tiny-qwen3-next", "tiny-qwen3-next", []),
    ("tiny-lfm2", "tiny-lfm2", []),
    ("tiny-lfm2-moe", "tiny-lfm2-moe", []),
    ("tiny-granite4", "tiny-granite4", []),
    ("tiny-granite4-dense", "tiny-granite4-dense", []),
    ("tiny-granite-moe", "tiny-granite-moe", []),
    ("tiny-granite-moe-shared", "tiny-granite-moe-shared", []),
    ("tiny-nemotron-h", "tiny-nemotron-h", []),
    ("tiny-nemotron-h-moe", "tiny-nemotron-h-moe", []),
    ("tiny-llama", "tiny-llama-mixedq", ["--q4-map", GOLDEN / "manifests" / "tiny-llama.mixed.q4_manifest.json"]),
    # --checksum sha256 writes what every earlier version wrote, byte for byte
    ("tiny-llama", "tiny-llama-sha256", ["--checksum", "sha256"]),
])
def test_reconversion_is_byte_identical_to_golden(model, golden_name, extra, tmp_path):
    res = run_tool("ieconv", "hf-to-iebin", "--hf-dir", GOLDEN_HF / model, "--out-dir", tmp_path / "o", *extra)
    assert res.returncode == 0, res.stderr
    model = golden_name
    golden = sorted(p.name for p in (GOLDEN_IEBIN / model).iterdir())
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == golden
    for name in golden:
        assert (tmp_path / "o" / name).read_bytes() == (GOLDEN_IEBIN / model / name).read_bytes(), name


@pytest.mark.parametrize("model", MODELS)
def test_tensor_bytes_equal_source_shard_bytes(model):
    m = iebin.load_model(GOLDEN_IEBIN / model, deep=True)
    src = source_tensors(model)
    assert sorted(t["name"] for t in m.tensors) == sorted(src)
    for t in m.tensors:
        s = src[t["name"]]
        assert t["dtype"] == s["dtype"].lower()
        assert t["shape"] == list(s["shape"])
        assert payload(m, t) == bytes(s["data"])
        assert t["file_data_offset"] % 64 == 0
        assert m.checksum == "xxh3_128"
        assert t["xxh3_128"] == xxhash.xxh3_128(bytes(s["data"])).hexdigest()


def test_sha256_artifacts_of_earlier_versions_still_read():
    """golden/iebin/tiny-llama-sha256 is byte for byte what ieconv wrote before
    xxh3_128 became the default: it validates (deep), and holds the same payloads."""
    old = iebin.load_model(GOLDEN_IEBIN / "tiny-llama-sha256", deep=True)
    new = iebin.load_model(GOLDEN_IEBIN / "tiny-llama", deep=True)
    assert old.checksum == "sha256"
    assert [t["name"] for t in old.tensors] == [t["name"] for t in new.tensors]
    for a, b in zip(old.tensors, new.tensors):
        assert payload(old, a) == payload(new, b)
        assert a["sha256"] == hashlib.sha256(payload(old, a)).hexdigest()
        assert "xxh3_128" not in a
    for s in old.meta["source"]["shards"]:
        assert s["sha256"] == hashlib.sha256((GOLDEN_HF / "tiny-llama" / s["name"]).read_bytes()).hexdigest()


@pytest.mark.parametrize("model", MODELS + ["tiny-llama-mixedq", "tiny-llama-sha256"])
def test_metadata_round_trip_is_byte_identical(model):
    path = GOLDEN_IEBIN / model / iebin.META_NAME
    assert dumps_canonical(load_json(path)) == path.read_bytes()


def test_metadata_captures_config_source_and_tokenizer():
    m = iebin.load_model(GOLDEN_IEBIN / "tiny-llama")
    cfg = load_json(GOLDEN_HF / "tiny-llama" / "config.json")
    assert m.meta["config"] == cfg
    mod = m.meta["model"]
    assert mod["architecture"] == "LlamaForCausalLM"
    assert (mod["hidden_size"], mod["num_hidden_layers"], mod["num_attention_heads"], mod["num_key_value_heads"]) == (64, 2, 4, 2)
    assert mod["rope_theta"] == 10000.0 and mod["norm_eps"] == 1e-5 and mod["tie_word_embeddings"] is False
    assert m.meta["tokenizer"]["files"] == ["tokenizer.json", "tokenizer_config.json"]
    src = m.meta["source"]
    assert src["kind"] == "hf_dir" and src["name"] == "tiny-llama" and src["revision"] is None
    shards = sorted(p.name for p in (GOLDEN_HF / "tiny-llama").glob("*.safetensors"))
    assert [s["name"] for s in src["shards"]] == shards
    for s in src["shards"]:
        assert s["xxh3_128"] == xxhash.xxh3_128((GOLDEN_HF / "tiny-llama" / s["name"]).read_bytes()).hexdigest()
    assert mod == model_summary(cfg)
    q = iebin.load_model(GOLDEN_IEBIN / "tiny-qwen2").meta["model"]
    assert q["architecture"] == "Qwen2ForCausalLM" and q["tie_word_embeddings"] is True


@pytest.mark.parametrize("model,dtype", [("tiny-llama", "bf16"), ("tiny-qwen2", "f32"), ("tiny-qwen2", "f16")])
def test_dtype_cast_matches_torch(model, dtype, tmp_path):
    convert(from_dir(GOLDEN_HF / model), tmp_path, dtype=dtype)
    m = iebin.load_model(tmp_path, deep=True)
    ref = st_tensors(GOLDEN_REF / model / f"cast_{dtype}.safetensors")
    assert len(ref) == len(m.tensors)
    for t in m.tensors:
        assert t["dtype"] == dtype
        assert payload(m, t) == bytes(ref[t["name"]]["data"]), t["name"]


def test_cast_edge_values_match_torch():
    from iekit.formats.casting import cast_bytes

    ref = st_tensors(GOLDEN_REF / "cast_edge.safetensors")
    x = bytes(ref["x"]["data"])
    assert cast_bytes(x, "f32", "bf16") == bytes(ref["x_bf16"]["data"])
    assert cast_bytes(x, "f32", "f16") == bytes(ref["x_f16"]["data"])
    # and back up: bf16 -> f32 is exact
    back = np.frombuffer(cast_bytes(bytes(ref["x_bf16"]["data"]), "bf16", "f32"), np.float32)
    bits = np.frombuffer(bytes(ref["x_bf16"]["data"]), np.uint16).astype(np.uint32) << 16
    assert np.array_equal(back.view(np.uint32), bits)


def test_casts_of_long_arrays_match_torch_across_pieces():
    """Casts run casting.PIECE elements at a time: the torch edge values,
    repeated past three pieces and cut at an odd length, cast as torch did."""
    from iekit.formats import casting

    ref = st_tensors(GOLDEN_REF / "cast_edge.safetensors")
    n = 3 * casting.PIECE + 17
    reps = -(-n // (len(ref["x"]["data"]) // 4))
    x = np.tile(np.frombuffer(bytes(ref["x"]["data"]), np.uint32), reps)[:n].tobytes()
    for dst in ("bf16", "f16"):
        want = np.tile(np.frombuffer(bytes(ref[f"x_{dst}"]["data"]), np.uint16), reps)[:n].tobytes()
        assert casting.cast_bytes(x, "f32", dst) == want, dst
        assert casting.encode_f32(np.frombuffer(x, np.float32), dst) == want, dst
    bf16 = np.tile(np.frombuffer(bytes(ref["x_bf16"]["data"]), np.uint16), reps)[:n]
    back = casting.decode_f32(bf16.tobytes(), "bf16").view(np.uint32)  # exact: the bits, shifted up
    assert np.array_equal(back, bf16.astype(np.uint32) << 16)


def test_converting_twice_is_deterministic(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    convert(from_dir(GOLDEN_HF / "tiny-qwen2"), a, dtype="f16")
    convert(from_dir(GOLDEN_HF / "tiny-qwen2"), b, dtype="f16")
    for p in a.iterdir():
        assert p.read_bytes() == (b / p.name).read_bytes()


def test_source_name_does_not_depend_on_path_spelling(tmp_path, monkeypatch):
    shutil.copytree(GOLDEN_HF / "tiny-llama", tmp_path / "tiny-llama")
    monkeypatch.chdir(tmp_path)
    convert(from_dir("tiny-llama/"), tmp_path / "o")
    assert (tmp_path / "o" / iebin.META_NAME).read_bytes() == (GOLDEN_IEBIN / "tiny-llama" / iebin.META_NAME).read_bytes()


def test_inspect_and_validate_cli():
    res = run_tool("ieconv", "validate", "--deep", GOLDEN_IEBIN / "tiny-llama")
    assert res.returncode == 0 and "OK" in res.stdout and "21 tensors" in res.stdout
    res = run_tool("ieconv", "inspect", "--json", GOLDEN_IEBIN / "tiny-qwen2")
    assert res.returncode == 0, res.stderr
    info = json.loads(res.stdout)
    assert info["tensors"] == 26 and set(info["by_dtype"]) == {"bf16"}
    assert info["bytes"] == sum(t["nbytes"] for t in load_json(GOLDEN_IEBIN / "tiny-qwen2" / iebin.META_NAME)["tensors"])
    res = run_tool("ieconv", "inspect", GOLDEN_IEBIN / "tiny-llama")
    assert res.returncode == 0 and "model.layers.1.mlp.down_proj.weight" in res.stdout and "totals" in res.stdout
    brief = run_tool("ieconv", "inspect", "--summary", GOLDEN_IEBIN / "tiny-llama")
    assert brief.returncode == 0 and "totals" in brief.stdout and "LlamaForCausalLM" in brief.stdout
    assert "model.layers.1.mlp.down_proj.weight" not in brief.stdout
