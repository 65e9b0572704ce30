"""The weight-type registry (formats/weight_types.py) is the one list of weight types.

Pins everything that lists weight types to it: the JSON schemas' dtype and
scheme enums, the CLIs' choices, the runtime's kernel lists; and checks the
table's sizes against the schemes' real output, the native kernels and gguf.
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest

from iekit.formats import weight_types
from iekit.formats.weight_types import manifest_schemes
from iekit.formats.casting import encode_f32
from iekit.formats.dtypes import DTYPES
from iekit.formats.errors import IEError
from iekit.formats.quant import SCHEMES, QuantParams
from iekit.formats.weight_types import WeightType
from iekit.runtime import native
from iekit.runtime.kernels import native_weight_args

REPO = Path(__file__).resolve().parent.parent
SCHEMAS = REPO / "schemas"
QUANTIZED = weight_types.names(quantized=True)
FLOATS = weight_types.names(quantized=False)


# ----------------------------------------------------------------- the table

def test_every_row_is_one_registered_class_with_the_rows_facts():
    rows = weight_types.table()
    assert [r["name"] for r in rows] == list(weight_types.names())
    assert len(set(weight_types.names())) == len(rows)
    for r in rows:
        assert set(r) == {"name", "block_elems", "block_bytes", "quantized", "gemv", "int8_act", "act_block"}
        wt = weight_types.get(r["name"])
        assert isinstance(wt, WeightType)
        assert {k: getattr(wt, k) for k in r} == r
    assert weight_types.names() == FLOATS + QUANTIZED  # floats first, then the schemes
    assert SCHEMES == {n: weight_types.get(n) for n in QUANTIZED}


def test_float_types_are_plain_element_dtypes():
    for n in FLOATS:
        wt = weight_types.get(n)
        assert DTYPES[n].is_float and wt.block_elems == 1 and wt.block_bytes == DTYPES[n].itemsize
        assert not wt.int8_act


def test_block_sizes_match_gguf():
    """llama.cpp's own size table is the independent reference for the types
    GGUF stores byte for byte (each type's GGUF name), and its file types."""
    assert set(weight_types.gguf_names()) == set(weight_types.names()) - {"int4w", "iq4_xsh"}
    for n, g in weight_types.gguf_names().items():
        wt = weight_types.get(n)
        assert g == n.upper()
        assert (wt.block_elems, wt.block_bytes) == gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[g]]
        assert wt.GGUF_FILE_TYPE in gguf.LlamaFileType.__members__
    for n in ("int4w", "iq4_xsh"):  # ours alone
        assert weight_types.get(n).GGUF is None and weight_types.get(n).GGUF_FILE_TYPE is None


def test_a_new_type_must_state_its_checklist():
    """GGUF and the file type (every type), FALLBACK and LADDER (every
    scheme) are stated in the class itself: inheriting q4_0's would make
    q5_0 export as Q4_0."""
    with pytest.raises(TypeError, match="must state GGUF, GGUF_FILE_TYPE in its own class body"):
        class Bare(WeightType, weight_type="q4_0"):
            pass
    with pytest.raises(TypeError, match="must state FALLBACK, GGUF, GGUF_FILE_TYPE, LADDER"):
        class Inherits(type(SCHEMES["q4_0"]), weight_type="q5_0"):
            pass


