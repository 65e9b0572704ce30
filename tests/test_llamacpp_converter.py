"""GGUF files written by llama.cpp's own converter (``convert_hf_to_gguf.py``,
frozen in golden/gguf/llamacpp/ by golden/gguf/make_llamacpp_converted.py):
the files users download, not our restatement of how they are written.

Imported, each is the Hugging Face checkpoint it came from: every tensor
equal in value to hf-to-iebin's, and the decoder's view of the config the
same. Exported from that checkpoint, iebin-to-gguf writes the same tensors
in the same types, byte for byte, and every key-value the converter wrote
that llama.cpp reads, with the same value."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import GOLDEN_HF, run_tool
from llamacpp_models import GRANITE4_LAYERS, LLAMA4_FIXED, falcon_h1_stored

from iekit.convert.gguf_names import DECAY_RATES
from iekit.formats.delta_net import decay_rate
from iekit.formats.iebin import load_model
from iekit.formats.model_spec import decoder_spec

CONVERTED = GOLDEN_HF.parent / "gguf" / "llamacpp"
# the generator's config changes to the checkpoints (its docstring says why)
CHANGES = {"tiny-qwen2": {}, "tiny-qwen3": {}, "tiny-mixtral": {}, "tiny-gpt-oss-mxfp4": {"swiglu_limit": 7.0},
           "tiny-gemma3": {}, "tiny-gemma": {}, "tiny-arcee": {}, "tiny-stablelm": {},
           "tiny-starcoder2": {"sliding_window": None}, "tiny-nemotron": {}, "tiny-phi": {},
           "tiny-phi3": {}, "tiny-smollm3": {},
           "tiny-granite": {}, "tiny-olmo2": {}, "tiny-olmo3": {}, "tiny-ministral3": {},
           "tiny-exaone4": {}, "tiny-olmoe": {}, "tiny-qwen2-moe": {}, "tiny-glm4-moe": {},
           "tiny-minimax-m2": {"rotary_dim": 8, "scoring_func": "sigmoid"},
           "tiny-seed-oss": {}, "tiny-apertus": {}, "tiny-afmoe": {}, "tiny-dots1": {},
           "tiny-solar-open": {"partial_rotary_factor": 1.0}, "tiny-youtu": {}, "tiny-jais2": {}, "tiny-exaone-moe": {}, "tiny-mamba2": {}, "tiny-falcon-h1": {}, "tiny-mamba": {}, "tiny-falcon-mamba": {}, "tiny-olmo": {},
           "tiny-granite-swa": {"no_rope_layers": [1, 1, 0, 1]}, "tiny-granite-moe-swa": {"no_rope_layers": [1, 1, 0, 1]},
           "tiny-glm4": {}, "tiny-deepseek-v3": {}, "tiny-deepseek-v2": {},
           "tiny-glm4-moe-lite": {"scoring_func": "sigmoid"},
           "tiny-llama4": LLAMA4_FIXED, "tiny-ernie4-5": {}, "tiny-ernie4-5-moe": {},
           "tiny-cohere2": {"rotary_pct": 1.0}, "tiny-cohere": {}, "tiny-qwen3-5": {}, "tiny-qwen3-5-moe": {},
           "tiny-qwen3-next": {}, "tiny-lfm2": {}, "tiny-lfm2-moe": {},
           "tiny-granite4": {"layer_types": GRANITE4_LAYERS}, "tiny-granite4-dense": {"layer_types": GRANITE4_LAYERS},
           "tiny-granite-moe": {}, "tiny-granite-moe-shared": {},
           "tiny-nemotron-h": {"hybrid_override_pattern": "M-*-MM", "layers_block_type": None, "num_hidden_layers": 6},
           "tiny-nemotron-h-moe": {"hybrid_override_pattern": "MEM*E", "layers_block_type": None,
                                   "num_hidden_layers": 5},
           "tiny-hunyuan-dense": {"max_position_embeddings": 32768}, "tiny-hunyuan-moe": {}, "tiny-hy-v3": {}}
# Mamba 1's toys, whose A_log values are random: torch's float32 exp takes some a unit off decay_rate's (_ulps)
MAMBA1 = ("tiny-mamba", "tiny-falcon-mamba")
# what an export needs beyond the defaults: tiny-phi3's window of 6, which llama.cpp's phi3 does not apply
EXPORT_ARGS = {"tiny-phi3": ["--allow-full-attention"]}
# descriptive keys the converter derives from the directory and file (llama.cpp reads none of them to run)
DESCRIPTIVE = {"general.name", "general.basename", "general.size_label", "general.finetune", "general.type", "general.version",
               "general.quantization_version"}


def _pair(name: str, d: Path):
    """(name, hf-to-iebin of the checkpoint, gguf-to-iebin of llama.cpp's file, the checkpoint)."""
    hf = d / "hf"
    shutil.copytree(GOLDEN_HF / name, hf)
    cfg = json.loads((hf / "config.json").read_text())
    (hf / "config.json").write_text(json.dumps({**cfg, **CHANGES.get(name, {})}, indent=2))
    for args in (("hf-to-iebin", "--hf-dir", hf, "--out-dir", d / "from-hf"),
                 ("gguf-to-iebin", "--gguf", CONVERTED / f"{name}.gguf", "--out-dir", d / "from-gguf")):
        res = run_tool("ieconv", *args, "-q")
        assert res.returncode == 0, res.stderr
    return name, d / "from-hf", d / "from-gguf", hf


@pytest.fixture(scope="module", params=list(CHANGES))
def pair(request, tmp_path_factory):
    return _pair(request.param, tmp_path_factory.mktemp(request.param))


def _values(model, entry) -> np.ndarray:
    with open(model.path_of(entry), "rb") as f:
        f.seek(entry["file_data_offset"])
        raw = np.frombuffer(f.read(entry["nbytes"]), np.uint8)
    if entry["dtype"] == "bf16":
        return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    if entry["dtype"] in ("f16", "f32"):
        return raw.view(np.dtype(entry["dtype"].replace("f", "float"))).astype(np.float64)
    return raw  # a block type: its bytes


def _ulps(a: np.ndarray, b: np.ndarray) -> int:
    """The most units in the last place two float32 arrays of one sign differ by. The converter takes -exp(A_log)
    with torch's float32 exp, which is not always correctly rounded (tiny-granite4: one rate of 24 a unit off
    decay_rate's; Mamba 1's toys, MAMBA1), and no numpy function is torch's: the rates are held to a unit, not to their
    bytes."""
    return int(np.abs(np.asarray(a, np.float32).view(np.int32).astype(np.int64)
                      - np.asarray(b, np.float32).view(np.int32).astype(np.int64)).max())


def test_llamacpp_converted_file_imports_to_its_checkpoint(pair):
    """The same tensors (names, shapes, values; MXFP4 experts byte for byte)
    and the same decoder spec. gpt-oss's YaRN is the one difference, and the
    intended one: llama.cpp rounds the correction range (truncate), which
    the import records, as it records llama.cpp's swiglu constants."""
    name, from_hf, from_gguf, _ = pair
    a, b = load_model(from_hf), load_model(from_gguf)
    ta, tb = {t["name"]: t for t in a.tensors}, {t["name"]: t for t in b.tensors}
    if name == "tiny-deepseek-v3":  # the MTP layer after the last, which llama.cpp's converter drops
        assert b.meta["config"]["num_hidden_layers"] == 2 and any(n.startswith("model.layers.2.") for n in ta)
        ta = {n: t for n, t in ta.items() if not n.startswith("model.layers.2.")}
    if name == "tiny-ernie4-5-moe":  # its MTP tensors beside the model, which the converter drops too
        assert any(n.startswith("model.mtp_") for n in ta)
        ta = {n: t for n, t in ta.items() if not n.startswith("model.mtp_")}
    assert sorted(ta) == sorted(tb)
    for n, t in ta.items():
        assert t["shape"] == tb[n]["shape"], n
        assert (t["dtype"] in ("f16", "bf16", "f32")) == (tb[n]["dtype"] in ("f16", "bf16", "f32")), n
        if n.endswith(DECAY_RATES):  # llama.cpp's -exp(A_log): the import's A_log a float32 of exactly that rate
            tolerance = 1 if n.endswith("mamba.A_log") or name in MAMBA1 else 0  # (their rates: _ulps)
            assert _ulps(decay_rate(_values(a, t)), decay_rate(_values(b, tb[n]))) <= tolerance, n
            continue
        want = _values(a, t)
        if name == "tiny-falcon-h1":  # the converter's matrices carry the muP multipliers (falcon_h1_stored)
            want = falcon_h1_stored(a.meta["config"], n, want.reshape(t["shape"])).astype(np.float64).reshape(-1)
        assert np.array_equal(want, _values(b, tb[n])), n
    sa, sb = (decoder_spec(m.meta, m.meta_path) for m in (a, b))
    differ = {"inv_freq", "inv_freq_long"}
    if name == "tiny-gemma3":  # (inv_freq_swa: numpy arrays, compared below)
        differ |= {"windows", "inv_freq_swa"}
        # the converter writes no sliding_window_pattern, so llama.cpp runs its default (every 6th layer full):
        # both of the toy's layers slide, as the import records; iebin-to-gguf writes the pattern (below)
        assert (sa.windows, sb.windows) == ((4, 0), (4, 4))
        assert np.array_equal(sa.inv_freq_swa, sb.inv_freq_swa)
    if name == "tiny-olmo3":  # the sliding layers' own table (numpy arrays)
        differ |= {"inv_freq_swa"}
        assert np.array_equal(sa.inv_freq_swa, sb.inv_freq_swa) and sa.windows == sb.windows == (4, 4, 4, 0)
    if name == "tiny-phi3":  # the window, which llama.cpp's phi3 graph does not apply
        differ |= {"windows", "eos_ids"}
        assert set(sa.windows) == {6} and set(sb.windows) == {0}
        assert sb.eos_ids == sa.eos_ids | {319}  # its <|endoftext|>, at which llama.cpp stops too
        assert np.array_equal(sa.inv_freq_long, sb.inv_freq_long) and sa.inv_freq_long.shape == (4,)
        assert sa.rope_original_ctx == 32 and sa.rope_scale > 1.18
    if name == "tiny-glm4":  # its <|endoftext|> and <|user|>, at which llama.cpp stops too
        differ |= {"eos_ids"}
        assert sb.eos_ids == sa.eos_ids | {318, 319}
    if name in ("tiny-glm4-moe", "tiny-glm4-moe-lite"):  # GLM-4.5's <|endoftext|>, <|user|> and <|observation|> likewise
        differ |= {"eos_ids"}
        assert sb.eos_ids == sa.eos_ids | {317, 318, 319}
    if name == "tiny-solar-open":  # its <|endoftext|>, the converter's end of turn, at which llama.cpp stops too
        differ |= {"eos_ids"}
        assert sb.eos_ids == sa.eos_ids | {319}
    if name.startswith(("tiny-granite4", "tiny-nemotron-h")):  # no RoPE: the converter writes 2^20 positions, its arbitrary value
        differ |= {"max_positions"}
        assert (sa.max_positions, sb.max_positions) == (128, 2 ** 20)
    if name == "tiny-hunyuan-dense":  # NTK-alpha RoPE: the converter writes 256k positions whatever the config says
        differ |= {"max_positions"}
        assert (sa.max_positions, sb.max_positions) == (32768, 256 * 1024)
    if name == "tiny-falcon-h1":  # the multipliers, in the matrices of llama.cpp's file: 1 each in its import
        mults = {"embed_scale", "logits_scaling", "q_mult", "k_mult", "v_mult", "o_mult", "ssm_out_mult", "gate_mult",
                 "down_mult", "ssm_in_mults"}
        differ |= mults
        assert all(getattr(sb, f) in (1.0, (1.0,) * 5) for f in mults)
        assert all(getattr(sa, f) not in (1.0, (1.0,) * 5) for f in mults)
    if name == "tiny-deepseek-v3":
        differ |= {"mtp_layers"}
        assert (sa.mtp_layers, sb.mtp_layers) == (1, 0)
    fields = [f.name for f in dataclasses.fields(sa) if f.name not in differ]
    assert {f: getattr(sa, f) for f in fields} == {f: getattr(sb, f) for f in fields}
    if name.startswith("tiny-gpt-oss"):
        assert b.meta["config"]["rope_scaling"]["truncate"] is True
        assert not np.array_equal(sa.inv_freq, sb.inv_freq)
    else:
        assert np.array_equal(sa.inv_freq, sb.inv_freq)


def test_export_writes_what_llamacpps_converter_writes(pair, tmp_path):
    """iebin-to-gguf of the checkpoint: every tensor in llama.cpp's type
    (vectors, biases, sinks and routers widened to F32, as its converter
    does) with the same bytes; every key-value llama.cpp's file has, with
    its value (ours adds only keys llama.cpp reads with the values it would
    otherwise derive, and where it came from)."""
    import gguf

    name, from_hf, _, _ = pair
    out = tmp_path / "ours.gguf"
    res = run_tool("ieconv", "iebin-to-gguf", "--model-dir", from_hf, "--out", out, "-q", *EXPORT_ARGS.get(name, []))
    assert res.returncode == 0, res.stderr
    theirs, ours = (gguf.GGUFReader(str(p)) for p in (CONVERTED / f"{name}.gguf", out))
    tt, to = {t.name: t for t in theirs.tensors}, {t.name: t for t in ours.tensors}
    assert sorted(tt) == sorted(to)
    for n, t in tt.items():
        assert (t.tensor_type, list(t.shape)) == (to[n].tensor_type, list(to[n].shape)), n
        if n.endswith((".ssm_a",)) and (name.startswith("tiny-granite4") or name in MAMBA1):  # (torch's exp: _ulps)
            assert _ulps(t.data, to[n].data) <= 1, n
            continue
        assert t.data.tobytes() == to[n].data.tobytes(), n
    kv_theirs = {k: f.contents() for k, f in theirs.fields.items() if not k.startswith("GGUF.") and k not in DESCRIPTIVE}
    kv_ours = {k: f.contents() for k, f in ours.fields.items() if not k.startswith("GGUF.") and k not in DESCRIPTIVE}
    if name == "tiny-gpt-oss-mxfp4":  # file type names the bulk of the bytes: the toy's are its BF16 embeddings
        assert kv_theirs.pop("general.file_type") == 38 and kv_ours.pop("general.file_type") == 32
    assert {k: kv_ours.get(k) for k in kv_theirs} == kv_theirs
    if name == "tiny-gemma3":  # the layer types the converter drops
        assert kv_ours["gemma3.attention.sliding_window_pattern"] == [True, False]
    extra = set(kv_ours) - set(kv_theirs)
    if name in ("tiny-llama4", "tiny-apertus"):  # Llama 3 scaling's original context, which pins what an import
        extra.remove(f"{kv_ours['general.architecture']}.rope.scaling.original_context_length")  # reads back
        # (llama.cpp reads it for YaRN alone)
    if name in ("tiny-gemma", "tiny-stablelm", "tiny-phi"):  # the base, which GemmaModel's, StableLMModel's and
        a = kv_ours["general.architecture"]  # Phi2Model's converters leave to llama.cpp's default (the toys': 10000)
        extra.remove(f"{a}.rope.freq_base")
        assert kv_ours[f"{a}.rope.freq_base"] == 10000.0
    assert all(k.startswith("iekit.") or k.endswith((
        ".attention.key_length", ".attention.value_length", ".rope.dimension_count", ".vocab_size",
        ".attention.sliding_window_pattern", "ggml.add_bos_token", "ggml.add_eos_token")) for k in extra), extra


# (tiny-gemma3's and tiny-phi3's files are other models: the converter drops gemma3's layer types and phi3's
# window, as test_llamacpp_converted_file_imports_to_its_checkpoint says)
@pytest.mark.parametrize("name", [n for n, change in CHANGES.items() if not change and n not in ("tiny-gemma3",
                                                                                             "tiny-phi3")])
def test_the_converters_file_generates_transformers_greedy_ids(name):
    """ierun runs llama.cpp's own file as users download it (no import first): the ids transformers generates
    greedily from the checkpoint it was converted from."""
    want = json.loads((GOLDEN_HF.parent / "ref" / name / "greedy.json").read_text())
    res = run_tool("ierun", "generate", "--model-dir", CONVERTED / f"{name}.gguf", "--ids",
                   ",".join(map(str, want["prompt_ids"])), "--max-new", str(want["max_new_tokens"]), "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["generated_ids"] == want["generated_ids"]


@pytest.mark.parametrize("name", ["tiny-mixtral", "tiny-qwen2", "tiny-qwen3-5-moe", "tiny-glm4-vl"])
def test_the_converters_fused_layouts_import_as_its_default_one(tmp_path, name):
    """The converter's --fuse-qkv (q, k, v rows, and biases, in one attn_qkv: tiny-mixtral's q/k rows interleaved
    as llama.cpp's llama turns them, tiny-qwen2's biased, tiny-qwen3-5-moe's gated q beside DeltaNet layers whose
    own attn_qkv stays theirs, tiny-glm4-vl's q/k rows in NeoX's order) and --fuse-gate-up-exps (each expert's gate rows, then its up rows, in one
    ffn_gate_up_exps: tiny-qwen3-5-moe's), files llama.cpp reads as it reads the default layout: imported, the
    same artifact, byte for byte."""
    import gguf

    fused = CONVERTED / f"{name}-fused.gguf"
    names = {t.name.split(".", 2)[-1] for t in gguf.GGUFReader(fused).tensors}
    assert {"attn_qkv.weight", *(["attn_qkv.bias"] if name == "tiny-qwen2" else []),
            *(["ffn_gate_up_exps.weight"] if name.endswith("moe") else [])} <= names
    assert "attn_q.weight" not in names
    for src, out in ((CONVERTED / f"{name}.gguf", tmp_path / "default"), (fused, tmp_path / "fused")):
        res = run_tool("ieconv", "gguf-to-iebin", "-q", "--gguf", src, "--out-dir", out)
        assert res.returncode == 0, res.stderr
    a, b = load_model(tmp_path / "default"), load_model(tmp_path / "fused")
    assert [(t["name"], t["dtype"], t["shape"]) for t in a.tensors] == [(t["name"], t["dtype"], t["shape"])
                                                                         for t in b.tensors]
    assert (tmp_path / "default" / "model.ie.bin").read_bytes() == (tmp_path / "fused" / "model.ie.bin").read_bytes()


@pytest.mark.parametrize("name,tensor,shape,named", [
    ("tiny-qwen2", "blk.0.attn_qkv.weight", [60, 64], "cannot hold q, k and v"),
    ("tiny-qwen3-5-moe", "blk.0.ffn_gate_up_exps.weight", [4, 63, 64], "2 × rows"),
])
def test_a_fused_tensor_of_the_wrong_shape_is_one_line(tmp_path, name, tensor, shape, named):
    from gguf_build import rewrite_gguf

    bad = rewrite_gguf(CONVERTED / f"{name}-fused.gguf", tmp_path / "bad.gguf",
                       tensors={tensor: np.zeros(shape, np.float32)})
    res = run_tool("ieconv", "gguf-to-iebin", "--gguf", bad, "--out-dir", tmp_path / "m")
    assert res.returncode == 1 and tensor in res.stderr and named in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and not (tmp_path / "m").exists()
