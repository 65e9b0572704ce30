"""``ierun verify quant`` as a user runs it, on the golden mixed-scheme artifact."""

from __future__ import annotations

import json
import shutil

import pytest

from conftest import GOLDEN_HF, GOLDEN_IEBIN, assert_one_line_error, copy_model, run_tool

MIXED = GOLDEN_IEBIN / "tiny-llama-mixedq"


def _quantized(model_dir):
    meta = json.loads((model_dir / "model.ie.json").read_text())
    return [t for t in meta["tensors"] if "quant" in t]


def test_verify_quant_passes_on_golden_with_source_bounds():
    res = run_tool("ierun", "verify", "quant", "--model-dir", MIXED, "--hf-dir", GOLDEN_HF / "tiny-llama", "--json")
    assert res.returncode == 0, res.stderr
    r = json.loads(res.stdout)
    assert r["ok"] and r["failed"] == 0 and r["tensors"] == len(_quantized(MIXED))
    assert {x["dtype"] for x in r["results"]} == {"int4w", "q4_0", "q4_1", "q8_0"}
    for x in r["results"]:
        assert set(x["checks"]) == {"checksum", "finite", "dequant", "gemv", "bound"}
        assert x["gemv_max_rel"] <= r["gemv_rtol"]
        # 4-bit schemes keep ~20 dB on Gaussian weights, q8_0 ~40 dB: a broken
        # quantizer that still met the per-element bound could not reach these.
        assert x["sqnr_db"] > (35 if x["dtype"] == "q8_0" else 15), x


@pytest.mark.parametrize("dtype", ["int4w", "q4_0", "q4_1", "q8_0"])
def test_verify_quant_fails_on_one_flipped_payload_byte(tmp_path, dtype):
    model = tmp_path / "m"
    shutil.copytree(MIXED, model)
    t = next(t for t in _quantized(model) if t["dtype"] == dtype)
    with open(model / t["file"], "r+b") as f:
        f.seek(t["file_data_offset"] + t["nbytes"] // 2)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0x01]))
    assert_one_line_error(run_tool("ierun", "verify", "quant", "--model-dir", model),
                          "verify quant: 1 of", f"{t['name']}: checksum")


def test_verify_quant_refuses_a_model_without_quantized_tensors():
    assert_one_line_error(run_tool("ierun", "verify", "quant", "--model-dir", GOLDEN_IEBIN / "tiny-llama"),
                          "no quantized tensors")


def test_verify_quant_with_dedup_checks_the_rebuilt_bytes(tmp_path, nearcopy_int4w):
    """With IE_DEDUP=1 the bytes verified are those the dedup loader serves:
    a flipped exception byte fails, though model.ie.bin is intact."""
    import os

    model = copy_model(nearcopy_int4w, tmp_path / "m")
    dedup = {**os.environ, "IE_DEDUP": "1", "IE_DEDUP_STRICT": "1"}
    assert run_tool("ierun", "verify", "quant", "--model-dir", model, env=dedup).returncode == 0
    index = json.loads((model / "model.dedup.json").read_text())
    member = next(m for g in index["groups"] for m in g["members"] if m["exceptions"]["count"] > 0)
    exc = (model / "model.exceptions.bin").resolve()
    data = bytearray(exc.read_bytes())
    data[member["exceptions"]["offset"]] ^= 0xFF  # inside the member's exceptions: the loader cannot tell
    exc.write_bytes(bytes(data))
    assert run_tool("ierun", "verify", "quant", "--model-dir", model).returncode == 0
    # Without strict mode verify's own checksum names it; strict mode refuses
    # the rebuilt tensor before any check runs (runtime/dedup.py _verify).
    assert_one_line_error(run_tool("ierun", "verify", "quant", "--model-dir", model, env={**dedup, "IE_DEDUP_STRICT": "0"}),
                          "verify quant: 1 of", f"{member['name']}: checksum")
    assert_one_line_error(run_tool("ierun", "verify", "quant", "--model-dir", model, env=dedup),
                          "IE_DEDUP_STRICT=1", repr(member["name"]))


def test_verify_int4_is_a_hidden_alias():
    """`verify int4`, the name before the command covered every scheme,
    gives the same result; --help lists `quant` only."""
    args = ("--model-dir", GOLDEN_IEBIN / "tiny-gpt-oss-mxfp4", "--json")
    new, old = run_tool("ierun", "verify", "quant", *args), run_tool("ierun", "verify", "int4", *args)
    assert new.returncode == old.returncode == 0, old.stderr
    assert json.loads(new.stdout) == json.loads(old.stdout)
    listed = run_tool("ierun", "verify", "--help").stdout
    assert " quant " in listed and " int4 " not in listed
