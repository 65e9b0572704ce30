"""``ierun bench``: environment policy, timed-window bookkeeping, metrics
arithmetic (with a fake decoder, so the numbers are known exactly), and the
real command on the golden models (JSON Lines on stdout, errors as one line).
"""

from __future__ import annotations

import json
import math
import os
import sys
import types
from pathlib import Path

import gguf
import numpy as np
import pytest
from click.testing import CliRunner

from conftest import GOLDEN_IEBIN, assert_one_line_error, copy_model, run_tool
from iekit.formats import iebin
from iekit.formats.errors import FormatError, IEError
from iekit.runtime import cuda
from iekit.runtime.env import BenchEnv
from iekit.runtime.bench_run import (PromptLine, RoundTimes, read_prompts, round_record, rss_peak_mb,
                                     run_round, tokenize)

FIELDS = ("round", "tokens_generated", "wall_time_s", "tps_true", "latency_p50_ms", "latency_p95_ms",
          "prefill_ms", "rss_peak_mb", "kv_hits", "kv_misses", "mb_per_token", "bytes_touched",
          "model_coverage", "effective_gbps", "read_bw_gbps", "roofline_fraction", "decode_gbps",
          "decode_roofline_fraction", "precision", "act_prec", "active_params_per_token",
          "threads", "device", "model_dir", "prompts", "max_new", "dedup", "touch_checksum", "read_bw_bytes",
          "decode_matmul_ms", "decode_attention_ms", "decode_other_ms", "matmul_gbps", "matmul_roofline_fraction",
          "llc_bytes", "read_bw_in_cache", "experts_copied")
# The yardstick of the real-command tests: a field's presence or an error path
# needs no DRAM-sized stream; test_golden_models_two_rounds[tiny-llama] keeps the default.
SMALL_BW_MB = 4


class FakeDecoder:
    """The Decoder interface with known behaviour: the next token is
    (last + 1) % vocab, touch returns nbytes // stride, and every prefill of
    a prompt seen before counts its tokens as KV hits."""

    def __init__(self, model_dir=None, *, threads=1, act="auto", affinity=None, ctx=None, vocab=16, eos=None,
                 device="cpu", cache_type_k="f32", cache_type_v="f32", ctx_flag="--ctx", experts="auto"):
        self.vocab_size, self.eos_ids, self.max_ctx = vocab, frozenset([] if eos is None else [eos]), 64
        self.cache_types = (cache_type_k, cache_type_v)
        self.precision, self.precisions = "int4w", ("int4w",)
        self.weight_bytes_per_token, self.model_bytes = 1_000_000, 4_000_000
        self.active_params_per_token = 1_800_000
        self.kv_hits = self.kv_misses = 0
        self.init = dict(model_dir=model_dir, threads=threads, act=act, affinity=affinity)
        self.copied_experts = False  # a dense model
        self.act = "int8" if act == "auto" else act  # what runs: the model is int4w
        self.touches: list[tuple[int, int]] = []
        self.seen: set[tuple[int, ...]] = set()

    def _logits(self, last):
        out = np.zeros(self.vocab_size, np.float32)
        out[(last + 1) % self.vocab_size] = 1.0
        return out

    def encode(self, text):
        return [ord(c) % self.vocab_size for c in text]

    def check_ids(self, ids, final_len=None):
        """Accepts everything: the real check is tested against the real Decoder."""

    def prefill(self, ids):
        if tuple(ids) in self.seen:
            self.kv_hits += len(ids)
        else:
            self.kv_misses += len(ids)
            self.seen.add(tuple(ids))
        return self._logits(ids[-1])

    # Each single-token call takes 4 ms: 3 in matmuls, 0.5 in attention (Decoder.step_times).
    STEP_SPLIT = {"total_s": 0.004, "matmul_s": 0.003, "attention_s": 0.0005}

    def reset_step_times(self):
        self.split = {"steps": 0, **dict.fromkeys(self.STEP_SPLIT, 0.0)}

    def step_times(self):
        return dict(self.split)

    def step(self, token):
        self.split["steps"] += 1
        for k, v in self.STEP_SPLIT.items():
            self.split[k] += v
        return self._logits(token)

    def touch(self, nbytes, stride):
        self.touches.append((nbytes, stride))
        return nbytes // stride


def ticking_clock(dt=0.001):
    """A clock that advances ``dt`` seconds per reading."""
    t = [0.0]

    def clock():
        t[0] += dt
        return t[0]
    return clock


# ------------------------------------------------------------------- prompts

def test_default_prompts_ship_in_the_package():
    source, prompts = read_prompts(None)
    assert "default.txt" in source
    assert 8 <= len(prompts) <= 12 and all(p.text and p.ids is None for p in prompts)


def test_prompts_file_text_and_ids(tmp_path):
    f = tmp_path / "p.txt"
    f.write_text("hello there\n\n ids: 1, 2,3 \n")
    _, prompts = read_prompts(f)
    assert [(p.text, p.ids) for p in prompts] == [("hello there", None), (None, (1, 2, 3))]
    assert tokenize(prompts, FakeDecoder(), 4)[1] == [1, 2, 3]


@pytest.mark.parametrize("body", ["ids:", "ids: 1,x", "ids: -1", "\n\n"])
def test_bad_prompts_files(tmp_path, body):
    f = tmp_path / "p.txt"
    f.write_text(body)
    with pytest.raises(FormatError):
        read_prompts(f)


