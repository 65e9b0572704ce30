"""``q4-manifest --target-bpw --measurements FILE`` (formats/policy_measurements.py):
the candidates' errors kept after each matrix, so an interrupted run goes
on where it stopped and another budget or other KL probes measure nothing,
with the manifest a run without the file writes; a file of other inputs is
said so and replaced; hostile files are one line each."""

from __future__ import annotations

import json
import os

import click
import pytest

from conftest import GOLDEN, GOLDEN_HF, GOLDEN_IEBIN, assert_one_line_error, run_tool
from iekit.formats import policy_measurements
from iekit.formats.errors import FormatError
from iekit.formats.jsonio import dumps_canonical
from iekit.formats.policy_measurements import Measurements

TEXT = GOLDEN / "text" / "eval-sample.txt"
HF, REF = GOLDEN_HF / "tiny-llama", GOLDEN_IEBIN / "tiny-llama"
PROBES = GOLDEN / "kl_probes" / "smollm2-rotated.json"  # its groups are Llama's layer patterns: they apply here
MATRICES = 15  # tiny-llama's 14 block matrices and its head
WITH_REF = ("--ref-dir", REF, "--text-file", TEXT, "--ctx", "32", "--chunks", "2", "--threads", "1")
GOLDEN_FILE = GOLDEN / "policy_measurements" / "tiny-llama.json"


def _manifest(out, bpw: str, *extra):
    res = run_tool("ieconv", "q4-manifest", "--hf-dir", HF, "--quantize-head", "--target-bpw", bpw, *extra, "-o", out)
    assert res.returncode == 0, res.stderr
    return json.loads(out.read_text()), res.stderr


@pytest.fixture(scope="module")
def imatrix(tmp_path_factory):
    im = tmp_path_factory.mktemp("pm") / "im.npz"
    res = run_tool("ieconv", "imatrix", "--model-dir", REF, "--text-file", TEXT, "--ctx", "32", "--chunks", "2",
                   "-o", im)
    assert res.returncode == 0, res.stderr
    return im


MODES = {"ref-dir, kl-probes": (*WITH_REF, "--kl-probes", PROBES), "imatrix": ()}


def _mode(mode, imatrix):
    return MODES[mode] if mode != "imatrix" else ("--imatrix", imatrix)


@pytest.mark.parametrize("mode", list(MODES))
def test_another_budget_measures_nothing_and_chooses_the_same(tmp_path, imatrix, mode):
    args = _mode(mode, imatrix)
    m = tmp_path / "m.json"
    first, err = _manifest(tmp_path / "a.json", "5.0", *args, "--measurements", m)
    assert first == _manifest(tmp_path / "a0.json", "5.0", *args)[0]  # the file changes nothing
    assert "measured before" not in err
    doc = json.loads(m.read_text())
    assert len(doc["matrices"]) == MATRICES
    assert all(("probed" in v) == (mode != "imatrix") for v in doc["matrices"].values())
    again, err = _manifest(tmp_path / "b.json", "4.6", *args, "--measurements", m)
    assert f"{MATRICES} of {MATRICES} matrices measured before (of the same inputs)" in err
    assert again == _manifest(tmp_path / "b0.json", "4.6", *args)[0]
    assert json.loads(m.read_text()) == doc  # nothing new was measured


def test_an_interrupted_run_goes_on_to_the_same_manifest(tmp_path, capfd):
    """Ctrl-C after the fifth matrix was kept: the next run takes those five
    and measures the other ten."""
    from iekit.convert.cli import q4_manifest_cmd

    whole, _ = _manifest(tmp_path / "whole.json", "4.6", *MODES["ref-dir, kl-probes"])
    m, out = tmp_path / "m.json", tmp_path / "q.json"
    save, count = Measurements.save, {"n": 0}

    def save_then_interrupt(self):
        save(self)
        count["n"] += 1
        if count["n"] == 5:
            raise KeyboardInterrupt

    Measurements.save = save_then_interrupt
    try:
        with pytest.raises(click.exceptions.Abort):
            q4_manifest_cmd.main(["--hf-dir", str(HF), "--quantize-head", "--target-bpw", "4.6",
                                  *map(str, MODES["ref-dir, kl-probes"]), "--measurements", str(m), "-o", str(out)],
                                 standalone_mode=False)
    finally:
        Measurements.save = save
    assert not out.exists() and len(json.loads(m.read_text())["matrices"]) == 5
    assert f"5 of {MATRICES} matrices' measured errors are kept in {m}: the same command goes on" in \
        capfd.readouterr().err
    got, err = _manifest(out, "4.6", *MODES["ref-dir, kl-probes"], "--measurements", m)
    assert f"5 of {MATRICES} matrices measured before" in err
    assert got == whole


