"""Non-finite stored floats in a tensor payload, found while streaming it.

A NaN or ±inf that reaches a weight matrix turns every logit into NaN, and
a checksum computed over the bad bytes matches them. So ``ieconv validate
--deep`` also reads what the payload *means* (docs/formats/iebin.md,
docs/formats/quant.md):

- quantized tensors: every stored scale and minimum (``int4w`` scales/mins
  planes; the f16 fields of every block, as its scheme's ``F16_FIELDS``
  lists them: ``d``, and ``m`` (``q4_1``, ``q5_1``) or ``dmin`` (``q4_k``,
  ``q5_k``)) must be finite, and every E8M0 scale byte (``mxfp4``'s ``e``)
  at most 252 (above, the block's values overflow float32; 255 is NaN), and
  every UE4M3 scale byte (``nvfp4``'s ``d0`` .. ``d3``) below 0x7F (E4M3's
  NaN; bit 7 is the sign an unsigned scale has not) -- always, nothing the
  quantizer writes is ever otherwise;
- float tensors (``f64 f32 f16 bf16``): every element must be finite unless
  the caller allows non-finite values (``--allow-nonfinite``, as for BSR).

Converters check what they write the same way (``checked``, and
IebinWriter's read-back of copied payloads), naming the source file, so
that no tool here writes an artifact ``validate --deep`` refuses.

``PayloadScan`` takes the payload in chunks of any size, in order (it keeps
at most one block of carry-over), and remembers the first problem as one
message naming the element, group or block. Integer tensors have nothing to
check. Detection works on bit patterns (all-ones exponent), so it needs no
float arithmetic and treats bf16 like the others.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Iterable, Iterator, Mapping

import numpy as np

from .dtypes import DTYPES
from .errors import FormatError
from .quant import E8M0_MAX, SCHEMES, matrix_dims

# element bytes -> (unsigned view, exponent mask, float view for messages)
_F16 = ("<u2", 0x7C00, "<f2")
_F32 = ("<u4", 0x7F800000, "<f4")
_F64 = ("<u8", 0x7FF0000000000000, "<f8")
_BF16 = ("<u2", 0x7F80, None)
_FLOAT_LAYOUT = {"f16": _F16, "f32": _F32, "f64": _F64, "bf16": _BF16}


def _first_nonfinite(raw: np.ndarray, layout: tuple) -> int | None:
    """Index of the first non-finite element of ``raw`` (uint8, whole elements)."""
    udt, mask, _ = layout
    u = raw.view(udt)
    bad = np.flatnonzero((u & np.array(mask, dtype=udt)) == mask)
    return int(bad[0]) if bad.size else None


def _value(raw: np.ndarray, i: int, layout: tuple) -> str:
    udt, _, fdt = layout
    if fdt is None:  # bf16: widen the bits
        v = float((raw.view(udt)[i:i + 1].astype(np.uint32) << 16).view(np.float32)[0])
    else:
        v = float(raw.view(fdt)[i])
    return repr(v)  # 'nan', 'inf', '-inf'


class PayloadScan:
    """Feed a tensor entry's payload with ``feed``; ``problem`` is the first
    non-finite value found, as a message, or None."""

    def __init__(self, entry: Mapping[str, Any], allow_nonfinite: bool = False, hint: bool = True):
        self.problem: str | None = None
        self._hint = hint  # a float's message names --allow-nonfinite (the caller has it)
        self._pos = 0  # payload bytes consumed by _check
        self._carry = b""
        dtype, shape = entry["dtype"], list(entry["shape"])
        self._shape = shape
        self._check = None
        self._unit = 1
        scheme = SCHEMES.get(dtype)
        if scheme is not None:
            count, rows, cols = matrix_dims(shape)  # int4w: never a stack
            self._stack_rows = rows if len(shape) == 3 else 0  # rows per expert of a stack (its messages say which)
            rows *= count  # a stack of block matrices is one matrix of all their rows
            self._rows, self._cols = rows, cols
            if dtype == "int4w":
                p = scheme.params_from(entry["quant"], cols)
                self._groups = cols // (p.group_size or cols)
                layout = _F16 if p.scale_dtype == "f16" else _F32
                self._layout = layout
                self._unit = 2 if p.scale_dtype == "f16" else 4
                self._qs = rows * cols // 2
                self._ns = rows * self._groups * self._unit
                self._planes = ["scale"] if p.symmetric else ["scale", "min"]
                self._check = self._int4w
            else:
                self._unit = scheme.block_bytes
                self._elems = scheme.block_elems
                self._scheme = scheme
                self._fields = scheme.F16_FIELDS
                self._e8m0 = scheme.E8M0_FIELDS
                self._ue4m3 = scheme.UE4M3_FIELDS
                self._check = self._blocks
        elif dtype in _FLOAT_LAYOUT and not allow_nonfinite:
            self._layout = _FLOAT_LAYOUT[dtype]
            self._unit = DTYPES[dtype].itemsize
            self._dtype = dtype
            self._check = self._floats

    @property
    def active(self) -> bool:
        """False when this tensor has nothing to check (integers, allowed floats)."""
        return self._check is not None

    def feed(self, chunk: bytes | memoryview) -> None:
        if self._check is None or self.problem is not None:
            return
        data = self._carry + bytes(chunk) if self._carry else chunk
        whole = len(data) - len(data) % self._unit
        self._carry = bytes(data[whole:])
        if whole:
            raw = np.frombuffer(data, dtype=np.uint8, count=whole)
            self.problem = self._check(raw, self._pos)
            self._pos += whole

    # -- per kind ----------------------------------------------------------

    def _floats(self, raw: np.ndarray, start: int) -> str | None:
        i = _first_nonfinite(raw, self._layout)
        if i is None:
            return None
        e = start // self._unit + i
        where = f"element {e}"
        if len(self._shape) > 1:
            where += f" (index {tuple(int(v) for v in np.unravel_index(e, self._shape))})"
        return (f"{self._dtype} {where} is {_value(raw, i, self._layout)}; non-finite weights are invalid"
                + (" (pass --allow-nonfinite to accept them)" if self._hint else ""))

    def _int4w(self, raw: np.ndarray, start: int) -> str | None:
        end = start + raw.size
        for k, plane in enumerate(self._planes):
            p0 = self._qs + k * self._ns
            lo, hi = max(start, p0), min(end, p0 + self._ns)
            if lo >= hi:
                continue
            part = raw[lo - start:hi - start]
            i = _first_nonfinite(part, self._layout)
            if i is not None:
                e = (lo - p0) // self._unit + i
                r, g = divmod(e, self._groups)
                return (f"int4w {plane} of row {r}, group {g} ({plane}s[{e}]) is {_value(part, i, self._layout)}; "
                        "non-finite scales and minimums are invalid")
        return None

    def _blocks(self, raw: np.ndarray, start: int) -> str | None:
        blocks = raw.reshape(-1, self._unit)
        first = None  # (block within the chunk, field name, what its value is)
        for f, (name, _off) in enumerate(self._fields):
            col = np.ascontiguousarray(self._scheme.f16_field(blocks, f)).view(np.uint8)
            i = _first_nonfinite(col, _F16)
            if i is not None and (first is None or i < first[0]):
                first = (i, name, f"{_value(col, i, _F16)}; non-finite block scales are invalid")
        for name, off in self._e8m0:
            bad = np.flatnonzero(blocks[:, off] > E8M0_MAX)
            if bad.size and (first is None or bad[0] < first[0]):
                i = int(bad[0])
                first = (i, name, f"{blocks[i, off]} (E8M0 codes above {E8M0_MAX} overflow float32; 255 is NaN)")
        for name, off in self._ue4m3:
            bad = np.flatnonzero(blocks[:, off] >= 0x7F)
            if bad.size and (first is None or bad[0] < first[0]):
                i = int(bad[0])
                first = (i, name, f"0x{blocks[i, off]:02X} (UE4M3 scales are unsigned, bit 7 clear; 0x7F is NaN)")
        if first is None:
            return None
        i, name, what = first
        k = start // self._unit + i
        r, b = divmod(k, self._cols // self._elems)
        row = f"expert {r // self._stack_rows}, row {r % self._stack_rows}" if self._stack_rows else f"row {r}"
        return f"block {k} ({row}, columns {b * self._elems}..{b * self._elems + self._elems - 1}): {name} is {what}"


def scan_bytes(entry: Mapping[str, Any], raw: Any, allow_nonfinite: bool = False) -> str | None:
    """The first non-finite stored value of a whole payload (bytes or a
    contiguous uint8 array), or None."""
    s = PayloadScan(entry, allow_nonfinite)
    s.feed(np.frombuffer(raw, dtype=np.uint8))
    return s.problem


def checker(entry: Mapping[str, Any], source: str | os.PathLike, tensor: str, allow_nonfinite: bool = False,
            hint: bool = True) -> Callable[[bytes | memoryview], None] | None:
    """A function to feed ``entry``'s payload to, chunk by chunk, that raises
    a FormatError naming ``source`` and ``tensor`` at the first non-finite
    value; None when the tensor has nothing to check. ``hint``: the caller
    offers --allow-nonfinite, and the message says so."""
    scan = PayloadScan(entry, allow_nonfinite, hint)
    if not scan.active:
        return None

    def feed(chunk: bytes | memoryview) -> None:
        scan.feed(chunk)
        if scan.problem:
            raise FormatError(source, f"tensor {tensor!r}", scan.problem)
    return feed


def checked(chunks: Iterable[bytes], entry: Mapping[str, Any], source: str | os.PathLike, tensor: str,
            allow_nonfinite: bool = False) -> Iterator[bytes]:
    """``chunks`` (a payload for ``entry``) passed on unchanged, each only
    after it was checked (``checker``)."""
    feed = checker(entry, source, tensor, allow_nonfinite)
    for c in chunks:
        if feed is not None:
            feed(c)
        yield c