def test_tokenize_checks_vocab_and_context():
    """Before any timing, with the real decoder's rule: the prompt and every
    generated token but the last (never fed back) must fit the context."""
    from iekit.runtime.decoder import Decoder

    dec = Decoder(GOLDEN_IEBIN / "tiny-llama", ctx=64)
    with pytest.raises(IEError, match=r"^f:1: token id 320 is outside the vocabulary \(0\.\.319\)"):
        tokenize([PromptLine("f:1", ids=(1, 320))], dec, 4)
    assert tokenize([PromptLine("f:1", ids=(1,) * 60)], dec, 5) == [[1] * 60]  # 60 + 4 = 64 fits
    with pytest.raises(IEError, match=r"^f:2: a sequence of 65 tokens exceeds the context of 64 tokens"):
        tokenize([PromptLine("f:2", ids=(1,) * 60)], dec, 6)


# ------------------------------------------------------ timed window, metrics

def test_round_counts_tokens_steps_and_touches():
    dec = FakeDecoder()
    env = BenchEnv(bytes_per_token=1024, stride_bytes=256, verify_touch=True)
    t = run_round(dec, [[1, 2], [3]], 5, env, clock=ticking_clock())
    assert t.tokens == 10 and len(t.step_s) == 8 and len(t.prefill_s) == 2
    assert dec.touches == [(1024, 256)] * 10 and t.touch_checksum == 40
    assert t.step_s == pytest.approx([0.001] * 8) and t.prefill_s == pytest.approx([0.001] * 2)


def test_round_stops_at_eos_which_counts():
    dec = FakeDecoder(eos=4)  # 1 -> 2 -> 3 -> 4 (EOS)
    t = run_round(dec, [[1]], 10, BenchEnv(), clock=ticking_clock())
    assert t.tokens == 3 and len(t.step_s) == 2
    assert dec.touches == []  # no work-touch without IE_BYTES_PER_TOKEN


def test_round_stops_at_any_eos_id():
    """Llama-3 style configs list several EOS ids; a round stops on each of
    them, not only on the smallest (0 here, never generated)."""
    dec = FakeDecoder()
    dec.eos_ids = frozenset({0, 3})  # 1 -> 2 -> 3 (EOS)
    t = run_round(dec, [[1]], 10, BenchEnv(), clock=ticking_clock())
    assert t.tokens == 2 and len(t.step_s) == 1


def test_affinity_pins_the_decoder_threads():
    import os

    res = _bench(GOLDEN_IEBIN / "tiny-llama", "--max-new", "2", "--rounds", "1", "--threads", "2",
                 env={"IE_TP_USE_AFFINITY": "1", "AFFINITY": "compact"})
    r = _records(res)[0]
    allowed = sorted(os.sched_getaffinity(0))
    assert r["affinity"] == "compact" and len(r["pinned_cpus"]) == 2
    assert r["pinned_cpus"] == [allowed[i % len(allowed)] for i in range(2)]
    assert _records(_bench(GOLDEN_IEBIN / "tiny-llama", "--max-new", "2", "--rounds", "1"))[0]["pinned_cpus"] is None


def test_round_record_arithmetic():
    dec = FakeDecoder()
    env = BenchEnv(bytes_per_token=500_000)
    t = RoundTimes(wall_s=2.0, tokens=8, prefill_s=[0.1, 0.2], step_s=[0.01, 0.02, 0.03, 0.04])
    r = round_record(1, t, dec=dec, env=env, kv=(3, 4), read_bw=(0.0115, 0.012), rss_mb=10.0, base={"x": 1})
    assert r["tps_true"] == 4.0 and r["mb_per_token"] == 1.5 and r["bytes_touched"] == 12_000_000
    assert r["model_coverage"] == 0.25 and r["effective_gbps"] == pytest.approx(0.006)
    assert r["roofline_fraction"] == pytest.approx(0.5) and r["prefill_ms"] == pytest.approx(300)
    # decode alone: 4 steps x 1.5 MB in 0.1 s = 0.06 GB/s, 5x the yardstick
    assert r["decode_gbps"] == pytest.approx(0.06) and r["decode_roofline_fraction"] == pytest.approx(5.0)
    assert r["latency_p50_ms"] == pytest.approx(25) and r["latency_p95_ms"] == pytest.approx(38.5)
    assert (r["kv_hits"], r["kv_misses"], r["x"], r["touch_checksum"]) == (3, 4, 1, None)
    assert r["read_bw_gbps"] == 0.012 and r["read_bw_spread"] == pytest.approx(0.0005 / 0.012) and not r["busy"]
    one = round_record(1, RoundTimes(wall_s=1.0, tokens=1, prefill_s=[0.5]), dec=dec, env=BenchEnv(),
                       kv=(0, 0), read_bw=(1.0, 1.0), rss_mb=1.0, base={})
    assert one["latency_p50_ms"] is None and one["mb_per_token"] == 1.0
    assert one["decode_matmul_ms"] is None and one["matmul_roofline_fraction"] is None  # no split: all null


def test_round_record_step_split():
    """4 steps: 80 ms in matmuls, 10 in attention, 100 in all; 1 MB of weights
    a step (the work-touch bytes are not the kernels'): 0.05 GB/s."""
    t = RoundTimes(wall_s=2.0, tokens=5, prefill_s=[0.1], step_s=[0.025] * 4,
                   step_split={"steps": 4, "total_s": 0.1, "matmul_s": 0.08, "attention_s": 0.01})
    r = round_record(1, t, dec=FakeDecoder(), env=BenchEnv(bytes_per_token=500_000), kv=(0, 0),
                     read_bw=(0.1, 0.1), rss_mb=1.0, base={})
    assert (r["decode_matmul_ms"], r["decode_attention_ms"], r["decode_other_ms"]) == pytest.approx((20, 2.5, 2.5))
    assert r["matmul_gbps"] == pytest.approx(0.05) and r["matmul_roofline_fraction"] == pytest.approx(0.5)
    none = round_record(1, RoundTimes(wall_s=1.0, tokens=1, step_split={"steps": 0, "total_s": 0.0, "matmul_s": 0.0,
                                                                        "attention_s": 0.0}),
                        dec=FakeDecoder(), env=BenchEnv(), kv=(0, 0), read_bw=(1.0, 1.0), rss_mb=1.0, base={})
    assert none["decode_matmul_ms"] is None and none["matmul_gbps"] is None


