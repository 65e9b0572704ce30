"""SmolLM3 (SmolLM3ForCausalLM; llama.cpp's smollm3): Llama's layer with
every 4th layer's q and k left unrotated (NoPE). The frozen transformers
logits are tests/test_decoder.py's, the converter's own file
tests/test_llamacpp_converter.py's; here, the config's two spellings and
what is refused rather than run as another model."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import (GOLDEN_IEBIN, GOLDEN_REF, assert_one_line_error, edited_artifact, exact_logits, reconfigure,
                      run_tool)

SMOLLM3 = GOLDEN_IEBIN / "tiny-smollm3"
IDS = json.loads((GOLDEN_REF / "tiny-smollm3" / "ids.json").read_text())


def _logits(model, tmp_path, name="l.npy") -> np.ndarray:
    return exact_logits(model, IDS, tmp_path / name)


def test_the_interval_gives_the_same_layers_as_the_list(tmp_path):
    """Without no_rope_layers, every no_rope_layer_interval-th layer is the
    NoPE one (SmolLM3Config derives the list so): the same logits; another
    interval is another model."""
    ref = _logits(SMOLLM3, tmp_path)
    d = edited_artifact(SMOLLM3, tmp_path / "a", lambda meta: reconfigure(meta, no_rope_layers=None))
    assert np.array_equal(_logits(d, tmp_path, "a.npy"), ref)
    e = edited_artifact(SMOLLM3, tmp_path / "b",
                        lambda meta: reconfigure(meta, no_rope_layers=None, no_rope_layer_interval=2))
    other = _logits(e, tmp_path, "b.npy")
    assert np.abs(other - ref).max() > 1e-2 * np.abs(ref).max()


@pytest.mark.parametrize("value,needle", [
    ([1, 1, 0], "expected 4 values"),
    ([1, 1, 2, 0], "1 (RoPE) or 0"),
    ("1110", "1 (RoPE) or 0"),
])
def test_a_no_rope_list_the_decoder_cannot_read_is_refused(tmp_path, value, needle):
    d = edited_artifact(SMOLLM3, tmp_path / "m", lambda meta: reconfigure(meta, no_rope_layers=value))
    assert_one_line_error(run_tool("ierun", "generate", "--model-dir", d, "--ids", "1"), "no_rope_layers", needle)


def test_export_refuses_layers_llamacpp_would_rotate(tmp_path):
    """llama.cpp's smollm3 leaves every 4th layer unrotated whatever the file
    says: another pattern is refused, the golden one exported."""
    d = edited_artifact(SMOLLM3, tmp_path / "m", lambda meta: reconfigure(meta, no_rope_layers=[1, 0, 1, 0]))
    res = run_tool("ieconv", "iebin-to-gguf", "--model-dir", d, "--out", tmp_path / "m.gguf")
    assert_one_line_error(res, "no_rope_layers", "every 4th layer")
    assert not (tmp_path / "m.gguf").exists()
    assert run_tool("ieconv", "iebin-to-gguf", "-q", "--model-dir", SMOLLM3, "--out", tmp_path / "g.gguf").returncode == 0
