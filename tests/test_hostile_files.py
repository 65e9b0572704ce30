"""Files that are not what a tool expects, and runs that do not end well.

One test (or a few) per finding of the security review: a user's files are
never replaced without --overwrite (and --overwrite replaces an artifact as
a whole); iebin-upgrade never loses an original; every JSON file is read as
a regular, bounded file (a FIFO or /dev/zero is one error line, not a hang);
no file is read through a symlink leading out of a model directory; killed
and interrupted runs leave nothing behind that the next run does not clean;
and the errors a new user met are one line naming their own path.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import BIN_DIR, GOLDEN, GOLDEN_HF, GOLDEN_IEBIN, assert_one_line_error, run_tool, st_write
from iekit.convert.hf_to_iebin import convert
from iekit.formats import iebin
from iekit.formats.atomic import StagedFiles, write_file_atomic
from iekit.formats.errors import FormatError
from iekit.formats.hf_checkpoint import from_dir
from iekit.formats.jsonio import load_json
from iekit.formats.safetensors_reader import SafetensorsFile

LLAMA = GOLDEN_HF / "tiny-llama"
QWEN2 = GOLDEN_HF / "tiny-qwen2"
MIXEDQ = GOLDEN_IEBIN / "tiny-llama-mixedq"
DEAD_PID = 999_999_999  # above any pid_max: no process has it


def snapshot(d: Path) -> dict[str, bytes | str]:
    """Every entry of a directory tree: file bytes, or a symlink's target."""
    out: dict[str, bytes | str] = {}
    for p in sorted(d.rglob("*")):
        rel = str(p.relative_to(d))
        if p.is_symlink():
            out[rel] = "-> " + os.readlink(p)
        elif p.is_file():
            out[rel] = p.read_bytes()
        else:
            out[rel] = "dir"
    return out


