"""EXAONE 3.5 (llama.cpp's exaone): a Llama under other names, whose
ExaoneForCausalLM is remote code transformers does not ship. Its GGUF
(golden/gguf/llamacpp/tiny-exaone.gguf: tiny-llama laid out as LG publishes
EXAONE 3.5, converted by llama.cpp's own converter) imports as the
LlamaForCausalLM it is, with q/k rows as they are (llama.cpp turns them
rotate-half), and exports as a llama file."""

from __future__ import annotations

import json

import numpy as np

from conftest import GOLDEN, GOLDEN_HF, exact_logits, run_tool
from gguf_build import rewrite_gguf

CONVERTED = GOLDEN / "gguf" / "llamacpp" / "tiny-exaone.gguf"
IDS = json.loads((GOLDEN / "ref" / "tiny-llama" / "ids.json").read_text())


def _imported(src, out):
    res = run_tool("ieconv", "gguf-to-iebin", "-q", "--gguf", src, "--out-dir", out)
    assert res.returncode == 0, res.stderr
    return out


def _tensors(model) -> dict[str, np.ndarray]:
    """The artifact's tensors as float64 (f16 and f32 widened exactly)."""
    from iekit.formats.iebin import load_model

    m = load_model(model)
    out = {}
    for t in m.tensors:
        raw = m.path_of(t).read_bytes()[t["file_data_offset"]:t["file_data_offset"] + t["nbytes"]]
        out[t["name"]] = np.frombuffer(raw, {"f16": np.float16, "f32": np.float32}[t["dtype"]]).astype(np.float64)
    return out


def test_an_exaone_file_is_the_llama_it_holds(tmp_path):
    """Every tensor of the converter's file is tiny-llama's under its HF
    name, with rows as they are (the matrices rounded to F16 by the
    converter, the norms F32), and the logits are tiny-llama's frozen
    transformers ones to that rounding. A file with the eps under
    LayerNorm's key alone (as this converter writes it for a config
    without rms_norm_eps) is the same model."""
    from gguf_build import hf_tensors

    model = _imported(CONVERTED, tmp_path / "e")
    cfg = json.loads((model / "config.json").read_text())
    assert (cfg["architectures"], cfg["model_type"], cfg["rms_norm_eps"]) == (["LlamaForCausalLM"], "llama", 1e-5)
    got, want = _tensors(model), hf_tensors(GOLDEN_HF / "tiny-llama")
    assert sorted(got) == sorted(want)
    for name, w in want.items():
        w = w.astype(np.float32 if name.endswith("norm.weight") else np.float16).astype(np.float64)
        assert np.array_equal(got[name], w.reshape(-1)), name
    logits = exact_logits(model, IDS, tmp_path / "got.npy")
    ref = np.load(GOLDEN / "ref" / "tiny-llama" / "logits.npy")
    assert np.abs(logits - ref).max() < 1e-2 * np.abs(ref).max()
    ln_only = rewrite_gguf(CONVERTED, tmp_path / "ln.gguf", drop={"exaone.attention.layer_norm_rms_epsilon"})
    np.testing.assert_array_equal(exact_logits(_imported(ln_only, tmp_path / "l"), IDS, tmp_path / "l.npy"), logits)


def test_the_import_exports_as_llama(tmp_path):
    model = _imported(CONVERTED, tmp_path / "e")
    res = run_tool("ieconv", "iebin-to-gguf", "-q", "--model-dir", model, "--out", tmp_path / "e.gguf")
    assert res.returncode == 0, res.stderr
    import gguf

    assert gguf.GGUFReader(str(tmp_path / "e.gguf")).fields["general.architecture"].contents() == "llama"
    back = _imported(tmp_path / "e.gguf", tmp_path / "back")
    np.testing.assert_array_equal(exact_logits(back, IDS, tmp_path / "b.npy"),
                                  exact_logits(model, IDS, tmp_path / "a.npy"))
