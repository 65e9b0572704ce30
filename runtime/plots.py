"""Pictures for people who would rather look than read: ``ierun eval --plot``
and ``ierun verify quant --plot``.

matplotlib is an optional extra (``pip install 'iekit[plot]'``): it is
imported only here, only when a plot is asked for, and its absence is one
clear error before any model is loaded. The PNG is rendered in memory and
written atomically; an existing file is replaced only with --overwrite.
"""

from __future__ import annotations

import io
import re
from pathlib import Path

import numpy as np

from iekit.formats.atomic import check_new_file, write_file_atomic
from iekit.formats.errors import IEError


def require_matplotlib():
    """matplotlib.pyplot on the headless Agg backend, or an IEError saying how to get it."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise IEError("--plot needs matplotlib: pip install 'iekit[plot]' (or pip install matplotlib)") from None
    return plt


def check_target(path: Path, overwrite: bool) -> None:
    """Refuse before any work: an existing file without --overwrite, a missing folder, no matplotlib."""
    check_new_file(path, overwrite)
    require_matplotlib()


def _save(fig, path: Path, overwrite: bool) -> None:
    plt = require_matplotlib()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    write_file_atomic(path, buf.getvalue(), replace=overwrite)


def eval_plot(scores, summary: dict, title: str, path: Path, overwrite: bool) -> None:
    """Three panels: the KL divergence distribution (log x), KL by position
    within the chunk (mean and p90 over chunks), and the Δp distribution."""
    plt = require_matplotlib()
    kld, dp, pos = scores.values("kld"), scores.values("dp"), scores.values("pos")
    fig, ax = plt.subplots(1, 3, figsize=(16, 4.6))
    fig.suptitle(f"{title}: KL(ref‖model) mean {summary['kld_mean']:.4g}, top-1 {100 * summary['top1_agree']:.2f}%, "
                 f"PPL {summary['ppl']:.4g} vs {summary['ppl_ref']:.4g} ({summary['tokens_scored']} tokens)")
    floor = 1e-10  # KL of a token can be exactly 0 (or round below 0): drawn at the floor of the log axis
    k = np.maximum(kld, floor)
    bins = np.logspace(np.log10(max(floor, k.min())), np.log10(max(k.max(), floor * 10)), 60)
    ax[0].hist(k, bins=bins, color="#4878cf")
    ax[0].set_xscale("log")
    for q, style in ((50, "-"), (99, "--")):
        ax[0].axvline(max(np.percentile(kld, q), floor), color="k", ls=style, lw=1, label=f"p{q}")
    ax[0].set(xlabel="KL divergence per token (nats, log scale)", ylabel="tokens", title="KL distribution")
    ax[0].legend()
    positions = np.unique(pos)
    mean = np.array([kld[pos == p].mean() for p in positions])
    p90 = np.array([np.percentile(kld[pos == p], 90) for p in positions])
    ax[1].plot(positions, mean, label="mean", color="#4878cf")
    ax[1].plot(positions, p90, label="p90", color="#d65f5f", lw=0.8)
    ax[1].set(xlabel="position within the chunk", ylabel="KL divergence (nats)", title="KL by position")
    ax[1].legend()
    ax[2].hist(dp, bins=80, color="#6acc65")
    ax[2].set_yscale("log")
    ax[2].set(xlabel="Δp = p_model − p_ref of the reference's top token", ylabel="tokens (log scale)",
              title=f"Δp: mean {summary['dp_mean']:+.4f}, RMS {summary['dp_rms']:.4f}")
    fig.tight_layout()
    _save(fig, path, overwrite)


_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.(?:[a-z_]+\.)?([A-Za-z0-9_]+)\.weight$")


def tensor_plot(reports, title: str, path: Path, overwrite: bool) -> None:
    """SQNR and RMSE of each quantized tensor by layer, one line per kind
    (q_proj, down_proj, ...); tensors outside the layers are listed apart."""
    plt = require_matplotlib()
    by_kind: dict[str, list[tuple[int, float, float]]] = {}
    others = []
    for r in reports:
        if r.sqnr_db is None or r.rmse is None:  # an exact tensor has no finite SQNR
            continue
        m = _LAYER.search(r.name)
        if m:
            by_kind.setdefault(m.group(2), []).append((int(m.group(1)), r.sqnr_db, r.rmse))
        else:
            others.append(r)
    fig, ax = plt.subplots(1, 2, figsize=(14, 4.8))
    fig.suptitle(title)
    for kind, pts in sorted(by_kind.items()):
        pts.sort()
        layer, sq, rm = zip(*pts)
        ax[0].plot(layer, sq, marker="o", ms=3, label=kind)
        ax[1].plot(layer, rm, marker="o", ms=3, label=kind)
    for r in others:
        ax[0].axhline(r.sqnr_db, ls=":", lw=1, color="gray")
        ax[0].annotate(r.name, (0, r.sqnr_db), fontsize=7, color="gray")
    ax[0].set(xlabel="layer", ylabel="SQNR (dB, higher is better)", title="signal to quantization noise")
    ax[1].set(xlabel="layer", ylabel="RMSE", title="root mean square error", yscale="log")
    for a in ax:
        a.grid(alpha=0.3)
    if by_kind:
        ax[1].legend(fontsize=8, ncol=2)
    fig.tight_layout()
    _save(fig, path, overwrite)
