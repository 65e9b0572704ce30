"""Phi-2 and Phi-1.5 (PhiForCausalLM; llama.cpp's phi2): one LayerNorm (with its bias) whose output the attention and
the MLP both read, their outputs joining the residual together; biases on every projection and on the output head;
RoPE over part of each head; an MLP of fc1, GELU and fc2 without a gate. The frozen transformers logits and greedy ids
are tests/test_decoder.py's, the converter's own file tests/test_llamacpp_converter.py's, the round trips through
GGUF tests/test_gguf_export.py's and tests/test_gguf_to_hf.py's; here, the head's bias and what the converter writes
whatever the config says."""

from __future__ import annotations

import numpy as np
from conftest import GOLDEN_HF, GOLDEN_IEBIN, assert_one_line_error, edited_artifact, reconfigure, run_tool
from gguf_build import rewrite_gguf

from iekit.formats.model_spec import decoder_spec
from iekit.runtime import decoder_weights, native
from iekit.runtime.decoder import native_config
from iekit.runtime.tensor_source import TensorSource

PHI = GOLDEN_IEBIN / "tiny-phi"
CONVERTED = GOLDEN_HF.parent / "gguf" / "llamacpp" / "tiny-phi.gguf"


def test_the_heads_bias_is_added_to_every_logit_row():
    """Every position's logits carry lm_head.bias: without it each row moves by exactly the bias (a prefill of
    several tokens takes the GEMM path, one token the GEMV's)."""
    src = TensorSource(PHI)
    s = decoder_spec(src.model.meta, src.model.meta_path)
    cfg = native_config(s, 16, ("f32", "f32"))
    bound = decoder_weights.bind(src, s)
    ids = np.array([3, 7, 11, 19, 23], np.int32)
    with_bias = native._native.Decoder(cfg, bound.weights).forward(ids, True)
    bias = bound.weights.pop("lm_head_b")
    without = native._native.Decoder(cfg, bound.weights).forward(ids, True)
    assert np.abs(bias).max() > 0.01
    np.testing.assert_allclose(with_bias - without, np.broadcast_to(bias, with_bias.shape), atol=1e-5)


def test_a_file_whose_widths_are_not_its_tensors_is_one_line(tmp_path):
    """llama.cpp's converter writes 4 x hidden for the MLP's width and a key head per head whatever the config says
    (Phi-2's are so); a file whose key disagrees with its tensors is refused, naming the tensor, not imported."""
    g = rewrite_gguf(CONVERTED, tmp_path / "w.gguf", drop={"phi2.feed_forward_length"},
                     kv={"phi2.feed_forward_length": 128})
    res = run_tool("ieconv", "gguf-to-iebin", "--gguf", g, "--out-dir", tmp_path / "m")
    assert_one_line_error(res, "mlp.fc1.weight", "the config implies [128, 64]")
    assert not (tmp_path / "m").exists()


def test_phis_q_k_layernorm_is_one_line(tmp_path):
    d = edited_artifact(PHI, tmp_path / "m", lambda m: reconfigure(m, qk_layernorm=True))
    assert_one_line_error(run_tool("ierun", "generate", "--model-dir", d, "--ids", "1"), "config.qk_layernorm")
