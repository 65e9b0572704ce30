"""``ieconv kl-probes`` resumes an interrupted run (formats/kl_probes_partial.py):
its two conversions and each scoring are kept in ``.OUT.partial`` beside
the output, the same command goes on from them and writes the file an
uninterrupted run writes, byte for byte; other inputs, and a damaged or
hostile folder, are one clear line each; ``ieconv quantize`` goes on after
its kl-probes stage was killed."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time

import click
import pytest

from conftest import BIN_DIR, GOLDEN, GOLDEN_HF, GOLDEN_IEBIN, assert_one_line_error, run_tool
from iekit.formats import kl_probes_partial
from iekit.formats.errors import FormatError
from iekit.formats.jsonio import dumps_canonical
from iekit.formats.kl_probes_partial import CONVERTED, STATE_NAME, ProbesRun, partial_dir

TEXT = GOLDEN / "text" / "eval-sample.txt"
HF, REF = GOLDEN_HF / "tiny-llama", GOLDEN_IEBIN / "tiny-llama"
GROUPS = 8  # tiny-llama's seven layer patterns and its head
ARGS = ("--hf-dir", HF, "--ref-dir", REF, "--text-file", TEXT, "--ctx", "32", "--chunks", "2", "--threads", "1")


@pytest.fixture(scope="module")
def whole(tmp_path_factory):
    """The output of an uninterrupted run (and the importance matrix the resumed runs are given)."""
    root = tmp_path_factory.mktemp("klresume")
    im = root / "im.npz"
    res = run_tool("ieconv", "imatrix", "--model-dir", REF, "--text-file", TEXT, "--ctx", "32", "--chunks", "2",
                   "-o", im)
    assert res.returncode == 0, res.stderr
    out = root / "whole.json"
    res = run_tool("ieconv", "kl-probes", "-q", *ARGS, "--imatrix", im, "-o", out)
    assert res.returncode == 0, res.stderr
    assert not partial_dir(out).exists()  # gone once the output is written
    return out, im


@contextlib.contextmanager
def _ctrl_c_after(method: str, after: int):
    """Ctrl-C arriving as the ``after``-th call of ProbesRun.``method`` has
    kept its result (deterministic, unlike a timed signal)."""
    keep = getattr(ProbesRun, method)
    count = {"n": 0}

    def keep_then_interrupt(self, *a):
        keep(self, *a)
        count["n"] += 1
        if count["n"] == after:
            raise KeyboardInterrupt

    setattr(ProbesRun, method, keep_then_interrupt)
    try:
        with pytest.raises(click.exceptions.Abort):  # click's wrapping of the KeyboardInterrupt
            yield
    finally:
        setattr(ProbesRun, method, keep)


def _interrupted(out, im, method: str, after: int) -> dict:
    """The command run in this process, interrupted; what it kept."""
    from iekit.convert.kl_probes_cli import kl_probes_cmd

    with _ctrl_c_after(method, after):
        kl_probes_cmd.main([*map(str, ARGS), "--imatrix", str(im), "-q", "-o", str(out)], standalone_mode=False)
    assert not out.exists()
    return json.loads((partial_dir(out) / STATE_NAME).read_text())


@pytest.mark.parametrize("method, after, scored", [("put_converted", 1, 0), ("put_base", 1, 1), ("put", 3, 4)])
def test_an_interrupted_run_resumes_to_the_same_bytes(whole, tmp_path, capfd, method, after, scored):
    """Stopped once the conversions were kept, after the base's scoring, and
    after three groups': the next run makes nothing twice and writes the
    uninterrupted run's file."""
    ref_out, im = whole
    out = tmp_path / "p.json"
    state = _interrupted(out, im, method, after)
    assert state["converted"] is not None and (state["base_kl"] is not None) == (scored > 0)
    assert len(state["groups"]) == max(scored - 1, 0)
    told = f"the two conversions and {scored} of {GROUPS + 1} scorings"
    assert f"{told} are kept in {partial_dir(out)}: the same command goes on" in capfd.readouterr().err
    res = run_tool("ieconv", "kl-probes", "-q", *ARGS, "--imatrix", im, "-o", out)
    assert res.returncode == 0, res.stderr
    assert f"resuming: {told} from {partial_dir(out)}" in res.stderr
    assert out.read_bytes() == ref_out.read_bytes()
    assert not partial_dir(out).exists()


