"""q4_manifest.json: schema, precedence, plan checks, the default policy, and
--q4-map conversions checked element-wise against the source weights."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import safetensors

from conftest import GOLDEN, GOLDEN_HF, GOLDEN_IEBIN, assert_one_line_error, run_tool
from iekit.formats.expert_stacks import shapes_as_written as tensor_shapes
from iekit.convert.hf_to_iebin import convert
from iekit.formats import iebin
from iekit.formats.hf_checkpoint import from_dir
from iekit.formats.errors import FormatError
from iekit.formats.jsonio import schema_check
from iekit.formats.q4_manifest import SCHEMA_PATH, load_manifest, plan
from iekit.formats.quant import SCHEMES, QuantParams

LLAMA = tensor_shapes(from_dir(GOLDEN_HF / "tiny-llama"))
MIXED = GOLDEN / "manifests" / "tiny-llama.mixed.q4_manifest.json"


def write(tmp_path, obj) -> str:
    p = tmp_path / "q4_manifest.json"
    p.write_text(json.dumps(obj))
    return p


@pytest.mark.parametrize("obj,field,words", [
    ({"rules": []}, "(root)", "version"),
    ({"version": 2}, "version", ""),
    ({"version": 1, "rules": [{"match": "*", "scheme": "int3"}]}, "rules[0].scheme", "int3"),
    ({"version": 1, "rules": [{"scheme": "q4_0"}]}, "rules[0]", "match"),
    ({"version": 1, "rules": [{"match": "*", "scheme": "q4_0", "group_size": 64}]}, "rules[0].group_size", "only scheme int4w"),
    ({"version": 1, "default": {"scheme": "keep", "symmetric": True}}, "default.symmetric", "only scheme int4w"),
    ({"version": 1, "rules": [{"match": "*", "scheme": "int4w", "group_size": 48}]}, "rules[0].group_size", "48"),
    ({"version": 1, "tensors": {"a": {"scheme": "int4w", "symmetric": "yes"}}}, "tensors.a.symmetric", "boolean"),
    ({"version": 1, "default": {"scheme": "keep", "extra": 1}}, "default", ""),
    ({"version": 1, "surprise": True}, "(root)", "surprise"),
])
def test_schema_rejects(tmp_path, obj, field, words):
    p = write(tmp_path, obj)
    with pytest.raises(FormatError) as ei:
        load_manifest(p)
    assert ei.value.field == field, str(ei.value)
    assert words in str(ei.value)


def test_precedence_tensors_then_first_rule_then_default(tmp_path):
    m = load_manifest(write(tmp_path, {
        "version": 1,
        "rules": [{"match": "*.q_proj.weight", "scheme": "q8_0"}, {"match": "*proj.weight", "scheme": "q4_1"}],
        "tensors": {"model.layers.0.self_attn.q_proj.weight": {"scheme": "keep"}},
        "default": {"scheme": "q4_0"}}))
    assert m.resolve("model.layers.0.self_attn.q_proj.weight") == (None, "tensors['model.layers.0.self_attn.q_proj.weight']")
    assert m.resolve("model.layers.1.self_attn.q_proj.weight") == (QuantParams("q8_0"), "rules[0]")
    assert m.resolve("model.layers.1.self_attn.k_proj.weight") == (QuantParams("q4_1"), "rules[1]")
    assert m.resolve("lm_head.weight") == (QuantParams("q4_0"), "default")


def test_plan_errors_and_warnings(tmp_path):
    m = load_manifest(write(tmp_path, {"version": 1, "rules": [{"match": "*norm*", "scheme": "q8_0"}]}))
    with pytest.raises(FormatError, match=r"rules\[0\]: selects 'model.layers.0.input_layernorm.weight': q8_0 needs a 2-D matrix"):
        plan(m, LLAMA)
    m = load_manifest(write(tmp_path, {"version": 1, "tensors": {"model.layers.0.mlp.down_proj.weight":
                                                                 {"scheme": "int4w", "group_size": 128}}}))
    assert plan(m, LLAMA).quantize  # 128 divides 128
    m = load_manifest(write(tmp_path, {"version": 1, "tensors": {"model.layers.0.mlp.up_proj.weight":
                                                                 {"scheme": "int4w", "group_size": 128}}}))
    with pytest.raises(FormatError, match="group_size 128 .* divides cols \\(64\\)"):
        plan(m, LLAMA)
    m = load_manifest(write(tmp_path, {"version": 1, "rules": [{"match": "nothing.*", "scheme": "q4_0"},
                                                               {"match": "*embed_tokens*", "scheme": "q8_0"}],
                                       "tensors": {"ghost.weight": {"scheme": "q4_0"}}}))
    p = plan(m, LLAMA)
    assert p.quantize == {}
    assert any("rules[0]" in w and "matches no tensor" in w for w in p.warnings)
    assert any("embed_tokens" in w and "--force" in w for w in p.warnings)
    assert any("ghost.weight" in w for w in p.warnings)
    assert plan(m, LLAMA, force=True).quantize == {"model.embed_tokens.weight": QuantParams("q8_0")}
    m = load_manifest(write(tmp_path, {"version": 1, "default": {"scheme": "q4_0"}}))
    with pytest.raises(FormatError, match="only float tensors"):
        plan(m, {"ids": ("i64", [4, 32])})


def test_default_policy_quantizes_projections_only(tmp_path):
    res = run_tool("ieconv", "q4-manifest", "--hf-dir", GOLDEN_HF / "tiny-llama", "-o", tmp_path / "m.json")
    assert res.returncode == 0, res.stderr
    obj = json.loads((tmp_path / "m.json").read_text())
    schema_check(obj, SCHEMA_PATH, "m.json")
    p = plan(load_manifest(tmp_path / "m.json"), LLAMA)
    assert sorted(p.quantize) == sorted(n for n in LLAMA if "_proj." in n)
    assert all(v == QuantParams("int4w", 64, True, "f16") for v in p.quantize.values())
    assert p.warnings == []
    # a second run refuses to overwrite
    assert_one_line_error(run_tool("ieconv", "q4-manifest", "--hf-dir", GOLDEN_HF / "tiny-llama", "-o", tmp_path / "m.json"),
                          "--overwrite")


def test_default_policy_falls_back_to_whole_rows(tmp_path):
    """A matrix whose rows 64 does not divide gets group_size 'row' (or is kept)."""
    d = tmp_path / "hf"
    shutil.copytree(GOLDEN_HF / "tiny-qwen2", d)
    from conftest import st_write
    st_write(d / "model.safetensors", {"a.0.proj.weight": ("F32", [4, 96], b"\0" * 4 * 384),
                                       "a.0.odd.weight": ("F32", [4, 40], b"\0" * 4 * 160)})
    res = run_tool("ieconv", "q4-manifest", "--hf-dir", d, "-o", tmp_path / "m.json")
    assert res.returncode == 0, res.stderr
    obj = json.loads((tmp_path / "m.json").read_text())
    assert obj["tensors"] == {"a.0.proj.weight": {"scheme": "int4w", "group_size": "row", "symmetric": True, "scale_dtype": "f16"}}
    assert obj["rules"] == []


def test_mixed_quantized_conversion_is_within_bounds_of_source():
    m = iebin.load_model(GOLDEN_IEBIN / "tiny-llama-mixedq", deep=True)
    src = {}
    for shard in sorted((GOLDEN_HF / "tiny-llama").glob("*.safetensors")):
        src.update(dict(safetensors.deserialize(shard.read_bytes())))
    blob = np.fromfile(GOLDEN_IEBIN / "tiny-llama-mixedq" / iebin.BIN_NAME, np.uint8)
    seen = set()
    for t in m.tensors:
        w = np.frombuffer(bytes(src[t["name"]]["data"]), np.float32).reshape(t["shape"])
        raw = blob[t["file_data_offset"]: t["file_data_offset"] + t["nbytes"]]
        if "quant" not in t:
            assert raw.tobytes() == w.tobytes()
            continue
        s = SCHEMES[t["dtype"]]
        p = s.params_from(t["quant"], t["shape"][1])
        seen.add((t["dtype"], p.group_size, p.symmetric, p.scale_dtype))
        deq = s.dequantize(raw, *t["shape"], p)
        assert (np.abs(w - deq) <= s.error_bound(w, raw, p)).all(), t["name"]
    assert len(seen) == 6  # every variant in the manifest made it into the artifact


def test_q4_map_errors_are_one_line(tmp_path):
    p = write(tmp_path, {"version": 1, "rules": [{"match": "*", "scheme": "int4w", "group_size": 128}]})
    res = run_tool("ieconv", "hf-to-iebin", "--hf-dir", GOLDEN_HF / "tiny-llama", "--out-dir", tmp_path / "o", "--q4-map", p)
    assert_one_line_error(res, "rules[0]")
    assert not (tmp_path / "o").exists()
    res = run_tool("ieconv", "hf-to-iebin", "--hf-dir", GOLDEN_HF / "tiny-llama", "--out-dir", tmp_path / "o", "--force")
    assert res.returncode == 2


def test_non_finite_weight_aborts_quantized_conversion(tmp_path):
    d = tmp_path / "hf"
    d.mkdir()
    (d / "config.json").write_text("{}")
    w = np.ones((4, 64), np.float32)
    w[2, 3] = np.nan
    from conftest import st_write
    st_write(d / "model.safetensors", {"x.weight": ("F32", [4, 64], w.tobytes())})
    p = write(tmp_path, {"version": 1, "default": {"scheme": "int4w"}})
    res = run_tool("ieconv", "hf-to-iebin", "--hf-dir", d, "--out-dir", tmp_path / "o", "--q4-map", p)
    assert_one_line_error(res, "x.weight", "non-finite", "(2, 3)")
    assert not (tmp_path / "o").exists()


def test_bf16_source_quantizes_from_its_exact_values(tmp_path):
    p = write(tmp_path, {"version": 1, "rules": [{"match": "*mlp*", "scheme": "q8_0"}]})
    convert(from_dir(GOLDEN_HF / "tiny-qwen2"), tmp_path / "o", manifest=load_manifest(p))
    m = iebin.load_model(tmp_path / "o", deep=True)
    src = dict(safetensors.deserialize((GOLDEN_HF / "tiny-qwen2" / "model.safetensors").read_bytes()))
    t = m.tensor("model.layers.0.mlp.down_proj.weight")
    bits = np.frombuffer(bytes(src[t["name"]]["data"]), np.uint16).astype(np.uint32) << 16
    w = bits.view(np.float32).reshape(t["shape"])
    import gguf
    ref = gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q8_0)
    blob = (tmp_path / "o" / iebin.BIN_NAME).read_bytes()
    assert blob[t["file_data_offset"]: t["file_data_offset"] + t["nbytes"]] == ref.tobytes()


def test_exact_entry_quantizes_an_embedding_without_force(tmp_path):
    """A name in "tensors" is deliberate; a rule or the default reaching an embedding needs --force."""
    m = load_manifest(write(tmp_path, {"version": 1, "tensors": {"model.embed_tokens.weight": {"scheme": "q8_0"}}}))
    p = plan(m, LLAMA)
    assert p.quantize == {"model.embed_tokens.weight": QuantParams("q8_0")} and p.warnings == []


def _policy(tmp_path, model: str, *args: str) -> tuple[dict, str]:
    res = run_tool("ieconv", "q4-manifest", "--hf-dir", GOLDEN_HF / model, "-o", tmp_path / "m.json", "--overwrite", *args)
    assert res.returncode == 0, res.stderr
    return json.loads((tmp_path / "m.json").read_text()), res.stdout


def test_tied_head_gets_an_8bit_scheme_by_default(tmp_path):
    """tiny-qwen2 ties its embedding to the head: the default policy stores it
    as q8_0 and says so, and the decode-step figure it prints is the one the
    decoder reports for the converted model."""
    from iekit.runtime.decoder import Decoder

    obj, stdout = _policy(tmp_path, "tiny-qwen2")
    assert obj["tensors"] == {"model.embed_tokens.weight": {"scheme": "q8_0"}}
    assert "tied embedding/head model.embed_tokens.weight: q8_0" in stdout
    res = run_tool("ieconv", "hf-to-iebin", "--hf-dir", GOLDEN_HF / "tiny-qwen2", "--out-dir", tmp_path / "o", "-q",
                   "--q4-map", tmp_path / "m.json")
    assert res.returncode == 0 and "warning" not in res.stderr, res.stderr
    dec = Decoder(tmp_path / "o", ctx=8)
    assert "q8_0" in dec.precision
    from iekit.formats.q4_manifest import bytes_per_token

    tensors = tensor_shapes(from_dir(GOLDEN_HF / "tiny-qwen2"))
    assert bytes_per_token(tensors, plan(load_manifest(tmp_path / "m.json"), tensors).quantize, True) == \
        dec.weight_bytes_per_token
    obj, _ = _policy(tmp_path, "tiny-qwen2", "--head-scheme", "keep")
    assert obj["tensors"] == {}
    obj, _ = _policy(tmp_path, "tiny-qwen2", "--quantize-head", "--group-size", "32")
    assert obj["tensors"]["model.embed_tokens.weight"]["scheme"] == "int4w"


def test_untied_head_and_embedding_schemes(tmp_path):
    from iekit.runtime.decoder import Decoder

    obj, stdout = _policy(tmp_path, "tiny-llama")
    assert obj["tensors"] == {}  # untied: head and embedding kept, as before
    obj, stdout = _policy(tmp_path, "tiny-llama", "--head-scheme", "q8_0", "--embedding-scheme", "q4_0")
    assert obj["tensors"] == {"lm_head.weight": {"scheme": "q8_0"}, "model.embed_tokens.weight": {"scheme": "q4_0"}}
    assert "head lm_head.weight: q8_0" in stdout and "embedding model.embed_tokens.weight: q4_0" in stdout
    res = run_tool("ieconv", "hf-to-iebin", "--hf-dir", GOLDEN_HF / "tiny-llama", "--out-dir", tmp_path / "o", "-q",
                   "--q4-map", tmp_path / "m.json")
    assert res.returncode == 0, res.stderr
    from iekit.formats.q4_manifest import bytes_per_token

    tensors = tensor_shapes(from_dir(GOLDEN_HF / "tiny-llama"))
    assert bytes_per_token(tensors, plan(load_manifest(tmp_path / "m.json"), tensors).quantize, False) == \
        Decoder(tmp_path / "o", ctx=8).weight_bytes_per_token
    res = run_tool("ieconv", "q4-manifest", "--hf-dir", GOLDEN_HF / "tiny-llama", "-o", tmp_path / "x.json",
                   "--quantize-head", "--head-scheme", "q8_0")
    assert res.returncode == 2


def test_tied_flag_with_a_stored_head_counts_the_embedding_only(tmp_path):
    """tie_word_embeddings true while lm_head.weight is stored: the decoder
    reads the embedding as the head, and the policy's figure agrees."""
    from iekit.formats.q4_manifest import bytes_per_token
    from iekit.runtime.decoder import Decoder

    hf = tmp_path / "hf"
    shutil.copytree(GOLDEN_HF / "tiny-llama", hf)
    cfg = json.loads((hf / "config.json").read_text())
    (hf / "config.json").write_text(json.dumps({**cfg, "tie_word_embeddings": True}))
    res = run_tool("ieconv", "q4-manifest", "--hf-dir", hf, "-o", tmp_path / "m.json", "--overwrite")
    assert res.returncode == 0 and "tied embedding/head" in res.stdout, res.stdout
    res = run_tool("ieconv", "hf-to-iebin", "--hf-dir", hf, "--out-dir", tmp_path / "o", "-q", "--q4-map", tmp_path / "m.json")
    assert res.returncode == 0, res.stderr
    tensors = tensor_shapes(from_dir(hf))
    assert "lm_head.weight" in tensors
    assert bytes_per_token(tensors, plan(load_manifest(tmp_path / "m.json"), tensors).quantize, True) == \
        Decoder(tmp_path / "o", ctx=8).weight_bytes_per_token


