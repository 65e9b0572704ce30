"""Solar Open (Upstage's SolarOpenForCausalLM, written by llama.cpp's converter as a glm4moe file): Llama's
attention, GLM-4.5's router and shared experts in every layer. The frozen transformers logits are
tests/test_decoder.py's and the converter's file tests/test_llamacpp_converter.py's; here, how its file is told
from GLM-4.5's, and what is refused."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import GOLDEN, GOLDEN_IEBIN, GOLDEN_REF, assert_one_line_error, exact_logits, reconfigure, run_tool
from gguf_build import rewrite_gguf

from iekit.formats.errors import UnsupportedError
from iekit.formats.model_spec import decoder_spec

SOLAR = GOLDEN_IEBIN / "tiny-solar-open"
CONVERTED = GOLDEN / "gguf" / "llamacpp" / "tiny-solar-open.gguf"
IDS = json.loads((GOLDEN_REF / "tiny-solar-open" / "ids.json").read_text())
REF = np.load(GOLDEN_REF / "tiny-solar-open" / "logits.npy").astype(np.float64)


def test_its_glm4moe_file_imports_as_solar_open(tmp_path):
    """The converter writes no dense width (Solar Open's config has none; GLM-4.5's always do): the import names
    the model SolarOpenForCausalLM, states no q/k norms and no dense layers, and computes transformers' logits; a
    GLM-4.5 file stays GLM-4.5."""
    res = run_tool("ieconv", "gguf-to-iebin", "-q", "--gguf", CONVERTED, "--out-dir", tmp_path / "m")
    assert res.returncode == 0, res.stderr
    cfg = json.loads((tmp_path / "m/config.json").read_text())
    assert cfg["architectures"] == ["SolarOpenForCausalLM"] and cfg["model_type"] == "solar_open"
    assert "use_qk_norm" not in cfg and "num_nextn_predict_layers" not in cfg and cfg["intermediate_size"] is None
    logits = exact_logits(tmp_path / "m", IDS, tmp_path / "l.npy").astype(np.float64)
    assert np.abs(logits - REF).max() / np.abs(REF).max() < 1e-5
    res = run_tool("ieconv", "gguf-to-iebin", "-q", "--gguf", GOLDEN / "gguf" / "llamacpp" / "tiny-glm4-moe.gguf",
                   "--out-dir", tmp_path / "glm")
    assert res.returncode == 0, res.stderr
    assert json.loads((tmp_path / "glm/config.json").read_text())["architectures"] == ["Glm4MoeForCausalLM"]


@pytest.mark.parametrize("kv, needles", [
    ({"glm4moe.leading_dense_block_count": 1}, ("glm4moe.feed_forward_length", "missing", "1 layers dense")),
    ({"glm4moe.nextn_predict_layers": 1}, ("glm4moe.nextn_predict_layers", "not read")),
])
def test_a_file_that_is_no_solar_open_is_refused(tmp_path, kv, needles):
    bad = rewrite_gguf(CONVERTED, tmp_path / "bad.gguf", kv=kv)
    res = run_tool("ieconv", "gguf-to-iebin", "-q", "--gguf", bad, "--out-dir", tmp_path / "m")
    assert_one_line_error(res, *needles)
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize("fields, needles", [
    ({"first_k_dense_replace": 1}, ("config.first_k_dense_replace", "every layer")),
    ({"partial_rotary_factor": 0.5}, ("partial_rotary_factor",)),
])
def test_what_solar_open_does_not_compute_is_refused(fields, needles):
    """transformers' Solar Open has experts in every layer and turns every dim of a head (a config saying
    otherwise would be read by llama.cpp's converter): refused, naming the key."""
    meta = json.loads((SOLAR / "model.ie.json").read_text())
    reconfigure(meta, **fields)
    with pytest.raises(UnsupportedError) as e:
        decoder_spec(meta, SOLAR / "model.ie.json")
    assert all(n in str(e.value) for n in needles), str(e.value)
