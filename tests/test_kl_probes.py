"""KL probes (formats/kl_probes.py, ``ieconv kl-probes``) and the
``--target-bpw --kl-probes`` policy that spends bits by them
(convert/bpw_policy.py). The end-to-end runs use the 256-wide Llama of
tests/test_quantize_imatrix.py (its ``wide`` fixture)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from conftest import GOLDEN, assert_one_line_error, run_tool
from iekit.convert import bpw_policy
from iekit.formats import kl_probes
from iekit.formats.errors import FormatError, IEError
from test_quantize_imatrix import TEXT, _quantize, wide  # noqa: F401  (the fixture)

GOOD = {"format": "iekit-kl-probes", "version": 1, "base": {"scheme": "q5_1"}, "probe": {"scheme": "iq4_nl"},
        "tokens": 1020, "base_kl": 0.05, "groups": {"model.layers.*.self_attn.v_proj.weight": 0.14,
                                                    "lm_head.weight": 0.08}}


def test_round_trip_is_byte_identical(tmp_path):
    f = tmp_path / "p.json"
    f.write_bytes(kl_probes.dumps(kl_probes.from_json(GOOD, f)))
    again = kl_probes.dumps(kl_probes.read(f))
    assert again == f.read_bytes()
    assert json.loads(again) == GOOD


def test_golden_file_reads_and_writes_back_byte_identical():
    """golden/kl_probes: ieconv kl-probes on the rotated SmolLM2 (docs/quality.md)."""
    golden = GOLDEN / "kl_probes" / "smollm2-rotated.json"
    p = kl_probes.read(golden)
    assert kl_probes.dumps(p) == golden.read_bytes()
    assert p.base == {"scheme": "q5_1"} and p.probe == {"scheme": "iq4_nl"} and len(p.groups) == 8
    assert max(p.groups, key=p.groups.get) == "model.layers.*.self_attn.v_proj.weight"


@pytest.mark.parametrize("change, field", [
    ({"format": "iekit-imatrix"}, "format"),
    ({"version": 2}, "version"),
    ({"tokens": "1020"}, "tokens"),
    ({"tokens": 0}, "tokens"),
    ({"base_kl": -0.1}, "base_kl"),
    ({"groups": {}}, "groups"),
    ({"groups": {"lm_head.weight": "0.1"}}, "groups.lm_head.weight"),
    ({"groups": {"lm_head.weight": -1}}, "groups.lm_head.weight"),
    ({"base": {"scheme": "keep"}}, "base.scheme"),
    ({"base": {"scheme": "q9_9"}}, "base.scheme"),
    ({"probe": {"scheme": "q4_0", "group_size": 64}}, "probe.group_size"),
    ({"extra": 1}, "(root)"),
])
def test_broken_rules_are_one_error_naming_the_field(tmp_path, change, field):
    f = tmp_path / "p.json"
    with pytest.raises(FormatError) as e:
        kl_probes.from_json({**GOOD, **change}, f)
    assert e.value.field == field and e.value.file == str(f)


def test_non_finite_json_is_refused(tmp_path):
    f = tmp_path / "p.json"
    f.write_text(json.dumps(GOOD).replace("0.14", "NaN"))
    with pytest.raises(IEError, match="p.json"):
        kl_probes.read(f)


BASE, PROBE = '{"scheme": "q5_1"}', '{"scheme": "iq4_nl"}'  # the selections as the policy keys them


def _one_slope(probes, errors) -> dict[str, float]:
    """The KL per unit of error of each matrix under one set of probes: its curve is that one line."""
    curves = bpw_policy.kl_curves([probes], errors)
    assert all(c.starts == (0.0,) for c in curves.values())
    return {name: c.slopes[0] for name, c in curves.items()}


def test_one_set_is_measured_kl_over_predicted_error():
    """Per group, the KL its probe added over the predicted error that adds:
    group a (two matrices) added 0.20 KL for 2 x 2.0 of error, b 0.05 for 1.0;
    a group whose probe added none keeps 1% of the (upper) median, a, and a
    matrix of no group the geometric mean of a and b."""
    errors = {"a.0.w": {BASE: 1.0, PROBE: 3.0}, "a.1.w": {BASE: 1.0, PROBE: 3.0},
              "b.0.w": {BASE: 0.5, PROBE: 1.5}, "c.0.w": {BASE: 1.0, PROBE: 2.0}, "d.0.w": {BASE: 1.0, PROBE: 2.0}}
    probes = kl_probes.KLProbes({"scheme": "q5_1"}, {"scheme": "iq4_nl"}, 100, 0.05,
                                {"a.*.w": 0.25, "b.0.w": 0.10, "c.*": 0.04})
    k = _one_slope(probes, errors)
    assert k["a.0.w"] == k["a.1.w"] == pytest.approx(0.20 / 4.0)
    assert k["b.0.w"] == pytest.approx(0.05 / 1.0)
    assert k["c.0.w"] == pytest.approx(0.01 * 0.05)
    assert k["d.0.w"] == pytest.approx(np.sqrt(0.05 * 0.05))


def test_a_group_the_selections_cannot_store_gets_the_geometric_mean():
    errors = {"a.0.w": {BASE: 1.0, PROBE: 3.0}, "b.0.w": {BASE: 1.0, PROBE: 2.0}, "c.0.w": {BASE: 1.0}}
    probes = kl_probes.KLProbes({"scheme": "q5_1"}, {"scheme": "iq4_nl"}, 100, 0.0,
                                {"a.*": 0.2, "b.*": 0.4, "c.*": 9.0})
    k = _one_slope(probes, errors)
    assert k["c.0.w"] == pytest.approx(np.sqrt(0.1 * 0.4))


def test_probes_that_measured_nothing_are_refused():
    probes = kl_probes.KLProbes({"scheme": "q5_1"}, {"scheme": "iq4_nl"}, 100, 0.05, {"a.*": 0.01})
    with pytest.raises(IEError, match="no KL cost"):
        _one_slope(probes, {"a.0.w": {BASE: 1.0, PROBE: 2.0}})


LOW = '{"scheme": "iq3_s"}'


def test_probes_at_two_bit_ranges_price_each_error_where_it_was_measured():
    """Set 1 (q5_1 -> iq4_nl) measured group a's slope at 0.20 / 4 = 0.05 per
    unit of error, set 2 (iq4_nl -> iq3_s) at 1.20 / 8 = 0.15: for a.0.w,
    whose iq4_nl error is 3, KL(e) is 0.05 e up to 3 and 0.15 per unit past
    it, checked by hand in float64. One set alone is one slope (the usual
    linear weighting). A matrix set 2 did not measure (o_proj at iq3_s's
    super-blocks: here b stores iq4_nl but not iq3_s) still gets set 2's
    segment: its own set-1 slope (0.10) times how much steeper set 2 found
    the matrices both measured (0.15 / 0.05 = 3), not set 2's mean."""
    errors = {"a.0.w": {BASE: 1.0, PROBE: 3.0, LOW: 9.0}, "a.1.w": {BASE: 1.0, PROBE: 3.0, LOW: 5.0},
              "b.0.w": {BASE: 0.5, PROBE: 1.5}}
    hi = kl_probes.KLProbes({"scheme": "q5_1"}, {"scheme": "iq4_nl"}, 100, 0.05, {"a.*.w": 0.25, "b.0.w": 0.15})
    lo = kl_probes.KLProbes({"scheme": "iq4_nl"}, {"scheme": "iq3_s"}, 100, 0.20, {"a.*.w": 1.40})
    one = bpw_policy.kl_curves([hi], errors)
    assert one["a.0.w"](7.0) == pytest.approx(0.05 * 7.0)
    both = bpw_policy.kl_curves([lo, hi], errors)  # the order given does not matter
    slope_lo = 1.20 / (6.0 + 2.0)
    assert both["a.0.w"](2.0) == pytest.approx(0.05 * 2.0)
    assert both["a.0.w"](9.0) == pytest.approx(0.05 * 3.0 + slope_lo * 6.0)
    assert both["b.0.w"].starts == (0.0, 1.5)
    assert both["b.0.w"](2.5) == pytest.approx(0.10 * 1.5 + 0.30 * 1.0)
    # placed: the segments start where the candidates' own (compensated) errors put the base
    placed = bpw_policy.kl_curves([hi, lo], errors, {"a.0.w": {PROBE: 2.0}})
    assert placed["a.0.w"].starts == (0.0, 2.0) and placed["a.1.w"].starts == (0.0, 3.0)