@pytest.mark.parametrize("model", ["tiny-llama", "tiny-gemma3", "tiny-mixtral", "tiny-qwen3-moe", "tiny-qwen2-moe",
                                   "tiny-gpt-oss", "tiny-gpt-oss-mxfp4", "tiny-glm4-moe", "tiny-deepseek-v3",
                                   "tiny-llama4", "tiny-ernie4-5-moe", "tiny-qwen3-5", "tiny-qwen3-5-moe",
                                   "tiny-qwen3-next", "tiny-lfm2", "tiny-lfm2-moe", "tiny-granite4",
                                   "tiny-granite4-dense", "tiny-granite-moe-shared", "tiny-nemotron-h",
                                   "tiny-nemotron-h-moe"])
def test_the_bytes_a_step_reads_are_the_decoders(model):
    """q4-manifest's "a decode step reads" is the decoder's own count, byte
    for byte: of a mixture of experts top_k of each layer's experts (per
    expert tensors, stacks, gpt-oss's bias stacks; ERNIE's moe_k), never an
    MTP layer after the last (tiny-deepseek-v3's) or beside the model
    (tiny-ernie4-5-moe's, tiny-qwen3-5's), a tied head once."""
    from iekit.formats.q4_manifest import bytes_per_token, is_tied, step_reads
    from iekit.runtime.decoder import Decoder

    src = from_dir(GOLDEN_HF / model)
    shapes, cfg = tensor_shapes(src), src.config
    got = bytes_per_token(shapes, {}, is_tied(shapes, cfg), *step_reads(cfg))
    assert got == Decoder(GOLDEN_IEBIN / model).weight_bytes_per_token


