"""``ieconv q4-manifest --target-bpw B``: a per-tensor mix of schemes that
meets an average bits-per-weight budget, spending bits where they buy most.

What llama.cpp's Q4_K_M hard-codes (some attention-value and FFN-down
matrices at 6 bits), derived here per model from its own numbers: every
matrix the policy quantizes gets a ladder of candidate selections ordered by
bits per weight; for each, the quantizer's own importance-weighted squared
error is measured on a sample of the matrix's rows (the imatrix's column
means of x², or 1 without one), scaled to the whole matrix. That error is
the expected squared error the matrix adds to its outputs per token
(E[(ΔW x)²] = Σ ΔW² E[x²] for independent columns). It ranks the candidates
of one matrix well, but not matrices against each other: an error in a value
projection's outputs costs the model far more than the same error in a
down projection's. With KL probes (``ieconv kl-probes``, measured KL per
group of matrices) each matrix's error is converted to KL (kl_curves);
without them it is taken as it is. For a policy ``ieconv gptq`` converts,
``--ref-dir`` measures each candidate as gptq quantizes it, under the
matrix's full input covariance (choose's ``covariance``): compensation
shrinks the errors of matrices with correlated inputs several times more
than others', which moves the bits (on the widened SmolLM2 at 4.0 bits, KL
0.114 -> 0.096, docs/quality.md). Starting from every matrix's cheapest candidate, the step
with the largest error saved per extra bit is taken while the budget allows
(a greedy knapsack over each matrix's candidates on the lower convex hull of
error against bits, so that its steps save less and less per bit).

The budget is the average over all quantized matrices (bytes × 8 / elements,
scales and minimums included), as llama.cpp counts its file types.
"""

from __future__ import annotations

import fnmatch
import heapq
import json
import math
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from iekit.formats import gptq
from iekit.formats.errors import FormatError, IEError
from iekit.formats.kl_probes import KLProbes
from iekit.formats.policy_measurements import Measurements
from iekit.formats.q4_manifest import selection_params
from iekit.formats.quant import SCHEMES, QuantError

SAMPLE_ROWS = 64  # rows measured per matrix (evenly spaced)

def selection_bits(sel: dict[str, Any]) -> float:
    """Bits per weight of a selection (on whole 256-element rows, which every scheme and group size divides)."""
    return SCHEMES[sel["scheme"]].nbytes(1, 256, selection_params(sel)) * 8 / 256


def _ladder(schemes: list[str]) -> tuple[dict[str, Any], ...]:
    """The candidates of ``schemes`` (each scheme's LADDER, quant.py), cheapest
    first; of equal sizes a type llama.cpp reads first (an exact tie of
    errors, as on an all-zero matrix, then exports as it is)."""
    order = list(SCHEMES)
    sels = [sel for n in schemes for sel in SCHEMES[n].LADDER]
    return tuple(sorted(sels, key=lambda sel: (selection_bits(sel), SCHEMES[sel["scheme"]].GGUF is None,
                                                order.index(sel["scheme"]))))


# A matrix gets those its shape allows, and of several with the same size
# the one with the least error on its rows.
LADDER: tuple[dict[str, Any], ...] = _ladder(list(SCHEMES))
# The candidates llama.cpp has (q4-manifest --gguf-types): a policy of these
# exports to GGUF byte for byte (ieconv iebin-to-gguf); int4w would be repacked
# as Q4_0/Q4_1 there, at 4.5/5 bits instead of its 4.125-4.5.
GGUF_LADDER: tuple[dict[str, Any], ...] = _ladder([n for n in SCHEMES if SCHEMES[n].GGUF is not None])


@dataclass
class Choice:
    """One matrix's candidates (ascending bits) and which is chosen."""

    name: str
    elems: int
    options: list[tuple[dict[str, Any], int, float]] = field(default_factory=list)  # (selection, bytes, error)
    at: int = 0
    members: list["Choice"] | None = None  # a tied group's matrices (choose's tied), given its selection

    @property
    def selection(self) -> dict[str, Any]:
        return self.options[self.at][0]

    @property
    def bits(self) -> int:
        return self.options[self.at][1] * 8


