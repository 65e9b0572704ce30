"""The payload file's disk writes start while a conversion runs
(formats.atomic.start_writeback, IebinWriter): over consecutive ranges that
cover what was written, and without changing a byte of it."""

from __future__ import annotations

import os

import numpy as np

from dedup_util import write_iebin
from iekit.formats import atomic, iebin


def test_writeback_ranges_cover_the_payload_in_order(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(iebin, "WRITEBACK_BYTES", 1 << 20)
    monkeypatch.setattr(iebin, "start_writeback", lambda fd, off, n: calls.append((off, n)))
    rng = np.random.default_rng(0)
    tensors = {f"t{i}": ("u8", [n], rng.integers(0, 256, n, dtype=np.uint8).tobytes())
               for i, n in enumerate([700_000, 500_000, 1_300_000, 100, 2_000_000])}
    d = write_iebin(tmp_path / "m", tensors)
    size = (d / iebin.BIN_NAME).stat().st_size
    assert calls, "no writeback was started"
    assert calls[0][0] == 0
    for (o1, n1), (o2, _n2) in zip(calls, calls[1:]):
        assert o2 == o1 + n1, calls  # consecutive, no gap, no overlap
    assert all(n >= 1 << 20 for _o, n in calls)
    assert calls[-1][0] + calls[-1][1] <= size and size - (calls[-1][0] + calls[-1][1]) < 1 << 20


def test_writeback_leaves_the_bytes_as_written(tmp_path, monkeypatch):
    rng = np.random.default_rng(1)
    tensors = {f"t{i}": ("u8", [n], rng.integers(0, 256, n, dtype=np.uint8).tobytes())
               for i, n in enumerate([3_000_000, 1_000_000, 2_500_000])}
    monkeypatch.setattr(iebin, "WRITEBACK_BYTES", 1 << 20)
    a = write_iebin(tmp_path / "a", tensors)
    monkeypatch.setattr(iebin, "start_writeback", lambda fd, off, n: None)
    b = write_iebin(tmp_path / "b", tensors)
    assert (a / iebin.BIN_NAME).read_bytes() == (b / iebin.BIN_NAME).read_bytes()
    assert (a / iebin.META_NAME).read_bytes() == (b / iebin.META_NAME).read_bytes()


def test_start_writeback_is_a_hint(tmp_path):
    p = tmp_path / "f"
    p.write_bytes(b"x" * 4096)
    fd = os.open(p, os.O_RDWR)
    try:
        atomic.start_writeback(fd, 0, 4096)
        atomic.start_writeback(fd, 0, 0)
    finally:
        os.close(fd)
    atomic.start_writeback(fd, 0, 4096)  # a closed descriptor: ignored, as any failure
    assert p.read_bytes() == b"x" * 4096