def test_a_run_stopped_before_keeping_anything_leaves_nothing(whole, tmp_path):
    """Interrupted inside its first conversion: no folder is left behind."""
    from iekit.convert import kl_probes_cli

    _ref_out, im = whole
    out = tmp_path / "p.json"
    convert = kl_probes_cli.convert

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    kl_probes_cli.convert = interrupted
    try:
        with pytest.raises(click.exceptions.Abort):
            kl_probes_cli.kl_probes_cmd.main([*map(str, ARGS), "--imatrix", str(im), "-q", "-o", str(out)],
                                             standalone_mode=False)
    finally:
        kl_probes_cli.convert = convert
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_real_ctrl_c_keeps_what_is_done(whole, tmp_path):
    """SIGINT to the command as a user's Ctrl-C: exit 130, one line saying
    what is kept; the next run finishes from it."""
    ref_out, im = whole
    out = tmp_path / "p.json"
    state = partial_dir(out) / STATE_NAME
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    p = subprocess.Popen([str(BIN_DIR / "ieconv"), "kl-probes", "-q", *map(str, ARGS), "--imatrix", str(im),
                          "-o", str(out)], stderr=subprocess.PIPE, text=True, env=env)
    while p.poll() is None and not (state.exists() and json.loads(state.read_text() or "{}").get("groups")):
        time.sleep(0.002)
    p.send_signal(signal.SIGINT)
    err = p.communicate(timeout=120)[1]
    if p.returncode == 0:
        pytest.skip("the run ended before the signal arrived")
    assert p.returncode == 130, err
    assert "scorings are kept in" in err and "Traceback" not in err
    res = run_tool("ieconv", "kl-probes", "-q", *ARGS, "--imatrix", im, "-o", out)
    assert res.returncode == 0 and "resuming: the two conversions and" in res.stderr, res.stderr
    assert out.read_bytes() == ref_out.read_bytes()


def test_other_inputs_are_refused_naming_what_differs(whole, tmp_path):
    ref_out, im = whole
    out = tmp_path / "p.json"
    _interrupted(out, im, "put", 2)
    kept = (partial_dir(out) / STATE_NAME).read_bytes()
    args = [*ARGS, "--imatrix", im]
    other = list(args)
    other[other.index("--chunks") + 1] = "3"
    assert_one_line_error(run_tool("ieconv", "kl-probes", "-q", *other, "-o", out),
                          "an interrupted kl-probes run of other inputs (calibration differ) kept its work here; "
                          "pass --no-resume")
    assert_one_line_error(run_tool("ieconv", "kl-probes", "-q", *ARGS, "-o", out), "(imatrix differ)")
    assert_one_line_error(run_tool("ieconv", "kl-probes", "-q", *args, "--probe", "q4_0", "-o", out), "(probe differ)")
    assert (partial_dir(out) / STATE_NAME).read_bytes() == kept  # untouched
    res = run_tool("ieconv", "kl-probes", "-q", *args, "--no-resume", "-o", out)
    assert res.returncode == 0, res.stderr
    assert "resuming" not in res.stderr and not partial_dir(out).exists()
    assert out.read_bytes() == ref_out.read_bytes()


def test_conversions_not_as_recorded_are_made_again(whole, tmp_path):
    """A kept payload touched (or removed) since: both conversions and every
    scoring are made again, silently right."""
    ref_out, im = whole
    out = tmp_path / "p.json"
    _interrupted(out, im, "put", 2)
    os.utime(partial_dir(out) / CONVERTED / "probe.ie.bin", ns=(1, 1))
    res = run_tool("ieconv", "kl-probes", "-q", *ARGS, "--imatrix", im, "-o", out)
    assert res.returncode == 0 and "resuming" not in res.stderr, res.stderr
    assert out.read_bytes() == ref_out.read_bytes()


def test_hostile_work_folders_are_one_line(whole, tmp_path):
    _ref_out, im = whole
    out = tmp_path / "p.json"
    run = [*ARGS, "--imatrix", im, "-o", out]
    d = partial_dir(out)
    d.write_text("mine")  # a file where the folder goes: refused, kept
    assert_one_line_error(run_tool("ieconv", "kl-probes", "-q", *run), str(d), "is a file, where kl-probes keeps")
    d.unlink()
    os.mkfifo(d)
    assert_one_line_error(run_tool("ieconv", "kl-probes", "-q", *run), str(d), "FIFO")
    d.unlink()
    (tmp_path / "elsewhere").mkdir()
    d.symlink_to(tmp_path / "elsewhere")  # never followed
    assert_one_line_error(run_tool("ieconv", "kl-probes", "-q", *run), str(d), "symlink")
    d.unlink()
    d.mkdir()
    (d / "notes.txt").write_text("mine")  # a file kl-probes did not write: refused, never removed
    assert_one_line_error(run_tool("ieconv", "kl-probes", "-q", *run), "notes.txt", "did not write")
    assert (d / "notes.txt").read_text() == "mine"
    (d / "notes.txt").unlink()
    (d / STATE_NAME).write_text('{"format": "iekit-kl-probes-partial", "version": 1')
    assert_one_line_error(run_tool("ieconv", "kl-probes", "-q", *run), STATE_NAME)
    (d / STATE_NAME).write_bytes(b"\0" * 100)
    assert_one_line_error(run_tool("ieconv", "kl-probes", "-q", *run), STATE_NAME)
    res = run_tool("ieconv", "kl-probes", "-q", *run, "--no-resume")  # a damaged record is discarded when asked
    assert res.returncode == 0, res.stderr