def sample_rows(rows: int) -> list[int]:
    """The rows each candidate is measured on: all, or SAMPLE_ROWS evenly spaced."""
    if rows <= SAMPLE_ROWS:
        return list(range(rows))
    return sorted({int(r) for r in np.linspace(0, rows - 1, SAMPLE_ROWS).round()})


def lower_hull(options: list[tuple[dict, int, float]]) -> list[tuple[dict, int, float]]:
    """The options (ascending bytes) on the lower convex hull of (bytes,
    error): each step then saves less error per extra bit than the one
    before, which the greedy allocation needs. A size whose error lies on or
    above the line between its neighbours would be skipped by an exact
    allocation anyway, but blocks the greedy from the larger step behind it."""
    hull: list[tuple[dict, int, float]] = []
    for o in options:
        if hull and o[2] >= hull[-1][2]:
            continue  # more bytes for no less error
        while len(hull) >= 2:
            (_s1, b1, e1), (_s2, b2, e2) = hull[-2], hull[-1]
            if (e1 - e2) * (o[1] - b1) <= (e1 - o[2]) * (b2 - b1):  # hull[-1] saves no more per byte than o
                hull.pop()
            else:
                break
        hull.append(o)
    return hull


def selection_key(sel: dict[str, Any]) -> str:
    """A selection as a dictionary key."""
    return json.dumps(sel, sort_keys=True)


def _storable(shape: list[int], selections) -> list[tuple[dict, Any, Any, int]]:
    """(selection, scheme, params, bytes) of each distinct selection that can
    store a matrix of ``shape`` (an expert stack: its matrices' rows one
    after another)."""
    out: dict[str, tuple[dict, Any, Any, int]] = {}
    for sel in selections:
        scheme, p = SCHEMES[sel["scheme"]], selection_params(sel)
        if selection_key(sel) not in out and not scheme.check(shape, p):
            out[selection_key(sel)] = (sel, scheme, p, scheme.nbytes(math.prod(shape[:-1]), shape[-1], p))
    return list(out.values())


def _measure(name: str, shape: list[int], rows: np.ndarray, imp: np.ndarray | None, selections,
             cov: Any = None, compensate: bool = False,
             row_ids: list[int] | None = None) -> dict[str, tuple[dict, int, float]]:
    """Per selection that can store the matrix (by selection_key):
    (selection, bytes, predicted error), the error measured on ``rows`` and
    scaled to all rows.
    With ``cov`` (the input covariance and its gptq.inverse_factor) the
    error is Σ δ H δᵀ, no independence of the columns assumed; with
    ``compensate`` the rows are quantized as ieconv gptq quantizes them
    (formats/gptq.py: each block's rounding error moved onto the columns
    after it), so the error is the one the artifact will have. For an
    expert stack ``cov`` may be expert -> its covariance (or None): each
    expert's rows (``row_ids``: which rows of the stack ``rows`` are) are
    then measured under its own, weighted by its diagonal, as gptq
    quantizes them; one expert's covariance is asked for at a time."""
    storable = _storable(shape, selections)
    sums = {selection_key(sel): 0.0 for sel, *_ in storable}
    def groups():  # (covariance, rows, importance) of each expert of a stack, or of the matrix
        if not callable(cov):
            yield cov, rows, imp
            return
        expert = np.asarray(row_ids) // shape[-2]
        for e in np.unique(expert):
            c = cov(int(e))
            yield c, rows[expert == e], None if c is None else gptq.importance(c[0]).astype(np.float32)

    for c, mine, g_imp in groups():
        for sel, scheme, p, _nbytes in storable:
            err = QuantError()
            if c is None:
                scheme.measured_rows(mine, p, name, g_imp, err)
            elif compensate:
                err = gptq.quantize(mine, c[0], scheme, p, name, c[1])[1]
            else:
                err.add_covariance(mine, scheme.dequantize_rows(scheme.quantize_rows(mine, p, name, g_imp), shape[-1],
                                                                p), c[0])
            sums[selection_key(sel)] += err.sq_error
    scale = math.prod(shape[:-1]) / rows.shape[0]
    return {selection_key(sel): (sel, nbytes, sums[selection_key(sel)] * scale) for sel, _s, _p, nbytes in storable}


