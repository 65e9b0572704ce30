"""EXAONE 4 (Exaone4ForCausalLM; llama.cpp's exaone4): OLMo 2's norms of
the blocks' outputs with per-head q/k norms; with a window, three sliding
layers to one full one, which rotates nothing (the 32B), else every layer
full and rotated (the 1.2B). The frozen transformers logits of the 64-layer
toy are tests/test_decoder.py's, the converter's own file
tests/test_llamacpp_converter.py's; here, llama.cpp's rule that only a
64-layer model slides, both ways, and what is refused."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from conftest import GOLDEN, GOLDEN_IEBIN, assert_one_line_error, edited_artifact, exact_logits, reconfigure, run_tool
from gguf_build import hf_tensors, rewrite_gguf

EXAONE4 = GOLDEN_IEBIN / "tiny-exaone4"
CONVERTED = GOLDEN / "gguf" / "llamacpp" / "tiny-exaone4.gguf"
IDS = [3, 17, 42, 99, 5, 250, 7, 8, 1, 64, 12, 200]


def _import(src, out) -> dict:
    res = run_tool("ieconv", "gguf-to-iebin", "-q", "--gguf", src, "--out-dir", out)
    assert res.returncode == 0, res.stderr
    return json.loads((out / "config.json").read_text())


def _four_layers(tmp_path, **config) -> Path:
    """tiny-exaone4's first four layers as a checkpoint of their own (the
    1.2B's shape of model where ``config`` drops the window), converted."""
    from safetensors.numpy import save_file

    hf = tmp_path / "hf4"
    hf.mkdir(parents=True)
    t = {k: v for k, v in hf_tensors(GOLDEN / "hf/tiny-exaone4").items()
         if not k.startswith("model.layers.") or int(k.split(".")[2]) < 4}
    save_file(t, str(hf / "model.safetensors"))
    cfg = json.loads((GOLDEN / "hf/tiny-exaone4/config.json").read_text())
    cfg.update({"num_hidden_layers": 4, "layer_types": cfg["layer_types"][:4], "dtype": "float32", **config})
    (hf / "config.json").write_text(json.dumps(cfg))
    (hf / "tokenizer.json").write_bytes((GOLDEN / "hf/tiny-exaone4/tokenizer.json").read_bytes())
    res = run_tool("ieconv", "hf-to-iebin", "-q", "--hf-dir", hf, "--out-dir", tmp_path / "ie4")
    assert res.returncode == 0, res.stderr
    return tmp_path / "ie4"


def test_a_64_layer_file_without_window_keys_takes_llamacpps_defaults(tmp_path):
    """llama.cpp gives a 64-layer exaone4 a 4096-position window and every
    4th layer full where the file says nothing: so does the import."""
    bare = rewrite_gguf(CONVERTED, tmp_path / "bare.gguf",
                        drop={"exaone4.attention.sliding_window", "exaone4.attention.sliding_window_pattern"})
    cfg = _import(bare, tmp_path / "b")
    assert cfg["sliding_window"] == 4096
    assert cfg["layer_types"] == (["sliding_attention"] * 3 + ["full_attention"]) * 16


def test_a_model_of_another_size_has_no_window_both_ways(tmp_path):
    """The 1.2B's shape (no window: every layer full and rotated) exports
    without window keys and comes back as itself, bit for bit; with a
    window, llama.cpp would neither slide nor leave layers unrotated at
    four layers: the export is refused."""
    plain = _four_layers(tmp_path / "a", sliding_window=None, layer_types=["full_attention"] * 4)
    res = run_tool("ieconv", "iebin-to-gguf", "-q", "--model-dir", plain, "--out", tmp_path / "p.gguf")
    assert res.returncode == 0, res.stderr
    import gguf

    assert not [k for k in gguf.GGUFReader(str(tmp_path / "p.gguf")).fields if "sliding" in k]
    back = _import(tmp_path / "p.gguf", tmp_path / "back")
    assert (back["sliding_window"], back["layer_types"]) == (None, ["full_attention"] * 4)
    np.testing.assert_array_equal(exact_logits(plain, IDS, tmp_path / "a.npy"),
                                  exact_logits(tmp_path / "back", IDS, tmp_path / "b.npy"))
    hybrid = _four_layers(tmp_path / "h")
    res = run_tool("ieconv", "iebin-to-gguf", "--model-dir", hybrid, "--out", tmp_path / "h.gguf")
    assert_one_line_error(res, "config.sliding_window", "only in 64-layer models")
    assert not (tmp_path / "h.gguf").exists()


def test_a_window_in_a_file_of_another_size_is_refused(tmp_path):
    """llama.cpp ignores the window of an exaone4 file that is not 64
    layers deep, so the file describes a model llama.cpp does not run."""
    bad = tmp_path / "bad.gguf"
    plain = _four_layers(tmp_path / "p", sliding_window=None, layer_types=["full_attention"] * 4)
    assert run_tool("ieconv", "iebin-to-gguf", "-q", "--model-dir", plain, "--out", tmp_path / "p.gguf").returncode == 0
    rewrite_gguf(tmp_path / "p.gguf", bad, kv={"exaone4.attention.sliding_window": 4})
    res = run_tool("ieconv", "gguf-to-iebin", "--gguf", bad, "--out-dir", tmp_path / "o")
    assert_one_line_error(res, "bad.gguf", "exaone4.attention.sliding_window", "only in 64-layer models")
    assert not (tmp_path / "o").exists()


def test_export_refuses_a_64_layer_model_without_a_window(tmp_path):
    """llama.cpp's exaone4 slides, and leaves the full layers unrotated, in
    every 64-layer model: one without a window would run as another."""
    d = edited_artifact(EXAONE4, tmp_path / "m", lambda meta: reconfigure(
        meta, sliding_window=None, layer_types=["full_attention"] * 64))
    res = run_tool("ieconv", "iebin-to-gguf", "--model-dir", d, "--out", tmp_path / "m.gguf")
    assert_one_line_error(res, "config.sliding_window", "whatever its file says")


def test_the_full_layers_rotate_only_without_a_window(tmp_path):
    """Exaone4Attention rotates where sliding_window is None or the layer
    slides: a window with every layer full leaves every layer unrotated,
    which differs from no window at all."""
    ref = exact_logits(EXAONE4, IDS, tmp_path / "ref.npy")
    outs = {}
    for tag, window in (("nope", 4), ("rope", None)):
        d = edited_artifact(EXAONE4, tmp_path / tag, lambda meta, w=window: reconfigure(
            meta, sliding_window=w, layer_types=["full_attention"] * 64))
        outs[tag] = exact_logits(d, IDS, tmp_path / f"{tag}.npy")
    scale = np.abs(ref).max()
    assert np.abs(outs["nope"] - outs["rope"]).max() > 1e-2 * scale
    assert np.abs(outs["nope"] - ref).max() > 1e-3 * scale and np.abs(outs["rope"] - ref).max() > 1e-3 * scale


def test_a_pattern_transformers_cannot_read_is_refused(tmp_path):
    """transformers 5's Exaone4Config derives layer_types from an integer
    sliding_window_pattern only; "LLLG" without layer_types is refused
    naming the key."""
    d = edited_artifact(EXAONE4, tmp_path / "m", lambda meta: reconfigure(
        meta, layer_types=None, sliding_window_pattern="LLLG"))
    assert_one_line_error(run_tool("ierun", "generate", "--model-dir", d, "--ids", "1"),
                          "config.sliding_window_pattern", "positive integer")
