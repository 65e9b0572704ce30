"""Mixtures of experts (gpt-oss, Mixtral, Qwen3-MoE): conversion of expert
stacks, routing, and the decoder's contract that a token reads only the
experts it is routed to. Parity with transformers' logits and greedy ids for
every tiny MoE model is in tests/test_decoder.py (MODELS)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from conftest import GOLDEN_HF, GOLDEN_IEBIN, assert_one_line_error, edited_artifact, max_rel, reconfigure, run_tool
from iekit.formats import iebin
from iekit.formats.casting import decode_f32
from iekit.formats.errors import IEError
from iekit.formats.safetensors_reader import SafetensorsFile
from iekit.runtime import native
from iekit.runtime.decoder import Decoder




def _tensor(model_dir, name: str) -> tuple[dict, bytes]:
    m = iebin.load_model(model_dir)
    t = next(t for t in m.tensors if t["name"] == name)
    return t, m.path_of(t).read_bytes()[t["file_data_offset"]:t["file_data_offset"] + t["nbytes"]]


def test_gpt_oss_float_stacks_are_stored_out_by_in():
    """GptOssExperts' bf16 parameters are [experts, in, out] (x @ W); IEBIN
    holds every stack [experts, out, in]: the converter transposes them."""
    with SafetensorsFile(GOLDEN_HF / "tiny-gpt-oss" / "model.safetensors") as sf:
        for name in ("model.layers.0.mlp.experts.gate_up_proj", "model.layers.1.mlp.experts.down_proj"):
            src = sf.tensors[name]
            hf = decode_f32(b"".join(sf.iter_chunks(src)), "bf16").reshape(src.shape)
            t, raw = _tensor(GOLDEN_IEBIN / "tiny-gpt-oss", name)
            assert t["shape"] == [src.shape[0], src.shape[2], src.shape[1]]
            assert np.array_equal(decode_f32(raw, "bf16").reshape(t["shape"]), hf.transpose(0, 2, 1))


def test_quantizing_bf16_experts_reproduces_the_published_mxfp4_layout(tmp_path):
    """`ieconv q4-manifest --scheme mxfp4` on tiny-gpt-oss quantizes its expert
    stacks (routers stay: they are sensitive) to exactly the bytes that the
    golden generator's own MXFP4 quantizer, written in HF's published
    blocks/scales layout and repacked by hf-to-iebin, gives."""
    man, out = tmp_path / "q.json", tmp_path / "m"
    assert run_tool("ieconv", "q4-manifest", "--hf-dir", GOLDEN_HF / "tiny-gpt-oss", "-o", man,
                    "--scheme", "mxfp4").returncode == 0
    assert not any("router" in r["match"] for r in json.loads(man.read_text())["rules"])
    res = run_tool("ieconv", "hf-to-iebin", "-q", "--hf-dir", GOLDEN_HF / "tiny-gpt-oss", "--out-dir", out, "--q4-map", man)
    assert res.returncode == 0, res.stderr
    for layer in (0, 1):
        for proj in ("gate_up_proj", "down_proj"):
            name = f"model.layers.{layer}.mlp.experts.{proj}"
            ours, published = _tensor(out, name), _tensor(GOLDEN_IEBIN / "tiny-gpt-oss-mxfp4", name)
            assert ours[0]["dtype"] == published[0]["dtype"] == "mxfp4" and ours[0]["shape"] == published[0]["shape"]
            assert ours[1] == published[1], name


@pytest.mark.parametrize("model,act", [("tiny-mixtral", "f32"), ("tiny-qwen3-moe", "f32"),
                                       ("tiny-gpt-oss-mxfp4", "f32"), ("tiny-gpt-oss-mxfp4", "int8")])
def test_batched_routing_equals_token_by_token(model, act):
    """A prefill chunk gathers every expert's routed rows into one product
    (f32: a GEMV, or past 8 rows a GEMM; int8: packed rows8 tiles past 7
    rows); one token at a time runs top_k GEMVs. Same sums to rounding."""
    ids = [int(i) for i in np.random.default_rng(5).integers(0, 320, 40)]
    d = Decoder(GOLDEN_IEBIN / model, threads=2, act=act)
    whole = d.logits(ids)
    d.reset()
    steps = np.stack([d.prefill(ids[:1])] + [d.step(t) for t in ids[1:]])
    assert max_rel(steps, whole) <= 1e-5


@pytest.fixture(scope="module")
def quantized_moe(tmp_path_factory) -> dict:
    """tiny-mixtral and tiny-qwen3-moe with every matrix 4-bit (the usual
    q4-manifest policy), so that act=int8 reads their experts."""
    out = {}
    for model in ("tiny-mixtral", "tiny-qwen3-moe"):
        d = tmp_path_factory.mktemp(model)
        res = run_tool("ieconv", "q4-manifest", "--hf-dir", GOLDEN_HF / model, "-o", d / "q.json")
        assert res.returncode == 0, res.stderr
        res = run_tool("ieconv", "hf-to-iebin", "-q", "--hf-dir", GOLDEN_HF / model, "--out-dir", d / "m",
                       "--q4-map", d / "q.json")
        assert res.returncode == 0, res.stderr
        out[model] = d / "m"
    return out


@pytest.mark.parametrize("model", ["tiny-mixtral", "tiny-qwen3-moe", "tiny-gpt-oss-mxfp4"])
@pytest.mark.parametrize("n", [7, 40, 120])
def test_int8_prefill_packs_expert_tiles_and_agrees_with_steps(quantized_moe, model, n):
    """An int8 prefill chunk of a model with experts (512 tokens) multiplies
    an expert that gets 8 or more of its tokens by the rows8 kernels over
    tiles packed as they run (gemv_packing), one with fewer by the stored
    layout, as a decode step does. Each token's activation is quantized
    alike either way and the integer sums are exact, so the two orders of
    float operations agree to float rounding: 7 tokens (no expert packs), 40
    (most do), 120. (A router near a tie can flip an expert on such a
    difference: with these prompts none is.)"""
    ids = [int(i) for i in np.random.default_rng(n + 1).integers(0, 320, n)]
    d = Decoder(quantized_moe.get(model, GOLDEN_IEBIN / model), threads=2, act="int8")
    whole = d.logits(ids)
    d.reset()
    steps = np.stack([d.prefill(ids[:1])] + [d.step(t) for t in ids[1:]])
    assert max_rel(steps, whole) <= 1e-5


@pytest.mark.parametrize("isa", ["avx2", "scalar"])
@pytest.mark.parametrize("model", ["tiny-mixtral", "tiny-qwen3-moe", "tiny-gpt-oss-mxfp4"])
def test_copied_experts_compute_what_in_place_ones_do(quantized_moe, model, isa):
    """experts="copy" gives every expert a rows8 copy at load (the tile
    kernels, a fused SwiGLU pass where the expert has no gate bias), where
    in place a decode step reads the stored layout and a chunk packs tiles
    past 7 routed rows: the same integer sums, so the logits agree to float
    rounding, a 40-token prefill and then single steps. An ISA without the
    rows8 kernels (scalar) copies nothing."""
    if isa not in native.cpu_features()["isas"]:
        pytest.skip(f"no {isa} here")
    path = quantized_moe.get(model, GOLDEN_IEBIN / model)
    ids = [int(i) for i in np.random.default_rng(11).integers(0, 320, 48)]
    out = {}
    for mode in ("in-place", "copy"):
        d = Decoder(path, threads=2, act="int8", isa=isa, experts=mode)
        assert d.copied_experts == (mode == "copy" and isa != "scalar")  # as the native decoder reports it
        out[mode] = (d.rows8_bytes, np.concatenate([d.logits(ids[:40]), np.stack([d.step(t) for t in ids[40:]])]))
    assert (out["copy"][0] > out["in-place"][0]) == (isa != "scalar")
    assert max_rel(out["copy"][1], out["in-place"][1].astype(np.float64)) <= 1e-5


def test_experts_copied_where_memory_allows(monkeypatch):
    """experts="auto" copies when the copies take at most two thirds of the
    memory available (and never for act=f32, which has no kernel to read
    them, nor on CUDA); "copy" copies unless the copies exceed the memory
    available (one clear error, not an out-of-memory kill); an unknown mode
    is one clear error. The copies' size is rows8's: the stored one for
    q4_0, about twice it for iq2_xxs (4.25 bits a weight for 2.06) and
    iq2_xs (4.56 for 2.31)."""
    from iekit.runtime import expert_copies
    from iekit.runtime.native import _native

    q4 = _native.WeightSpec("q4_0", 8, 512)
    assert q4.rows8_nbytes == q4.nbytes == 2304
    weights = {"layers": [{"experts": [{"gate": (q4, np.zeros(q4.nbytes, np.uint8)), "bgate": np.zeros(4, np.float32)}]},
                          {}]}
    for avail, want in ((3456, True), (3455, False), (None, False)):
        monkeypatch.setattr(expert_copies, "available_bytes", lambda a=avail: a)
        assert expert_copies.copy_experts("auto", weights, "int8", "cpu") is want, avail
    iq2 = _native.WeightSpec("iq2_xxs", 8, 512)
    assert (iq2.nbytes, iq2.rows8_nbytes) == (1056, 2176)
    # iq2_xs's and iq2_s's: q6_k's header (16 int8 sub-scales and d per row and super-block) beside the nibbles
    assert [(s.nbytes, s.rows8_nbytes) for s in (_native.WeightSpec(t, 8, 512) for t in ("iq2_xs", "iq2_s"))] == \
        [(1184, 2336), (1312, 2336)]
    # iq1_s's and iq1_m's the same, 2.9x and 2.6x their stored bytes
    assert [(s.nbytes, s.rows8_nbytes) for s in (_native.WeightSpec(t, 8, 512) for t in ("iq1_s", "iq1_m"))] == \
        [(800, 2336), (896, 2336)]
    small = {"layers": [{"experts": [{"gate": (iq2, np.zeros(iq2.nbytes, np.uint8))}]}]}
    for avail, want in ((3264, True), (3263, False)):  # 2176 x 3 / 2, not 1056's 1584
        monkeypatch.setattr(expert_copies, "available_bytes", lambda a=avail: a)
        assert expert_copies.copy_experts("auto", small, "int8", "cpu") is want, avail
    monkeypatch.setattr(expert_copies, "available_bytes", lambda: 2304)
    assert expert_copies.copy_experts("copy", weights, "int8", "cpu") is True
    monkeypatch.setattr(expert_copies, "available_bytes", lambda: 2303)
    with pytest.raises(IEError, match="experts copy: the experts' copies take 0.0 GiB, more than the 0.0 GiB of "
                                      "memory available"):
        expert_copies.copy_experts("copy", weights, "int8", "cpu")
    assert not expert_copies.copy_experts("in-place", weights, "int8", "cpu")
    assert not expert_copies.copy_experts("copy", weights, "f32", "cpu")
    assert not expert_copies.copy_experts("copy", weights, "int8", "cuda")
    assert not expert_copies.copy_experts("copy", {"layers": [{}]}, "int8", "cpu")  # a dense model: nothing to copy
    with pytest.raises(IEError, match="experts: 'all' is not one of auto, copy, in-place"):
        expert_copies.copy_experts("all", weights, "int8", "cpu")


def test_experts_flag_chooses_copies_from_the_commands(quantized_moe, tmp_path):
    """--experts reaches the decoder from the commands a user runs: logits
    computed from copies and in place agree to float rounding, bench's JSON
    says which ran, and a mode that does not exist is a usage error."""
    if "avx2" not in native.cpu_features()["isas"]:
        pytest.skip("no rows8 kernels here: nothing is copied")
    model = quantized_moe["tiny-qwen3-moe"]
    out = {}
    for mode in ("copy", "in-place"):
        out[mode] = tmp_path / f"{mode}.npy"
        res = run_tool("ierun", "logits", "--model-dir", model, "--ids", "5,17,200,3,99", "--act", "int8",
                       "--experts", mode, "--out", out[mode])
        assert res.returncode == 0, res.stderr
    assert max_rel(np.load(out["copy"]), np.load(out["in-place"]).astype(np.float64)) <= 1e-5
    prompts = tmp_path / "p.txt"
    prompts.write_text("ids: 1,2,3\n")
    for mode, want in (("copy", True), ("in-place", False)):
        res = run_tool("ierun", "bench", "--model-dir", model, "--prompts-file", prompts, "--max-new", "2",
                       "--rounds", "1", "--warmup", "0", "--bandwidth-mb", "1", "--act", "int8", "--experts", mode)
        assert res.returncode == 0, res.stderr
        assert [json.loads(ln)["experts_copied"] for ln in res.stdout.splitlines()] == [want]
    res = run_tool("ierun", "generate", "--model-dir", model, "--ids", "1", "--experts", "all")
    assert res.returncode == 2 and "'all' is not one of" in res.stderr


def _router_top2(model_dir, token: int) -> list[int]:
    """Layer 0's two experts for ``token`` at position 0, in float64."""
    m = iebin.load_model(model_dir)

    def get(name):
        t, raw = _tensor(model_dir, name)
        return decode_f32(raw, t["dtype"]).reshape(t["shape"]).astype(np.float64)

    x = get("model.embed_tokens.weight")[token]
    # Position 0 attends to itself only: the attention output is o_proj of its own v.
    hd = m.meta["model"]["head_dim"]
    eps = m.meta["model"]["norm_eps"]
    xn = get("model.layers.0.input_layernorm.weight") * x / np.sqrt((x * x).mean() + eps)
    v = get("model.layers.0.self_attn.v_proj.weight") @ xn
    heads = m.meta["model"]["num_attention_heads"]
    group = heads // m.meta["model"]["num_key_value_heads"]
    att = np.concatenate([v[(h // group) * hd:(h // group + 1) * hd] for h in range(heads)])
    x = x + get("model.layers.0.self_attn.o_proj.weight") @ att
    xn = get("model.layers.0.post_attention_layernorm.weight") * x / np.sqrt((x * x).mean() + eps)
    logits = get("model.layers.0.block_sparse_moe.gate.weight") @ xn
    return sorted(np.argsort(-logits)[:2].tolist())


def test_a_token_reads_only_its_experts(tmp_path):
    """tiny-mixtral with layer 0's two unrouted experts overwritten by NaN
    gives the same logits for a one-token prompt (their bytes are never
    multiplied); NaN in a routed expert reaches the logits (the poison is
    real)."""
    token = 77
    used = _router_top2(GOLDEN_IEBIN / "tiny-mixtral", token)
    clean = Decoder(GOLDEN_IEBIN / "tiny-mixtral").prefill([token])

    def poisoned(experts: list[int]):
        d = tmp_path / f"p{len(list(tmp_path.iterdir()))}"
        shutil.copytree(GOLDEN_IEBIN / "tiny-mixtral", d)
        m = iebin.load_model(d)
        with open(d / iebin.BIN_NAME, "r+b") as f:
            for e in experts:
                for w in ("w1", "w2", "w3"):
                    t = next(t for t in m.tensors if t["name"] == f"model.layers.0.block_sparse_moe.experts.{e}.{w}.weight")
                    f.seek(t["file_data_offset"])
                    f.write(b"\xc0\x7f" * (t["nbytes"] // 2))  # bf16 NaN
        return Decoder(d)  # IE_VERIFY is not set: the bytes are not hashed at load

    unused = [e for e in range(4) if e not in used]
    assert np.array_equal(poisoned(unused).prefill([token]), clean)
    with pytest.raises(IEError, match="non-finite"):
        poisoned(used[:1]).prefill([token])


def test_bytes_and_params_per_token_count_active_experts():
    """weight_bytes_per_token: everything but the embedding (one row) and
    the unrouted experts; tiny-mixtral routes 2 of 4, so half its expert
    bytes are read per token."""
    m = iebin.load_model(GOLDEN_IEBIN / "tiny-mixtral")
    d = Decoder(GOLDEN_IEBIN / "tiny-mixtral")
    experts = sum(t["nbytes"] for t in m.tensors if ".experts." in t["name"])
    embed = next(t for t in m.tensors if t["name"] == "model.embed_tokens.weight")
    total = sum(t["nbytes"] for t in m.tensors)
    assert d.weight_bytes_per_token == total - embed["nbytes"] + embed["nbytes"] // 320 - experts // 2
    n_expert_params = sum(int(np.prod(t["shape"])) for t in m.tensors if ".experts." in t["name"])
    n_params = sum(int(np.prod(t["shape"])) for t in m.tensors)
    assert d.active_params_per_token == n_params - 320 * 64 - n_expert_params // 2


def _edited(tmp_path, model: str, edit) -> object:
    return edited_artifact(GOLDEN_IEBIN / model, tmp_path / "m", edit)


@pytest.mark.parametrize("model,key,value,needles", [
    ("tiny-mixtral", "num_experts_per_tok", 5, ("config.num_experts_per_tok", "more than the 4 experts")),
    ("tiny-mixtral", "num_experts_per_tok", 0, ("config.num_experts_per_tok", "positive integer")),
    ("tiny-mixtral", "num_local_experts", None, ("config.num_local_experts", "positive integer")),
    ("tiny-gpt-oss", "swiglu_limit", 0, ("config.swiglu_limit", "positive number")),
    ("tiny-gpt-oss", "swiglu_limit", -7.0, ("config.swiglu_limit", "positive number")),
    ("tiny-gpt-oss", "swiglu_alpha", "x", ("config.swiglu_alpha", "number")),
    ("tiny-gpt-oss", "layer_types", ["full_attention"], ("config.layer_types", "expected 2 values", "got 1 entries")),
    ("tiny-gpt-oss", "layer_types", ["full_attention", "chunked_attention"], ("config.layer_types", "chunked_attention")),
    ("tiny-gpt-oss", "sliding_window", 0, ("config.sliding_window", "positive integer")),
    ("tiny-qwen3-moe", "mlp_only_layers", "1", ("config.mlp_only_layers", "list of layer indices")),
    ("tiny-qwen3-moe", "norm_topk_prob", "yes", ("config.norm_topk_prob", "true or false")),
    ("tiny-qwen3", "use_sliding_window", True, ("config.use_sliding_window", "not supported")),
])
def test_error_moe_configs_the_decoder_cannot_run(tmp_path, model, key, value, needles):
    d = _edited(tmp_path, model, lambda m: m["config"].update({key: value}))
    assert_one_line_error(run_tool("ierun", "generate", "--model-dir", d, "--ids", "1"), "model.ie.json", *needles)


def test_error_missing_expert_and_wrong_rope(tmp_path):
    def drop(m):
        m["tensors"] = [t for t in m["tensors"] if t["name"] != "model.layers.1.block_sparse_moe.experts.3.w2.weight"]
    d = _edited(tmp_path, "tiny-mixtral", drop)
    assert_one_line_error(run_tool("ierun", "generate", "--model-dir", d, "--ids", "1"),
                          "experts.3.w2.weight", "missing")
    shutil.rmtree(d)
    d = _edited(tmp_path, "tiny-gpt-oss", lambda m: (m["config"]["rope_parameters"].update(factor=-1), reconfigure(m)))
    assert_one_line_error(run_tool("ierun", "generate", "--model-dir", d, "--ids", "1"),
                          "rope_scaling.factor", "positive number")


@pytest.mark.parametrize("args,stack_scheme", [((), "q4_0"), (("--affine",), "q4_1"), (("--scheme", "q4_k"), "q4_1")])
def test_int4w_policies_give_expert_stacks_a_block_scheme(tmp_path, args, stack_scheme):
    """int4w cannot stack (its planes span one matrix): the usual policy
    gives expert stacks the 4-bit block scheme with its grid, and says so;
    the stored stacks are byte for byte gguf's quantizer on the stack's
    [experts, out, in] values, and the model decodes."""
    import gguf

    man, out = tmp_path / "q.json", tmp_path / "m"
    res = run_tool("ieconv", "q4-manifest", "--hf-dir", GOLDEN_HF / "tiny-gpt-oss", "-o", man, *args)
    assert res.returncode == 0, res.stderr
    assert "4 expert stacks" in res.stdout and f"cannot store: {stack_scheme}" in res.stdout
    res = run_tool("ieconv", "hf-to-iebin", "-q", "--hf-dir", GOLDEN_HF / "tiny-gpt-oss", "--out-dir", out, "--q4-map", man)
    assert res.returncode == 0, res.stderr
    for name in ("model.layers.0.mlp.experts.gate_up_proj", "model.layers.1.mlp.experts.down_proj"):
        t, raw = _tensor(out, name)
        ref_t, ref_raw = _tensor(GOLDEN_IEBIN / "tiny-gpt-oss", name)
        assert (t["dtype"], t["shape"]) == (stack_scheme, ref_t["shape"])
        w = decode_f32(ref_raw, "bf16").reshape(-1, ref_t["shape"][-1])
        assert raw == gguf.quants.quantize(w, gguf.GGMLQuantizationType[stack_scheme.upper()]).tobytes()
    assert np.isfinite(Decoder(out, threads=1, act="f32").logits([3, 17, 250])).all()
    # Rounding bounds against the checkpoint's [experts, in, out] parameters, read as written.
    res = run_tool("ierun", "verify", "quant", "--json", "--model-dir", out, "--hf-dir", GOLDEN_HF / "tiny-gpt-oss")
    assert res.returncode == 0, res.stdout + res.stderr
    assert all(r["checks"]["bound"] for r in json.loads(res.stdout)["results"])


@pytest.mark.parametrize("model,key,value,needles", [
    ("tiny-mixtral", "num_experts_per_tok", 5, ("config.num_experts_per_tok", "more than the 4 experts")),
    ("tiny-gpt-oss", "swiglu_limit", 0, ("config.swiglu_limit", "positive number")),
    ("tiny-gpt-oss", "layer_types", ["full_attention"], ("config.layer_types", "expected 2 values", "got 1 entries")),
    ("tiny-qwen3-moe", "num_experts", 0, ("config.num_experts", "positive integer")),
])
def test_converter_refuses_an_invalid_moe_config(tmp_path, model, key, value, needles):
    """Bad input of the issue: one line naming the source config.json and
    the key, before anything is written."""
    src, out = tmp_path / "hf", tmp_path / "out"
    shutil.copytree(GOLDEN_HF / model, src)
    cfg = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**cfg, key: value}))
    res = run_tool("ieconv", "hf-to-iebin", "-q", "--hf-dir", src, "--out-dir", out)
    assert_one_line_error(res, f"{src / 'config.json'}:", *needles)
    assert not out.exists()


def test_converter_writes_a_valid_model_the_decoder_cannot_run_with_a_warning(tmp_path):
    """Qwen's use_sliding_window is valid transformers, not implemented here:
    the artifact is written (another runtime may run it), with a warning
    saying ierun will refuse it, and ierun does."""
    src, out = tmp_path / "hf", tmp_path / "out"
    shutil.copytree(GOLDEN_HF / "tiny-qwen3", src)
    cfg = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**cfg, "use_sliding_window": True}))
    res = run_tool("ieconv", "hf-to-iebin", "-q", "--hf-dir", src, "--out-dir", out)
    assert res.returncode == 0, res.stderr
    assert "warning: ierun cannot run this model" in res.stderr and "use_sliding_window" in res.stderr
    assert_one_line_error(run_tool("ierun", "generate", "--model-dir", out, "--ids", "1"), "config.use_sliding_window")
