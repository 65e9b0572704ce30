"""The native extension: CPU feature report, ISA dispatch, streaming-read kernel."""

from __future__ import annotations

import numpy as np
import pytest

from iekit.runtime import native

ISAS = native.cpu_features()["isas"]


def test_cpu_features_report():
    f = native.cpu_features()
    assert f["isas"][0] == "scalar"
    assert f["selected_isa"] == f["isas"][-1]
    assert f["logical_cpus"] >= 1
    assert set(f["flags"]) >= {"avx2", "fma", "avx512f"}
    # An ISA is only offered when the CPU has its features.
    if "avx2" in f["isas"]:
        assert f["flags"]["avx2"] and f["flags"]["fma"]
    want_512 = f["flags"]["avx2"] and all(f["flags"][k] for k in ("avx512f", "avx512bw", "avx512vl", "avx512vbmi", "avx512vbmi2",
                                                                   "avx512vnni"))
    assert ("avx512" in f["isas"]) == want_512
    assert ("avxvnni" in f["isas"]) == (f["flags"]["avx2"] and f["flags"]["avxvnni"])
    # amx also needs the OS's grant (isa.cpp), which Linux gives any process that asks
    assert ("amx" in f["isas"]) == (want_512 and f["flags"]["amx_tile"] and f["flags"]["amx_int8"])
    # Benchmarks report the variant that runs: the best one at or below the
    # level, from the table each family's driver dispatches through.
    variants = native._native.kernel_variants()
    # A CPU with AVX-512 VNNI may lack AVX-VNNI's VEX form (Zen 4), so avx512 never falls back to avxvnni.
    order = ["scalar", "avx2", "avxvnni", "avx512", "amx"]
    for family, levels in variants.items():
        assert levels[0] == "scalar" and levels == sorted(levels, key=order.index)
        for isa in f["isas"]:
            below = [v for v in levels if order.index(v) <= order.index(isa) and not (v == "avxvnni" and isa in ("avx512", "amx"))]
            assert native._native.kernel_isa(family, isa) == max(below, key=order.index)
    # What this build holds: dedup, the prefill GEMM, the rows8 GEMVs (VNNI), attention (32 registers) and the
    # yardsticks have AVX-512 bodies; the rows8 GEMVs and the int8 yardstick AVX-VNNI ones and AMX ones.
    assert variants == {"gemv": ["scalar", "avx2", "avxvnni", "avx512", "amx"], "gemm": ["scalar", "avx2", "avx512"],
                        "attention": ["scalar", "avx2", "avx512"],
                        "bsr": ["scalar", "avx2"], "stream_read": ["scalar", "avx2", "avxvnni", "avx512", "amx"],
                        "dedup": ["scalar", "avx2", "avx512"]}


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("n", [0, 1, 7, 31, 32, 33, 1000, 65537])
def test_stream_sum_matches_float64(isa, threads, n):
    rng = np.random.default_rng(n)
    x = rng.standard_normal(n).astype(np.float32)
    got = native.stream_sum(x, threads=threads, isa=isa)
    ref = x.astype(np.float64).sum()
    scale = np.abs(x).astype(np.float64).sum() + 1e-30
    assert abs(got - ref) <= 1e-5 * scale


def test_isa_override(monkeypatch):
    monkeypatch.setenv("IE_ISA", "scalar")
    assert native.cpu_features()["selected_isa"] == "scalar"
    monkeypatch.setenv("IE_ISA", "avx9000")
    with pytest.raises(ValueError, match="avx9000"):
        native.cpu_features()
    with pytest.raises(ValueError, match="not available"):
        native.stream_sum(np.ones(4, np.float32), isa="bogus")


def test_read_bandwidth_reports_positive_rate():
    r = native.read_bandwidth(bytes=8 << 20, threads=1, passes=2)
    assert r["gbps"] > 0 and r["gbps_best"] >= r["gbps"]
    assert r["bytes"] == 8 << 20 and r["passes"] == 2


@pytest.mark.parametrize("isa", ISAS)
def test_fma_yardstick_loop_matches_float64(isa):
    """The FMA peak's loop computes what it claims: 192 chains v = v*m + c."""
    m, c, iters = 0.999, 1e-3, 1000
    v = 0.5 + np.arange(192) / 1024
    for _ in range(iters):
        v = v * m + c
    got = native._native.fma_chains(0.5, m, c, iters, isa=isa)
    assert got == pytest.approx(v.sum(), rel=1e-5)


def test_fma_peak_reports_positive_rate():
    r = native.fma_peak(threads=2, passes=1)
    assert r["gflops"] > 0 and r["gflops_best"] >= r["gflops"] and r["threads"] == 2
    with pytest.raises(ValueError, match="threads"):
        native.fma_peak(threads=0)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("a, b", [(3, -7), (127, 127), (255, -64), (0, 5)])
def test_int8_yardstick_loop_matches_int64(isa, a, b):
    """The int8 peak's loop computes what it claims: 128 int32 lanes += 4ab,
    as vpmaddubsw (a unsigned, b signed) then vpmaddwd compute it; at amx,
    four tiles of 16 x 16 int32 lanes += 64ab (tdpbusd), the multiply-adds
    its peak counts."""
    iters = 1000
    lanes, per_step = (4 * 16 * 16, 64) if isa == "amx" else (128, 4)
    assert native._native.int8_chains(a, b, iters, isa=isa) == lanes * iters * per_step * a * b
    for bad in ((256, 0), (255, 127)):  # not a byte; a pair sum past int16, which vpmaddubsw saturates
        with pytest.raises(ValueError, match="a must be a byte"):
            native._native.int8_chains(*bad, 1, isa=isa)


def test_int8_peak_reports_positive_rate():
    r = native.int8_peak(threads=2, passes=1)
    assert r["gmacs"] > 0 and r["gmacs_best"] >= r["gmacs"] and r["threads"] == 2
    with pytest.raises(ValueError, match="threads"):
        native.int8_peak(threads=0)


def test_ierun_info_json():
    import json

    from conftest import run_tool

    res = run_tool("ierun", "info", "--json")
    assert res.returncode == 0, res.stderr
    info = json.loads(res.stdout)
    assert info["selected_isa"] in info["isas"]
