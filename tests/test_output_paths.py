"""Where outputs land: concurrent writers, paths that are not regular files,
and writes that fail half-way (issue 45, items 1, 4 and 5).

The promises (docs/security.md, "Output paths"): two runs writing one
artifact directory never leave a mix of both — one is refused, at once
when it overlaps the other (a lock on the directory) or at its commit when
the other finished first (no-replace rename); an output path that exists
and is not a regular file (FIFO, device node, symlink) is refused even
with --overwrite; a failed write removes its staging file and names the
user's file.
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
from pathlib import Path

import pytest

from conftest import BIN_DIR, GOLDEN_HF, GOLDEN_IEBIN, assert_one_line_error, run_tool
from iekit.convert.artifact_out import Progress
from iekit.convert.hf_to_iebin import convert
from iekit.formats import iebin
from iekit.formats.atomic import StagedFiles
from iekit.formats.errors import IEError
from iekit.formats.hf_checkpoint import from_dir
from iekit.formats.jsonio import load_json

LLAMA = GOLDEN_HF / "tiny-llama"
QWEN2 = GOLDEN_HF / "tiny-qwen2"


def _entries(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir())


# ------------------------------------------------------------ 1: two writers, one directory

def test_two_conversions_into_one_new_out_dir_never_mix(tmp_path):
    """Started together into the same new directory: exactly one succeeds
    and the directory is that model, whole (the old code let both exit 0,
    leaving one model's weights beside the other's tokenizer files)."""
    out = tmp_path / "out"
    argv = [[str(BIN_DIR / "ieconv"), "hf-to-iebin", "--hf-dir", str(src), "--out-dir", str(out), "--quiet"]
            for src in (LLAMA, QWEN2)]
    procs = [subprocess.Popen(a, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for a in argv]
    results = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
    ok = [i for i, (rc, _) in enumerate(results) if rc == 0]
    assert len(ok) == 1, results
    loser_rc, loser_err = results[1 - ok[0]]
    assert loser_rc == 1 and loser_err.count("\n") == 1 and "Traceback" not in loser_err, loser_err
    assert str(out) in loser_err
    winner = (LLAMA, QWEN2)[ok[0]]
    model = iebin.load_model(out, deep=True)
    assert model.meta["config"] == load_json(winner / "config.json")
    for aux in model.meta["aux_files"]:  # deep validation checked them against these digests
        assert (out / aux["name"]).read_bytes() == (winner / aux["name"]).read_bytes(), aux["name"]
    assert not [n for n in _entries(out) if n.endswith(".tmp")]


def test_a_writer_holding_the_directory_refuses_a_second_at_once(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    with StagedFiles(out, exclusive=True) as held:
        res = run_tool("ieconv", "hf-to-iebin", "--hf-dir", LLAMA, "--out-dir", out, "--quiet")
        assert_one_line_error(res, str(out), "another ieconv run is writing")
        held.write_bytes("first.txt", b"1")
    assert _entries(out) == ["first.txt"]
    res = run_tool("ieconv", "hf-to-iebin", "--hf-dir", LLAMA, "--out-dir", out / "sub", "--quiet")
    assert res.returncode == 0, res.stderr  # released at commit


def test_files_that_appear_during_a_conversion_are_not_replaced(tmp_path):
    """The up-front check passed (the directory was empty); another run's
    model.ie.json landed while this one worked: the commit refuses, keeps
    the other's file and leaves no staging file."""
    out = tmp_path / "out"
    written = []

    def advance(_n: int) -> None:
        # the first tick after the output directory exists (the source's hashing may tick before)
        if not written and out.is_dir():
            (out / iebin.META_NAME).write_text("theirs")
            written.append(_n)

    with pytest.raises(FileExistsError) as ei:
        convert(from_dir(LLAMA), out, progress=Progress(advance=advance))
    assert written
    assert ei.value.filename == str(out / iebin.META_NAME)
    assert _entries(out) == [iebin.META_NAME] and (out / iebin.META_NAME).read_text() == "theirs"


def test_a_no_replace_commit_takes_back_what_it_placed_when_a_later_file_exists(tmp_path, monkeypatch):
    """A writer outside the lock wins the race for the second name between
    the check and the rename: the first name this commit placed is removed
    again, so the directory never holds half of each."""
    import iekit.formats.atomic as atomic

    real = atomic.link_no_replace

    def racing(tmp: Path, final: Path) -> None:
        if final.name == "b":
            final.write_text("theirs")
        real(tmp, final)

    monkeypatch.setattr(atomic, "link_no_replace", racing)
    with pytest.raises(FileExistsError), StagedFiles(tmp_path, replace=False) as s:
        s.write_bytes("a", b"mine")
        s.write_bytes("b", b"mine")
    assert _entries(tmp_path) == ["b"] and (tmp_path / "b").read_text() == "theirs"


