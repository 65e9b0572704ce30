"""``ieconv quantize``: the calibrated pipeline in one command. Its artifact
is byte for byte what the documented commands typed one after another
write; run again it keeps the stages that finished (formats/
quantize_stages.py) and goes on from the first that did not, after a
failed stage or a Ctrl-C in the middle of gptq; a hostile work directory
or record is one clear line."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections import Counter

import pytest

from conftest import BIN_DIR, GOLDEN, assert_one_line_error, run_tool
from llamacpp_models import llamacpp_models
from iekit.formats import iebin
from iekit.formats.errors import IEError
from iekit.formats.quantize_stages import STATE_NAME, StageLog, encode
from test_quantize_imatrix import wide  # noqa: F401  (the fixture: a Llama whose matrices are 256-multiples)

TEXT = GOLDEN / "text" / "eval-sample.txt"
# small enough for a test: 4 chunks of 64 tokens, probes scoring one
FAST = ("--text-file", TEXT, "--ctx", "64", "--chunks", "4", "--probe-chunks", "1", "--threads", "1")
STAGES = ["reference (f32)", "imatrix", "kl-probes", "kl-probes (3-4 bits)", "policy", "gptq"]


def _quantize(hf, out, *extra):
    return run_tool("ieconv", "quantize", "-q", "--hf-dir", hf, "--out-dir", out, *FAST, *extra)


def _stage_lines(res) -> list[str]:
    return [ln for ln in res.stderr.splitlines() if ln.startswith("[")]


@pytest.fixture(scope="module")
def whole(wide, tmp_path_factory):
    """One uninterrupted run at 4.0 bits with a --work-dir kept: (out, work)."""
    root = tmp_path_factory.mktemp("quantize")
    out, work = root / "out", root / "work"
    res = _quantize(wide["hf"], out, "--target-bpw", "4.0", "--work-dir", work)
    assert res.returncode == 0, res.stderr
    assert [ln.split(":")[0] for ln in _stage_lines(res)] == [f"[{i + 1}/6] {s}" for i, s in enumerate(STAGES)]
    return out, work


def test_the_pipeline_is_the_documented_commands(wide, whole, tmp_path):
    """The same artifact, byte for byte, as the README's commands typed by hand."""
    out, _work = whole
    hf, t = wide["hf"], ["--text-file", TEXT, "--ctx", "64", "--threads", "1"]
    ref, im, kl, kl_low, man, q = (tmp_path / n for n in ("ref", "im.npz", "kl.json", "kl-low.json", "q.json", "q"))
    for cmd in (["hf-to-iebin", "--hf-dir", hf, "--out-dir", ref],
                ["imatrix", "--model-dir", ref, *t, "--chunks", "4", "-o", im],
                ["kl-probes", "--hf-dir", hf, "--ref-dir", ref, *t, "--imatrix", im, "--chunks", "1", "-o", kl],
                ["kl-probes", "--hf-dir", hf, "--ref-dir", ref, *t, "--imatrix", im, "--chunks", "1",
                 "--base", "iq4_nl", "--probe", "iq3_s", "-o", kl_low],
                ["q4-manifest", "--hf-dir", hf, "--target-bpw", "4.0", "--quantize-head", "--imatrix", im,
                 "--kl-probes", kl, "--kl-probes", kl_low, "--ref-dir", ref, *t, "--chunks", "4", "-o", man],
                ["gptq", "--hf-dir", hf, "--ref-dir", ref, "--q4-map", man, *t, "--chunks", "4", "--out-dir", q]):
        res = run_tool("ieconv", *cmd)
        assert res.returncode == 0, (cmd[0], res.stderr)
    for name in (iebin.META_NAME, iebin.BIN_NAME):
        assert (out / name).read_bytes() == (q / name).read_bytes(), name
    assert not (out / ".quantize").exists()  # a --work-dir was given: nothing in the output directory


