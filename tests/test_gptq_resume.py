"""``ieconv gptq`` resumes an interrupted run (formats/gptq_partial.py):
the matrices it finished are kept in OUT/.gptq-partial, the same command
goes on from them and writes the artifact an uninterrupted run writes, byte
for byte; other inputs, and a damaged or hostile directory, are one clear
line each."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time

import click
import numpy as np
import pytest

from conftest import BIN_DIR, GOLDEN, assert_one_line_error, run_tool
from iekit.formats import gptq_partial, iebin
from iekit.formats.errors import IEError
from iekit.formats.gptq_partial import PARTIAL_DIR, STATE_NAME
from iekit.formats.quant import SCHEMES
from test_quantize_imatrix import wide  # noqa: F401  (the fixture: a Llama whose matrices are 256-multiples)

TEXT = GOLDEN / "text" / "eval-sample.txt"
MATRICES = 15  # the wide model's 14 block matrices and its head


@pytest.fixture(scope="module")
def runs(wide, tmp_path_factory):
    """The manifest, the command line's arguments but --out-dir, and the
    artifact of an uninterrupted run, per mode."""
    root = tmp_path_factory.mktemp("resume")
    m = root / "q.json"
    assert run_tool("ieconv", "q4-manifest", "--hf-dir", wide["hf"], "-o", m, "--scheme", "q3_k", "--quantize-head",
                    "--imatrix", wide["imatrix"]).returncode == 0
    out = {}
    for mode in ("--no-sequential", "--sequential"):
        args = ("--hf-dir", wide["hf"], "--ref-dir", wide["f32"], "--q4-map", m, "--text-file", TEXT, "--ctx", "64",
                "--chunks", "4", "--threads", "2", mode)
        whole = root / mode.strip("-")
        res = run_tool("ieconv", "gptq", "-q", *args, "--out-dir", whole)
        assert res.returncode == 0, res.stderr
        assert not (whole / PARTIAL_DIR).exists()  # gone once the artifact is committed
        out[mode] = (args, whole)
    return m, out


@contextlib.contextmanager
def _ctrl_c_after(after: int, exc=KeyboardInterrupt):
    """Ctrl-C arriving as the ``after``-th matrix has been kept (deterministic,
    unlike a timed signal); the block must end in ``exc``."""
    put = gptq_partial.PartialRun.put
    count = {"n": 0}

    def put_then_interrupt(self, name, data, error):
        put(self, name, data, error)
        count["n"] += 1
        if count["n"] == after:
            raise KeyboardInterrupt

    gptq_partial.PartialRun.put = put_then_interrupt
    try:
        with pytest.raises(exc):
            yield
    finally:
        gptq_partial.PartialRun.put = put


def _interrupted(args, out_dir, after: int) -> None:
    """The command run in this process, interrupted after ``after`` matrices."""
    from iekit.convert.gptq_cli import gptq_cmd

    with _ctrl_c_after(after, click.exceptions.Abort):  # click's wrapping of the KeyboardInterrupt
        gptq_cmd.main([*map(str, args), "-q", "--out-dir", str(out_dir)], standalone_mode=False)
    assert not (out_dir / iebin.BIN_NAME).exists()  # nothing committed
    state = json.loads((out_dir / PARTIAL_DIR / STATE_NAME).read_text())
    assert len(state["matrices"]) == after


@pytest.mark.parametrize("mode", ["--no-sequential", "--sequential"])
@pytest.mark.parametrize("after", [2, 5, 7, 9])
def test_an_interrupted_run_resumes_to_the_same_bytes(runs, tmp_path, mode, after, capfd):
    """Interrupted inside layer 0's first slot (2: k_proj and q_proj kept,
    v_proj not), later in it (5: up of gate/up not kept), at its end (7), and
    inside layer 1 (9). With --sequential a kept matrix must not reach the
    model before the window that took its layer's covariances in the
    interrupted run: the resumed run takes them from the same windows."""
    _m, out = runs
    args, whole = out[mode]
    o = tmp_path / "o"
    _interrupted(args, o, after)
    assert f"{after} of {MATRICES} matrices are kept in {o / PARTIAL_DIR}: the same command goes on" in \
        capfd.readouterr().err
    res = run_tool("ieconv", "gptq", "-q", *args, "--out-dir", o)
    assert res.returncode == 0, res.stderr
    assert f"resuming: {after} of {MATRICES} matrices from {o / PARTIAL_DIR}" in res.stderr
    assert f"{MATRICES} error-compensated ({after} kept by the interrupted run)" in res.stderr
    for f in (iebin.BIN_NAME, iebin.META_NAME):
        assert (o / f).read_bytes() == (whole / f).read_bytes(), f
    assert not (o / PARTIAL_DIR).exists()
    if after == 7:  # the kept layer's covariances are not collected again: layer 1's pass and the head's
        assert ("2 passes)" if mode == "--sequential" else "1 pass)") in res.stderr


def test_a_real_ctrl_c_keeps_what_is_done(runs, tmp_path):
    """SIGINT to the command as a user's Ctrl-C: exit 130, one line saying
    what is kept; the next run finishes from it."""
    _m, out = runs
    args, whole = out["--sequential"]
    o = tmp_path / "o"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    for _attempt in range(3):  # the run is short: if it ends before the signal, run again with the signal sooner
        shutil.rmtree(o, ignore_errors=True)
        p = subprocess.Popen([str(BIN_DIR / "ieconv"), "gptq", "-q", *map(str, args), "--out-dir", str(o)],
                             stderr=subprocess.PIPE, text=True, env=env)
        state = o / PARTIAL_DIR / STATE_NAME
        while p.poll() is None and not (state.exists() and json.loads(state.read_text() or "{}").get("matrices")):
            time.sleep(0.005)
        p.send_signal(signal.SIGINT)
        err = p.communicate(timeout=120)[1]
        if p.returncode == 130:
            break
    assert p.returncode == 130, err
    kept = len(json.loads(state.read_text())["matrices"])
    assert 1 <= kept < MATRICES
    assert f"{kept} of {MATRICES} matrices are kept" in err and "Traceback" not in err
    res = run_tool("ieconv", "gptq", "-q", *args, "--out-dir", o)
    assert res.returncode == 0, res.stderr
    assert (o / iebin.BIN_NAME).read_bytes() == (whole / iebin.BIN_NAME).read_bytes()


def test_other_inputs_are_refused_naming_what_differs(runs, tmp_path):
    m, out = runs
    args, _whole = out["--no-sequential"]
    o = tmp_path / "o"
    _interrupted(args, o, 3)
    other = list(args)
    other[other.index("--chunks") + 1] = "3"
    res = run_tool("ieconv", "gptq", "-q", *other, "--out-dir", o)
    assert_one_line_error(res, "an interrupted gptq run of other inputs (calibration differ) kept 3 matrices here; "
                               "pass --no-resume")
    other = [a if a != "--no-sequential" else "--sequential" for a in args]
    assert_one_line_error(run_tool("ieconv", "gptq", "-q", *other, "--out-dir", o), "(sequential differ)")
    assert_one_line_error(run_tool("ieconv", "gptq", "-q", *args, "--no-refit-scales", "--out-dir", o),
                          "(refit_scales differ)")
    m2 = tmp_path / "q2.json"
    m2.write_text(m.read_text().replace('"q3_k"', '"q4_k"'))
    other = [a if a != m else m2 for a in args]
    assert_one_line_error(run_tool("ieconv", "gptq", "-q", *other, "--out-dir", o), "(q4_map differ)")
    assert len(json.loads((o / PARTIAL_DIR / STATE_NAME).read_text())["matrices"]) == 3  # untouched
    res = run_tool("ieconv", "gptq", "-q", *other, "--out-dir", o, "--no-resume")
    assert res.returncode == 0, res.stderr
    assert "resuming" not in res.stderr and not (o / PARTIAL_DIR).exists()
    assert {t["dtype"] for t in iebin.load_model(o).tensors if "quant" in t} == {"q4_k"}


def _state(o):
    return json.loads((o / PARTIAL_DIR / STATE_NAME).read_text())


def _first_payload(o):
    return o / PARTIAL_DIR / next(iter(_state(o)["matrices"].values()))["file"]


@pytest.mark.parametrize("damage, needle", [
    ("dir is a fifo", "is a FIFO (named pipe), where gptq keeps an interrupted run's matrices"),
    ("dir is a symlink", "is a symlink, where gptq keeps an interrupted run's matrices"),
    ("state wrong type", "progress.json: matrices"),
    ("state not json", "progress.json: (file): invalid JSON"),
    ("state is a fifo", "progress.json: (file): is a FIFO"),
    ("payload truncated", "the kept payload of model.layers.0"),
    ("payload is a fifo", "the kept payload of model.layers.0.self_attn.k_proj.weight is a FIFO"),
    ("payload changed", "does not match its record (sha256)"),
    ("payload renamed", "expected '"),
    ("subdirectory", "a directory inside"),
])
def test_a_damaged_partial_directory_is_one_line(runs, tmp_path, damage, needle):
    _m, out = runs
    args, _whole = out["--no-sequential"]
    o = tmp_path / "o"
    _interrupted(args, o, 2)
    d = o / PARTIAL_DIR
    if damage == "dir is a fifo":
        shutil.rmtree(d)
        os.mkfifo(d)
    elif damage == "dir is a symlink":
        shutil.move(d, tmp_path / "elsewhere")
        d.symlink_to(tmp_path / "elsewhere")
    elif damage == "state wrong type":
        s = _state(o)
        s["matrices"] = []
        (d / STATE_NAME).write_text(json.dumps(s))
    elif damage == "state not json":
        (d / STATE_NAME).write_text("{")
    elif damage == "state is a fifo":
        (d / STATE_NAME).unlink()
        os.mkfifo(d / STATE_NAME)
    elif damage == "payload truncated":
        p = _first_payload(o)
        p.write_bytes(p.read_bytes()[:-1])
    elif damage == "payload is a fifo":
        s = _state(o)
        name = "model.layers.0.self_attn.k_proj.weight"
        p = d / s["matrices"][name]["file"]
        p.unlink()
        os.mkfifo(p)
    elif damage == "payload changed":
        p = _first_payload(o)
        b = bytearray(p.read_bytes())
        b[7] ^= 1
        p.write_bytes(bytes(b))
    elif damage == "payload renamed":
        s = _state(o)
        rec = next(iter(s["matrices"].values()))
        rec["file"] = "0" * 24 + ".bin"
        (d / STATE_NAME).write_text(json.dumps(s))
    else:
        (d / "sub").mkdir()
    res = run_tool("ieconv", "gptq", "-q", *args, "--out-dir", o, timeout=120)
    assert_one_line_error(res, needle)
    assert not (o / iebin.BIN_NAME).exists()


@pytest.mark.parametrize("resume", ["--resume", "--no-resume"])
def test_a_file_gptq_did_not_write_is_refused_never_removed(runs, tmp_path, resume):
    _m, out = runs
    args, _whole = out["--no-sequential"]
    o = tmp_path / "o"
    _interrupted(args, o, 2)
    mine = o / PARTIAL_DIR / "notes.txt"
    mine.write_text("mine")
    res = run_tool("ieconv", "gptq", "-q", *args, "--out-dir", o, resume)
    assert_one_line_error(res, f"{mine}: a file inside {o / PARTIAL_DIR} that gptq did not write; move it away")
    assert mine.read_text() == "mine" and len(_state(o)["matrices"]) == 2


def test_a_payload_without_a_record_is_dropped(runs, tmp_path):
    """A kill between a payload's rename and its record: the payload is not
    kept (a record is what keeps it), and the next run removes it."""
    _m, out = runs
    args, whole = out["--no-sequential"]
    o = tmp_path / "o"
    _interrupted(args, o, 2)
    stray = o / PARTIAL_DIR / ("f" * 24 + ".bin")
    stray.write_bytes(b"half")
    res = run_tool("ieconv", "gptq", "-q", *args, "--out-dir", o)
    assert res.returncode == 0, res.stderr
    assert (o / iebin.BIN_NAME).read_bytes() == (whole / iebin.BIN_NAME).read_bytes()
    assert not (o / PARTIAL_DIR).exists()


@pytest.mark.parametrize("sel", [{"scheme": "q3_k"}, {"scheme": "q4_k"}, {"scheme": "iq4_xs"}, {"scheme": "iq3_s"},
                                 {"scheme": "q2_k"}, {"scheme": "q4_0"}, {"scheme": "mxfp4"},
                                 {"scheme": "int4w", "group_size": 64, "symmetric": False, "scale_dtype": "f16"}])
def test_a_kept_payload_dequantizes_as_its_rows_did(sel):
    """A sequential run hands the next layers a kept matrix's values from its
    payload (_add_kept): they must be the values the rows gave when made."""
    from iekit.formats.q4_manifest import selection_params

    scheme = SCHEMES[sel["scheme"]]
    p = selection_params(sel)
    w = np.random.default_rng(3).standard_normal((24, 512)).astype(np.float32)
    qr = scheme.quantize_rows(w, p)
    data = b"".join(x.tobytes() for x in scheme.payload(qr))
    from_rows = scheme.dequantize_rows(qr, 512, p)
    from_payload = scheme.dequantize(np.frombuffer(data, np.uint8), 24, 512, p)
    assert np.array_equal(from_rows, from_payload.reshape(24, 512))


def test_golden_partial_directory_reads_and_writes_back_byte_identical(tmp_path):
    """golden/gptq_partial (tiny-llama, q4_0, interrupted after two matrices):
    read with its own inputs, every payload checked, written back the same."""
    golden = GOLDEN / "gptq_partial"
    shutil.copytree(golden, tmp_path / PARTIAL_DIR)
    state = json.loads((golden / STATE_NAME).read_text())
    pr = gptq_partial.PartialRun(tmp_path, state["inputs"])
    assert sorted(pr.done) == ["model.layers.0.self_attn.k_proj.weight", "model.layers.0.self_attn.q_proj.weight"]
    data, err = pr.get("model.layers.0.self_attn.q_proj.weight")
    assert len(data) == 2304 == SCHEMES["q4_0"].nbytes(64, 64, None) and err.compensated and err.weighted
    pr.begin()
    pr._write_state()
    assert (tmp_path / PARTIAL_DIR / STATE_NAME).read_bytes() == (golden / STATE_NAME).read_bytes()


def test_partial_state_round_trips(tmp_path):
    """progress.json written, read by a new run of the same inputs, and
    written again: byte-identical; a loss that is not finite is not kept."""
    from iekit.formats.quant import QuantError

    inputs = {"checkpoint": "a" * 64, "calibration": "b" * 64, "sequential": False}
    pr = gptq_partial.PartialRun(tmp_path, inputs)
    pr.begin()
    pr.put("model.layers.0.mlp.down_proj.weight", b"\x01\x02\x03", QuantError(True, 0.1 + 0.2, 3.0, True))
    pr.put("lm_head.weight", b"\x04", QuantError(True, float("nan"), 1.0, True))
    first = (tmp_path / PARTIAL_DIR / STATE_NAME).read_bytes()
    again = gptq_partial.PartialRun(tmp_path, inputs)
    assert list(again.done) == ["model.layers.0.mlp.down_proj.weight"]
    data, err = again.get("model.layers.0.mlp.down_proj.weight")
    assert data == b"\x01\x02\x03" and err == QuantError(True, 0.1 + 0.2, 3.0, True)  # exact, not 6 digits
    again.begin()
    again._write_state()
    assert (tmp_path / PARTIAL_DIR / STATE_NAME).read_bytes() == first
    with pytest.raises(IEError, match=r"other inputs \(sequential, x differ\) kept 1 matrices"):
        gptq_partial.PartialRun(tmp_path, {**inputs, "sequential": True, "x": 1})
    again.finish()
    assert not (tmp_path / PARTIAL_DIR).exists()


@pytest.mark.parametrize("after", [1, 5, 8])
def test_windows_split_by_the_budget_resume_the_same(runs, wide, tmp_path, after):
    """At Llama-3-8B's shapes a down_proj covariance is a window of its own
    (1.6 GB of the 1 GiB budget), so with --sequential its window sees its
    layer's other matrices quantized. A budget of one slot per window here:
    resumed inside such a layer, the artifact is the uninterrupted one's."""
    from iekit.convert import hf_to_iebin
    from iekit.formats import expert_stacks, hf_checkpoint
    from iekit.formats.q4_manifest import load_manifest, plan
    from iekit.runtime.decoder import Decoder
    from iekit.runtime.hessians import Hessians

    m, _out = runs
    manifest, src = load_manifest(m), hf_checkpoint.from_dir(wide["hf"])
    names = list(plan(manifest, expert_stacks.shapes_as_written(src)).quantize)
    dec = Decoder(wide["f32"], act="f32", ctx=64)
    ids = dec.encode(TEXT.read_text())[:192]
    parts = [ids[i:i + 64] for i in range(0, 192, 64)]

    def run(out, partial=None):
        d = Decoder(wide["f32"], act="f32", ctx=64)  # a fresh model: sequential runs swap quantized matrices in
        cov = Hessians(d, parts, names, budget=1, sequential=True, kept=set(partial.done) if partial else set())
        return hf_to_iebin.convert(src, out, manifest=manifest, covariances=cov, partial=partial)

    run(tmp_path / "whole")
    inputs = {"x": "y"}
    with _ctrl_c_after(after):
        run(tmp_path / "o", gptq_partial.PartialRun(tmp_path / "o", inputs))
    partial = gptq_partial.PartialRun(tmp_path / "o", inputs)
    assert len(partial.done) == after
    res = run(tmp_path / "o", partial)
    assert sum(e.compensated for e in res.errors.values()) == MATRICES
    assert (tmp_path / "o" / iebin.BIN_NAME).read_bytes() == (tmp_path / "whole" / iebin.BIN_NAME).read_bytes()


