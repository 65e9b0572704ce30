"""Mistral 4 (Mistral Small 4: Mistral4ForCausalLM inside a
Mistral3ForConditionalGeneration; llama.cpp's mistral4): DeepSeek-V3's latent
attention under YaRN and Llama 4's attention temperature, a softmax router
whose top k are renormalised and scaled, shared experts, and the routed ones
stored as two stacks. The frozen transformers logits are
tests/test_decoder.py's; here, the published layout, llama.cpp's own file
(which carries no temperature), the export both ways, and what is refused."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import (GOLDEN, GOLDEN_HF, GOLDEN_IEBIN, GOLDEN_REF, assert_one_line_error, edited_artifact, exact_logits,
                      max_rel, reconfigure, run_tool)
from gguf_build import rewrite_gguf

MISTRAL4 = GOLDEN_IEBIN / "tiny-mistral4"
CONVERTED = GOLDEN / "gguf" / "llamacpp" / "tiny-mistral4-vl.gguf"
IDS = json.loads((GOLDEN_REF / "tiny-mistral4" / "ids.json").read_text())
REF = np.load(GOLDEN_REF / "tiny-mistral4" / "logits.npy").astype(np.float64)
# transformers' logits of the same weights without the temperature: what llama.cpp runs the converter's file as
COOL = np.load(GOLDEN_REF / "tiny-mistral4" / "logits_no_temperature.npy").astype(np.float64)
ROPE = json.loads((MISTRAL4 / "config.json").read_text())["rope_parameters"]




def _tensors(model) -> dict[str, bytes]:
    """Every tensor's stored bytes by name."""
    meta = json.loads((model / "model.ie.json").read_text())
    raw = (model / "model.ie.bin").read_bytes()
    return {t["name"]: raw[t["file_data_offset"]:t["file_data_offset"] + t["nbytes"]] for t in meta["tensors"]}


def _run(*args) -> None:
    res = run_tool("ieconv", *args, "-q")
    assert res.returncode == 0, res.stderr


def test_the_published_layout_is_the_text_model(tmp_path):
    """text-model of the Mistral3ForConditionalGeneration (Pixtral tower and
    projector beside it) gives tiny-mistral4's artifact byte for byte; its
    text_config's defaults are transformers' own Mistral4Config's."""
    from iekit.convert.text_model import MISTRAL4_ROPE_DEFAULTS, MISTRAL4_TEXT_DEFAULTS

    theirs = json.loads((GOLDEN_REF / "mistral4-text-defaults.json").read_text())
    assert {k: theirs[k] for k in MISTRAL4_TEXT_DEFAULTS} == MISTRAL4_TEXT_DEFAULTS
    # (transformers derives partial_rotary_factor from the q/k dims, and names the type twice)
    rp = {k: v for k, v in theirs["rope_parameters"].items()
          if k not in ("type", "max_position_embeddings", "partial_rotary_factor")}
    assert MISTRAL4_ROPE_DEFAULTS == {"rope_parameters": rp}
    _run("text-model", "--hf-dir", GOLDEN_HF / "tiny-mistral4-vl", "--out-dir", tmp_path / "t")
    _run("hf-to-iebin", "--hf-dir", tmp_path / "t", "--out-dir", tmp_path / "ie")
    assert (tmp_path / "ie/model.ie.bin").read_bytes() == (MISTRAL4 / "model.ie.bin").read_bytes()
    cfg = json.loads((tmp_path / "t/config.json").read_text())
    assert cfg["architectures"] == ["Mistral4ForCausalLM"] and not any("vision" in k for k in cfg)


def test_the_temperature_and_the_stacks_act(tmp_path):
    """The toy's original context is 4 positions: without the temperature the
    first four positions' logits are the same bits, every later one differs
    (and are transformers' without it). The experts' stacks are read as
    gate's rows then up's: swapping the halves changes the model."""
    d = edited_artifact(MISTRAL4, tmp_path / "m", lambda m: reconfigure(m, rope_parameters={
        **ROPE, "llama_4_scaling_beta": 0.0}))
    off = exact_logits(d, IDS, tmp_path / "off.npy")
    ref = exact_logits(MISTRAL4, IDS, tmp_path / "ref.npy")
    assert np.array_equal(off[:4], ref[:4])
    assert all(np.abs(off[p] - ref[p]).max() > 1e-3 * np.abs(ref).max() for p in range(4, len(IDS)))
    assert max_rel(off, COOL) < 1e-4 and max_rel(ref, REF) < 1e-4


