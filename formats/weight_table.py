"""The weight types' table and base class: the dtypes a matrix can be
stored in and run through GEMV.

``TABLE`` is the one place that says what each weight type is (block size,
bytes per block, quantized, kernels present); one class per type gives it
behaviour and is registered by subclassing, as gguf-py's ``quants.py`` does
with its size table::

    class Q4_0(Scheme, weight_type="q4_0"): ...

The plain float types are registered below; the quantized ones are the
schemes of ``quant.py``, which builds on this module. Look types up through
``weight_types.py``, which imports both and so holds every type; everything
else derives from it: the CLIs' choices, the runtime's kernel lists, the
validators' messages (and ``tests/test_weight_types.py`` pins the JSON
schemas' enums to it).

Adding a weight type on the Python side: a row in ``TABLE``, its class
(a quantized one in ``quant.py``), the dtype enums of
schemas/iebin.schema.json (and, if the manifest may select it,
schemas/q4_manifest.schema.json), and docs/formats/quant.md.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, ClassVar

from .dtypes import DTYPES

BLOCK = 32  # elements per block (or sub-block, q4_k) of the quantized types


@dataclass(frozen=True)
class WeightFacts:
    name: str
    block_elems: int  # elements per block (1: a plain element type)
    block_bytes: int  # bytes of one block (int4w: its packed codes; scales/mins are separate planes)
    quantized: bool
    gemv: bool  # the native GEMV and dequantization kernels read it
    int8_act: bool  # the GEMV has an int8-activation path (act="int8")
    # act="int8": elements per activation scale (0: no such path); 256 where the kernels sum a super-block's
    # sub-blocks as integers under one scale (llama.cpp's q8_K), docs/formats/quant.md "Int8 activations"
    act_block: int


def _plain(name: str) -> WeightFacts:
    return WeightFacts(name, 1, DTYPES[name].itemsize, quantized=False, gemv=True, int8_act=False, act_block=0)


def _blocks(name: str, block_bytes: int, block_elems: int = BLOCK, act_block: int = BLOCK) -> WeightFacts:
    return WeightFacts(name, block_elems, block_bytes, quantized=True, gemv=True, int8_act=True, act_block=act_block)


# In registry order (the order every list of weight types is shown in).
TABLE: tuple[WeightFacts, ...] = (
    _plain("f32"),
    _plain("f16"),
    _plain("bf16"),
    _blocks("int4w", 16),  # 32 nibbles; scales (and mins) follow in planes
    _blocks("q4_0", 2 + 16),  # d: f16, 32 nibbles
    _blocks("q4_1", 2 + 2 + 16),  # d, m: f16, 32 nibbles
    _blocks("q8_0", 2 + 32),  # d: f16, 32 x int8
    _blocks("q4_k", 2 + 2 + 12 + 128, 256, 256),  # d, dmin: f16, 8 x 6-bit scale and min, 256 nibbles
    _blocks("iq4_nl", 2 + 16),  # d: f16, 32 nibbles indexing the non-linear grid
    _blocks("iq4_xs", 2 + 2 + 4 + 128, 256, 256),  # d: f16, 8 x 6-bit scale (high bits, low nibbles), 256 nibbles
    _blocks("q5_k", 2 + 2 + 12 + 32 + 128, 256, 256),  # q4_k's d, dmin, scales; 256 fifth bits, 256 nibbles
    _blocks("q6_k", 128 + 64 + 16 + 2, 256, 256),  # 256 low nibbles, 256 high bit pairs, 16 x int8 scale, d: f16
    _blocks("q5_0", 2 + 4 + 16),  # d: f16, 32 fifth bits, 32 nibbles
    _blocks("q5_1", 2 + 2 + 4 + 16),  # d, m: f16, 32 fifth bits, 32 nibbles
    _blocks("mxfp4", 1 + 16),  # e: E8M0 scale byte, 32 e2m1 nibbles
    _blocks("q3_k", 32 + 64 + 12 + 2, 256, 256),  # 256 high bits, 256 low bit pairs, 16 x 6-bit scale, d: f16
    _blocks("q2_k", 16 + 64 + 2 + 2, 256, 256),  # 16 x (4-bit scale, 4-bit min), 256 bit pairs, d, dmin: f16
    _blocks("iq3_s", 2 + 64 + 8 + 32 + 4, 256, 256),  # d: f16, 64 x 9-bit codebook index (low bytes, high bits), 256 signs, 8 x 4-bit scale
    _blocks("iq4_xsh", 2 + 2 + 4 + 128 + 1, 256, 256),  # iq4_xs's bytes, then 8 grid-shift bits (one per sub-block)
    _blocks("iq3_xxs", 2 + 64 + 32, 256, 256),  # d: f16, 64 x 8-bit codebook index, 8 x (28 sign bits, 4-bit scale)
    _blocks("iq2_xxs", 2 + 64, 256, 256),  # d: f16, per sub-block 4 x 8-bit codebook index and (28 sign bits, 4-bit scale)
    _blocks("iq2_xs", 2 + 64 + 8, 256, 256),  # d: f16, 32 x u16 (9-bit codebook index, 7 sign bits), 16 x 4-bit scale
    _blocks("iq2_s", 2 + 32 + 32 + 8 + 8, 256, 256),  # d: f16, 32 x 10-bit codebook index (low bytes), 256 signs, high bits, 16 x 4-bit scale
    _blocks("iq1_s", 2 + 32 + 16, 256, 256),  # d: f16, 32 x 11-bit ternary codebook index (low bytes), 8 x u16 (high bits, 3-bit scale, shift sign)
    _blocks("iq1_m", 32 + 16 + 8, 256, 256),  # 32 x 11-bit index (low bytes), 32 x (3 high bits, shift sign), 16 x 3-bit scale and d in 4 u16
    _blocks("nvfp4", 4 + 32, 64),  # 4 x UE4M3 scale (one per 16), 64 e2m1 nibbles; a float32 tensor_scale in quant
    _blocks("q1_0", 2 + 16, 128),  # d: f16, 128 sign bits (bit j of byte k: element 8k + j; set: +d, clear: -d)
)
_FACTS: dict[str, WeightFacts] = {f.name: f for f in TABLE}

_REGISTRY: dict[str, WeightType] = {}


class WeightType:
    """A weight type. Concrete types subclass it (or a subclass) with
    ``weight_type=NAME``: that registers one instance and sets the facts of
    NAME's ``TABLE`` row as class attributes. Subclasses without it are
    abstract (e.g. ``quant.Scheme``)."""

    name: ClassVar[str]
    block_elems: ClassVar[int]
    block_bytes: ClassVar[int]
    quantized: ClassVar[bool]
    gemv: ClassVar[bool]
    int8_act: ClassVar[bool]
    act_block: ClassVar[int]

    # What every registered type states in its own class body, never by
    # inheritance (q5_0 subclasses q4_0 but is not GGUF's Q4_0): the
    # checklist of a new type, enforced when its class is defined. Subclasses
    # add their own items (quant.Scheme: FALLBACK, LADDER).
    DECLARE: ClassVar[tuple[str, ...]] = ("GGUF", "GGUF_FILE_TYPE")
    GGUF: ClassVar[str | None]  # gguf.GGMLQuantizationType name of the same bytes (import and export copy them)
    GGUF_FILE_TYPE: ClassVar[str | None]  # gguf.LlamaFileType of a file mostly of this type (general.file_type)

    def __init_subclass__(cls, weight_type: str | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if weight_type is None:
            return
        if weight_type not in _FACTS:
            raise TypeError(f"{cls.__qualname__}: weight type {weight_type!r} has no row in "
                            f"formats/weight_table.py TABLE (rows: {', '.join(_FACTS)})")
        required = {a for k in cls.__mro__ for a in vars(k).get("DECLARE", ())}
        missing = sorted(a for a in required if a not in vars(cls))
        if missing:
            raise TypeError(f"{cls.__qualname__}: weight type {weight_type!r} must state {', '.join(missing)} in its "
                            "own class body (None where it has none): see WeightType.DECLARE")
        if weight_type in _REGISTRY:
            raise TypeError(f"{cls.__qualname__}: weight type {weight_type!r} is already registered "
                            f"(by {type(_REGISTRY[weight_type]).__qualname__})")
        for key, value in asdict(_FACTS[weight_type]).items():
            setattr(cls, key, value)
        _REGISTRY[weight_type] = cls()

    def nbytes(self, rows: int, cols: int, params: Any = None) -> int:
        """Payload bytes of a [rows, cols] matrix (cols a multiple of block_elems)."""
        return rows * (cols // self.block_elems) * self.block_bytes


class F32(WeightType, weight_type="f32"):
    """IEEE binary32 elements."""

    GGUF, GGUF_FILE_TYPE = "F32", "ALL_F32"


class F16(WeightType, weight_type="f16"):
    """IEEE binary16 elements."""

    GGUF, GGUF_FILE_TYPE = "F16", "MOSTLY_F16"


class BF16(WeightType, weight_type="bf16"):
    """bfloat16 elements (the top half of a binary32)."""

    GGUF, GGUF_FILE_TYPE = "BF16", "MOSTLY_BF16"


def names(*, quantized: bool | None = None, gemv: bool | None = None,
          int8_act: bool | None = None) -> tuple[str, ...]:
    """Weight type names in registry order; each given filter must match."""
    want = {"quantized": quantized, "gemv": gemv, "int8_act": int8_act}
    return tuple(f.name for f in TABLE
                 if all(v is None or getattr(f, k) == v for k, v in want.items()))


def registered(name: str) -> WeightType | None:
    """The instance registered for ``name``, or None (weight_types.py's lookups
    see every type; this module alone sees those defined so far)."""
    return _REGISTRY.get(name)