def test_two_runs_into_one_output_at_once_are_refused(whole, tmp_path):
    """The folder's writer lock: the second run is refused at once."""
    from iekit.formats.atomic import lock_directory

    _ref_out, im = whole
    out = tmp_path / "p.json"
    partial_dir(out).mkdir()
    fd = lock_directory(partial_dir(out))
    try:
        assert_one_line_error(run_tool("ieconv", "kl-probes", "-q", *ARGS, "--imatrix", im, "-o", out),
                              "another ieconv run is writing")
    finally:
        os.close(fd)


def test_golden_state_reads_and_writes_back_byte_identical(tmp_path):
    """golden/kl_probes_partial (tiny-llama, no imatrix, 2 chunks of 32,
    stopped after two groups): read, checked, written back the same."""
    golden = GOLDEN / "kl_probes_partial" / STATE_NAME
    obj = kl_probes_partial.from_json(json.loads(golden.read_text()), golden)
    assert obj["tokens"] == 30 and len(obj["groups"]) == 2 and obj["converted"] is not None
    assert dumps_canonical(obj) == golden.read_bytes()


@pytest.mark.parametrize("change, field", [
    ({"base_kl": None}, "tokens"),
    ({"base_kl": None, "tokens": None}, "base_kl"),
    ({"converted": None}, "converted"),
    ({"groups": {"lm_head.weight": -0.5}}, "groups.lm_head.weight"),
    ({"tokens": 0}, "tokens"),
    ({"converted": "xyz"}, "converted"),
    ({"extra": 1}, "(root)"),
])
def test_broken_rules_are_one_error_naming_the_field(tmp_path, change, field):
    golden = GOLDEN / "kl_probes_partial" / STATE_NAME
    with pytest.raises(FormatError) as e:
        kl_probes_partial.from_json({**json.loads(golden.read_text()), **change}, tmp_path / STATE_NAME)
    assert e.value.field == field


def test_quantize_goes_on_after_its_kl_probes_stage_was_killed(tmp_path):
    """The whole pipeline killed (SIGKILL to its process group: an
    out-of-memory kill, a reboot) while kl-probes ran: the next run keeps the
    stages before it, kl-probes resumes, and the artifact is an
    uninterrupted run's. (Before, the killed stage's randomly named work
    folder made the next run refuse the work directory.)"""
    args = ["quantize", "-q", "--hf-dir", str(HF), "--text-file", str(TEXT), "--target-bpw", "5.0", "--ctx", "32",
            "--chunks", "2", "--probe-chunks", "2", "--threads", "1"]
    res = run_tool("ieconv", *args, "--out-dir", tmp_path / "whole")
    assert res.returncode == 0, res.stderr
    work, out = tmp_path / "work", tmp_path / "o"
    state = partial_dir(work / "kl-probes.json") / STATE_NAME
    p = subprocess.Popen([str(BIN_DIR / "ieconv"), *args, "--out-dir", str(out), "--work-dir", str(work)],
                         stderr=subprocess.DEVNULL, start_new_session=True)
    while p.poll() is None and not (state.exists() and json.loads(state.read_text() or "{}").get("groups")):
        time.sleep(0.002)
    if p.poll() is not None:
        pytest.skip("the run ended before the kill")
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    elsewhere = tmp_path / "work2"  # the same kept work under stages that run again: a new reference
    shutil.copytree(work, elsewhere, symlinks=True)
    res = run_tool("ieconv", *args, "--out-dir", tmp_path / "o2", "--work-dir", elsewhere)
    assert res.returncode == 1 and "ref_dir differ)" in res.stderr and "pass --no-resume" in res.stderr
    res = run_tool("ieconv", *args, "--out-dir", tmp_path / "o2", "--work-dir", elsewhere, "--no-resume")
    assert res.returncode == 0 and "resuming" not in res.stderr, res.stderr
    assert (tmp_path / "o2" / "model.ie.bin").read_bytes() == (tmp_path / "whole" / "model.ie.bin").read_bytes()
    res = run_tool("ieconv", *args, "--out-dir", out, "--work-dir", work)
    assert res.returncode == 0, res.stderr
    assert "resuming: the two conversions and" in res.stderr and "imatrix: kept from an earlier run" in res.stderr
    for f in ("model.ie.bin", "model.ie.json"):
        assert (out / f).read_bytes() == (tmp_path / "whole" / f).read_bytes(), f
    assert not partial_dir(work / "kl-probes.json").exists()