def run_bounded(tool: str, *args, timeout: float = 60, env: dict | None = None) -> subprocess.CompletedProcess:
    """A tool run that cannot hang the suite nor eat the machine's memory
    (the old code blocked on FIFOs and read /dev/zero until memory ran out)."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

    try:
        return subprocess.run([str(BIN_DIR / tool), *map(str, args)], capture_output=True, text=True,
                              timeout=timeout, preexec_fn=limit, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{tool} {' '.join(map(str, args))}: still running after {timeout} s (blocked?)")


# ---------------------------------------------------------------- 1: no replacing without --overwrite

def test_hf_to_iebin_refuses_to_replace_another_checkpoints_files(tmp_path):
    """An existing directory without model.ie.* (here another model's HF
    checkpoint) keeps its config.json, generation_config.json and tokenizer
    files: the run is refused, naming the first file it would replace."""
    out = tmp_path / "qwen2"
    shutil.copytree(QWEN2, out)
    before = snapshot(out)
    res = run_tool("ieconv", "hf-to-iebin", "--hf-dir", LLAMA, "--out-dir", out)
    assert_one_line_error(res, str(out / "config.json"), "--overwrite")
    assert snapshot(out) == before


def test_hf_to_iebin_refuses_a_foreign_tokenizer_it_would_not_replace(tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    (out / "vocab.txt").write_text("[PAD]\n[UNK]\n")
    (out / "notes.txt").write_text("mine")
    res = run_tool("ieconv", "hf-to-iebin", "--hf-dir", LLAMA, "--out-dir", out)
    assert_one_line_error(res, str(out / "vocab.txt"), "--overwrite")
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt", "vocab.txt"]
    # an unrelated file alone is no reason to refuse, and it is kept
    (out / "vocab.txt").unlink()
    res = run_tool("ieconv", "hf-to-iebin", "-q", "--hf-dir", LLAMA, "--out-dir", out)
    assert res.returncode == 0, res.stderr
    assert (out / "notes.txt").read_text() == "mine"


# ---------------------------------------------------------------- 2: iebin-upgrade keeps originals

def _legacy(d: Path) -> bytes:
    """Golden shards and a legacy (version 1, shard/shard_data_offset) metadata file."""
    d.mkdir()
    entries = []
    for shard in sorted(LLAMA.glob("*.safetensors")):
        shutil.copyfile(shard, d / shard.name)
        with SafetensorsFile(d / shard.name) as sf:
            entries += [{"name": t.name, "dtype": t.dtype.safetensors, "shape": list(t.shape),
                         "shard": shard.name, "shard_data_offset": t.start} for t in sf.tensors.values()]
    data = json.dumps({"format": "iebin", "version": 1, "tensors": entries}).encode()
    (d / "legacy.json").write_bytes(data)
    return data


def test_iebin_upgrade_twice_keeps_the_original_backup(tmp_path):
    d = tmp_path / "m"
    orig = _legacy(d)
    res = run_tool("ieconv", "iebin-upgrade", d / "legacy.json")
    assert res.returncode == 0, res.stderr
    assert (d / "legacy.json.bak").read_bytes() == orig
    upgraded = (d / "legacy.json").read_bytes()
    # the second run meets a schema2 file: a no-op that says so, nothing written
    before = snapshot(d)
    res = run_tool("ieconv", "iebin-upgrade", d / "legacy.json")
    assert res.returncode == 0, res.stderr
    assert "nothing to do" in res.stdout and "schema2" in res.stdout
    assert snapshot(d) == before
    assert (d / "legacy.json").read_bytes() == upgraded
    assert (d / "legacy.json.bak").read_bytes() == orig


def test_iebin_upgrade_never_overwrites_an_existing_backup(tmp_path):
    d = tmp_path / "m"
    orig = _legacy(d)
    (d / "legacy.json.bak").write_bytes(b"an older backup the user keeps")
    res = run_tool("ieconv", "iebin-upgrade", d / "legacy.json")
    assert res.returncode == 0, res.stderr
    assert (d / "legacy.json.bak").read_bytes() == b"an older backup the user keeps"
    assert (d / "legacy.json.bak.1").read_bytes() == orig
    assert "legacy.json.bak.1" in res.stderr
    assert iebin.load_model(d / "legacy.json", deep=True).meta["version"] == 2


def test_iebin_upgrade_of_schema2_is_a_no_op_keeping_every_field(tmp_path):
    d = tmp_path / "m"
    shutil.copytree(GOLDEN_IEBIN / "tiny-llama", d)
    before = snapshot(d)
    res = run_tool("ieconv", "iebin-upgrade", d / iebin.META_NAME)
    assert res.returncode == 0, res.stderr
    assert "nothing to do" in res.stdout
    assert snapshot(d) == before  # aux_files, source, tokenizer kept; no .bak
    assert "iebin-upgrade" in run_tool("ieconv", "iebin-upgrade", "--help").stdout
    assert "already schema2" in run_tool("ieconv", "iebin-upgrade", "--help").stdout.replace("\n", " ")


def test_iebin_upgrade_refuses_to_replace_an_existing_out_file(tmp_path):
    d = tmp_path / "m"
    _legacy(d)
    (d / "model.ie.json").write_text("mine")
    res = run_tool("ieconv", "iebin-upgrade", d / "legacy.json", "-o", d / "model.ie.json")
    assert_one_line_error(res, str(d / "model.ie.json"), "--overwrite")
    assert (d / "model.ie.json").read_text() == "mine"
    res = run_tool("ieconv", "iebin-upgrade", d / "legacy.json", "-o", d / "model.ie.json", "--overwrite")
    assert res.returncode == 0, res.stderr
    assert iebin.load_model(d, deep=True).meta["version"] == 2


# ---------------------------------------------------------------- 6: FIFOs, devices, sizes

def _iebin_copy(tmp_path: Path, src: Path = GOLDEN_IEBIN / "tiny-llama") -> Path:
    d = tmp_path / "m"
    shutil.copytree(src, d)
    return d


def _fifo(p: Path) -> None:
    if p.exists() or p.is_symlink():
        p.unlink()
    os.mkfifo(p)


def _fifo_cases(tmp_path: Path) -> dict[str, tuple[list, Path]]:
    """For each kind of JSON file: the command that reads it, and where the FIFO goes."""
    m = _iebin_copy(tmp_path)
    hf = tmp_path / "hf"
    shutil.copytree(LLAMA, hf)
    hf1 = tmp_path / "hf1"
    shutil.copytree(QWEN2, hf1)
    q4 = tmp_path / "q4_manifest.json"
    tm = tmp_path / "tensor_map.json"
    return {
        "model.ie.json": (["ieconv", "validate", m], m / iebin.META_NAME),
        "model.ie.json-ierun": (["ierun", "logits", "--model-dir", m, "--ids", "1", "--out", tmp_path / "l.npy"],
                                m / iebin.META_NAME),
        "config.json": (["ieconv", "hf-to-iebin", "--hf-dir", hf1, "--out-dir", tmp_path / "o"], hf1 / "config.json"),
        "safetensors-index": (["ieconv", "hf-to-iebin", "--hf-dir", hf, "--out-dir", tmp_path / "o"],
                              hf / "model.safetensors.index.json"),
        "q4-manifest": (["ieconv", "hf-to-iebin", "--hf-dir", LLAMA, "--out-dir", tmp_path / "o", "--q4-map", q4], q4),
        "tensor-map": (["ieconv", "dedup-extract", "--model-dir", m, "--tensor-map", tm, "--groups", tm,
                        "--out-prefix", tmp_path / "x" / "model"], tm),
        "model.dedup.json": (["ierun", "verify", "dedup", "--model-dir", m], m / "model.dedup.json"),
        "tokenizer.json": (["ieconv", "hf-to-iebin", "--hf-dir", hf1, "--out-dir", tmp_path / "o"],
                           hf1 / "tokenizer.json"),
    }


@pytest.mark.parametrize("kind", ["model.ie.json", "model.ie.json-ierun", "config.json", "safetensors-index",
                                  "q4-manifest", "tensor-map", "model.dedup.json", "tokenizer.json"])
def test_a_fifo_where_a_json_file_belongs_is_one_error_not_a_hang(tmp_path, kind):
    cmd, where = _fifo_cases(tmp_path)[kind]
    _fifo(where)
    res = run_bounded(*cmd, timeout=60)
    assert_one_line_error(res, where.name, "FIFO", "regular file")


def test_a_link_to_dev_zero_is_not_read_until_memory_runs_out(tmp_path):
    d = _iebin_copy(tmp_path)
    link = d / "zero.json"
    link.symlink_to("/dev/zero")
    res = run_bounded("ieconv", "validate", link, timeout=60)
    assert_one_line_error(res, "zero.json", "character device")
    res = run_bounded("ieconv", "iebin-upgrade", link, timeout=60)
    assert_one_line_error(res, "zero.json", "character device")


def test_json_files_have_a_size_cap(tmp_path):
    from iekit.formats.jsonio import JSON_MAX_BYTES

    d = _iebin_copy(tmp_path)
    meta = d / iebin.META_NAME
    with open(meta, "r+b") as f:  # sparse: costs no disk
        f.truncate(JSON_MAX_BYTES + 1)
    res = run_bounded("ieconv", "validate", d)
    assert_one_line_error(res, iebin.META_NAME, str(JSON_MAX_BYTES + 1), "100 MiB")
    small = tmp_path / "small.json"
    small.write_text('{"a": [1, 2, 3]}')
    assert load_json(small, max_bytes=16) == {"a": [1, 2, 3]}
    with pytest.raises(FormatError, match="more than"):
        load_json(small, max_bytes=15)


def test_binary_inputs_that_are_fifos_are_refused(tmp_path):
    fifo = tmp_path / "w.bsr"
    os.mkfifo(fifo)
    assert_one_line_error(run_bounded("ieconv", "validate", fifo), "w.bsr", "FIFO")
    npy = tmp_path / "d.npy"
    os.mkfifo(npy)
    assert_one_line_error(run_bounded("ieconv", "block-sparse", npy, "-o", tmp_path / "o.bsr",
                                      "--block-rows", "4", "--block-cols", "4"), "d.npy", "FIFO")


# ---------------------------------------------------------------- 7: nothing read through links leading out

@pytest.mark.parametrize("name", ["config.json", "generation_config.json", "tokenizer.json",
                                  "tokenizer_config.json", "model.safetensors.index.json"])
def test_checkpoint_files_linking_out_of_the_checkpoint_are_refused(tmp_path, name):
    hf = tmp_path / "hf"
    shutil.copytree(LLAMA, hf)
    outside = tmp_path / "elsewhere" / name
    outside.parent.mkdir()
    shutil.move(hf / name, outside)
    (hf / name).symlink_to(outside)
    res = run_tool("ieconv", "hf-to-iebin", "--hf-dir", hf, "--out-dir", tmp_path / "o")
    assert_one_line_error(res, name, "outside")
    assert not (tmp_path / "o").exists()


def test_single_file_checkpoint_linking_out_is_refused(tmp_path):
    hf = tmp_path / "hf"
    shutil.copytree(QWEN2, hf)
    shutil.move(hf / "model.safetensors", tmp_path / "w.safetensors")
    (hf / "model.safetensors").symlink_to(tmp_path / "w.safetensors")
    assert_one_line_error(run_tool("ieconv", "hf-to-iebin", "--hf-dir", hf, "--out-dir", tmp_path / "o"),
                          "model.safetensors", "outside")


def test_links_inside_the_checkpoint_are_fine(tmp_path):
    hf = tmp_path / "hf"
    shutil.copytree(LLAMA, hf)
    (hf / "sub").mkdir()
    shutil.move(hf / "tokenizer.json", hf / "sub" / "tok.json")
    (hf / "tokenizer.json").symlink_to("sub/tok.json")
    res = run_tool("ieconv", "hf-to-iebin", "-q", "--hf-dir", hf, "--out-dir", tmp_path / "o")
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "o" / "tokenizer.json").read_bytes() == (LLAMA / "tokenizer.json").read_bytes()


def test_hub_cache_snapshot_links_into_blobs_and_no_further(tmp_path):
    """The HF cache's snapshot files are symlinks into the repo's blobs/: that
    is inside the checkpoint; a link out of the repo's cache folder is not."""
    cache = tmp_path / "cache"
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = cache / "models--org--tiny"
    snap = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True)
    snap.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    for f in LLAMA.iterdir():
        blob = repo / "blobs" / hashlib.sha256(f.read_bytes()).hexdigest()
        shutil.copyfile(f, blob)
        (snap / f.name).symlink_to(os.path.relpath(blob, snap))
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    res = run_tool("ieconv", "hf-to-iebin", "-q", "--repo-id", "org/tiny", "--out-dir", tmp_path / "o", env=env)
    assert res.returncode == 0, res.stderr
    assert iebin.load_model(tmp_path / "o", deep=True).meta["source"]["revision"] == commit
    (tmp_path / "secret.json").write_text("{}")
    (snap / "tokenizer_config.json").unlink()
    (snap / "tokenizer_config.json").symlink_to(tmp_path / "secret.json")
    res = run_tool("ieconv", "hf-to-iebin", "-q", "--repo-id", "org/tiny", "--out-dir", tmp_path / "p", env=env)
    assert_one_line_error(res, "tokenizer_config.json", "outside")