def test_rerun_keeps_finished_stages_and_another_budget_reuses_them(wide, whole, tmp_path):
    out, work = whole
    before = (out / iebin.BIN_NAME).stat().st_mtime_ns
    res = _quantize(wide["hf"], out, "--target-bpw", "4.0", "--work-dir", work)
    assert res.returncode == 0, res.stderr
    assert all("kept from an earlier run" in ln for ln in _stage_lines(res))
    assert (out / iebin.BIN_NAME).stat().st_mtime_ns == before
    # another budget: the reference, imatrix and probes are kept, the policy and gptq run (into a new --out-dir)
    other = tmp_path / "out-4.25"
    res = _quantize(wide["hf"], other, "--target-bpw", "4.25", "--work-dir", work)
    assert res.returncode == 0, res.stderr
    lines = _stage_lines(res)
    assert ["kept from an earlier run" in ln for ln in lines] == [True] * 4 + [False] * 2
    assert 4.0 < json.loads((work / "q4_manifest.json").read_text())["bits_per_weight"] <= 4.25
    # the policy measured nothing (the 4.0-bit run's errors, in WORK/measurements.json), and chose as if it had
    assert "15 of 15 matrices measured before (of the same inputs)" in res.stderr
    by_hand = tmp_path / "q.json"
    res = run_tool("ieconv", "q4-manifest", "--hf-dir", wide["hf"], "--target-bpw", "4.25", "--quantize-head",
                   "--imatrix", work / "imatrix.npz", "--kl-probes", work / "kl-probes.json", "--kl-probes",
                   work / "kl-probes-low.json", "--ref-dir", work / "ref", "--text-file", TEXT, "--ctx", "64",
                   "--chunks", "4", "--threads", "1", "-o", by_hand)
    assert res.returncode == 0, res.stderr
    assert json.loads(by_hand.read_text())["tensors"] == json.loads((work / "q4_manifest.json").read_text())["tensors"]
    # the record now ends with the 4.25-bit policy: the 4.0-bit run's gptq is no longer kept
    stages = json.loads((work / STATE_NAME).read_text())["stages"]
    assert [s["name"] for s in stages] == STAGES and "4.25" in stages[4]["argv"]


def test_gguf_split_is_a_stage_kept_by_its_files(wide, tmp_path):
    """--gguf q.gguf --split-max-size: the export stage writes gguf-split's
    files (those the artifact's tensors decide), which import to the
    artifact; run again, the stage is kept, as long as its files are there
    (one gone, the others are replaced only with --overwrite)."""
    out, work, gguf = tmp_path / "out", tmp_path / "work", tmp_path / "q.gguf"
    args = ("--target-bpw", "4.5", "--no-kl-probes", "--work-dir", work, "--gguf", gguf, "--split-max-size", "300K")
    res = _quantize(wide["hf"], out, *args)
    assert res.returncode == 0, res.stderr
    files = sorted(tmp_path.glob("q-*-of-*.gguf"))
    assert len(files) > 2 and not gguf.exists()
    assert [ln.split(":")[0] for ln in _stage_lines(res)] == \
        [f"[{i + 1}/5] {s}" for i, s in enumerate(["reference (f32)", "imatrix", "policy", "gptq", "gguf"])]
    assert f"{files[0].name} ({len(files)} files)" in res.stderr
    res = run_tool("ieconv", "gguf-to-iebin", "-q", "--gguf", files[0], "--out-dir", tmp_path / "back")
    assert res.returncode == 0, res.stderr
    again = _quantize(wide["hf"], out, *args)
    assert again.returncode == 0, again.stderr
    assert all("kept from an earlier run" in ln for ln in _stage_lines(again))
    files[-1].unlink()  # the stage is not kept; its other files are not replaced unasked
    assert_one_line_error(_quantize(wide["hf"], out, *args), str(files[0]), "--overwrite")
    again = _quantize(wide["hf"], out, *args, "--overwrite")
    assert again.returncode == 0, again.stderr
    assert ["kept from an earlier run" in ln for ln in _stage_lines(again)] == [True] * 4 + [False]
    assert files[-1].exists()
    res = run_tool("ieconv", "quantize", "--hf-dir", wide["hf"], "--out-dir", tmp_path / "x", *FAST, "--target-bpw",
                   "4", "--split-max-size", "1G")
    assert res.returncode == 2 and "give --gguf too" in res.stderr