# ------------------------------------------------------------ 4: not a regular file

def _non_regular(kind: str, p: Path, tmp_path: Path) -> None:
    if kind == "fifo":
        os.mkfifo(p)
    elif kind == "symlink":
        (tmp_path / "target").write_text("keep me")
        p.symlink_to(tmp_path / "target")
    else:
        if os.geteuid() != 0:
            pytest.skip("device nodes need root")
        os.mknod(p, 0o600 | 0o020000, os.makedev(1, 3))  # a character device: /dev/null's numbers


@pytest.mark.parametrize("kind", ["fifo", "symlink", "chardev"])
def test_overwrite_never_replaces_a_non_regular_output_file(tmp_path, kind):
    target = tmp_path / "l.npy"
    _non_regular(kind, target, tmp_path)
    res = run_tool("ierun", "logits", "--model-dir", GOLDEN_IEBIN / "tiny-llama", "--ids", "1,2",
                   "--out", target, "--overwrite")
    assert_one_line_error(res, str(target), "not a regular file")
    assert target.is_symlink() if kind == "symlink" else os.path.lexists(target) and not target.is_file()
    if kind == "symlink":
        assert (tmp_path / "target").read_text() == "keep me"


@pytest.mark.parametrize("kind", ["fifo", "symlink", "chardev"])
def test_overwrite_of_an_artifact_never_replaces_a_non_regular_file_in_it(tmp_path, kind):
    out = tmp_path / "out"
    assert run_tool("ieconv", "hf-to-iebin", "--hf-dir", LLAMA, "--out-dir", out, "--quiet").returncode == 0
    (out / "config.json").unlink()
    _non_regular(kind, out / "config.json", tmp_path)
    before = _entries(out)
    res = run_tool("ieconv", "hf-to-iebin", "--hf-dir", LLAMA, "--out-dir", out, "--overwrite", "--quiet")
    assert_one_line_error(res, str(out / "config.json"), "not a regular file")
    assert _entries(out) == before


def test_the_commit_rechecks_for_a_non_regular_file(tmp_path):
    with pytest.raises(IEError, match="a FIFO"), StagedFiles(tmp_path) as s:
        s.write_bytes("x", b"data")
        os.mkfifo(tmp_path / "x")
    assert _entries(tmp_path) == ["x"]


# ------------------------------------------------------------ 5: a write that fails half-way

def _file_size_limit(nbytes: int):
    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead
        resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, nbytes))
    return limit


def test_a_failed_write_removes_its_staging_file_and_names_the_file(tmp_path):
    """A write that fails (EFBIG here, ENOSPC on a full disk) leaves no
    staging file: closing it flushes again and fails again, and the old
    code skipped the unlink. The line names the user's file."""
    out = tmp_path / "out"
    res = subprocess.run([str(BIN_DIR / "ieconv"), "hf-to-iebin", "--hf-dir", str(LLAMA), "--out-dir", str(out),
                          "--quiet"], capture_output=True, text=True, timeout=300,
                         preexec_fn=_file_size_limit(100_000))
    assert_one_line_error(res, str(out / iebin.BIN_NAME), "cannot write")
    assert ".tmp" not in res.stderr
    assert not out.exists()  # the directory it created is gone too


def test_abort_removes_a_staged_file_whose_close_fails(tmp_path):
    class FailingClose:
        closed = False

        def close(self):
            raise OSError(28, "No space left on device")

    s = StagedFiles(tmp_path)
    s.open("x").write(b"data")
    tmp, final, f = s._staged[0]
    f.close()
    s._staged[0] = (tmp, final, FailingClose())
    s.abort()
    assert _entries(tmp_path) == []


def test_the_lock_is_per_open_directory_not_per_process(tmp_path):
    """Two writers in one process (threads) are refused like two processes."""
    with StagedFiles(tmp_path, exclusive=True):
        with pytest.raises(IEError, match="another ieconv run is writing"):
            StagedFiles(tmp_path, exclusive=True)
    StagedFiles(tmp_path, exclusive=True).abort()  # released