def test_model_dir_json_linking_out_is_refused(tmp_path):
    d = _iebin_copy(tmp_path)
    shutil.move(d / iebin.META_NAME, tmp_path / "meta.json")
    (d / iebin.META_NAME).symlink_to(tmp_path / "meta.json")
    assert_one_line_error(run_tool("ieconv", "validate", d), iebin.META_NAME, "outside")
    (d / iebin.META_NAME).unlink()
    shutil.move(tmp_path / "meta.json", d / iebin.META_NAME)
    (tmp_path / "index.json").write_text("{}")
    (d / "model.dedup.json").symlink_to(tmp_path / "index.json")
    assert_one_line_error(run_tool("ierun", "verify", "dedup", "--model-dir", d), "model.dedup.json", "outside")


def test_tokenizer_linking_out_of_the_model_dir_is_not_read(tmp_path):
    d = _iebin_copy(tmp_path)
    # an artifact that does not list tokenizer.json (e.g. upgraded from legacy) but has one linking out
    meta = json.loads((d / iebin.META_NAME).read_text())
    meta["aux_files"] = [a for a in meta["aux_files"] if a["name"] != "tokenizer.json"]
    meta["tokenizer"]["files"] = [f for f in meta["tokenizer"]["files"] if f != "tokenizer.json"]
    (d / iebin.META_NAME).write_text(json.dumps(meta))
    shutil.move(d / "tokenizer.json", tmp_path / "tokenizer.json")
    (d / "tokenizer.json").symlink_to(tmp_path / "tokenizer.json")
    res = run_tool("ierun", "generate", "--model-dir", d, "--prompt", "hi", "--max-new", "2")
    assert_one_line_error(res, "tokenizer.json", "outside")