def _known(cache: Measurements | None, name: str, shape: list[int], kind: str, selections,
           measure: Callable[[list[dict]], dict[str, tuple[dict, int, float]]]) -> dict[str, tuple[dict, int, float]]:
    """_measure's answer for ``selections``: from ``cache`` where it has
    them (their bytes checked against the matrix's), the rest measured and
    added to it."""
    have = cache.get(name, kind) if cache is not None else {}
    out, missing = {}, []
    for sel, _scheme, _p, nbytes in _storable(shape, selections):
        key = selection_key(sel)
        if key not in have:
            missing.append(sel)
        elif have[key][0] != nbytes:
            raise FormatError(cache.path, f"matrices.{name}.{kind}.{key}",
                              f"{have[key][0]} bytes, but the matrix takes {nbytes} in this selection")
        else:
            out[key] = (sel, nbytes, float(have[key][1]))
    if missing:
        new = measure(missing)
        if cache is not None:
            cache.put(name, kind, {k: (nb, err) for k, (_sel, nb, err) in new.items()})
        out.update(new)
    return out


def measured_before(cache: Measurements, shapes: dict[str, list[int]], ladder, probes: tuple[KLProbes, ...],
                    with_covariance: bool) -> set[str]:
    """The matrices whose every candidate ``cache`` holds (so choose never
    asks for their covariance, and the calibration pass can skip them)."""
    probe_sels = tuple(sel for p in probes for sel in (p.base, p.probe))
    wants = [("placed", ladder), ("probed", probe_sels)] if with_covariance else [("placed", ladder + probe_sels)]
    return {name for name, shape in shapes.items()
            if all(selection_key(sel) in cache.get(name, kind) for kind, sels in wants
                   for sel, *_ in _storable(shape, sels))}


def _cheapest_bits(name: str, shape: list[int], ladder: tuple[dict[str, Any], ...]) -> int:
    """Bits of the smallest ladder candidate that can store the matrix."""
    sizes = [nbytes * 8 for _sel, _scheme, _p, nbytes in _storable(shape, ladder)]
    if not sizes:
        raise IEError(f"{name}: no candidate scheme can store a {'x'.join(map(str, shape))} matrix")
    return min(sizes)


def _options(measured: dict[str, tuple[dict, int, float]],
             ladder: tuple[dict[str, Any], ...] = LADDER) -> list[tuple[dict, int, float]]:
    """Of the ladder's measured candidates, per size the one with the least
    predicted error, on the lower convex hull of error against size."""
    best: dict[int, tuple[dict, int, float]] = {}
    for sel in ladder:
        got = measured.get(selection_key(sel))
        if got is not None and (got[1] not in best or got[2] < best[got[1]][2]):
            best[got[1]] = got
    return lower_hull([best[nbytes] for nbytes in sorted(best)])


def group_of(name: str, groups: Any) -> str | None:
    """The probes' group of a matrix: its exact name, else the first pattern matching it."""
    if name in groups:
        return name
    return next((g for g in groups if fnmatch.fnmatchcase(name, g)), None)