def test_run_round_reads_the_split_of_its_own_window():
    dec = FakeDecoder()
    dec.reset_step_times()
    dec.step(1)  # before the window: not this round's
    t = run_round(dec, [[1, 2], [3]], 5, BenchEnv(), clock=ticking_clock(), ignore_eos=True)
    assert t.step_split == pytest.approx({"steps": 8, "total_s": 0.032, "matmul_s": 0.024, "attention_s": 0.004})


def test_decoder_splits_single_token_calls_only():
    """The real decoder: a prefill of several tokens is not a decode step; each
    single-token call is, and its matmul and attention time are parts of its
    wall time."""
    from iekit.runtime.decoder import Decoder
    from iekit.runtime.sampling import Sampler, stream

    dec = Decoder(GOLDEN_IEBIN / "tiny-llama", threads=2)
    dec.reset_step_times()
    dec.prefill([1, 2, 3, 4, 5])
    assert dec.step_times() == {"steps": 0, "total_s": 0.0, "matmul_s": 0.0, "attention_s": 0.0}
    dec.reset()
    dec.reset_step_times()
    assert len(list(stream(dec, [5, 6, 7], 6, Sampler(), stop_at_eos=False))) == 6
    t = dec.step_times()
    assert t["steps"] == 5 and 0 < t["attention_s"] and 0 < t["matmul_s"]
    assert t["matmul_s"] + t["attention_s"] < t["total_s"]
    dec.reset_step_times()
    assert dec.step_times()["steps"] == 0


@pytest.mark.parametrize("read_bw, wall, busy", [((0.012, 0.012), 2.0, False),   # fraction 0.5, steady
                                                 ((0.012, 0.010), 2.0, True),    # the yardstick moved 17%
                                                 ((0.004, 0.004), 2.0, True)])   # decoding faster than it
def test_busy_rounds_are_flagged(read_bw, wall, busy):
    t = RoundTimes(wall_s=wall, tokens=8, prefill_s=[0.1], step_s=[0.01] * 7)
    r = round_record(1, t, dec=FakeDecoder(), env=BenchEnv(bytes_per_token=500_000), kv=(0, 0), read_bw=read_bw,
                     rss_mb=1.0, base={})
    assert r["busy"] is busy


def test_rss_peak_is_plausible():
    assert 1 < rss_peak_mb() < 1 << 20


def test_command_with_fake_decoder(monkeypatch, tmp_path):
    """The whole command in-process against the fake: JSON Lines on
    stdout, per-round KV differences, env passed to the Decoder."""
    made = []

    def factory(*a, **kw):
        made.append(FakeDecoder(*a, **kw))
        return made[-1]

    monkeypatch.setitem(sys.modules, "iekit.runtime.decoder", types.SimpleNamespace(Decoder=factory))
    from iekit.runtime.bench import bench

    f = tmp_path / "p.txt"
    f.write_text("ids: 1,2\nids: 5\n")
    env = {"IE_ACT_PREC": "int8", "IE_TP_USE_AFFINITY": "1", "AFFINITY": "compact", "IE_BYTES_PER_TOKEN": "2048",
           "IE_VERIFY_TOUCH": "1", "IE_PRECISION": "f32"}
    try:  # click < 8.2 mixes stderr into stdout unless told not to
        runner = CliRunner(mix_stderr=False)
    except TypeError:
        runner = CliRunner()
    res = runner.invoke(bench, ["--model-dir", "m", "--prompts-file", str(f), "--max-new", "3", "--threads", "1",
                                "--rounds", "2", "--warmup", "0", "--bandwidth-mb", str(SMALL_BW_MB)], env=env)
    assert res.exit_code == 0, res.output + res.stderr
    recs = [json.loads(ln) for ln in res.stdout.splitlines()]
    assert [r["round"] for r in recs] == [1, 2]
    assert all(r["read_bw_bytes"] == SMALL_BW_MB << 20 and r["read_bw_gbps"] > 0 for r in recs)
    assert made[0].init == dict(model_dir=Path("m"), threads=1, act="int8", affinity="compact")
    assert [(r["kv_hits"], r["kv_misses"]) for r in recs] == [(0, 3), (3, 0)]
    assert all(r["tokens_generated"] == 6 and r["touch_checksum"] == 48 and r["mb_per_token"] == 1.002048
               for r in recs)
    assert "IE_PRECISION=f32 but the model's matrices are stored as int4w" in res.stderr
    assert recs[0]["dedup_active"] is None  # the fake does not say


class RejectingDecoder(FakeDecoder):
    def check_ids(self, ids, final_len=None):
        raise IEError("token id 99 is outside the vocabulary")


@pytest.mark.parametrize("decoder, needle", [
    (None, "cannot load the model"), (RejectingDecoder, "outside the vocabulary"), (FakeDecoder, None)])