def test_iebin_upgrade_config_linking_out_is_refused(tmp_path):
    d = tmp_path / "m"
    _legacy(d)
    (tmp_path / "cfg.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    (d / "config.json").symlink_to(tmp_path / "cfg.json")
    assert_one_line_error(run_tool("ieconv", "iebin-upgrade", d / "legacy.json"), "config.json", "outside")


# ---------------------------------------------------------------- 10: killed and interrupted runs

def test_stale_temp_files_of_a_killed_run_are_cleaned_by_the_next_run(tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    stale = out / f".model.ie.bin.{DEAD_PID}.0badf00d.tmp"
    stale.write_bytes(b"\0" * 4096)
    live = out / f".model.ie.bin.{os.getpid()}.0badf00d.tmp"  # a running writer's: kept
    live.write_bytes(b"x")
    mine = out / ".notes.tmp"  # not our naming: kept
    mine.write_bytes(b"y")
    res = run_tool("ieconv", "hf-to-iebin", "-q", "--hf-dir", LLAMA, "--out-dir", out)
    assert res.returncode == 0, res.stderr
    assert not stale.exists()
    assert live.exists() and mine.exists()
    notes = [ln for ln in res.stderr.splitlines() if stale.name in ln]
    assert len(notes) == 1 and "interrupted run" in notes[0] and "4096 bytes" in notes[0]


def test_a_sigkilled_conversion_leaves_temp_files_the_next_run_removes(tmp_path):
    big = tmp_path / "big"
    big.mkdir()
    (big / "config.json").write_text(json.dumps({"architectures": ["TestModel"]}))
    st_write(big / "model.safetensors", {f"w{i}": ("F32", [1024, 1024], bytes(4 << 20)) for i in range(24)})
    out = tmp_path / "o"
    out.mkdir()
    p = subprocess.Popen([str(BIN_DIR / "ieconv"), "hf-to-iebin", "-q", "--hf-dir", big, "--out-dir", out,
                          "--dtype", "bf16"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not any(n.endswith(".tmp") for n in os.listdir(out)) and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    p.kill()
    p.wait()
    left = [n for n in os.listdir(out) if n.endswith(".tmp")]
    if not left:
        pytest.skip("the conversion finished before it could be killed")
    res = run_tool("ieconv", "hf-to-iebin", "-q", "--hf-dir", LLAMA, "--out-dir", out)
    assert res.returncode == 0, res.stderr
    assert not [n for n in os.listdir(out) if n.endswith(".tmp")]
    assert len([ln for ln in res.stderr.splitlines() if "interrupted run" in ln]) == 1


def test_staged_files_clean_stale_temps_and_warn_once(tmp_path):
    from iekit.formats.atomic import StaleTempWarning, clean_stale_temps

    (tmp_path / f".a.json.{DEAD_PID}.00000000.tmp").write_bytes(b"12")
    (tmp_path / f".b.bin.{DEAD_PID}.11111111.tmp").write_bytes(b"345")
    with pytest.warns(StaleTempWarning, match=r"removed 2 temporary files \(5 bytes\)"):
        write_file_atomic(tmp_path / "a.json", b"{}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]
    assert clean_stale_temps(tmp_path) == []


def test_a_failed_conversion_removes_the_parent_directories_it_created(tmp_path):
    hf = tmp_path / "hf"
    shutil.copytree(QWEN2, hf)
    with open(hf / "model.safetensors", "r+b") as f:
        f.truncate(1000)
    res = run_tool("ieconv", "hf-to-iebin", "--hf-dir", hf, "--out-dir", tmp_path / "a" / "b" / "c")
    assert_one_line_error(res, "model.safetensors")
    assert not (tmp_path / "a").exists()
    # and an interrupted one (Ctrl-C while streaming)
    calls = {"n": 0}

    def advance(_n):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt

    from iekit.convert.artifact_out import Progress
    with pytest.raises(KeyboardInterrupt):
        convert(from_dir(LLAMA), tmp_path / "x" / "y", progress=Progress(advance=advance))
    assert not (tmp_path / "x").exists()


def test_dedup_extract_does_not_leave_created_directories_on_failure(tmp_path):
    from dedup_util import write_iebin

    rng = np.random.default_rng(0)
    data = rng.integers(0, 256, 16384, dtype=np.uint8)
    m = write_iebin(tmp_path / "m", {"a": ("u8", [data.size], data.tobytes()),
                                     "b": ("u8", [data.size], data.tobytes())})
    res = run_tool("ieconv", "dedup-plan", "--model-dir", m, "--out-dir", tmp_path / "plan")
    assert res.returncode == 0, res.stderr
    with open(m / iebin.BIN_NAME, "r+b") as f:  # the model changed after planning: extraction fails midway
        f.seek(100)
        f.write(b"\xff" * 8)
    res = run_tool("ieconv", "dedup-extract", "--model-dir", m, "--tensor-map", tmp_path / "plan" / "tensor_map.json",
                   "--groups", tmp_path / "plan" / "groups.indices.json", "--out-prefix", tmp_path / "p" / "q" / "model")
    assert_one_line_error(res, "xxh3_128", "stale map, or the model changed")
    assert not (tmp_path / "p").exists()


@pytest.mark.parametrize("tool", ["ieconv", "ierun"])
def test_ctrl_c_while_importing_exits_130_without_a_traceback(tmp_path, tool):
    """A KeyboardInterrupt raised by an import the tool makes at start-up
    (click stands in for any of them)."""
    fake = tmp_path / "fake" / "click"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise KeyboardInterrupt\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "fake")}
    res = run_tool(tool, "--help", env=env)
    assert res.returncode == 130, (res.returncode, res.stderr)
    assert "Traceback" not in res.stderr
    assert [ln for ln in res.stderr.splitlines() if ln.strip()] == ["interrupted"]


_INTERRUPT_IN_A_FINALIZER = """
import sys, time
from iekit.cli.interrupt import run_guarded

class Dropped:
    def __del__(self):
        raise KeyboardInterrupt  # as a SIGINT landing in a finalizer does

if sys.argv[1] == "before":  # between the entry point's imports and run_guarded, which go on a while (a loaded
    Dropped()                # machine): the interrupt must wait for run_guarded, not land here
    time.sleep(0.05)

class Interrupted:
    def __set_name__(self, owner, name):
        raise KeyboardInterrupt  # as a SIGINT landing while a dataclass is defined does

def load_main():
    if sys.argv[1] == "class":  # Python 3.11 re-raises it as a RuntimeError
        class Imported:
            field = Interrupted()
    def main():
        if sys.argv[1] == "during":
            Dropped()
        for _ in range(200):  # the command goes on: the interrupt must stop it here
            time.sleep(0.01)
        print("finished")
    return main

run_guarded(load_main)
"""


@pytest.mark.parametrize("when", ["during", "before", "class"])
def test_ctrl_c_inside_a_finalizer_still_stops_the_command(when):
    """Ctrl-C that lands in a weakref callback or __del__ (importlib drops a
    module lock through one after every import; CI's SIGINT test hit it, in
    the command and, on a loaded machine, in the entry point's own imports
    before run_guarded) is "Exception ignored" to Python, which printed a
    traceback and went on running the command; one that lands while a class
    is defined (a dataclass, importing) became a RuntimeError with a
    traceback and exit 1. The console scripts deliver the first again and
    trace the second to its cause: exit 130, one line."""
    for _ in range(3):
        res = subprocess.run([sys.executable, "-c", _INTERRUPT_IN_A_FINALIZER, when], capture_output=True, text=True,
                             timeout=60)
        assert res.returncode == 130, (res.returncode, res.stderr)
        assert [ln for ln in res.stderr.splitlines() if ln.strip()] == ["interrupted"], res.stderr
        assert "finished" not in res.stdout


@pytest.mark.parametrize("tool", ["ieconv", "ierun"])
def test_ctrl_c_before_the_command_line_is_imported_exits_130_quietly(tmp_path, tool):
    """The ~20 ms after Python has read site-packages and before iekit's guard
    runs (the console script's own `import re`, the first iekit imports):
    held open here by a sitecustomize that waits, which Python runs at that
    point. The old start-up printed a KeyboardInterrupt traceback."""
    (tmp_path / "sitecustomize.py").write_text(
        f"import pathlib, time\npathlib.Path({str(tmp_path / 'ready')!r}).touch()\ntime.sleep(30)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))}
    p = subprocess.Popen([str(BIN_DIR / tool), "--help"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=env)
    deadline = time.monotonic() + 60
    while not (tmp_path / "ready").exists() and time.monotonic() < deadline and p.poll() is None:
        time.sleep(0.01)
    p.send_signal(signal.SIGINT)
    _out, err = p.communicate(timeout=60)
    assert (p.returncode, err) == (130, "interrupted\n")


@pytest.mark.parametrize("delay", [0.15, 0.3, 0.6, 1.0])
def test_sigint_at_any_moment_of_start_up_exits_130_quietly(tmp_path, delay):
    """A real SIGINT at several moments of `ierun logits` (imports, native
    extension, model load, run): exit 130 (or 0 if it had finished), never a
    traceback nor death by the signal."""
    p = subprocess.Popen([str(BIN_DIR / "ierun"), "logits", "--model-dir", GOLDEN_IEBIN / "tiny-llama",
                          "--ids", "1,2,3", "--out", tmp_path / "l.npy"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(delay)
    p.send_signal(signal.SIGINT)
    _out, err = p.communicate(timeout=120)
    assert p.returncode in (130, 0), (p.returncode, err)
    assert "Traceback" not in err
    if p.returncode == 130:
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]
        if lines[:1] != ["interrupted"]:
            # The signal landed after the result line, while the finished command was
            # unwinding (seen once on CI's loaded machine): the file is complete, and
            # the interrupt is still reported.
            assert lines == [lines[0], "interrupted"] and lines[0].startswith("OK "), lines
            assert np.load(tmp_path / "l.npy").shape == (3, 320)
        else:
            assert lines == ["interrupted"]


# ---------------------------------------------------------------- 11: what a new user met

def test_overwrite_replaces_the_artifact_as_a_whole(tmp_path):
    """A BERT-like artifact (vocab.txt, special tokens, a dedup link) replaced
    by a Llama: the BERT's files that the Llama does not write are removed
    and listed; a file iekit never writes is kept."""
    bert = tmp_path / "bert"
    shutil.copytree(QWEN2, bert)
    (bert / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n")
    (bert / "special_tokens_map.json").write_text('{"unk_token": "[UNK]"}')
    out = tmp_path / "o"
    convert(from_dir(bert), out)
    (out / "model.dedup.json").symlink_to("dedup_out/model.dedup.json")
    (out / "README.md").write_text("my notes")
    res = run_tool("ieconv", "hf-to-iebin", "-q", "--hf-dir", LLAMA, "--out-dir", out, "--overwrite")
    assert res.returncode == 0, res.stderr
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["README.md", "config.json", "generation_config.json", "model.ie.bin", "model.ie.json",
         "tokenizer.json", "tokenizer_config.json"])
    assert (out / "tokenizer.json").read_bytes() == (LLAMA / "tokenizer.json").read_bytes()
    removed = [ln for ln in res.stderr.splitlines() if "removed" in ln]
    assert len(removed) == 1
    for n in ("vocab.txt", "special_tokens_map.json", "model.dedup.json"):
        assert n in removed[0]
    assert iebin.load_model(out, deep=True).meta["source"]["name"] == "tiny-llama"
    assert "--overwrite" in run_tool("ieconv", "hf-to-iebin", "--help").stdout


def test_verify_quant_against_another_models_checkpoint_is_one_line(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    st_write(other / "model.safetensors", {"lm_head.weight": ("F32", [10, 10], bytes(400))})
    res = run_tool("ierun", "verify", "quant", "--model-dir", MIXEDQ, "--hf-dir", other)
    assert_one_line_error(res, str(other), "--hf-dir")
    # same names, other shapes: checked before anything is compared
    q = json.loads((MIXEDQ / iebin.META_NAME).read_text())
    tensors = {t["name"]: ("F32", [t["shape"][0] * 2, t["shape"][1]], bytes(8 * t["shape"][0] * t["shape"][1]))
               for t in q["tensors"] if t["dtype"] not in ("f32", "f16", "bf16")}
    shutil.rmtree(other)
    other.mkdir()
    (other / "config.json").write_text("{}")
    st_write(other / "model.safetensors", tensors)
    res = run_tool("ierun", "verify", "quant", "--model-dir", MIXEDQ, "--hf-dir", other)
    assert_one_line_error(res, str(other), "shape")


def test_logits_out_refuses_an_existing_file_and_names_the_users_path(tmp_path):
    out = tmp_path / "l.npy"
    out.write_bytes(b"precious")
    args = ["logits", "--model-dir", GOLDEN_IEBIN / "tiny-llama", "--ids", "1,2"]
    res = run_tool("ierun", *args, "--out", out)
    assert_one_line_error(res, str(out), "--overwrite")
    assert out.read_bytes() == b"precious"
    res = run_tool("ierun", *args, "--out", out, "--overwrite")
    assert res.returncode == 0, res.stderr
    assert np.load(out).shape == (2, 320)
    missing = tmp_path / "no" / "such" / "l.npy"
    res = run_tool("ierun", *args, "--out", missing)
    assert_one_line_error(res, str(missing), "does not exist")
    assert ".tmp" not in res.stderr
    assert "--overwrite" in run_tool("ierun", "logits", "--help").stdout


def test_staged_write_errors_name_the_users_path(tmp_path):
    target = tmp_path / "missing" / "x.json"
    with pytest.raises(Exception) as ei:
        write_file_atomic(target, b"{}")
    assert str(target) in str(ei.value) and ".tmp" not in str(ei.value)
    (tmp_path / "x.json").write_text("mine")
    with pytest.raises(FileExistsError):
        write_file_atomic(tmp_path / "x.json", b"{}", replace=False)
    assert (tmp_path / "x.json").read_text() == "mine"
    with StagedFiles(tmp_path, replace=False) as s:
        s.write_bytes("new.json", b"{}")
    assert (tmp_path / "new.json").read_bytes() == b"{}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new.json", "x.json"]


def test_generation_stops_cleanly_where_the_context_is_full():
    """A KV cache of 4 positions holds the 2 prompt ids and 3 generated ones
    (the last is never fed back): the text streams, a note says why it
    stopped, exit 0 (it was an error after the text had streamed)."""
    res = subprocess.run([str(BIN_DIR / "ierun"), "generate", "--model-dir", GOLDEN_IEBIN / "tiny-llama",
                          "--ids", "1,2", "--ctx", "4", "--max-new", "10", "--ignore-eos"],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip()
    assert "the context of 4 positions is full" in res.stderr and "3 generated" in res.stderr
    js = subprocess.run([str(BIN_DIR / "ierun"), "generate", "--model-dir", GOLDEN_IEBIN / "tiny-llama",
                         "--ids", "1,2", "--ctx", "4", "--max-new", "10", "--ignore-eos", "--json"],
                        capture_output=True, text=True, timeout=300)
    out = json.loads(js.stdout)
    assert len(out["generated_ids"]) == 3 and out["stopped_at_ctx"] is True
    too_long = subprocess.run([str(BIN_DIR / "ierun"), "generate", "--model-dir", GOLDEN_IEBIN / "tiny-llama",
                               "--ids", "1,2,3,4,5", "--ctx", "4"], capture_output=True, text=True, timeout=300)
    assert_one_line_error(too_long, "5 tokens exceeds the context of 4")

# ---------------------------------------------------------------- 8: what a sweep of every path option found

def _loop(p: Path) -> Path:
    """A symlink that points at itself: opening it fails with ELOOP."""
    p.symlink_to(p.name)
    return p


@pytest.mark.parametrize("what", ["q4-manifest --imatrix", "kl-probes --imatrix", "quantize --text-file",
                                  "quantize --eval-text", "quantize --from-gguf", "quantize --out-dir"])
def test_a_loop_of_symlinks_is_one_line_naming_it_not_an_internal_error(tmp_path, what):
    """Path.resolve() raised RuntimeError ("Symlink loop") before Python 3.13:
    these options were an internal error, exit 3."""
    loop = _loop(tmp_path / "loop")
    text = GOLDEN / "text" / "eval-sample.txt"
    q = ["ieconv", "quantize", "--target-bpw", "4.5", "--ctx", "32", "--chunks", "2"]
    cmd = {
        "q4-manifest --imatrix": ["ieconv", "q4-manifest", "--hf-dir", LLAMA, "--imatrix", loop, "-o", tmp_path / "m.json"],
        "kl-probes --imatrix": ["ieconv", "kl-probes", "--hf-dir", LLAMA, "--ref-dir", GOLDEN_IEBIN / "tiny-llama",
                                "--text-file", text, "--imatrix", loop, "-o", tmp_path / "k.json"],
        "quantize --text-file": [*q, "--hf-dir", LLAMA, "--text-file", loop, "--out-dir", tmp_path / "o"],
        "quantize --eval-text": [*q, "--hf-dir", LLAMA, "--text-file", text, "--eval-text", loop, "--out-dir", tmp_path / "o"],
        "quantize --from-gguf": [*q, "--from-gguf", loop, "--text-file", text, "--out-dir", tmp_path / "o"],
        "quantize --out-dir": [*q, "--hf-dir", LLAMA, "--text-file", text, "--out-dir", loop],
    }[what]
    res = run_bounded(*cmd, timeout=120)
    assert_one_line_error(res, str(loop), "Too many levels of symbolic links")


@pytest.mark.parametrize("name", ["tokenizer.json", "tokenizer_config.json", "generation_config.json"])
@pytest.mark.parametrize("how", ["truncated", "a list", "binary"])
def test_a_checkpoint_json_file_that_is_not_a_json_object_is_refused_at_conversion(tmp_path, name, how):
    """These files are copied byte for byte: a broken tokenizer.json passed
    the conversion and validate --deep, and failed only when ierun loaded it."""
    hf = tmp_path / "hf"
    shutil.copytree(LLAMA, hf)
    data = (hf / name).read_bytes()
    (hf / name).write_bytes({"truncated": data[: len(data) // 2], "a list": b"[1, 2]", "binary": b"\xff\xfe{}"}[how])
    for cmd in (["hf-to-iebin", "--hf-dir", hf, "--out-dir", tmp_path / "o"],
                ["rotate", "--hf-dir", hf, "--out-dir", tmp_path / "r"]):
        res = run_bounded("ieconv", *cmd)
        assert_one_line_error(res, str(hf / name), {"truncated": "invalid JSON", "a list": "must be a JSON object",
                                                     "binary": "not valid UTF-8"}[how])
    assert not (tmp_path / "o").exists() and not (tmp_path / "r").exists()


def test_validate_deep_refuses_an_aux_json_file_that_is_not_json_even_with_its_checksum(tmp_path):
    """A checksum says the file is what was recorded, not that it is a
    tokenizer: an artifact written by another tool with a broken
    tokenizer.json is refused by validate --deep, naming the file."""
    from iekit.formats import checksums

    d = _iebin_copy(tmp_path)
    meta = json.loads((d / iebin.META_NAME).read_text())
    rec = next(a for a in meta["aux_files"] if a["name"] == "tokenizer.json")
    bad = b"[" + b" " * (rec["nbytes"] - 2) + b"]"
    (d / "tokenizer.json").write_bytes(bad)
    alg = next(k for k in rec if k not in ("name", "nbytes"))
    rec[alg] = checksums.digest(alg, bad)
    (d / iebin.META_NAME).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    assert run_bounded("ieconv", "validate", d).returncode == 0  # sizes only
    res = run_bounded("ieconv", "validate", "--deep", d)
    assert_one_line_error(res, str(d / "tokenizer.json"), "must be a JSON object")


@pytest.mark.parametrize("option", ["--text-file", "--eval-text"])
@pytest.mark.parametrize("how", ["empty", "binary"])
def test_quantize_refuses_an_unusable_text_before_its_first_stage(tmp_path, option, how):
    """The imatrix stage used to find an empty or binary calibration text
    after the reference conversion (minutes at 8B), --eval-text after gptq."""
    bad = tmp_path / "bad.txt"
    bad.write_bytes({"empty": b"\n \n", "binary": b"\x00\xff\xfe" * 100}[how])
    text = bad if option == "--text-file" else GOLDEN / "text" / "eval-sample.txt"
    extra = ["--eval-text", bad] if option == "--eval-text" else []
    res = run_bounded("ieconv", "quantize", "--hf-dir", LLAMA, "--text-file", text, *extra, "--target-bpw", "4.5",
                      "--ctx", "32", "--chunks", "2", "--out-dir", tmp_path / "o")
    assert_one_line_error(res, str(bad), {"empty": "no text to evaluate", "binary": "not UTF-8 text"}[how])
    assert "[1" not in res.stderr + res.stdout and not (tmp_path / "o").exists()