def _slopes(probes: KLProbes, errors: dict[str, dict[str, float]]) -> tuple[dict[str, float], float]:
    """Per matrix of a measured group, the KL one unit of its predicted
    error costs; and the geometric mean of the groups' slopes. ``errors``:
    per matrix, the predicted error of each selection measured (by
    selection_key).
    Per probed group, (KL with the group at the probe selection − KL at base)
    over the predicted error that change adds to the group's matrices. A group
    whose probe measured no KL (noise) keeps 1% of the median; groups base or
    probe cannot store are not measured."""
    base, probe = selection_key(probes.base), selection_key(probes.probe)
    members: dict[str, list[str]] = {}
    for name in errors:
        g = group_of(name, probes.groups)
        if g is not None:
            members.setdefault(g, []).append(name)
    per_group: dict[str, float] = {}
    for g, names in members.items():
        if all(base in errors[n] and probe in errors[n] for n in names):
            delta = sum(errors[n][probe] - errors[n][base] for n in names)
            if delta > 0:
                per_group[g] = max(probes.groups[g] - probes.base_kl, 0.0) / delta
    positive = sorted(a for a in per_group.values() if a > 0)
    if not positive:
        raise IEError("the KL probes measured no KL cost for any group; nothing to weight the errors by")
    floor = 0.01 * positive[len(positive) // 2]
    mean = math.exp(sum(math.log(a) for a in positive) / len(positive))
    return {n: max(a, floor) for g, a in per_group.items() for n in members[g]}, mean


@dataclass(frozen=True)
class KLCurve:
    """One matrix's KL as a function of its predicted error: piecewise
    linear, one slope per set of probes, each slope used from the error the
    matrix has at that set's base selection up to the next set's. One set
    (the usual) is one slope, KL = slope × error. Several sets measured at
    different bits (q5_1 → iq4_nl, iq4_nl → iq3_s) price each error where it
    was measured: a policy that moves matrices to 2–3 bits is ranked by
    the KL per error measured there, not by a slope measured at 5 bits
    extrapolated (docs/quality.md, "KL probes at the bits a policy uses")."""

    starts: tuple[float, ...]  # ascending, the first 0
    slopes: tuple[float, ...]

    def __call__(self, error: float) -> float:
        kl = 0.0
        for i, (start, slope) in enumerate(zip(self.starts, self.slopes)):
            end = self.starts[i + 1] if i + 1 < len(self.starts) else math.inf
            kl += slope * max(0.0, min(error, end) - start)
        return kl


def kl_curves(probe_sets: list[KLProbes], errors: dict[str, dict[str, float]],
              placed: dict[str, dict[str, float]] | None = None) -> dict[str, KLCurve]:
    """Per matrix, its KLCurve: the sets of probes from the most bits at
    their base to the fewest, each one's segment starting at the matrix's
    error at that base, as ``placed`` measured it where it did (the
    candidates' errors as gptq leaves them, on the scale the curve is read
    at), else as ``errors``. A set whose base the matrix cannot store adds no
    segment. A matrix a set did not measure (a super-block probe on 576-wide
    rows) keeps its slope from the set before, times how much steeper this
    set found the matrices both measured (the geometric mean of the ratios):
    its own sensitivity, not every group's mean; with no set before (one set:
    matrices of no group, or of a group it could not store), the set's
    geometric mean."""
    sets = sorted(probe_sets, key=lambda p: -selection_bits(p.base))
    measured = [_slopes(p, errors) for p in sets]
    ratios: dict[tuple[int, int], float] = {}

    def steeper(k: int, j: int) -> float:
        if (k, j) not in ratios:
            both = [math.log(measured[k][0][n] / measured[j][0][n]) for n in measured[k][0] if n in measured[j][0]]
            ratios[k, j] = (math.exp(sum(both) / len(both)) if both else measured[k][1] / measured[j][1])
        return ratios[k, j]

    curves = {}
    for name, errs in errors.items():
        at = {**errs, **(placed or {}).get(name, {})}
        starts: list[float] = []
        slopes: list[float] = []
        prev = None
        for k, p in enumerate(sets):
            if selection_key(p.base) not in at:
                continue
            slope = measured[k][0].get(name)
            if slope is None:
                slope = measured[k][1] if prev is None else slopes[-1] * steeper(k, prev)
            starts.append(max(at[selection_key(p.base)], starts[-1]) if starts else 0.0)
            slopes.append(slope)
            prev = k
        if not slopes:  # no base storable: the first set's weight from zero
            starts, slopes = [0.0], [measured[0][0].get(name, measured[0][1])]
        curves[name] = KLCurve(tuple(starts), tuple(slopes))
    return curves


def choose(shapes: dict[str, list[int]], rows_of: Callable[[str, list[int]], np.ndarray],
           importance: dict[str, np.ndarray], target_bpw: float,
           progress: Callable[[str], None] = lambda _n: None, probes: tuple[KLProbes, ...] = (),
           ladder: tuple[dict[str, Any], ...] = LADDER,
           covariance: Callable[[str], Any] | None = None,
           cache: Measurements | None = None, tied: list[tuple[str, ...]] = ()) -> list[Choice]:
    """The chosen selection per matrix (``shapes``: the matrices to quantize;
    ``rows_of(name, rows)``: those float32 rows of it, read from the source:
    only sample_rows(...) are). With ``probes`` (formats/kl_probes.py, one
    set or several measured at different bits) each matrix's errors are
    turned into the KL they cost (kl_curves). Raises
    IEError when even the cheapest candidates exceed the budget. ``ladder``:
    the candidates (GGUF_LADDER: only types llama.cpp has).

    ``covariance(name)``: the input covariance of a matrix and its
    gptq.inverse_factor (runtime/hessians.py), or None where there is none
    (asked in ``shapes``' order); for an expert stack, expert -> its own.
    With it the candidates are measured as ieconv gptq will quantize them:
    compensation shrinks some matrices' errors several times more than
    others' (q/k/v/gate/up 2.5x, down_proj
    1.1x on the widened SmolLM2, docs/quality.md), so a policy ranked by
    nearest rounding spends bits where gptq no longer needs them. The
    probes' KL per unit of error is still taken from nearest rounding
    under the same covariance, since that is how the probes quantized.

    ``cache`` (formats/policy_measurements.py): errors measured before for
    the same inputs, taken instead of measuring (a matrix whose candidates
    are all there is not read, and its covariance never asked for:
    measured_before), and what is measured added and saved after each
    matrix.

    ``tied``: groups of matrices that must take one selection (a GGUF
    export stores them as one tensor: gguf_names.joint_types). Each group
    is allocated as one matrix whose error at a selection is its members'
    summed, over the selections all of them can store."""
    # The floor before any measuring (which --ref-dir makes minutes long): every matrix at its cheapest candidate.
    elems = sum(math.prod(shape) for shape in shapes.values())
    budget = target_bpw * elems
    floor = sum(_cheapest_bits(name, shape, ladder) for name, shape in shapes.items())
    if floor > budget:
        raise IEError(f"--target-bpw {target_bpw}: the cheapest candidates already average "
                      f"{floor / elems:.3f} bits per weight")
    choices = []
    candidates: dict[str, dict[str, tuple[dict, int, float]]] = {}  # every candidate measured, by matrix
    errors: dict[str, dict[str, float]] = {}
    placed: dict[str, dict[str, float]] = {}
    probe_sels = tuple(sel for p in probes for sel in (p.base, p.probe))
    before = measured_before(cache, shapes, ladder, probes, covariance is not None) if cache is not None else set()
    for name, shape in shapes.items():
        progress(name)
        cov = covariance(name) if covariance is not None and name not in before else None
        with_cov = covariance is not None and (cov is not None or name in before)
        sampled: list[np.ndarray] = []  # read only if something is measured
        row_ids = sample_rows(math.prod(shape[:-1]))

        def rows() -> np.ndarray:
            if not sampled:
                sampled.append(rows_of(name, row_ids))
            return sampled[0]

        if not with_cov:  # one measure serves the ladder and the probes
            imp = importance.get(name)
            if imp is not None and imp.ndim == 2:  # an expert stack's per-expert vectors: their mean ranks the schemes
                imp = imp.mean(axis=0)
            measured = _known(cache, name, shape, "placed", ladder + probe_sels,
                              lambda sels: _measure(name, shape, rows(), imp, sels))
            errors[name] = {k: err for k, (_sel, _nb, err) in measured.items()}
        else:  # (cov is None only where every candidate was measured before)
            # H's diagonal, as gptq weighs (a stack's: each expert's own, in _measure)
            imp = gptq.importance(cov[0]).astype(np.float32) if cov is not None and not callable(cov) else None
            measured = _known(cache, name, shape, "placed", ladder,
                              lambda sels: _measure(name, shape, rows(), imp, sels, cov, compensate=True,
                                                    row_ids=row_ids))
            probed = _known(cache, name, shape, "probed", probe_sels,
                            lambda sels: _measure(name, shape, rows(), imp, sels, cov, row_ids=row_ids))
            errors[name] = {k: err for k, (_sel, _nb, err) in probed.items()}
            placed[name] = {k: err for k, (_sel, _nb, err) in measured.items()}
        if cache is not None and sampled:
            cache.save()
        choices.append(Choice(name, math.prod(shape), _options(measured, ladder)))
        candidates[name] = measured
        cov = None  # not held while the next window's covariances are collected (at 8B shapes 3.3 GB)
    kl = kl_curves(probes, errors, placed) if probes else {}
    if probes:
        for c in choices:  # errors in KL: the ranking across matrices changes, with several sets the hull too
            c.options = lower_hull([(sel, nb, kl[c.name](err)) for sel, nb, err in c.options])
    members = {n: g for g in tied if all(m in shapes for m in g) for n in g}
    if members:
        choices = _tie(choices, candidates, members, kl, ladder)
    used = sum(c.bits for c in choices)
    heap: list[tuple[float, int]] = []

    def push(i: int) -> None:
        c = choices[i]
        if c.at + 1 < len(c.options):
            _sel, nb, err = c.options[c.at + 1]
            gain = (c.options[c.at][2] - err) / (nb * 8 - c.bits)
            heapq.heappush(heap, (-gain, i))

    for i in range(len(choices)):
        push(i)
    while heap:
        _g, i = heapq.heappop(heap)
        c = choices[i]
        extra = c.options[c.at + 1][1] * 8 - c.bits
        if used + extra > budget:
            continue  # too dear now; a cheaper step elsewhere may still fit
        used += extra
        c.at += 1
        push(i)
    out = []
    for c in choices:  # a tied group's members, each at the group's selection
        for m in c.members or ():
            m.options = [candidates[m.name][selection_key(c.selection)]]
        out.extend(c.members or [c])
    return out


def _tie(choices: list[Choice], candidates: dict, members: dict[str, tuple[str, ...]], kl: dict,
         ladder: tuple[dict[str, Any], ...]) -> list[Choice]:
    """``choices`` with each tied group's members replaced by one Choice
    whose options are the selections every member can store, at the
    members' summed bytes and errors (in KL where ``kl`` has curves); its
    ``members`` take the selection it is given."""
    out, done = [], set()
    for c in choices:
        group = members.get(c.name)
        if group is None:
            out.append(c)
            continue
        if group in done:
            continue
        done.add(group)
        keys = [selection_key(sel) for sel in ladder if all(selection_key(sel) in candidates[m] for m in group)]
        if not keys:
            raise IEError(f"{group[0]}: no candidate stores all of {', '.join(group)}, which a GGUF export keeps "
                          "as one tensor of one type")
        per = {m: {k: candidates[m][k] for k in keys} for m in group}

        def score(m: str, err: float) -> float:
            return kl[m](err) if kl else err

        summed = {k: (per[group[0]][k][0], sum(per[m][k][1] for m in group), sum(score(m, per[m][k][2]) for m in group))
                  for k in keys}
        joint = Choice(group[0], sum(next(x.elems for x in choices if x.name == m) for m in group),
                       _options(summed, ladder))
        joint.members = [Choice(m, next(x.elems for x in choices if x.name == m)) for m in group]
        out.append(joint)
    return out


def summary(choices: list[Choice]) -> dict[str, Any]:
    """Average bits per weight, and the count per selection."""
    elems = sum(c.elems for c in choices)
    counts: dict[str, int] = {}
    for c in choices:
        k = label(c.selection)
        counts[k] = counts.get(k, 0) + 1
    return {"bits_per_weight": sum(c.bits for c in choices) / elems, "counts": counts}


def label(sel: dict[str, Any]) -> str:
    if sel["scheme"] != "int4w":
        return sel["scheme"]
    return f"int4w g{sel['group_size']} {'sym' if sel['symmetric'] else 'affine'}"