def test_llamacpps_own_file_is_the_checkpoint_without_its_temperature(tmp_path):
    """The converter writes the experts' stacks whole (ffn_gate_up_exps) and no
    attention temperature, so llama.cpp runs that file without one: the
    import holds every tensor of the checkpoint in value (the stacks as
    transformers keeps them) and records beta 0, and its logits are
    transformers' without the temperature. ierun runs the file itself too."""
    import gguf

    kv = gguf.GGUFReader(str(CONVERTED)).fields
    assert "mistral4.attention.temperature_scale" not in kv
    assert any(t.name == "blk.1.ffn_gate_up_exps.weight" for t in gguf.GGUFReader(str(CONVERTED)).tensors)
    _run("gguf-to-iebin", "--gguf", CONVERTED, "--out-dir", tmp_path / "m")
    cfg = json.loads((tmp_path / "m/config.json").read_text())
    assert cfg["architectures"] == ["Mistral4ForCausalLM"] and cfg["head_dim"] == 24
    assert cfg["rope_parameters"]["llama_4_scaling_beta"] == 0.0
    ours, theirs = _tensors(MISTRAL4), _tensors(tmp_path / "m")
    assert sorted(ours) == sorted(theirs)
    for n, b in ours.items():
        if len(theirs[n]) == 2 * len(b):  # (the norms and the router: the converter's F32 of our bf16, exactly)
            assert n.endswith(("norm.weight", "mlp.gate.weight")), n
            widened = (np.frombuffer(b, "<u2").astype(np.uint32) << 16).view(np.float32)
            assert np.array_equal(widened, np.frombuffer(theirs[n], "<f4")), n
        else:
            assert b == theirs[n], n
    assert max_rel(exact_logits(tmp_path / "m", IDS, tmp_path / "l.npy"), COOL) < 1e-4
    assert max_rel(exact_logits(CONVERTED, IDS, tmp_path / "g.npy"), COOL) < 1e-4


def test_the_export_keeps_the_temperature_and_comes_back(tmp_path):
    """iebin-to-gguf writes what the converter writes (every key it wrote, with
    its value; the experts' gate and up as two stacks, whose rows are its
    ffn_gate_up_exps' halves), plus the temperature llama.cpp's deepseek2
    graph reads (attention.temperature_scale over attention.temperature_length
    positions); imported again it is the checkpoint, temperature and all."""
    import gguf

    out = tmp_path / "m.gguf"
    _run("iebin-to-gguf", "--model-dir", MISTRAL4, "--out", out)
    ours, theirs = gguf.GGUFReader(str(out)), gguf.GGUFReader(str(CONVERTED))
    kv = {k: f.contents() for k, f in ours.fields.items()}
    assert kv["general.architecture"] == "mistral4"
    assert kv["mistral4.attention.temperature_scale"] == pytest.approx(0.5)
    assert kv["mistral4.attention.temperature_length"] == 4
    for k, f in theirs.fields.items():
        if k.startswith("mistral4."):
            assert kv[k] == f.contents(), k
    to, tt = {t.name: t for t in ours.tensors}, {t.name: t for t in theirs.tensors}
    both = np.asarray(tt.pop("blk.1.ffn_gate_up_exps.weight").data)  # [experts, 2 inter, hidden] (layer 0 is dense)
    half = both.shape[1] // 2
    for k, rows in (("gate", both[:, :half]), ("up", both[:, half:])):
        assert np.asarray(to.pop(f"blk.1.ffn_{k}_exps.weight").data).tobytes() == rows.tobytes()
    assert sorted(to) == sorted(tt)
    for n, t in tt.items():
        assert (t.tensor_type, np.asarray(t.data).tobytes()) == (to[n].tensor_type, np.asarray(to[n].data).tobytes()), n
    _run("gguf-to-iebin", "--gguf", out, "--out-dir", tmp_path / "back")
    assert max_rel(exact_logits(tmp_path / "back", IDS, tmp_path / "l.npy"), REF) < 1e-4


@pytest.mark.parametrize("edit,needles", [
    ({"n_group": 2, "topk_group": 1}, ("config.topk_group", "softmax")),
    ({"rope_parameters": {**ROPE, "partial_rotary_factor": 0.5}}, ("partial_rotary_factor", "qk_rope_head_dim")),
    ({"rope_parameters": {k: v for k, v in ROPE.items() if k != "llama_4_scaling_beta"}},
     ("llama_4_scaling_beta", "missing")),
])
def test_what_the_decoder_cannot_run_is_one_line(tmp_path, edit, needles):
    d = edited_artifact(MISTRAL4, tmp_path / "m", lambda m: reconfigure(m, **edit))
    assert_one_line_error(run_tool("ierun", "generate", "--model-dir", d, "--ids", "1"), *needles)


@pytest.mark.parametrize("kv,drop,needles", [
    ({"mistral4.expert_gating_func": 2}, set(), ("mistral4.expert_gating_func", "softmax")),
    ({"mistral4.expert_group_count": 2}, set(), ("mistral4.expert_group_used_count", "softmax")),
    ({"mistral4.attention.temperature_scale": 0.5, "mistral4.attention.temperature_length": 8}, set(),
     ("mistral4.attention.temperature_length", "original context")),
    ({"mistral4.attention.temperature_scale": 0.5}, set(), ("mistral4.attention.temperature_length",)),
    ({"mistral4.attention.temperature_scale": -1.0}, set(), ("mistral4.attention.temperature_scale",)),
    ({"mistral4.nextn_predict_layers": 1}, set(), ("mistral4.nextn_predict_layers",)),
])
def test_a_file_the_import_cannot_read_as_mistral4_is_one_line(tmp_path, kv, drop, needles):
    bad = rewrite_gguf(CONVERTED, tmp_path / "bad.gguf", kv=kv, drop=drop)
    res = run_tool("ieconv", "gguf-to-iebin", "--gguf", bad, "--out-dir", tmp_path / "m")
    assert_one_line_error(res, *needles)
    assert not (tmp_path / "m").exists()