@pytest.mark.parametrize("model", ["tiny-mixtral", "tiny-qwen3-moe", "tiny-qwen2-moe", "tiny-glm4-moe", "tiny-minimax-m2",
                                   "tiny-deepseek-v3", "tiny-llama4", "tiny-ernie4-5-moe", "tiny-qwen3-5-moe",
                                   "tiny-lfm2-moe", "tiny-granite4", "tiny-nemotron-h-moe", "tiny-gpt-oss"])
def test_every_router_stays_float(tmp_path, model):
    """A router's error changes which experts run, so q4-manifest keeps every layout's (and Qwen2-MoE's
    shared-expert gate) as llama.cpp keeps ffn_gate_inp: LFM2-MoE's feed_forward.gate and Nemotron-H's mixer.gate,
    which no name pattern of the generic policy matched, among them. The routers are the decoder's own (its bound
    parts), not restated here."""
    from iekit.formats.model_spec import decoder_spec, layer_parts

    res = run_tool("ieconv", "q4-manifest", "--hf-dir", GOLDEN_HF / model, "-o", tmp_path / "m.json",
                   "--scheme", "q8_0")
    assert res.returncode == 0, res.stderr
    m = iebin.load_model(GOLDEN_IEBIN / model)
    s = decoder_spec(m.meta, m.meta_path)
    routers = {p.name for i in range(s.n_layers) for p in layer_parts(s, i) if p.key in ("router", "shared_gate")}
    assert routers
    shapes = {t["name"]: (t["dtype"], t["shape"]) for t in m.meta["tensors"]}
    quantized = plan(load_manifest(tmp_path / "m.json"), shapes).quantize
    assert not routers & set(quantized), sorted(routers & set(quantized))
    assert quantized  # (the experts are)