def test_inputs_are_checked_before_the_yardstick(monkeypatch, tmp_path, decoder, needle):
    """The model is loaded and the prompts tokenized and checked before the
    bandwidth is measured: a bad input fails without streaming the buffer;
    then the yardstick runs once, on the decoder's thread count, before the
    first round."""
    from iekit.runtime import native

    events = []

    def factory(*a, **kw):
        events.append("decoder")
        if decoder is None:
            raise IEError("m: no such directory")
        d = decoder(*a, **kw)
        d.prefill = lambda ids, _p=d.prefill: events.append("prefill") or _p(ids)
        return d

    def read_bandwidth(bytes, threads, passes):
        events.append(("bandwidth", bytes, threads))
        return {"gbps": 1.0}

    monkeypatch.setitem(sys.modules, "iekit.runtime.decoder", types.SimpleNamespace(Decoder=factory))
    monkeypatch.setattr(native, "read_bandwidth", read_bandwidth)
    from iekit.runtime.bench import bench

    f = tmp_path / "p.txt"
    f.write_text("ids: 1,2\n")
    res = CliRunner().invoke(bench, ["--model-dir", "m", "--prompts-file", str(f), "--max-new", "2",
                                     "--rounds", "2", "--threads", "2", "--bandwidth-mb", "3"], env={})
    if needle:
        assert res.exit_code != 0 and isinstance(res.exception, IEError) and needle in str(res.exception)
        assert events == ["decoder"]
    else:
        assert res.exit_code == 0, res.output
        bw = ("bandwidth", 3 << 20, 2)  # after the warm-up round, then after each counted round
        assert events == ["decoder", "prefill", bw, "prefill", bw, "prefill", bw]


def test_warmup_ignore_eos_act_and_summary(monkeypatch, tmp_path):
    """--warmup rounds are not printed; --ignore-eos generates past EOS;
    --act reaches the decoder and wins over IE_ACT_PREC (with a warning);
    the summary gives the median; threads default to the physical cores."""
    made = []

    def factory(*a, **kw):
        made.append(FakeDecoder(*a, eos=3, **kw))
        return made[-1]

    monkeypatch.setitem(sys.modules, "iekit.runtime.decoder", types.SimpleNamespace(Decoder=factory))
    from iekit.runtime import bench as bench_mod
    from iekit.formats.workers import physical_cores

    f = tmp_path / "p.txt"
    f.write_text("ids: 1\n")
    args = ["--model-dir", "m", "--prompts-file", str(f), "--max-new", "5", "--rounds", "3", "--warmup", "2",
            "--bandwidth-mb", str(SMALL_BW_MB)]
    try:
        runner = CliRunner(mix_stderr=False)
    except TypeError:
        runner = CliRunner()
    res = runner.invoke(bench_mod.bench, args, env={"IE_ACT_PREC": "fp32"})
    recs = [json.loads(ln) for ln in res.stdout.splitlines()]
    assert [r["round"] for r in recs] == [1, 2, 3] and res.stderr.count("(not counted)") == 2
    assert all(r["tokens_generated"] == 2 and not r["ignore_eos"] and r["warmup_rounds"] == 2 for r in recs)  # 1 -> 2, 3=EOS
    assert made[0].init["threads"] == physical_cores() and made[0].init["act"] == "f32"
    assert "median" in res.stderr.splitlines()[-2]
    # then where a step's time went (FakeDecoder.STEP_SPLIT)
    assert "a decode step: 4.00 ms = weight matmuls 3.00 (75% of it;" in res.stderr.splitlines()[-1]
    assert res.stderr.splitlines()[-1].endswith("+ attention 0.50 + other 0.50")
    res = runner.invoke(bench_mod.bench, args + ["--ignore-eos", "--act", "int8"], env={"IE_ACT_PREC": "fp32"})
    recs = [json.loads(ln) for ln in res.stdout.splitlines()]
    assert all(r["tokens_generated"] == 5 and r["ignore_eos"] and r["act"] == "int8" and r["act_prec"] == "int8"
               for r in recs)
    assert made[-1].init["act"] == "int8" and "--act int8 overrides IE_ACT_PREC=fp32" in res.stderr


def test_physical_cores_from_sysfs(tmp_path, monkeypatch):
    """Two hyperthreads of one core count once; unreadable topology counts every CPU."""
    from iekit.formats import workers

    monkeypatch.setattr(workers, "allowed_cpus", lambda: {0, 1, 2})
    for cpu, core in ((0, 0), (1, 0), (2, 1)):
        d = tmp_path / f"cpu{cpu}" / "topology"
        d.mkdir(parents=True)
        (d / "physical_package_id").write_text("0\n")
        (d / "core_id").write_text(f"{core}\n")
    assert workers.physical_cores(tmp_path) == 2
    (tmp_path / "cpu2" / "topology" / "core_id").unlink()
    assert workers.physical_cores(tmp_path) == 3


def _caches(root, cpu, *caches):
    for i, (level, kind, size, shared) in enumerate(caches):
        d = root / f"cpu{cpu}" / "cache" / f"index{i}"
        d.mkdir(parents=True)
        for name, value in (("level", level), ("type", kind), ("size", size), ("shared_cpu_list", shared)):
            (d / name).write_text(f"{value}\n")