def test_other_inputs_are_said_and_replaced(tmp_path, imatrix):
    m = tmp_path / "m.json"
    _manifest(tmp_path / "a.json", "5.0", *WITH_REF, "--measurements", m)
    other = list(WITH_REF)
    other[other.index("--chunks") + 1] = "3"
    got, err = _manifest(tmp_path / "b.json", "5.0", *other, "--measurements", m)
    assert "measured for other inputs (calibration differ): every candidate is measured again, and the file " \
           "replaced" in err and "measured before" not in err
    assert got == _manifest(tmp_path / "b0.json", "5.0", *other)[0]
    _got, err = _manifest(tmp_path / "c.json", "5.0", "--imatrix", imatrix, "--measurements", m)
    assert "(calibration, imatrix, ref_dir, refit_scales differ)" in err
    assert json.loads(m.read_text())["inputs"]["ref_dir"] is None


def test_hostile_files_are_one_line(tmp_path):
    args = ("ieconv", "q4-manifest", "--hf-dir", HF, "--target-bpw", "5.0", *WITH_REF, "-o", tmp_path / "q.json")
    m = tmp_path / "m.json"
    os.mkfifo(m)  # never opened (no hang), never replaced
    assert_one_line_error(run_tool(*args, "--measurements", m), str(m), "not a regular file")
    m.unlink()
    m.symlink_to(GOLDEN_FILE)
    assert_one_line_error(run_tool(*args, "--measurements", m), str(m), "not a regular file")
    m.unlink()
    m.write_text('{"format": "iekit-policy-measurements"')
    assert_one_line_error(run_tool(*args, "--measurements", m), "m.json")
    res = run_tool("ieconv", "q4-manifest", "--hf-dir", HF, "--scheme", "q4_0", "-o", tmp_path / "r.json",
                   "--measurements", tmp_path / "x.json")
    assert res.returncode == 2 and "give --target-bpw too" in res.stderr
    res = run_tool(*args, "--measurements", tmp_path / "q.json")
    assert res.returncode == 2 and "another file than the manifest" in res.stderr


def test_bytes_not_of_the_selection_are_one_error_naming_the_field(tmp_path):
    """A kept entry whose bytes are not what the matrix takes in that
    selection (an edited file) is refused, naming the entry."""
    from iekit.convert import bpw_policy

    name = "model.layers.0.mlp.down_proj.weight"
    m = Measurements(tmp_path / "m.json", {"weights": "w"})
    sel = {"scheme": "q4_0"}
    m.put(name, "placed", {bpw_policy.selection_key(sel): (1, 0.5)})
    with pytest.raises(FormatError) as e:
        bpw_policy._known(m, name, [64, 128], "placed", (sel,), lambda sels: {})
    assert e.value.field == f"matrices.{name}.placed.{bpw_policy.selection_key(sel)}"
    assert "1 bytes, but the matrix takes 4608" in e.value.message


def test_golden_file_reads_and_writes_back_byte_identical():
    """golden/policy_measurements (tiny-llama, --ref-dir iebin/tiny-llama,
    2 chunks of 32, --target-bpw 5.0)."""
    doc = policy_measurements.from_json(json.loads(GOLDEN_FILE.read_text()), GOLDEN_FILE)
    assert len(doc["matrices"]) == MATRICES and doc["inputs"]["imatrix"] is None
    assert dumps_canonical(doc) == GOLDEN_FILE.read_bytes()


@pytest.mark.parametrize("edit, field", [
    (lambda d, k: d["matrices"]["lm_head.weight"]["placed"].update({k.replace(" ", ""): [1, 0.1]}), "lm_head.weight"),
    (lambda d, k: d["matrices"]["lm_head.weight"]["placed"].update({"[1]": [1, 0.1]}), "lm_head.weight.placed.[1]"),
    (lambda d, k: d["matrices"]["lm_head.weight"]["placed"][k].__setitem__(1, -1.0), "matrices.lm_head.weight"),
    (lambda d, k: d["matrices"]["lm_head.weight"]["placed"][k].__setitem__(0, 0), "matrices.lm_head.weight"),
    (lambda d, k: d["matrices"]["lm_head.weight"].update(other={}), "matrices.lm_head.weight"),
    (lambda d, k: d.update(version=2), "version"),
])
def test_broken_rules_are_one_error_naming_the_field(tmp_path, edit, field):
    doc = json.loads(GOLDEN_FILE.read_text())
    edit(doc, next(iter(doc["matrices"]["lm_head.weight"]["placed"])))
    with pytest.raises(FormatError) as e:
        policy_measurements.from_json(doc, tmp_path / "m.json")
    assert field in e.value.field
