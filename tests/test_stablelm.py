"""StableLM (StableLmForCausalLM: StableLM 2 1.6B, StableLM 3B, Stable Code 3B; llama.cpp's stablelm): Llama's layer
with LayerNorms and their biases, RoPE over a quarter of each head, q/k/v biases by use_qkv_bias. The frozen
transformers logits and greedy ids are tests/test_decoder.py's, the converter's own file
tests/test_llamacpp_converter.py's, the round trips through GGUF tests/test_gguf_export.py's and
tests/test_gguf_to_hf.py's; here, the norm biases the native decoder holds
to a LayerNorm, and what StableLM 2 12B adds, refused in one line on every path."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import GOLDEN_HF, GOLDEN_IEBIN, assert_one_line_error, edited_artifact, reconfigure, run_tool
from gguf_build import rewrite_gguf

from iekit.runtime import native
from iekit.runtime.decoder import native_config
from iekit.runtime.tensor_source import TensorSource

STABLELM = GOLDEN_IEBIN / "tiny-stablelm"
CONVERTED = GOLDEN_HF.parent / "gguf" / "llamacpp" / "tiny-stablelm.gguf"


def test_the_norm_biases_move_the_logits_and_belong_to_a_layernorm():
    """The LayerNorms' biases are applied (zeroing them moves the logits), and the native decoder refuses one beside
    an RMSNorm, which has none."""
    from iekit.formats.model_spec import LAYERS_KEY, decoder_spec
    from iekit.runtime import decoder_weights

    src = TensorSource(STABLELM)
    s = decoder_spec(src.model.meta, src.model.meta_path)
    cfg = native_config(s, 16, ("f32", "f32"))
    bound = decoder_weights.bind(src, s)
    ids = np.array([3, 7, 11], np.int32)
    out = native._native.Decoder(cfg, bound.weights).forward(ids)
    zeroed = dict(bound.weights, norm_b=np.zeros(s.hidden, np.float32))
    other = native._native.Decoder(cfg, zeroed).forward(ids)
    assert np.abs(out - other).max() > 1e-3 * np.abs(out).max()
    cfg.layer_norm = False
    with pytest.raises(ValueError, match="an RMSNorm has no bias"):
        native._native.Decoder(cfg, bound.weights)
    del bound.weights["norm_b"]
    with pytest.raises(ValueError, match="layer 0 norm biases: a bias belongs to a LayerNorm"):
        native._native.Decoder(cfg, bound.weights)
    assert bound.weights[LAYERS_KEY][0]["attn_norm_b"].shape == (s.hidden,)


@pytest.mark.parametrize("key", ["qk_layernorm", "use_parallel_residual"])
def test_stablelm_2_12bs_layer_is_one_line(tmp_path, key):
    """StableLM 2 12B's per-head q/k LayerNorms and parallel layer are not implemented: refused, not run as 1.6B's."""
    d = edited_artifact(STABLELM, tmp_path / "m", lambda m: reconfigure(m, **{key: True}))
    assert_one_line_error(run_tool("ierun", "generate", "--model-dir", d, "--ids", "1"), f"config.{key}",
                          "StableLM 2 12B")


def test_use_qkv_bias_decides_the_biases(tmp_path):
    """Without use_qkv_bias transformers builds no q/k/v biases: stored ones would be left unread, so they are
    refused; with it, each is required."""
    d = edited_artifact(STABLELM, tmp_path / "m", lambda m: reconfigure(m, use_qkv_bias=False))
    assert_one_line_error(run_tool("ierun", "generate", "--model-dir", d, "--ids", "1"), "tensors['model.layers.0.",
                          "does not use it")

    def without_a_bias(meta):
        meta["tensors"] = [t for t in meta["tensors"] if t["name"] != "model.layers.1.self_attn.k_proj.bias"]

    d = edited_artifact(STABLELM, tmp_path / "n", without_a_bias)
    assert_one_line_error(run_tool("ierun", "generate", "--model-dir", d, "--ids", "1"),
                          "model.layers.1.self_attn.k_proj.bias")


def test_a_parallel_file_imports_as_the_layer_llamacpp_runs_and_is_refused(tmp_path):
    """llama.cpp's stablelm runs a block without ffn_norm as the parallel layer (StableLM 2 12B's): the import
    reads it so, whatever use_parallel_residual says, and ierun refuses that layer in one line."""
    drop = {f"blk.{i}.ffn_norm.{w}": None for i in range(2) for w in ("weight", "bias")}
    g = rewrite_gguf(CONVERTED, tmp_path / "p.gguf", tensors=drop)
    res = run_tool("ieconv", "gguf-to-iebin", "-q", "--gguf", g, "--out-dir", tmp_path / "m")
    assert res.returncode == 0, res.stderr
    assert json.loads((tmp_path / "m" / "config.json").read_text())["use_parallel_residual"] is True
    assert_one_line_error(run_tool("ierun", "generate", "--model-dir", tmp_path / "m", "--ids", "1"),
                          "config.use_parallel_residual")


def test_the_export_needs_an_output_head_of_its_own(tmp_path):
    """llama.cpp's stablelm loader requires output.weight: a tied StableLM is refused, not written unloadable."""
    d = edited_artifact(STABLELM, tmp_path / "m", lambda m: reconfigure(m, tie_word_embeddings=True))
    res = run_tool("ieconv", "iebin-to-gguf", "--model-dir", d, "--out", tmp_path / "m.gguf")
    assert_one_line_error(res, "tie_word_embeddings", "requires an output head of its own")
    assert not (tmp_path / "m.gguf").exists()