def test_two_probe_sets_from_one_base_are_refused(wide, tmp_path):
    f = tmp_path / "p.json"
    f.write_text(json.dumps(GOOD))
    res = run_tool("ieconv", "q4-manifest", "--hf-dir", wide["hf"], "-o", tmp_path / "q.json", "--target-bpw", "5",
                   "--kl-probes", f, "--kl-probes", f)
    assert res.returncode == 2 and "two sets measured from the same --base" in res.stderr
    assert not (tmp_path / "q.json").exists()


def test_kl_probes_measure_every_group_and_the_policy_reads_them(wide, tmp_path):
    probes = tmp_path / "probes.json"
    res = run_tool("ieconv", "kl-probes", "-q", "--hf-dir", wide["hf"], "--ref-dir", wide["f32"], "--text-file", TEXT,
                   "--imatrix", wide["imatrix"], "--ctx", "64", "--chunks", "2", "-o", probes)
    assert res.returncode == 0, res.stderr
    p = kl_probes.read(probes)
    m = tmp_path / "usual.json"
    assert run_tool("ieconv", "q4-manifest", "--hf-dir", wide["hf"], "-o", m, "--scheme", "q5_1",
                    "--quantize-head").returncode == 0
    usual = json.loads(m.read_text())
    assert set(p.groups) == {r["match"] for r in usual["rules"]} | set(usual["tensors"])
    assert p.tokens == 2 * (63 - 32) and p.base_kl > 0
    assert all(kl > 0 for kl in p.groups.values())
    assert not list(tmp_path.glob(".kl-probes-*"))  # the work folder is gone
    # each probe is the KL of that artifact converted on its own (the probes compose it from two conversions)
    g = "model.layers.*.self_attn.v_proj.weight"
    one = {**usual, "rules": [{**r, "scheme": "iq4_nl"} if r["match"] == g else r for r in usual["rules"]]}
    m1 = tmp_path / "one.json"
    m1.write_text(json.dumps(one))
    res = run_tool("ieconv", "hf-to-iebin", "-q", "--hf-dir", wide["hf"], "--q4-map", m1, "--out-dir", tmp_path / "one",
                   "--imatrix", wide["imatrix"])
    assert res.returncode == 0, res.stderr
    res = run_tool("ierun", "eval", "--model-dir", tmp_path / "one", "--ref-dir", wide["f32"], "--text-file", TEXT,
                   "--ctx", "64", "--chunks", "2", "--act", "f32", "-ctk", "f32", "-ctv", "f32", "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout.splitlines()[-1])["kld_mean"] == p.groups[g]  # the probes run the exact f32 cache
    # the policy reads them: the budget is met and the manifest says what inspect measures
    out, m2, res = _quantize(wide, "bpw-probes", "--target-bpw", "5.5", "--imatrix", wide["imatrix"],
                             "--kl-probes", probes)
    bpw = json.loads(run_tool("ieconv", "inspect", out, "--json").stdout)["quantized_bits_per_weight"]
    assert bpw <= 5.5 and bpw == pytest.approx(json.loads(m2.read_text())["bits_per_weight"], abs=1e-4)


def test_groups_a_super_block_probe_cannot_store_are_left_unprobed(wide, tmp_path):
    """A 320-wide FFN: down_proj's rows are not whole 256-element super-blocks,
    so --probe iq3_s leaves its group out (named on stderr) instead of failing
    the run; the policy then weights it by the other groups' mean."""
    from safetensors.numpy import load_file, save_file

    hf = tmp_path / "hf"
    shutil.copytree(wide["hf"], hf)
    w = load_file(str(hf / "model.safetensors"))
    for name in list(w):
        if name.endswith(("gate_proj.weight", "up_proj.weight")):
            w[name] = np.ascontiguousarray(w[name][:320])
        elif name.endswith("down_proj.weight"):
            w[name] = np.ascontiguousarray(w[name][:, :320])
    save_file(w, str(hf / "model.safetensors"))
    cfg = json.loads((hf / "config.json").read_text())
    (hf / "config.json").write_text(json.dumps({**cfg, "intermediate_size": 320}))
    f32 = tmp_path / "f32"
    assert run_tool("ieconv", "hf-to-iebin", "-q", "--hf-dir", hf, "--out-dir", f32).returncode == 0
    probes = tmp_path / "probes.json"
    res = run_tool("ieconv", "kl-probes", "--hf-dir", hf, "--ref-dir", f32, "--text-file", TEXT, "--ctx", "64",
                   "--chunks", "2", "--base", "iq4_nl", "--probe", "iq3_s", "-o", probes)
    assert res.returncode == 0, res.stderr
    assert "not probed: model.layers.*.mlp.down_proj.weight (iq3_s needs cols to be a multiple of 256" in res.stderr
    p = kl_probes.read(probes)
    assert "model.layers.*.mlp.down_proj.weight" not in p.groups and "model.layers.*.mlp.up_proj.weight" in p.groups
    assert len(p.groups) == 7 and all(kl > p.base_kl for kl in p.groups.values())
    res = run_tool("ieconv", "q4-manifest", "--hf-dir", hf, "-o", tmp_path / "m.json", "--target-bpw", "4.0",
                   "--kl-probes", probes)
    assert res.returncode == 0, res.stderr
    # a base that falls back per tensor (iq4_xs -> iq4_nl on 320 columns): one line for the layer pattern
    res = run_tool("ieconv", "kl-probes", "--hf-dir", hf, "--ref-dir", f32, "--text-file", TEXT, "--ctx", "64",
                   "--chunks", "2", "--base", "iq4_xs", "--probe", "iq3_s", "-o", tmp_path / "xs.json")
    assert res.returncode == 0, res.stderr
    assert res.stderr.count("not probed") == 1
    assert "not probed: model.layers.*.mlp.down_proj.weight (2 tensors; iq3_s needs cols" in res.stderr
    # a probe no matrix can store measures nothing: refused before any conversion
    res = run_tool("ieconv", "kl-probes", "--hf-dir", GOLDEN / "hf" / "tiny-llama", "--ref-dir", f32,
                   "--text-file", TEXT, "--base", "iq4_nl", "--probe", "iq3_s", "-o", tmp_path / "none.json")
    assert res.returncode == 2 and "--probe iq3_s can store no group" in res.stderr


def test_a_group_that_costs_much_kl_gets_the_bits(wide, tmp_path):
    """Probes saying the value projections cost 100x the KL of everything else:
    at a budget that cannot raise everything, they get the top of the ladder."""
    groups = {"model.layers.*.self_attn.v_proj.weight": 5.0, "model.layers.*.self_attn.q_proj.weight": 0.06,
              "model.layers.*.self_attn.k_proj.weight": 0.06, "model.layers.*.self_attn.o_proj.weight": 0.06,
              "model.layers.*.mlp.gate_proj.weight": 0.06, "model.layers.*.mlp.up_proj.weight": 0.06,
              "model.layers.*.mlp.down_proj.weight": 0.06, "lm_head.weight": 0.06}
    f = tmp_path / "p.json"
    f.write_bytes(kl_probes.dumps(kl_probes.KLProbes({"scheme": "q5_1"}, {"scheme": "iq4_nl"}, 100, 0.05, groups)))
    m = tmp_path / "q.json"
    res = run_tool("ieconv", "q4-manifest", "--hf-dir", wide["hf"], "-o", m, "--target-bpw", "4.6",
                   "--imatrix", wide["imatrix"], "--kl-probes", f)
    assert res.returncode == 0, res.stderr
    sel = json.loads(m.read_text())["tensors"]
    for name, s in sel.items():
        if "v_proj" in name:
            assert s == {"scheme": "q8_0"}, (name, s)


def test_bad_probes_file_is_one_line(wide, tmp_path):
    f = tmp_path / "p.json"
    f.write_text(json.dumps({**GOOD, "base_kl": "x"}))
    res = run_tool("ieconv", "q4-manifest", "--hf-dir", wide["hf"], "-o", tmp_path / "q.json", "--target-bpw", "5",
                   "--kl-probes", f)
    assert_one_line_error(res, "p.json", "base_kl")
    assert not (tmp_path / "q.json").exists()
    res = run_tool("ieconv", "q4-manifest", "--hf-dir", wide["hf"], "-o", tmp_path / "q.json", "--kl-probes", f)
    assert res.returncode == 2 and "--kl-probes weights --target-bpw" in res.stderr


def test_kl_probes_bad_input_is_one_line(wide, tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    args = ("ieconv", "kl-probes", "--hf-dir", wide["hf"], "--ref-dir", wide["f32"], "-o", tmp_path / "p.json")
    assert_one_line_error(run_tool(*args, "--text-file", empty), "empty.txt", "no text")
    short = tmp_path / "short.txt"
    short.write_text("hello")
    assert_one_line_error(run_tool(*args, "--text-file", short), "short.txt", "fewer than one chunk")
    assert_one_line_error(run_tool(*args, "--text-file", TEXT, "--ctx", "100000"), "--ctx", "max_position_embeddings")
    res = run_tool(*args, "--text-file", TEXT, "--base", "q5_1", "--probe", "q5_1")
    assert res.returncode == 2 and "--probe must differ from --base" in res.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.txt", "short.txt"]  # no output, no work folder


def _two_sets(tmp_path, v_lo: float):
    """Two probe files for the wide model, each group's KL given: at 5 bits
    (q5_1 -> iq4_nl) the value projections cost almost nothing; at 3 bits
    (iq4_nl -> iq3_s) they cost v_lo, the other groups 0.45."""
    groups = ["model.layers.*.self_attn.v_proj.weight", "model.layers.*.self_attn.q_proj.weight",
              "model.layers.*.self_attn.k_proj.weight", "model.layers.*.self_attn.o_proj.weight",
              "model.layers.*.mlp.gate_proj.weight", "model.layers.*.mlp.up_proj.weight",
              "model.layers.*.mlp.down_proj.weight", "lm_head.weight"]
    hi, lo = tmp_path / "hi.json", tmp_path / "lo.json"
    hi.write_bytes(kl_probes.dumps(kl_probes.KLProbes({"scheme": "q5_1"}, {"scheme": "iq4_nl"}, 100, 0.05,
                                                      {g: 0.0501 if "v_proj" in g else 0.10 for g in groups})))
    lo.write_bytes(kl_probes.dumps(kl_probes.KLProbes({"scheme": "iq4_nl"}, {"scheme": "iq3_s"}, 100, 0.20,
                                                      {g: v_lo if "v_proj" in g else 0.45 for g in groups})))
    return hi, lo


def _policy(wide, tmp_path, target: str, *probes) -> tuple[dict, str]:
    """q4-manifest --target-bpw on the wide model with these probe files: its selections and stderr."""
    m = tmp_path / "q.json"
    args = [a for p in probes for a in ("--kl-probes", p)]
    res = run_tool("ieconv", "q4-manifest", "--hf-dir", wide["hf"], "-o", m, "--overwrite", "--target-bpw", target,
                   "--quantize-head", "--imatrix", wide["imatrix"], *args)
    assert res.returncode == 0, res.stderr
    return json.loads(m.read_text())["tensors"], res.stderr


def test_probes_at_low_bits_keep_a_group_that_suffers_there_out_of_them(wide, tmp_path):
    """Two sets: at 5 bits (q5_1 -> iq4_nl) the value projections cost
    almost nothing, at 3 bits (iq4_nl -> iq3_s) 20x the others. At 3.5 bits
    per weight the first set alone sends them to the bottom of the ladder;
    with both, they keep at least 4.25 bits."""
    hi, lo = _two_sets(tmp_path, v_lo=5.0)

    def v_bits(*probes) -> list[float]:
        sel, stderr = _policy(wide, tmp_path, "3.5", *probes)
        return [bpw_policy.selection_bits(s) for n, s in sorted(sel.items()) if "v_proj" in n], stderr

    bits, stderr = v_bits(hi)
    assert max(bits) < 3.0
    # the user is told the probes stop above the budget, and what to measure (once: before the policy runs)
    assert "note: the KL probes reach down to iq4_nl (4.5 bits per weight)" in stderr
    assert "ieconv kl-probes --base iq4_nl --probe TYPE" in stderr
    assert stderr.count("note:") == 1
    bits, stderr = v_bits(hi, lo)
    assert min(bits) >= 4.25 and "note:" not in stderr


def test_matrices_far_below_the_probes_are_named(wide, tmp_path):
    """A budget above the probes can still send matrices far below them: one
    set at 4-5 bits that finds the value projections almost free puts them at
    the bottom of the ladder at 4.6 bits per weight, over a bit under the
    probe's iq4_nl, where their KL is extrapolated. The note names them and
    what to measure; with a set measured down there it says nothing."""
    hi, lo = _two_sets(tmp_path, v_lo=0.25)

    def run(*probes):
        sel, stderr = _policy(wide, tmp_path, "4.6", *probes)
        return {n: s for n, s in sel.items() if bpw_policy.selection_bits(s) < 3.5}, stderr

    far, stderr = run(hi)
    assert far and any("v_proj" in n for n in far)
    noun = "matrix" if len(far) == 1 else "matrices"
    assert f"note: {len(far)} {noun} went over a bit below the KL probes' lowest type, iq4_nl (4.5 bits" in stderr
    first = sorted(far)[0]
    assert f"{first} {far[first]['scheme']}" in stderr
    assert "ieconv kl-probes --base iq4_nl --probe TYPE" in stderr and stderr.count("note:") == 1
    far, stderr = run(hi, lo)
    assert "note:" not in stderr