def test_fallbacks_and_ladder_entries_are_selections_of_real_schemes():
    from iekit.convert import bpw_policy
    from iekit.formats.q4_manifest import selection_params

    for n in QUANTIZED:
        s = SCHEMES[n]
        for sel in s.LADDER:
            assert sel["scheme"] == n and s.check([8, 1024], selection_params(sel)) is None, (n, sel)
        if s.FALLBACK is not None:  # used where the rows are not whole blocks: it must fit SmolLM2's 576
            fb = SCHEMES[s.FALLBACK["scheme"]]
            assert s.check([8, 576], selection_params({"scheme": n})) is not None
            assert fb.check([8, 576], selection_params(s.FALLBACK)) is None, n

    # The ladder the classes add up to, pinned, with bits per weight from
    # independent sources: int4w's definition (4 + 16/g per f16 scale, twice
    # with mins), iq4_xsh's (iq4_xs's 4.25 and a bit per sub-block) and
    # gguf-py's size table for the block types.
    def bits(sel):
        if sel["scheme"] == "int4w":
            return 4 + 16 / sel["group_size"] * (1 if sel["symmetric"] else 2)
        if sel["scheme"] == "iq4_xsh":
            return 4.25 + 1 / 32
        elems, nbytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[sel["scheme"].upper()]]
        return nbytes * 8 / elems

    got = [(bits(sel), sel["scheme"], sel.get("group_size"), sel.get("symmetric")) for sel in bpw_policy.LADDER]
    assert got == [(2.625, "q2_k", None, None), (3.4375, "q3_k", None, None), (3.4375, "iq3_s", None, None), (4.125, "int4w", 128, True), (4.25, "iq4_xs", None, None), (4.25, "int4w", 64, True),
                   (4.28125, "iq4_xsh", None, None),
                   (4.5, "q4_0", None, None), (4.5, "q4_k", None, None), (4.5, "iq4_nl", None, None),
                   (4.5, "int4w", 64, False), (5.0, "q4_1", None, None), (5.0, "int4w", 32, False),
                   (5.5, "q5_k", None, None), (5.5, "q5_0", None, None), (6.0, "q5_1", None, None),
                   (6.5625, "q6_k", None, None), (8.5, "q8_0", None, None)]
    assert bpw_policy.GGUF_LADDER == tuple(sel for sel in bpw_policy.LADDER if sel["scheme"] not in ("int4w", "iq4_xsh"))


def test_names_filters():
    assert weight_types.names(quantized=True) == ("int4w", "q4_0", "q4_1", "q8_0", "q4_k", "iq4_nl", "iq4_xs", "q5_k", "q6_k", "q5_0", "q5_1", "mxfp4", "q3_k", "q2_k", "iq3_s", "iq4_xsh", "iq3_xxs", "iq2_xxs", "iq2_xs", "iq2_s", "iq1_s", "iq1_m", "nvfp4", "q1_0")
    assert weight_types.names(quantized=False) == ("f32", "f16", "bf16")
    assert weight_types.names(int8_act=True) == QUANTIZED
    assert weight_types.names(gemv=True) == weight_types.names()
    assert weight_types.names(quantized=False, int8_act=True) == ()


def test_unknown_name_is_a_clear_error():
    with pytest.raises(IEError, match=r"unknown weight type 'q7_k' \(known: f32, f16, bf16, int4w, q4_0, q4_1, q8_0, q4_k, iq4_nl, iq4_xs, q5_k, q6_k, q5_0, q5_1, mxfp4, q3_k, q2_k, iq3_s, iq4_xsh, iq3_xxs, iq2_xxs, iq2_xs, iq2_s, iq1_s, iq1_m, nvfp4, q1_0\)"):
        weight_types.get("q7_k")
    assert weight_types.find("q7_k") is None and weight_types.find(None) is None