def test_last_level_cache_and_dram_probe_from_sysfs(tmp_path, monkeypatch):
    """The highest level's data/unified caches, each shared one once; the
    yardstick is 4x them, never under 256 MiB; unknown caches give 256 MiB."""
    from iekit.runtime import cpu_topology

    monkeypatch.setattr(cpu_topology, "allowed_cpus", lambda: {0, 1, 2})
    vm = tmp_path / "vm"  # this VM: private L1/L2, one 32 MiB L3 for all
    for cpu in (0, 1, 2):
        _caches(vm, cpu, (1, "Data", "32K", cpu), (1, "Instruction", "32K", cpu), (2, "Unified", "512K", cpu),
                (3, "Unified", "32768K", "0-2"))
    assert cpu_topology.last_level_cache_bytes(vm) == 32 << 20
    assert cpu_topology.dram_probe_bytes(vm) == 256 << 20
    xeon = tmp_path / "xeon"  # the GPU host's Xeon: 300 MiB of L3
    for cpu in (0, 1, 2):
        _caches(xeon, cpu, (2, "Unified", "2048K", cpu), (3, "Unified", "300M", "0-15"))
    assert cpu_topology.last_level_cache_bytes(xeon) == 300 << 20
    assert cpu_topology.dram_probe_bytes(xeon) == 1200 << 20
    two = tmp_path / "two"  # CPUs 0-1 and 2 under different 96 MiB L3s (two sockets, or two CCDs)
    for cpu in (0, 1, 2):
        _caches(two, cpu, (3, "Unified", "98304K", "0-1" if cpu < 2 else "2-3"))
    assert cpu_topology.last_level_cache_bytes(two) == 192 << 20
    assert cpu_topology.dram_probe_bytes(two) == 768 << 20
    odd = tmp_path / "odd"  # not a whole MiB: rounded up
    for cpu in (0, 1, 2):
        _caches(odd, cpu, (3, "Unified", "100000K", "0-2"))
    assert cpu_topology.dram_probe_bytes(odd) == 391 << 20  # 4 x 100000 KiB = 390.6 MiB
    (odd / "cpu1" / "cache" / "index0" / "size").write_text("lots\n")
    assert cpu_topology.last_level_cache_bytes(odd) is None
    assert cpu_topology.last_level_cache_bytes(tmp_path / "nothing") is None
    assert cpu_topology.dram_probe_bytes(tmp_path / "nothing") == 256 << 20


# ------------------------------------------------------------- real command

def _bench(model, *args, env=None, bandwidth_mb=SMALL_BW_MB):
    """``ierun bench`` as a user runs it; bandwidth_mb=None: the default yardstick."""
    import os
    bw = () if bandwidth_mb is None else ("--bandwidth-mb", str(bandwidth_mb))
    return run_tool("ierun", "bench", "--model-dir", model, *args, *bw, env={**os.environ, **(env or {})})


def _records(res):
    assert res.returncode == 0, res.stderr
    return [json.loads(ln) for ln in res.stdout.splitlines()]


def test_help_documents_fields_and_env():
    res = run_tool("ierun", "bench", "--help")
    assert res.returncode == 0
    for word in FIELDS + ("IE_PRECISION", "IE_REQUIRE_MODEL", "IE_BYTES_PER_TOKEN", "IE_STRIDE_BYTES",
                          "IE_VERIFY_TOUCH", "IE_DEDUP", "IE_ACT_PREC", "IE_TP_USE_AFFINITY", "ids: 1,2,3"):
        assert word in res.stdout, word


def test_device_errors(tmp_path):
    why = cuda.unavailable()
    if why:  # a CUDA build with a GPU runs it (tests/test_cuda_decoder.py)
        assert_one_line_error(_bench(GOLDEN_IEBIN / "tiny-llama", "--device", "cuda"), why)
    res = _bench(GOLDEN_IEBIN / "tiny-llama", "--device", "tpu")
    assert res.returncode == 2 and not res.stdout
    res = _bench(GOLDEN_IEBIN / "tiny-llama", bandwidth_mb=0)
    assert res.returncode == 2 and "--bandwidth-mb" in res.stderr and not res.stdout


@pytest.mark.parametrize("require", ["0", "1"])
def test_missing_model_is_one_line_error(tmp_path, require):
    res = _bench(tmp_path / "nope", env={"IE_REQUIRE_MODEL": require})
    assert_one_line_error(res, str(tmp_path / "nope"))
    assert not res.stdout
    assert res.stderr.startswith("error: IE_REQUIRE_MODEL=1: cannot load the model") == (require == "1")
    assert ("no stub mode" in res.stderr) == (require == "0")


