"""The JSON Schemas read two ways agree: the product checks documents with
jsonschema-rs (formats/jsonio.py, for speed); the pure-Python jsonschema is the
independent second reading. Every golden document is accepted by both, and so
is every schema itself by the 2020-12 meta-schema; then each golden document is
broken one node at a time (a key dropped, an unknown key added, a value of
every other JSON type or out of range put in) and both must reject exactly the
same variants, with ``schema_check`` naming the broken field or an object
holding it."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import jsonschema
import pytest

from iekit.formats.errors import FormatError
from iekit.formats.jsonio import schema_check

REPO = Path(__file__).resolve().parent.parent
SCHEMAS = REPO / "schemas"
GOLDEN = REPO / "golden"

# golden document -> the schema it follows
DOCUMENTS = {
    **{str(p.relative_to(REPO)): "iebin" for p in sorted(GOLDEN.glob("**/model.ie.json"))},
    "golden/dedup/model/dedup_out/model.dedup.json": "dedup_index",
    "golden/dedup/model/dedup_out/tensor_map.json": "dedup_tensor_map",
    "golden/dedup/model/dedup_out/groups.indices.json": "dedup_groups",
    "golden/manifests/tiny-llama.mixed.q4_manifest.json": "q4_manifest",
    "golden/kl_probes/smollm2-rotated.json": "kl_probes",
    "golden/gptq_partial/progress.json": "gptq_partial",
    "golden/kl_probes_partial/progress.json": "kl_probes_partial",
    "golden/policy_measurements/tiny-llama.json": "policy_measurements",
    "golden/quantize_stages/stages.json": "quantize_stages",
}

# one document of each kind is broken node by node (the other iebin files differ in values, not in shape)
BROKEN = ("golden/iebin/tiny-llama-mixedq/model.ie.json", "golden/gguf/tiny-llama-mixed/model.ie.json",
          "golden/iebin/tiny-gpt-oss-mxfp4/model.ie.json", "golden/dedup/model/dedup_out/model.dedup.json",
          "golden/dedup/model/dedup_out/tensor_map.json", "golden/dedup/model/dedup_out/groups.indices.json",
          "golden/manifests/tiny-llama.mixed.q4_manifest.json", "golden/kl_probes/smollm2-rotated.json",
          "golden/gptq_partial/progress.json", "golden/kl_probes_partial/progress.json",
          "golden/policy_measurements/tiny-llama.json", "golden/quantize_stages/stages.json")

# what a value is replaced with: every JSON type, and numbers past the ranges the schemas allow
REPLACEMENTS = (None, True, 0, -1, 1.5, 2**64, "", "x", [], {})
LIST_ITEMS = 2  # lists are cut to their first items: the rules per item are the same


def schema_path(name: str) -> Path:
    return SCHEMAS / f"{name}.schema.json"


def python_validator(name: str) -> jsonschema.Draft202012Validator:
    schema = json.loads(schema_path(name).read_text())
    return jsonschema.Draft202012Validator(schema)


def shrink(doc):
    if isinstance(doc, list):
        return [shrink(x) for x in doc[:LIST_ITEMS]]
    if isinstance(doc, dict):
        return {k: shrink(v) for k, v in doc.items()}
    return doc


def nodes(doc, path=()):
    """(path, value) of every node under the root."""
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield path + (k,), v
            yield from nodes(v, path + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield path + (i,), v
            yield from nodes(v, path + (i,))


def variants(doc):
    """(label, path changed, broken copy) of the document, one change each."""
    def edited(path, change):
        new = copy.deepcopy(doc)
        parent = new
        for p in path[:-1]:
            parent = parent[p]
        change(parent, path[-1])
        return new

    yield "unknown key at root", ("zz_unknown",), {**copy.deepcopy(doc), "zz_unknown": 1}
    for path, value in nodes(doc):
        where = "/".join(map(str, path))
        if isinstance(path[-1], str):
            yield f"drop {where}", path, edited(path, lambda d, k: d.pop(k))
        if isinstance(value, dict):
            yield f"unknown key in {where}", path + ("zz_unknown",), edited(path, lambda d, k: d[k].update(zz_unknown=1))
        for r in REPLACEMENTS:
            if r != value or type(r) is not type(value):
                yield f"{where} = {r!r:.12}", path, edited(path, lambda d, k, r=r: d.__setitem__(k, copy.deepcopy(r)))


def field_of(path) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".") or "(root)"


def test_every_schema_is_a_valid_2020_12_schema():
    names = sorted(p.name.removesuffix(".schema.json") for p in SCHEMAS.glob("*.schema.json"))
    assert len(names) >= 7
    for name in names:
        schema = json.loads(schema_path(name).read_text())
        assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema", name
        jsonschema.Draft202012Validator.check_schema(schema)


@pytest.mark.parametrize("doc_path", sorted(DOCUMENTS))
def test_golden_documents_pass_both_readings(doc_path):
    name = DOCUMENTS[doc_path]
    doc = json.loads((REPO / doc_path).read_text())
    assert list(python_validator(name).iter_errors(doc)) == []
    schema_check(doc, schema_path(name), doc_path)


@pytest.mark.parametrize("doc_path", sorted(BROKEN))
def test_both_readings_reject_the_same_variants(doc_path):
    """jsonschema-rs must name the broken node (or a key under it), the
    object holding it, or below the root a sibling a rule ties to it (an
    ``if``/``else`` on a scheme): never
    somewhere else (jsonschema's ``best_match`` sometimes does: a bad
    ``quant.scheme`` is reported at ``quant.block_size``)."""
    name = DOCUMENTS[doc_path]
    py = python_validator(name)
    doc = shrink(json.loads((REPO / doc_path).read_text()))
    checked = rejected = 0
    wrong = []
    for label, changed, broken in variants(doc):
        py_rejects = next(py.iter_errors(broken), None) is not None
        try:
            schema_check(broken, schema_path(name), "f.json")
            field = None
        except FormatError as e:
            assert e.file == "f.json" and e.message, label
            field = e.field
        parent = field_of(changed[:-1])
        if py_rejects != (field is not None):
            wrong.append(f"{label}: jsonschema-rs names {field}, jsonschema rejects: {py_rejects}")
        elif field is not None and field != parent and not field.startswith(field_of(changed)) and not (
                parent != "(root)" and field.startswith(parent)):
            wrong.append(f"{label}: jsonschema-rs names {field}")
        checked += 1
        rejected += py_rejects
    assert not wrong, "\n".join(wrong[:20])
    # the variants do break documents (a test whose inputs all pass would prove nothing)
    assert checked > 50 and rejected > checked // 4, (checked, rejected)


def test_long_values_are_cut_in_the_error_line():
    with pytest.raises(FormatError) as ei:
        schema_check([1] * 500, schema_path("q4_manifest"), "m.json")
    assert ei.value.field == "(root)" and "..." in ei.value.message and len(str(ei.value)) < 200, str(ei.value)


def test_nesting_past_what_the_checker_takes_is_one_error_line():
    """jsonschema-rs refuses values nested over 255 deep with a ValueError;
    that is a FormatError naming the file, as the JSON reader's own limit."""
    doc = json.loads((GOLDEN / "manifests" / "tiny-llama.mixed.q4_manifest.json").read_text())
    deep = []
    for _ in range(300):
        deep = [deep]
    doc["imatrix"] = deep
    with pytest.raises(FormatError) as ei:
        schema_check(doc, schema_path("q4_manifest"), "m.json")
    assert (ei.value.file, ei.value.field) == ("m.json", "(file)") and "q4_manifest.schema.json" in ei.value.message
