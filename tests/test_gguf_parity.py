"""benchmarks/gguf_parity.py's reading of llama-perplexity's KL output
(llama.cpp 0.3.36's format), whole and with its summary lost, as its
logger thread loses it on a loaded machine (llama.cpp issue 22142)."""

from __future__ import annotations

import gguf_parity

CHUNKS = """chunk             PPL               ln(PPL(Q)/PPL(base))          KL Divergence              Δp RMS            Same top p
   1     500.3178 ±   71.0568      -0.00033 ±    0.00110       0.00004 ±    0.00000     0.004 ±  0.001 %    98.413 ±  1.587 %
   2     611.7060 ±   70.4611      -0.00065 ±    0.00070       0.00003 ±    0.00000     0.003 ±  0.000 %    99.206 ±  0.794 %
"""
LAST = """   3     640.4622 ±   61.0024      -0.00092 ±    0.00060       0.00012 ±    0.00002     0.003 ±  0.001 %    98.942 ±  0.746 %
"""
SUMMARY = """
====== KL divergence statistics ======
Mean    KLD:   0.000117 ±   0.000021
Maximum KLD:   0.000193

====== Token probability statistics ======
Same top p: 98.942 ± 0.746 %
"""


def test_the_summary_is_read_where_printed():
    assert gguf_parity.kld_result(CHUNKS + LAST + SUMMARY, 3) == {"kld": 0.000117, "se": 0.000021, "top1": 0.98942}


def test_a_lost_summary_is_read_from_the_last_chunk():
    """The last chunk's running figures are the summary's, to 5 decimals."""
    assert gguf_parity.kld_result(CHUNKS + LAST, 3) == {"kld": 0.00012, "se": 0.00002, "top1": 0.98942}


def test_a_run_missing_its_last_chunk_is_no_result():
    assert gguf_parity.kld_result(CHUNKS, 3) is None
    assert gguf_parity.kld_result("", 3) is None