def test_factors_run_on_one_blas_thread(runs, tmp_path, monkeypatch):
    """OpenBLAS's results depend on its thread count, and a map's one-thread
    limit is process-wide: a factor taken while a map ran got one thread,
    otherwise every one, so a run's codes depended on timing (a resumed run
    differed from an uninterrupted one under load). Every factor gptq takes
    now runs on one BLAS thread (formats/workers.py, one_blas_thread)."""
    from threadpoolctl import threadpool_info, threadpool_limits

    from iekit.convert.gptq_cli import gptq_cmd
    from iekit.formats import gptq

    seen, real = [], gptq.inverse_factor

    def spy(h, *a, **k):
        seen.append({i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"})
        return real(h, *a, **k)

    monkeypatch.setattr(gptq, "inverse_factor", spy)
    args, _whole = runs[1]["--no-sequential"]
    with threadpool_limits(2, user_api="blas"):  # as a 2-CPU machine runs it, even where this one has one CPU
        gptq_cmd.main([*map(str, args), "-q", "--out-dir", str(tmp_path / "q")], standalone_mode=False)
    assert len(seen) >= 4 and all(s == {1} for s in seen), seen


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to compare with one")
@pytest.mark.parametrize("mode", ["--no-sequential", "--sequential"])
def test_one_cpu_gives_the_bytes_of_two(runs, tmp_path, mode):
    """Rows are compensated in chunks sized by the CPUs the process may use
    (gptq.chunk_rows: a 256-row matrix in chunks of 128 on one CPU, of 64
    on two), every
    product on one BLAS thread: a row's values do not depend on how many
    rows share its product, so a run resumed on a machine with other CPUs
    still gives the uninterrupted run's bytes."""
    args, whole = runs[1][mode]
    one = {min(os.sched_getaffinity(0))}
    res = subprocess.run([str(BIN_DIR / "ieconv"), "gptq", "-q", *map(str, args), "--out-dir", str(tmp_path / "q")],
                         capture_output=True, text=True, preexec_fn=lambda: os.sched_setaffinity(0, one))
    assert res.returncode == 0, res.stderr
    for name in (iebin.META_NAME, iebin.BIN_NAME):
        assert (tmp_path / "q" / name).read_bytes() == (whole / name).read_bytes(), name