def _check_consistent(r, model, prompts_file=None):
    for f in FIELDS:
        assert f in r, f
    assert r["tokens_generated"] > 0 and r["wall_time_s"] > 0
    assert math.isclose(r["tps_true"] * r["wall_time_s"], r["tokens_generated"], rel_tol=1e-9)
    assert math.isclose(r["roofline_fraction"], r["effective_gbps"] / r["read_bw_gbps"], rel_tol=1e-9)
    if r["decode_steps"]:
        assert math.isclose(r["decode_roofline_fraction"], r["decode_gbps"] / r["read_bw_gbps"], rel_tol=1e-9)
    assert math.isclose(r["effective_gbps"], r["bytes_touched"] / r["wall_time_s"] / 1e9, rel_tol=1e-9)
    assert r["bytes_touched"] == r["tokens_generated"] * (r["weight_bytes_per_token"] + r["touch_bytes_per_token"])
    assert math.isclose(r["mb_per_token"] * 1e6, r["weight_bytes_per_token"] + r["touch_bytes_per_token"])
    assert 0 < r["model_coverage"] <= 1
    # every token fed to the model this round was either reused from the KV
    # cache or computed: the prompts' tokens and one per decode step
    from iekit.runtime.decoder import Decoder

    prompt_tokens = sum(len(ids) for ids in tokenize(read_prompts(prompts_file)[1], Decoder(model), 4))
    assert r["kv_hits"] + r["kv_misses"] == prompt_tokens + r["decode_steps"]
    assert r["latency_p50_ms"] <= r["latency_p95_ms"] and r["prefill_ms"] > 0 and r["rss_peak_mb"] > 0
    if r["rss_peak_reset"] and r["read_bw_bytes"] >= 256 << 20:
        assert r["rss_peak_mb"] < 256  # the bandwidth buffer (>= 256 MiB) is not counted against a tiny model
    assert (r["device"], r["model_dir"], r["max_new"]) == ("cpu", str(model), 4)
    # the split of a decode step: parts of its time, and the matmuls' rate from it
    assert r["decode_matmul_ms"] > 0 and r["decode_attention_ms"] > 0 and r["decode_other_ms"] >= 0
    assert math.isclose(r["matmul_gbps"], r["weight_bytes_per_token"] / r["decode_matmul_ms"] / 1e6, rel_tol=1e-9)
    assert math.isclose(r["matmul_roofline_fraction"], r["matmul_gbps"] / r["read_bw_gbps"], rel_tol=1e-9)


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-llama-mixedq", "tiny-gpt-oss-mxfp4"])
def test_golden_models_two_rounds(name):
    model = GOLDEN_IEBIN / name
    default = name == "tiny-llama"  # the real default-size measurement path
    res = _bench(model, "--max-new", "4", "--rounds", "2", bandwidth_mb=None if default else SMALL_BW_MB)
    recs = _records(res)
    assert [r["round"] for r in recs] == [1, 2]
    from iekit.runtime.cpu_topology import dram_probe_bytes, last_level_cache_bytes

    llc = last_level_cache_bytes()
    assert all(r["read_bw_bytes"] == (dram_probe_bytes() if default else SMALL_BW_MB << 20) for r in recs)
    assert all(r["llc_bytes"] == llc for r in recs)
    # the default yardstick is never cache-sized; this machine's LLC is over 1 MiB (4 MiB is cache),
    # and a cache-sized one is said once on stderr
    in_cache = None if llc is None else not default and llc > 1 << 20
    assert all(r["read_bw_in_cache"] is in_cache for r in recs)
    assert res.stderr.count("MiB yardstick is under 4x the") == (1 if in_cache else 0)
    for r in recs:
        _check_consistent(r, model)
        assert r["n_prompts"] == 10 and "default.txt" in r["prompts"]
    # The decoder keeps one sequence and reuses its common prefix with the next
    # prompt: round 2's first prompt ("The capital ...") follows round 1's last
    # sequence ("The quick ..."), which share at least the token(s) of "The".
    assert recs[1]["kv_hits"] > 0
    # the matrices' storage, most bytes first (golden/manifests/tiny-llama.mixed.q4_manifest.json)
    assert recs[0]["precision"] == {"tiny-llama": "f32", "tiny-llama-mixedq": "mixed(int4w,q8_0,q4_1,q4_0)",
                                    "tiny-gpt-oss-mxfp4": "mixed(bf16,mxfp4)"}[name]
    if name == "tiny-gpt-oss-mxfp4":  # 2 of 4 experts a token: half the expert bytes and parameters
        tensors = iebin.load_model(model).tensors
        size = {t["name"]: (t["nbytes"], math.prod(t["shape"])) for t in tensors}
        experts = [size[n] for n in size if ".experts." in n]
        embed = size["model.embed_tokens.weight"]
        assert recs[0]["weight_bytes_per_token"] == (sum(b for b, _ in size.values()) - embed[0] + embed[0] // 320
                                                     - sum(b for b, _ in experts) // 2)
        assert recs[0]["active_params_per_token"] == (sum(p for _, p in size.values()) - embed[1]
                                                      - sum(p for _, p in experts) // 2)


def test_work_touch_env_and_unsupported_act(tmp_path):
    model = GOLDEN_IEBIN / "tiny-llama"
    f = tmp_path / "p.txt"
    f.write_text("ids: 1,2,3\n")
    plain = _records(_bench(model, "--prompts-file", f, "--max-new", "4", "--rounds", "1"))[0]
    res = _bench(model, "--prompts-file", f, "--max-new", "4", "--rounds", "1",
                 env={"IE_BYTES_PER_TOKEN": "1000000", "IE_VERIFY_TOUCH": "1", "IE_ACT_PREC": "fp8"})
    touched = _records(res)[0]
    _check_consistent(touched, model, f)
    assert touched["mb_per_token"] == pytest.approx(plain["mb_per_token"] + 1.0)
    assert isinstance(touched["touch_checksum"], int) and plain["touch_checksum"] is None
    # tiny-llama is f32: auto runs f32 activations
    assert touched["act_prec"] == "fp8" and touched["act"] == "f32" and plain["act"] == "f32"
    assert "IE_ACT_PREC=fp8: not supported, using auto" in res.stderr


def test_dedup_reported_as_requested_and_as_used(tmp_path, nearcopy_f32):
    """IE_DEDUP=1 reaches the decoder; dedup_active says whether its loader
    really serves tensors (false after the fallback, which is one warning),
    dedup_cache carries the loader's counters."""
    model = copy_model(nearcopy_f32, tmp_path / "m")
    args = ("--max-new", "2", "--rounds", "1")
    for f in ("model.dedup.json", "model.defaults.bin", "model.masks.bin", "model.exceptions.bin"):
        (model / f).rename(model / (f + ".off"))
    res = _bench(model, *args, env={"IE_DEDUP": "1"})
    r = _records(res)[0]
    assert (r["dedup"], r["dedup_active"], r["dedup_cache"]) == (True, False, None)
    assert [ln for ln in res.stderr.splitlines() if ln.startswith("warning:") and "machine was busy" not in ln
            and "yardstick is under" not in ln] == [f"warning: {r['warnings'][0]}"]  # 4 MiB yardstick: caches, noisy
    for f in ("model.dedup.json", "model.defaults.bin", "model.masks.bin", "model.exceptions.bin"):
        (model / (f + ".off")).rename(model / f)
    r = _records(_bench(model, *args, env={"IE_DEDUP": "1", "IE_DEDUP_STRICT": "1"}))[0]
    assert (r["dedup"], r["dedup_active"], r["warnings"]) == (True, True, [])
    groups = json.loads((model / "dedup_out" / "groups.indices.json").read_text())["groups"]
    grouped = sum(len(g["members"]) for g in groups)
    # each grouped tensor is rebuilt once, when the decoder is built (strict: hashed); every
    # product then reads it from the cache (256 MiB holds them all): nothing fused
    c = r["dedup_cache"]
    assert grouped >= 14 and c["misses"] == grouped and c["hits"] >= grouped and c["fused_calls"] == 0
    plain = _records(_bench(model, *args))[0]
    assert (plain["dedup_active"], plain["dedup_cache"]) == (False, None)

def test_llama_bench_tests_and_outputs():
    """-p/-n/-t as llama-bench takes them: one test per (threads, value),
    each ppP / tgN with the mean and spread of -r repetitions, in
    llama-bench's markdown table, csv, json and jsonl; the same tests in each."""
    import csv
    import io

    args = ("-p", "8,16", "-n", "4", "-t", "1,2", "-r", "2")
    rows = json.loads(_check_ok(_bench(GOLDEN_IEBIN / "tiny-llama", *args, "-o", "json", bandwidth_mb=None)))
    assert [(r["threads"], r["test"]) for r in rows] == [(t, x) for t in (1, 2) for x in ("pp8", "pp16", "tg4")]
    for r in rows:
        assert len(r["samples_ts"]) == 2 and r["avg_ts"] == pytest.approx(sum(r["samples_ts"]) / 2)
        assert r["avg_ts"] > 0 and r["stddev_ts"] >= 0 and r["backend"].startswith("CPU")
        # llama-bench's model column: architecture, parameters, weight type (tiny-llama: 0.12 M f32 parameters)
        assert r["model"] == "llama 0.12M F32" and r["model_filename"] == str(GOLDEN_IEBIN / "tiny-llama")
        assert (r["n_prompt"], r["n_gen"]) == ((int(r["test"][2:]), 0) if r["test"].startswith("pp")
                                               else (0, int(r["test"][2:])))
    lines = [json.loads(ln) for ln in _check_ok(_bench(GOLDEN_IEBIN / "tiny-llama", *args, "-o", "jsonl",
                                                       bandwidth_mb=None)).splitlines()]
    assert [(r["threads"], r["test"]) for r in lines] == [(r["threads"], r["test"]) for r in rows]
    table = list(csv.DictReader(io.StringIO(_check_ok(_bench(GOLDEN_IEBIN / "tiny-llama", *args, "-o", "csv",
                                                              bandwidth_mb=None)))))
    assert [(int(r["threads"]), r["test"]) for r in table] == [(r["threads"], r["test"]) for r in rows]
    md = _check_ok(_bench(GOLDEN_IEBIN / "tiny-llama", *args, bandwidth_mb=None)).splitlines()
    assert md[0] == "| model | size | params | backend | threads | test | t/s |" and len(md) == 2 + len(rows)
    assert all(" ± " in ln for ln in md[2:]) and "| 2 | tg4 |" in md[-1]


def test_llama_bench_frees_each_decoder_before_the_next_loads():
    """-t 1,2: each thread count's decoder (its rows8 copies, a mixture's
    experts) is gone before the next one loads, so memory holds one model's
    copies and --experts auto judges the memory without the last one's; the
    records say whether experts were copied."""
    import gc
    import weakref

    from iekit.runtime.bench_llama import run_tests
    from iekit.runtime.decoder import Decoder

    gc.collect()
    gc.disable()  # only reference counts free the decoders: a cycle would keep one alive and fail
    try:
        alive = []

        def load(t, ctx):
            assert all(r() is None for r in alive), "the last decoder is still alive"
            dec = Decoder(GOLDEN_IEBIN / "tiny-llama", threads=t, ctx=ctx, act="int8")
            alive.append(weakref.ref(dec))
            return dec

        rows = run_tests(load, [1, 2, 1], [8], [2], 1, "CPU")
    finally:
        gc.enable()
    assert len(alive) == 3 and [r["threads"] for r in rows] == [1, 1, 2, 2, 1, 1]
    assert all(r["experts_copied"] is False for r in rows)  # a dense model


def test_llama_bench_depths_and_cache_types():
    """-d as llama-bench takes it: every test again after D tokens fill the
    context, labelled "tg4 @ d16" with n_depth; type_k / type_v name the KV
    cache (f16 by default, -ctk / -ctv). The context is sized for the
    deepest test, and one past the model's positions says which flags asked."""
    rows = json.loads(_check_ok(_bench(GOLDEN_IEBIN / "tiny-llama", "-p", "8", "-n", "4", "-d", "0,16", "-r", "1",
                                       "-ctk", "f32", "-o", "json", bandwidth_mb=None)))
    assert [(r["test"], r["n_depth"]) for r in rows] == [("pp8", 0), ("pp8 @ d16", 16), ("tg4", 0), ("tg4 @ d16", 16)]
    assert all((r["type_k"], r["type_v"]) == ("f32", "f16") and r["avg_ts"] > 0 for r in rows)
    deep = _bench(GOLDEN_IEBIN / "tiny-llama", "-n", "4", "-d", "125", "-r", "1", bandwidth_mb=None)
    assert deep.returncode == 1 and "the largest -p/-n plus the largest -d: 129 exceeds the model's " \
        "max_position_embeddings (128)" in deep.stderr and "Traceback" not in deep.stderr
    assert json.loads(_check_ok(_bench(GOLDEN_IEBIN / "tiny-llama", "-n", "4", "-d", "124", "-r", "1", "-o", "json",
                                       bandwidth_mb=None)))[0]["test"] == "tg4 @ d124"
    rounds = _bench(GOLDEN_IEBIN / "tiny-llama", "-d", "4")
    assert rounds.returncode == 2 and "-d lists depths for llama-bench's tests" in rounds.stderr
    r = _records(_bench(GOLDEN_IEBIN / "tiny-llama", "--max-new", "2", "--rounds", "1", "-ctv", "f32"))[0]
    assert (r["type_k"], r["type_v"]) == ("f16", "f32")  # the JSON rounds name the cache too


def test_model_type_is_llama_benchs_label():
    """The GGUF's own file type where the model was imported from one as it
    was; else the type of most of the layers' matrix bytes (embedding and
    head left out), "mixed" where other types hold a third or more."""
    from iekit.runtime.bench_llama import model_type

    def t(name, dtype, nbytes):
        return {"name": name, "dtype": dtype, "nbytes": nbytes, "shape": [2, 2]}

    meta = {"model": {"model_type": "llama"}}
    layers = [t("model.layers.0.mlp.up_proj.weight", "q4_k", 700),
              t("model.layers.0.mlp.down_proj.weight", "q6_k", 300)]
    big_embed = [t("model.embed_tokens.weight", "q8_0", 5000)]
    assert model_type(meta, layers + big_embed, 135_000_000) == "llama 135M Q4_K"
    assert model_type(meta, layers[:1] + [t("model.layers.0.mlp.gate_proj.weight", "q6_k", 400)], 8_030_000_000) == \
        "llama 8.0B Q4_K mixed"
    gguf_meta = {**meta, "source": {"gguf": {"file_type": "MOSTLY_Q4_K_M"}}}
    assert model_type(gguf_meta, layers, 1_230_000) == "llama 1.23M Q4_K_M"
    assert model_type({**meta, "source": {"gguf": {"file_type": None}}}, layers, 1_230_000) == "llama 1.23M Q4_K"
    # requantized by --q4-map from an F16 GGUF: what it holds now, not its source's type
    f16_meta = {**meta, "source": {"gguf": {"file_type": "MOSTLY_F16"}}}
    requantized = {**t("model.layers.0.mlp.up_proj.weight", "mxfp4", 700), "quant_error": {"sq_error": 1.0}}
    assert model_type(f16_meta, [requantized], 1_230_000) == "llama 1.23M MXFP4"
    assert model_type(f16_meta, [t("model.layers.0.mlp.up_proj.weight", "f16", 700)], 1_230_000) == "llama 1.23M F16"


def test_gguf_with_llama_bench_flags_and_in_rounds(tmp_path):
    """`ierun bench -m file.gguf` as llama-bench is run: -m takes a GGUF,
    which is imported once; the model column is llama-bench's (the file's
    own type), and the JSON rounds name the imported directory (a GGUF's
    directory, a path object, made the rounds an internal error)."""
    gguf_file = GOLDEN_IEBIN.parent / "gguf" / "tiny-llama.mixed.gguf"
    env = {**os.environ, "IE_GGUF_CACHE": str(tmp_path / "cache")}
    res = run_tool("ierun", "bench", "-m", gguf_file, "-p", "8", "-r", "1", "-o", "json", env=env)
    rows = json.loads(_check_ok(res))
    gguf_type = gguf.GGUFReader(gguf_file).fields["general.file_type"]
    want = gguf.LlamaFileType(int(gguf_type.parts[gguf_type.data[0]][0])).name.removeprefix("MOSTLY_")
    assert [r["model"] for r in rows] == [f"llama 0.12M {want}"]
    imported = Path(rows[0]["model_filename"])
    assert imported.parent == tmp_path / "cache" and (imported / "model.ie.json").is_file()
    recs = _records(run_tool("ierun", "bench", "-m", gguf_file, "--max-new", "2", "--rounds", "1",
                             "--bandwidth-mb", str(SMALL_BW_MB), env=env))
    assert recs[0]["model_dir"] == str(imported)


@pytest.mark.parametrize("args, needle", [(("-p", "8,x"), "'x' is not an integer"),
                                          (("-t", "0", "-n", "4"), "-t: 0 is too small"),
                                          (("-t", "1,5000", "-n", "4"), "-t: 5000 is more than 4096 threads"),
                                          (("-t", "2",), "-t lists threads")])
def test_llama_bench_bad_lists_are_usage_errors(args, needle):
    res = _bench(GOLDEN_IEBIN / "tiny-llama", *args, bandwidth_mb=None)
    assert res.returncode == 2 and needle in res.stderr and "Traceback" not in res.stderr


def _check_ok(res) -> str:
    assert res.returncode == 0, res.stderr
    return res.stdout


@pytest.mark.parametrize("kind", ["fifo", "device", "not-utf8"])
def test_prompts_file_goes_through_the_hardened_reader(tmp_path, kind):
    """--prompts-file as eval's --text-file: a FIFO (it hung), /dev/zero (it
    filled memory) or bytes that are not UTF-8 (exit 3) are one line, exit 1."""
    import os

    p = tmp_path / "prompts.txt"
    if kind == "fifo":
        os.mkfifo(p)
    elif kind == "device":
        p = "/dev/zero"
    else:
        p.write_bytes(b"hello \xff\xfe world\n")
    res = run_tool("ierun", "bench", "--model-dir", GOLDEN_IEBIN / "tiny-llama", "--prompts-file", p, "--max-new", "1",
                   timeout=60)
    assert_one_line_error(res, str(p), "not UTF-8 text" if kind == "not-utf8" else "expected a regular file")