def test_duplicate_registration_is_refused():
    with pytest.raises(TypeError, match="'q4_0' is already registered"):
        class Again(WeightType, weight_type="q4_0"):
            GGUF = GGUF_FILE_TYPE = None
    with pytest.raises(TypeError, match="'q7_k' has no row"):
        class Unknown(WeightType, weight_type="q7_k"):
            pass
    # Subclassing without weight_type= is an abstract intermediate: not registered.
    class Abstract(WeightType):
        pass

    assert weight_types.get("q4_0") is SCHEMES["q4_0"]
    assert [type(weight_types.get(n)).__name__ for n in weight_types.names()] == \
        ["F32", "F16", "BF16", "Int4W", "Q4_0", "Q4_1", "Q8_0", "Q4_K", "IQ4_NL", "IQ4_XS", "Q5_K", "Q6_K", "Q5_0", "Q5_1", "MXFP4", "Q3_K", "Q2_K", "IQ3_S", "IQ4_XSH", "IQ3_XXS", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ1_S", "IQ1_M", "NVFP4", "Q1_0"]


# ------------------------------------------------------------------- nbytes

def _params(name: str):
    if name != "int4w":
        yield QuantParams(name)
        return
    for g in (None, 32, 64, 128, 96):
        for sym in (True, False):
            for sd in ("f16", "f32"):
                yield QuantParams("int4w", g, sym, sd)


@pytest.mark.parametrize("name", QUANTIZED)
def test_nbytes_is_what_quantize_writes(name):
    s = weight_types.get(name)
    rng = np.random.default_rng(0)
    n = 0
    for rows in (1, 3, 5):
        for cols in (32, 64, 96, 128, 192, 256, 512, 768):
            for p in _params(name):
                if s.check([rows, cols], p):
                    continue
                w = rng.standard_normal((rows, cols)).astype(np.float32)
                got = len(s.quantize(w, p))
                assert s.nbytes(rows, cols, p) == got, (name, rows, cols, p)
                assert native.expected_nbytes(**native_weight_args(s, rows, cols, p)) == got
                n += 1
    # q4_k, iq4_xs: 3 rows x the 3 widths of whole super-blocks; q1_0: the 4 of whole 128-blocks
    assert n >= (9 if s.block_elems == 256 else 12 if s.block_elems == 128 else 18)


@pytest.mark.parametrize("name", FLOATS)
def test_float_nbytes(name):
    wt = weight_types.get(name)
    for rows, cols in ((1, 1), (3, 7), (5, 32)):
        got = len(encode_f32(np.zeros((rows, cols), np.float32), name))
        assert wt.nbytes(rows, cols) == got == native.expected_nbytes(**native_weight_args(wt, rows, cols))


# ------------------------------------------------------------------- schemas

def _enums(node, path=()):
    """(path, values) of every dtype/scheme enum or const in a JSON Schema."""
    if isinstance(node, dict):
        for k, v in node.items():
            if k in ("dtype", "scheme") and isinstance(v, dict) and ("enum" in v or "const" in v):
                yield "/".join((*path, k)), v["enum"] if "enum" in v else [v["const"]]
            yield from _enums(v, (*path, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _enums(v, (*path, str(i)))


def _schema(name):
    return json.loads((SCHEMAS / name).read_text())


def test_schema_dtype_and_scheme_enums_are_the_registry():
    found = {(f.name, p): v for f in sorted(SCHEMAS.glob("*.json")) for p, v in _enums(json.loads(f.read_text()))}
    grouped = [n for n in QUANTIZED if "group_size" in SCHEMES[n].QUANT_KEYS]
    pinned = {
        ("iebin.schema.json", "properties/tensors/items/properties/dtype"): [*DTYPES, *QUANTIZED],
        # a quantized dtype needs a quant object
        ("iebin.schema.json", "properties/tensors/items/allOf/0/if/properties/dtype"): list(QUANTIZED),
        # (nvfp4 comes from checkpoints alone: weight_types.manifest_schemes)
        ("q4_manifest.schema.json", "$defs/selection_core/properties/scheme"): ["keep", *manifest_schemes()],
        # group_size / symmetric / scale_dtype: only for the schemes that take them
        ("q4_manifest.schema.json", "$defs/selection_core/if/properties/scheme"): grouped,
    }
    for where, values in pinned.items():
        assert found.get(where) == values, where
    # The quant object: one alternative per key set, each listing the schemes
    # that take exactly its keys; together every scheme, once.
    alts = _schema("iebin.schema.json")["$defs"]["quant"]["oneOf"]
    listed = []
    for i, alt in enumerate(alts):
        schemes = found.pop(("iebin.schema.json", f"$defs/quant/oneOf/{i}/properties/scheme"))
        listed += schemes
        for n in schemes:
            assert set(alt["required"]) == set(SCHEMES[n].QUANT_KEYS), n
    assert sorted(listed) == sorted(QUANTIZED)
    # Every dtype/scheme enum of every schema is checked here: a new one must be added above.
    assert set(found) == set(pinned)


# --------------------------------------------------------------------- CLIs

def _choices(cmd, param):
    return tuple(next(p for p in cmd.params if p.name == param).type.choices)


def test_cli_choices_are_the_registry():
    from iekit.convert.cli import cli
    from iekit.runtime import decoder_weights, kernels, microbench

    assert _choices(cli.commands["q4-manifest"], "scheme") == manifest_schemes()
    assert _choices(cli.commands["hf-to-iebin"], "dtype") == FLOATS
    kernel_choices = _choices(microbench.microbench, "kernel")
    assert set(kernel_choices) - {"bsr", "dedup"} == set(weight_types.names(gemv=True))
    assert microbench.PACKED == weight_types.names(int8_act=True)
    assert kernels.GEMV_DTYPES == weight_types.names(gemv=True)
    assert decoder_weights.FLOAT_VECTOR_DTYPES == FLOATS