def test_failed_stage_keeps_the_ones_before_it(wide, tmp_path):
    """A budget the shapes cannot meet fails in the policy stage: one last line
    naming it, exit 1, the stages before it recorded for the next run."""
    w2 = tmp_path / "work"
    res = _quantize(wide["hf"], tmp_path / "out", "--target-bpw", "1.0", "--work-dir", w2)
    assert res.returncode == 1, res.stderr
    assert res.stderr.strip().splitlines()[-1].startswith("error: stage policy: ieconv q4-manifest failed (exit 1")
    assert "Traceback" not in res.stderr
    assert not (tmp_path / "out" / iebin.META_NAME).exists()
    assert [s["name"] for s in json.loads((w2 / STATE_NAME).read_text())["stages"]] == STAGES[:4]
    res = _quantize(wide["hf"], tmp_path / "out", "--target-bpw", "4.0", "--work-dir", w2)
    assert res.returncode == 0, res.stderr
    assert ["kept from an earlier run" in ln for ln in _stage_lines(res)] == [True] * 4 + [False] * 2


def _kept_matrices(out) -> int:
    try:
        return len(json.loads((out / ".gptq-partial" / "progress.json").read_bytes())["matrices"])
    except (OSError, ValueError):  # not there yet
        return 0


def test_ctrl_c_as_the_stage_ends_is_an_interrupt_not_an_error():
    """Ctrl-C raised just after wait4 reaped the stage (it stopped at once):
    letting it finish is nothing to do, not 'No child processes'."""
    from iekit.convert.quantize_cli import _let_finish

    pid = os.posix_spawn("/bin/true", ["true"], os.environ)
    os.waitpid(pid, 0)
    t0 = time.monotonic()
    _let_finish(pid)  # raised ChildProcessError before
    assert time.monotonic() - t0 < 1


