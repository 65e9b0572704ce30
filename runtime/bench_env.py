"""The environment variables of ``ierun bench``, read in one place.

The design's harness drives the benchmark through environment variables
(IE_PRECISION, IE_ACT_PREC, IE_BYTES_PER_TOKEN, ...). Reading them all here,
once, into a frozen dataclass keeps the rest of the command free of
``os.environ`` and makes every decision testable with a plain dict.

Policy: a value this runtime cannot honour is reported (one warning line on
stderr, and the requested value next to the one used in the JSON) and then
ignored; it is never fatal, so an existing harness keeps running. The one
exception is the model itself: there is no stub mode, a model that cannot
be loaded is always an error (see ``model_error``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Mapping

# Storage precisions IE_PRECISION may name; the fp* spellings are aliases.
PRECISIONS = ("int4w", "q4_0", "q4_1", "q8_0", "f32", "f16", "bf16")
PRECISION_ALIASES = {"fp32": "f32", "fp16": "f16"}
# IE_ACT_PREC values: what the Decoder runs (act=) and what it cannot.
ACT_SUPPORTED = {"fp32": "f32", "int8": "int8"}
ACT_UNSUPPORTED = ("fp8", "fp16", "bf16")
AFFINITIES = ("compact", "scatter", "auto")
DEFAULT_STRIDE = 256


@dataclass(frozen=True)
class BenchEnv:
    precision_expected: str | None = None   # normalised IE_PRECISION, None when unset or unknown
    require_model: bool = False             # IE_REQUIRE_MODEL=1
    bytes_per_token: int = 0                # IE_BYTES_PER_TOKEN (work-touch per generated token)
    stride_bytes: int = DEFAULT_STRIDE      # IE_STRIDE_BYTES
    verify_touch: bool = False              # IE_VERIFY_TOUCH=1
    dedup: bool = False                     # IE_DEDUP=1 (the Decoder reads IE_DEDUP_* itself)
    act_prec: str = "fp32"                  # IE_ACT_PREC as requested
    act: str = "f32"                        # what the Decoder is asked to use (act=)
    affinity: str | None = None             # Decoder(affinity=), from IE_TP_USE_AFFINITY + AFFINITY
    warnings: tuple[str, ...] = field(default=())

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "BenchEnv":
        env = os.environ if env is None else env
        warn: list[str] = []

        raw = env.get("IE_PRECISION", "").strip().lower()
        precision = PRECISION_ALIASES.get(raw, raw) or None
        if precision is not None and precision not in PRECISIONS:
            warn.append(f"IE_PRECISION={raw!r} is not a storage precision "
                        f"({'|'.join(PRECISIONS + tuple(PRECISION_ALIASES))}); ignored")
            precision = None

        act_prec = env.get("IE_ACT_PREC", "").strip().lower() or "fp32"
        act = ACT_SUPPORTED.get(act_prec)
        if act is None:
            why = "not supported" if act_prec in ACT_UNSUPPORTED else "unknown"
            warn.append(f"IE_ACT_PREC={act_prec}: {why}, using fp32")
            act = "f32"

        affinity = None
        aff_raw = env.get("AFFINITY", "").strip().lower()
        if _flag(env, "IE_TP_USE_AFFINITY", warn):
            affinity = aff_raw or "auto"
            if affinity not in AFFINITIES:
                warn.append(f"AFFINITY={aff_raw!r}: expected {'|'.join(AFFINITIES)}; no thread pinning")
                affinity = None
        elif aff_raw:
            warn.append(f"AFFINITY={aff_raw} is ignored without IE_TP_USE_AFFINITY=1")

        return cls(
            precision_expected=precision,
            require_model=_flag(env, "IE_REQUIRE_MODEL", warn),
            bytes_per_token=_count(env, "IE_BYTES_PER_TOKEN", 0, 0, warn),
            stride_bytes=_count(env, "IE_STRIDE_BYTES", DEFAULT_STRIDE, 1, warn),
            verify_touch=_flag(env, "IE_VERIFY_TOUCH", warn),
            dedup=_flag(env, "IE_DEDUP", warn),
            act_prec=act_prec, act=act, affinity=affinity, warnings=tuple(warn))

    def precision_warning(self, stored: tuple[str, ...]) -> str | None:
        """The one-line warning when the artifact's matrices (``stored``:
        their dtypes, most bytes first) are not all stored in IE_PRECISION;
        a mixed artifact that merely contains it counts as a mismatch."""
        if self.precision_expected is None or stored == (self.precision_expected,):
            return None
        some = f" (only some are {self.precision_expected})" if self.precision_expected in stored else ""
        return (f"IE_PRECISION={self.precision_expected} but the model's matrices are stored as "
                f"{', '.join(stored)}{some}; benchmarking them as stored")

    def model_error(self, model_dir: str, reason: str) -> str:
        """The message for a model that cannot be loaded. Without
        IE_REQUIRE_MODEL=1 it is an error all the same (no silent stub);
        the message says so, so nobody waits for a stub run."""
        what = "cannot load the model" + ("" if model_dir in reason else f" in {model_dir}")
        if self.require_model:
            return f"IE_REQUIRE_MODEL=1: {what}: {reason}"
        return (f"{what}: {reason} "
                f"(ierun bench has no stub mode: a real model is required even without IE_REQUIRE_MODEL=1)")


def _flag(env: Mapping[str, str], name: str, warn: list[str]) -> bool:
    v = env.get(name, "").strip()
    if v in ("", "0"):
        return False
    if v == "1":
        return True
    warn.append(f"{name}={v!r}: expected 0 or 1; treated as 0")
    return False


def _count(env: Mapping[str, str], name: str, default: int, minimum: int, warn: list[str]) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        v = int(raw)
    except ValueError:
        v = minimum - 1
    if v < minimum:
        warn.append(f"{name}={raw!r}: expected an integer >= {minimum}; using {default}")
        return default
    return v