def test_ctrl_c_in_gptq_resumes_to_the_same_bytes(wide, whole, tmp_path):
    """Ctrl-C (SIGINT to the process group, as a terminal sends it) once gptq
    has kept a matrix: exit 130; the same command keeps the stages before,
    gptq resumes, and the artifact is the uninterrupted run's. Without
    --work-dir the work directory is OUT/.quantize, removed at the end."""
    out_ref, _work = whole
    out = tmp_path / "out"
    argv = [str(BIN_DIR / "ieconv"), "quantize", "-q", "--hf-dir", str(wide["hf"]), "--out-dir", str(out),
            *map(str, FAST), "--target-bpw", "4.0"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 240
    while not _kept_matrices(out) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert proc.poll() is None, proc.communicate()
    os.killpg(proc.pid, signal.SIGINT)
    _stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    assert not (out / iebin.META_NAME).exists()
    res = _quantize(wide["hf"], out, "--target-bpw", "4.0")
    assert res.returncode == 0, res.stderr
    assert ["kept from an earlier run" in ln for ln in _stage_lines(res)] == [True] * 5 + [False]
    assert "resuming:" in res.stderr
    assert (out / iebin.BIN_NAME).read_bytes() == (out_ref / iebin.BIN_NAME).read_bytes()
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == []  # work directory gone


def test_existing_artifact_is_refused_before_any_stage(wide, whole):
    out, _work = whole
    res = _quantize(wide["hf"], out, "--target-bpw", "4.5", "--no-kl-probes")
    assert_one_line_error(res, f"{out / iebin.META_NAME}: exists; pass --overwrite to replace it")
    assert not (out / ".quantize").exists()


@pytest.mark.parametrize("case", ["fifo", "symlink", "foreign", "record-garbage", "record-types", "record-fifo"])
def test_hostile_work_directory(wide, tmp_path, case):
    work, out = tmp_path / "work", tmp_path / "out"
    where = ["--work-dir", work]
    if case == "fifo":
        os.mkfifo(work)
    elif case == "symlink":  # the default work directory, whose files are removed at the end, is never followed
        (tmp_path / "elsewhere").mkdir()
        out.mkdir()
        (out / ".quantize").symlink_to(tmp_path / "elsewhere")
        where = []
    else:
        work.mkdir()
        if case == "foreign":
            (work / "notes.txt").write_text("mine")
        elif case == "record-garbage":
            (work / STATE_NAME).write_bytes(b"{not json")
        elif case == "record-types":
            (work / STATE_NAME).write_text(json.dumps({"format": "iekit-quantize-stages", "version": 1,
                                                       "inputs": {}, "stages": [{"name": "x", "argv": "imatrix"}]}))
        else:
            os.mkfifo(work / STATE_NAME)
    res = _quantize(wide["hf"], out, "--target-bpw", "4.0", *where)
    needle = {"fifo": "is a FIFO", "symlink": "is a symlink", "foreign": "notes.txt: inside the work directory",
              "record-garbage": STATE_NAME, "record-types": "stages[0]", "record-fifo": "is a FIFO"}[case]
    assert_one_line_error(res, needle)
    assert not (out / iebin.META_NAME).exists()
    if case == "foreign":
        assert (work / "notes.txt").read_text() == "mine"


def _gguf_of(model_dir, out, scheme=None):
    """The artifact at ``model_dir`` as a GGUF: its float blocks, or each
    matrix quantized to ``scheme`` (q4-manifest and gguf-to-iebin of that)."""
    res = run_tool("ieconv", "iebin-to-gguf", "--model-dir", model_dir, "--out", out)
    assert res.returncode == 0, res.stderr
    if scheme is None:
        return out
    man, q = out.with_suffix(".json"), out.with_suffix(".q")
    assert run_tool("ieconv", "q4-manifest", "--gguf", out, "-o", man, "--scheme", scheme).returncode == 0
    assert run_tool("ieconv", "gguf-to-iebin", "-q", "--gguf", out, "--q4-map", man, "--out-dir", q).returncode == 0
    out.unlink()
    return _gguf_of(q, out)


def test_from_gguf_quantizes_the_checkpoint_it_holds(wide, whole, tmp_path):
    """The model as an F32 GGUF (what convert_hf_to_gguf.py writes, here
    iebin-to-gguf of the float artifact): a first stage writes it as an HF
    checkpoint, and the artifact is byte for byte the --hf-dir run's. Run
    again, every stage is kept, the checkpoint's too."""
    out, _work = whole
    gguf = _gguf_of(wide["f32"], tmp_path / "m-f32.gguf")
    q, work = tmp_path / "q", tmp_path / "work"
    res = run_tool("ieconv", "quantize", "-q", "--from-gguf", gguf, "--out-dir", q, *FAST, "--target-bpw", "4.0",
                   "--work-dir", work)
    assert res.returncode == 0, res.stderr
    assert [ln.split(":")[0] for ln in _stage_lines(res)] == \
        ["[1] checkpoint", *(f"[{i + 2}/7] {s}" for i, s in enumerate(STAGES))]
    assert f"ieconv gguf-to-hf --gguf {gguf} --out-dir {work / 'hf'}" in res.stderr
    assert (q / iebin.BIN_NAME).read_bytes() == (out / iebin.BIN_NAME).read_bytes()
    res = run_tool("ieconv", "quantize", "-q", "--from-gguf", gguf, "--out-dir", q, *FAST, "--target-bpw", "4.0",
                   "--work-dir", work)
    assert res.returncode == 0, res.stderr
    lines = _stage_lines(res)
    assert len(lines) == 7 and all("kept from an earlier run" in ln for ln in lines), lines


def test_quantized_gguf_is_requantized_only_when_asked(wide, tmp_path):
    gguf = _gguf_of(wide["f32"], tmp_path / "m-q4_k.gguf", "q4_k")
    q = tmp_path / "q"
    args = ("ieconv", "quantize", "-q", "--from-gguf", gguf, "--out-dir", q, *FAST, "--target-bpw", "4.5",
            "--no-kl-probes")
    assert_one_line_error(run_tool(*args), f"{gguf}: tensor 'blk.0.", "is Q4_K", "--allow-requantize")
    assert not q.exists()
    res = run_tool(*args, "--allow-requantize")
    assert res.returncode == 0, res.stderr
    assert run_tool("ierun", "generate", "--model-dir", q, "--ids", "3,17", "--max-new", "2").returncode == 0
    assert not (q / ".quantize").exists()


def test_from_gguf_refusals(wide, tmp_path):
    gguf, q = _gguf_of(wide["f32"], tmp_path / "m.gguf"), tmp_path / "q"
    base = ("ieconv", "quantize", "--out-dir", q, *FAST, "--target-bpw", "4")
    for extra, needle in ((["--from-gguf", gguf, "--hf-dir", wide["hf"]], "--hf-dir or --from-gguf"),
                          ([], "--hf-dir or --from-gguf"),
                          (["--hf-dir", wide["hf"], "--allow-requantize"], "--allow-requantize")):
        res = run_tool(*base, *extra)
        assert res.returncode == 2 and needle in res.stderr, res.stderr
    assert_one_line_error(run_tool(*base, "--from-gguf", gguf, "--gguf", gguf, "--overwrite"),
                          "--gguf would replace the --from-gguf file")
    os.mkfifo(tmp_path / "fifo.gguf")
    assert_one_line_error(run_tool(*base, "--from-gguf", tmp_path / "fifo.gguf"), "fifo.gguf", "FIFO")
    oss = llamacpp_models(tmp_path / "toys")["tiny-gpt-oss"]  # gguf-to-hf does not write its HF layout
    assert_one_line_error(run_tool(*base, "--from-gguf", _gguf_of(oss, tmp_path / "oss.gguf")),
                          "general.architecture", "gpt_oss", "give its HF checkpoint as --hf-dir")
    assert not q.exists()


def test_rotate_is_ieconv_rotate_then_the_pipeline(wide, tmp_path):
    """--rotate: a stage before the plan rotates the checkpoint (ieconv
    rotate, the seed given), every later stage reads the rotated one: the
    artifact is byte for byte rotate typed by hand, then quantize."""
    rot, fast = tmp_path / "rot", (*FAST, "--target-bpw", "4.0", "--no-kl-probes")
    assert run_tool("ieconv", "rotate", "-q", "--hf-dir", wide["hf"], "--out-dir", rot, "--seed", "5").returncode == 0
    assert run_tool("ieconv", "quantize", "-q", "--hf-dir", rot, "--out-dir", tmp_path / "by-hand", *fast).returncode == 0
    args = ("ieconv", "quantize", "-q", "--hf-dir", wide["hf"], "--rotate", "5", "--out-dir", tmp_path / "q", *fast,
            "--work-dir", tmp_path / "work")
    res = run_tool(*args)
    assert res.returncode == 0, res.stderr
    assert [ln.split(":")[0] for ln in _stage_lines(res)] == \
        ["[1] rotate", *(f"[{i + 2}/5] {s}" for i, s in enumerate(("reference (f32)", "imatrix", "policy", "gptq")))]
    assert f"--out-dir {tmp_path / 'work' / 'rotated'} --seed 5" in res.stderr
    assert (tmp_path / "q" / iebin.BIN_NAME).read_bytes() == (tmp_path / "by-hand" / iebin.BIN_NAME).read_bytes()
    res = run_tool(*args)
    assert res.returncode == 0 and all("kept from an earlier run" in ln for ln in _stage_lines(res)), res.stderr
    res = run_tool(*args[:-2], "--ref-dir", wide["f32"])  # a reference of the unrotated model: not for its covariances
    assert res.returncode == 2 and "--rotate makes the reference" in res.stderr


def test_eval_text_scores_the_artifact(wide, tmp_path):
    """--eval-text: a last stage scores the artifact against the reference
    (ierun eval, as typed by hand gives the same figures); kept on a rerun,
    run again alone when the text changes."""
    held = tmp_path / "held.txt"
    held.write_text("\n".join(reversed(TEXT.read_text().splitlines())))
    q, work = tmp_path / "q", tmp_path / "work"
    args = ("ieconv", "quantize", "-q", "--hf-dir", wide["hf"], "--out-dir", q, *FAST, "--target-bpw", "4.0",
            "--work-dir", work, "--eval-text", held)
    res = run_tool(*args)
    assert res.returncode == 0, res.stderr
    lines = _stage_lines(res)
    assert lines[-1].startswith("[7/7] eval: ierun eval --model-dir"), lines
    by_hand = run_tool("ierun", "eval", "--model-dir", q, "--ref-dir", work / "ref", "--text-file", held, "--ctx", "64",
                       "--threads", "1", "--json")
    assert by_hand.returncode == 0, by_hand.stderr
    want, got = json.loads(by_hand.stdout), json.loads((work / "eval.json").read_text())
    for k in ("kld_mean", "top1_agree", "ppl", "ppl_ref", "tokens_scored"):
        assert got[k] == want[k], k
    summary = (f"scored on held.txt ({want['tokens_scored']} tokens, act int8): KL {want['kld_mean']:.4f} ± "
               f"{want['kld_se']:.4f}, top-1 {want['top1_agree']:.1%}")
    assert summary in res.stderr
    # the summary's mix line says what the policy chose (its manifest: the budget's own arithmetic)
    man = json.loads((work / "q4_manifest.json").read_text())
    mix = [ln for ln in res.stderr.splitlines() if ln.startswith(f"{q}: ")]
    got = re.search(r"; ([0-9.]+) bits per weight over (\d+) quantized tensors: (.*)$", mix[0]) if len(mix) == 1 else None
    assert got, res.stderr
    assert float(got[1]) == pytest.approx(man["bits_per_weight"], abs=6e-4)
    assert int(got[2]) == len(man["tensors"])
    assert dict((k, int(n)) for n, k in (t.split() for t in got[3].split(", "))) == \
        dict(Counter(sel["scheme"] for sel in man["tensors"].values()))
    res = run_tool(*args)
    assert res.returncode == 0 and all("kept from an earlier run" in ln for ln in _stage_lines(res)), res.stderr
    assert summary in res.stderr  # from the kept stage's file
    st = held.stat()
    os.utime(held, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # the text edited: it is scored again, alone
    res = run_tool(*args)
    assert res.returncode == 0, res.stderr
    lines = _stage_lines(res)
    assert all("kept" in ln for ln in lines[:-1]) and lines[-1].startswith("[7/7] eval: ierun eval"), lines
    ev = work / "eval.json"  # garbage with the kept file's size and time: one line, not a traceback
    st = ev.stat()
    ev.write_bytes(b"x" * st.st_size)
    os.utime(ev, ns=(st.st_atime_ns, st.st_mtime_ns))
    res = run_tool(*args)
    assert res.returncode == 1 and "eval.json: not ierun eval's JSON line" in res.stderr.splitlines()[-1], res.stderr
    assert "Traceback" not in res.stderr


def test_eval_text_refusals(wide, tmp_path):
    base = ("ieconv", "quantize", "--out-dir", tmp_path / "q", *FAST, "--target-bpw", "4")
    res = run_tool(*base, "--hf-dir", tmp_path / "missing", "--eval-text", TEXT)  # the calibration text: warned
    assert res.returncode == 1 and "is also the calibration text" in res.stderr, res.stderr
    os.mkfifo(tmp_path / "held.txt")
    assert_one_line_error(run_tool(*base, "--hf-dir", wide["hf"], "--eval-text", tmp_path / "held.txt"), "held.txt",
                          "FIFO")
    assert not (tmp_path / "q").exists()


def test_calibration_text_is_required_once(wide, tmp_path):
    res = run_tool("ieconv", "quantize", "--hf-dir", wide["hf"], "--out-dir", tmp_path / "o", "--target-bpw", "4")
    assert res.returncode == 2 and "--text-file or --ids-file" in res.stderr


def test_golden_record_reads_and_writes_back_byte_identical(tmp_path):
    """golden/quantize_stages/stages.json (a real run's record, its paths
    made generic): read with its own inputs and written back the same; with
    other inputs nothing is kept."""
    golden = (GOLDEN / "quantize_stages" / STATE_NAME).read_bytes()
    (tmp_path / STATE_NAME).write_bytes(golden)
    inputs = json.loads(golden)["inputs"]
    log = StageLog(tmp_path, inputs)
    assert [f.name for f in log.finished] == STAGES and not log.inputs_changed
    assert encode(log.inputs, log.finished) == golden
    other = StageLog(tmp_path, {**inputs, "calibration": "0" * 64})
    assert other.inputs_changed and other.finished == []
    # outputs that are not there (or not as the stage left them) keep nothing
    planned = [(f.name, f.argv, [tmp_path / "missing"]) for f in log.finished]
    assert log.keep_prefix(planned) == 0


def test_record_schema_refusal_names_the_field(tmp_path):
    doc = json.loads((GOLDEN / "quantize_stages" / STATE_NAME).read_text())
    doc["stages"][1]["peak_rss_bytes"] = -1
    (tmp_path / STATE_NAME).write_text(json.dumps(doc))
    with pytest.raises(IEError, match=r"stages\[1\]\.peak_rss_bytes"):
        StageLog(tmp_path, doc["inputs"])
