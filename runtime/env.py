"""Every IE_* environment variable the Python runtime reads, parsed here.

No other Python module of iekit reads an IE_* variable (tests/test_env.py
scans the sources), except the CLI plumbing's IE_DEBUG (below). Each
variable has exactly one rule, one function in this module, whatever command
reads it; the configs are frozen dataclasses built from a mapping (default:
``os.environ``), so every decision is testable with a plain dict.

==================== ===================================== ========= ====================================== ======
variable             values                                default   read by                                rule
==================== ===================================== ========= ====================================== ======
IE_DEDUP             0 | 1                                 0         DedupConfig: every command that loads  error
                                                                     a model (generate, logits, bench,
                                                                     verify quant); ierun verify dedup
IE_DEDUP_STRICT      0 | 1                                 0         DedupConfig (as IE_DEDUP)              error
IE_DEDUP_POLICY      lossless                              lossless  DedupConfig (as IE_DEDUP)              error
IE_DEDUP_CACHE_MB    number of MiB >= 0                    256       DedupConfig (as IE_DEDUP)              error
IE_DEDUP_DEBUG       0 | 1                                 0         DedupConfig (as IE_DEDUP)              error
IE_PRECISION         int4w q4_0 q4_1 q8_0 q4_k iq4_nl      (none)    BenchEnv: ierun bench                  warn
                     iq4_xs q5_k q6_k q5_0 q5_1 mxfp4 q3_k
                     q2_k iq3_s iq4_xsh iq3_xxs iq2_xxs
                     iq2_xs iq2_s iq1_s iq1_m nvfp4 q1_0 f32
                     f16 bf16 (fp32 fp16: aliases; any case)
IE_ACT_PREC          auto | fp32 | int8 (fp8 fp16 bf16:    auto      BenchEnv: ierun bench                  warn
                     not supported; any case)
IE_REQUIRE_MODEL     0 | 1                                 0         BenchEnv: ierun bench                  warn
IE_BYTES_PER_TOKEN   integer >= 0                          0         BenchEnv: ierun bench                  warn
IE_STRIDE_BYTES      integer >= 1                          256       BenchEnv: ierun bench                  warn
IE_VERIFY_TOUCH      0 | 1                                 0         BenchEnv: ierun bench                  warn
IE_TP_USE_AFFINITY   0 | 1                                 0         BenchEnv: ierun bench                  warn
AFFINITY             compact | scatter | auto (any case)   auto      BenchEnv: ierun bench, with            warn
                                                                     IE_TP_USE_AFFINITY=1 only
IE_GGUF_CACHE        a directory (absolute path)           (below)   gguf_models: every ierun command given error
                                                                     a .gguf as --model-dir
IE_DEBUG             1: traceback of an internal error     (unset)   the CLI plumbing                       cli
                                                                     (cli/support.py)
IE_ISA               scalar | avx2 | avxvnni | avx512 |    auto      the native library                     native
                     amx | auto                                      (csrc/common/isa.cpp)
==================== ===================================== ========= ====================================== ======

Rules, by the last column:

* Every value is stripped of surrounding whitespace; unset and empty are the
  same (the default). A flag (``0 | 1``) accepts exactly ``0`` or ``1``.
* ``error``: any other value is an ``IEError`` of one line, ``NAME='value':
  expected ...``: exit 1 from every command, ``ierun bench`` included,
  before anything runs. These variables choose which bytes the model is
  computed from; a typo (``IE_DEDUP=yes``) must not silently change that.
* ``warn`` (``ierun bench``'s measurement knobs, read by nothing else): a
  value the runtime cannot honour is one ``warning:`` line on stderr and in
  the JSON ``warnings`` (requested and used values are both reported), and
  the default is used: a benchmark harness written for a larger set of
  values keeps running and its records say what really ran.
* ``cli``: IE_DEBUG is read by the command-line error handler itself
  (``== "1"``, anything else is off), which runs around every command, this
  module included; it has no parser here, so it has one reader.
* ``native``: IE_ISA is read by the native library only (``resolve_isa``:
  an ISA this CPU lacks is an error of the kernel call); Python passes
  ``isa=""`` and never reads it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Mapping

from iekit.formats import dedup as _fmt
from iekit.formats import weight_types
from iekit.formats.errors import IEError


@dataclass(frozen=True)
class Variable:
    """One row of the table above (tests check docs/environment.md against it)."""
    name: str
    values: str
    default: str
    read_by: str
    rule: str  # "error" | "warn" | "cli" | "native"


VARIABLES: tuple[Variable, ...] = (
    Variable("IE_DEDUP", "0 | 1", "0", "DedupConfig (every command that loads a model; verify dedup)", "error"),
    Variable("IE_DEDUP_STRICT", "0 | 1", "0", "DedupConfig", "error"),
    Variable("IE_DEDUP_POLICY", "lossless", "lossless", "DedupConfig", "error"),
    Variable("IE_DEDUP_CACHE_MB", "number of MiB >= 0", "256", "DedupConfig", "error"),
    Variable("IE_DEDUP_DEBUG", "0 | 1", "0", "DedupConfig", "error"),
    Variable("IE_PRECISION", " ".join(weight_types.names(quantized=True) + weight_types.names(quantized=False))
             + " (fp32 fp16)", "", "BenchEnv (ierun bench)", "warn"),
    Variable("IE_ACT_PREC", "auto | fp32 | int8", "auto", "BenchEnv (ierun bench)", "warn"),
    Variable("IE_REQUIRE_MODEL", "0 | 1", "0", "BenchEnv (ierun bench)", "warn"),
    Variable("IE_BYTES_PER_TOKEN", "integer >= 0", "0", "BenchEnv (ierun bench)", "warn"),
    Variable("IE_STRIDE_BYTES", "integer >= 1", "256", "BenchEnv (ierun bench)", "warn"),
    Variable("IE_VERIFY_TOUCH", "0 | 1", "0", "BenchEnv (ierun bench)", "warn"),
    Variable("IE_TP_USE_AFFINITY", "0 | 1", "0", "BenchEnv (ierun bench)", "warn"),
    Variable("AFFINITY", "compact | scatter | auto", "auto", "BenchEnv (ierun bench)", "warn"),
    Variable("IE_GGUF_CACHE", "absolute directory", "$XDG_CACHE_HOME/iekit/gguf or ~/.cache/iekit/gguf",
             "gguf_models (ierun given a .gguf)", "error"),
    Variable("IE_DEBUG", "1", "", "the CLI plumbing (cli/support.py)", "cli"),
    Variable("IE_ISA", "scalar | avx2 | avxvnni | avx512 | amx | auto", "auto", "the native library (csrc/common/isa.cpp)", "native"),
)

# Storage precisions IE_PRECISION may name (the weight types, quantized
# first); the fp* spellings are aliases.
PRECISIONS = tuple(weight_types.names(quantized=True)) + tuple(weight_types.names(quantized=False))
PRECISION_ALIASES = {"fp32": "f32", "fp16": "f16"}
# IE_ACT_PREC values: what the Decoder runs (act=) and what it cannot.
ACT_SUPPORTED = {"auto": "auto", "fp32": "f32", "int8": "int8"}
ACTS = tuple(ACT_SUPPORTED.values())                      # the Decoder's act= values (--act choices)
ACT_PREC_OF = {act: prec for prec, act in ACT_SUPPORTED.items()}  # --act value -> its IE_ACT_PREC spelling
ACT_UNSUPPORTED = ("fp8", "fp16", "bf16")
AFFINITIES = ("compact", "scatter", "auto")
DEFAULT_STRIDE = 256
DEFAULT_CACHE_MB = 256.0


def _raw(env: Mapping[str, str], name: str) -> str:
    return env.get(name, "").strip()


def _flag(env: Mapping[str, str], name: str) -> bool | None:
    """True/False for 1/0 (unset or empty: False); None when malformed."""
    v = _raw(env, name)
    return {"": False, "0": False, "1": True}.get(v)


def _error_flag(env: Mapping[str, str], name: str) -> bool:
    v = _flag(env, name)
    if v is None:
        raise IEError(f"{name}={_raw(env, name)!r}: expected 0 or 1")
    return v


def _warn_flag(env: Mapping[str, str], name: str, warn: list[str]) -> bool:
    v = _flag(env, name)
    if v is None:
        warn.append(f"{name}={_raw(env, name)!r}: expected 0 or 1; treated as 0")
        return False
    return v


def _warn_count(env: Mapping[str, str], name: str, default: int, minimum: int, warn: list[str]) -> int:
    raw = _raw(env, name)
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


# ----------------------------------------------------------- one rule each
# The dedup loader's variables (rule: error).

def ie_gguf_cache(env: Mapping[str, str]) -> str:
    """Where ierun keeps the import of each GGUF file it is given (by digest)."""
    v = _raw(env, "IE_GGUF_CACHE")
    if v:
        if not os.path.isabs(v):
            raise IEError(f"IE_GGUF_CACHE={v!r}: expected an absolute directory")
        return v
    base = _raw(env, "XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "iekit", "gguf")


def ie_dedup(env: Mapping[str, str]) -> bool:
    """IE_DEDUP=1: serve grouped tensors from the dedup artifact."""
    return _error_flag(env, "IE_DEDUP")


def ie_dedup_strict(env: Mapping[str, str]) -> bool:
    """IE_DEDUP_STRICT=1: an unusable artifact is an error, not a fallback."""
    return _error_flag(env, "IE_DEDUP_STRICT")


def ie_dedup_policy(env: Mapping[str, str]) -> str:
    """IE_DEDUP_POLICY: only ``lossless`` (bit-exact) exists."""
    policy = _raw(env, "IE_DEDUP_POLICY") or _fmt.POLICY
    if policy != _fmt.POLICY:
        raise IEError(f"IE_DEDUP_POLICY={policy!r}: only {_fmt.POLICY!r} is supported (bit-exact reconstruction)")
    return policy


def ie_dedup_cache_mb(env: Mapping[str, str]) -> float:
    """IE_DEDUP_CACHE_MB: the LRU cache of reconstructed tensors, MiB."""
    raw = _raw(env, "IE_DEDUP_CACHE_MB")
    try:
        cache_mb = float(raw) if raw else DEFAULT_CACHE_MB
    except ValueError:
        cache_mb = -1.0
    if not (0 <= cache_mb < 1 << 40):
        raise IEError(f"IE_DEDUP_CACHE_MB={raw!r}: expected a number of MiB >= 0")
    return cache_mb


def ie_dedup_debug(env: Mapping[str, str]) -> bool:
    """IE_DEDUP_DEBUG=1: parsing steps and cache decisions on stderr."""
    return _error_flag(env, "IE_DEDUP_DEBUG")


# ``ierun bench``'s knobs (rule: warn; each appends its warnings to ``warn``).

def ie_precision(env: Mapping[str, str], warn: list[str]) -> str | None:
    """IE_PRECISION: the storage the harness expects, normalised; None when unset or unknown."""
    raw = _raw(env, "IE_PRECISION").lower()
    precision = PRECISION_ALIASES.get(raw, raw) or None
    if precision is not None and precision not in PRECISIONS:
        warn.append(f"IE_PRECISION={raw!r} is not a storage precision "
                    f"({'|'.join(PRECISIONS + tuple(PRECISION_ALIASES))}); ignored")
        return None
    return precision


def ie_act_prec(env: Mapping[str, str], warn: list[str]) -> tuple[str, str]:
    """IE_ACT_PREC: (as requested, what the Decoder runs: act=)."""
    act_prec = _raw(env, "IE_ACT_PREC").lower() or "auto"
    act = ACT_SUPPORTED.get(act_prec)
    if act is None:
        why = "not supported" if act_prec in ACT_UNSUPPORTED else "unknown"
        warn.append(f"IE_ACT_PREC={act_prec}: {why}, using auto")
        act = "auto"
    return act_prec, act


def ie_require_model(env: Mapping[str, str], warn: list[str]) -> bool:
    return _warn_flag(env, "IE_REQUIRE_MODEL", warn)


def ie_bytes_per_token(env: Mapping[str, str], warn: list[str]) -> int:
    return _warn_count(env, "IE_BYTES_PER_TOKEN", 0, 0, warn)


def ie_stride_bytes(env: Mapping[str, str], warn: list[str]) -> int:
    return _warn_count(env, "IE_STRIDE_BYTES", DEFAULT_STRIDE, 1, warn)


def ie_verify_touch(env: Mapping[str, str], warn: list[str]) -> bool:
    return _warn_flag(env, "IE_VERIFY_TOUCH", warn)


def ie_affinity(env: Mapping[str, str], warn: list[str]) -> str | None:
    """IE_TP_USE_AFFINITY=1 with AFFINITY: Decoder(affinity=); None: no pinning."""
    aff_raw = _raw(env, "AFFINITY").lower()
    if _warn_flag(env, "IE_TP_USE_AFFINITY", warn):
        affinity = aff_raw or "auto"
        if affinity not in AFFINITIES:
            warn.append(f"AFFINITY={aff_raw!r}: expected {'|'.join(AFFINITIES)}; no thread pinning")
            return None
        return affinity
    if aff_raw:
        warn.append(f"AFFINITY={aff_raw} is ignored without IE_TP_USE_AFFINITY=1")
    return None


# ----------------------------------------------------------------- configs

@dataclass(frozen=True)
class DedupConfig:
    """The dedup loader's settings (runtime/dedup.py; docs/formats/dedup.md)."""
    enabled: bool = False            # IE_DEDUP
    strict: bool = False             # IE_DEDUP_STRICT
    policy: str = _fmt.POLICY        # IE_DEDUP_POLICY
    cache_mb: float = DEFAULT_CACHE_MB  # IE_DEDUP_CACHE_MB
    debug: bool = False              # IE_DEDUP_DEBUG

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "DedupConfig":
        env = os.environ if env is None else env
        return cls(enabled=ie_dedup(env), strict=ie_dedup_strict(env), policy=ie_dedup_policy(env),
                   cache_mb=ie_dedup_cache_mb(env), debug=ie_dedup_debug(env))

    def as_env(self) -> dict[str, str]:
        """The variables that give a child process these settings (what a
        benchmark hands to ``ierun``), so no other module spells the names."""
        flag = lambda b: "1" if b else "0"  # noqa: E731
        return {"IE_DEDUP": flag(self.enabled), "IE_DEDUP_STRICT": flag(self.strict), "IE_DEDUP_POLICY": self.policy,
                "IE_DEDUP_CACHE_MB": f"{self.cache_mb:g}", "IE_DEDUP_DEBUG": flag(self.debug)}


@dataclass(frozen=True)
class BenchEnv:
    """What ``ierun bench`` reads. ``from_env`` also parses the dedup
    variables (the decoder it loads reads them through DedupConfig), so a
    malformed one fails the command before any measurement."""
    precision_expected: str | None = None   # normalised IE_PRECISION, None when unset or unknown
    require_model: bool = False             # IE_REQUIRE_MODEL=1
    bytes_per_token: int = 0                # IE_BYTES_PER_TOKEN (work-touch per generated token)
    stride_bytes: int = DEFAULT_STRIDE      # IE_STRIDE_BYTES
    verify_touch: bool = False              # IE_VERIFY_TOUCH=1
    dedup: bool = False                     # IE_DEDUP=1, as DedupConfig reads it
    act_prec: str = "auto"                  # IE_ACT_PREC as requested
    act: str = "auto"                       # what the Decoder is asked to use (act=)
    act_prec_set: bool = False              # IE_ACT_PREC was given (bench --act then overrides it, saying so)
    affinity: str | None = None             # Decoder(affinity=), from IE_TP_USE_AFFINITY + AFFINITY
    warnings: tuple[str, ...] = field(default=())

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "BenchEnv":
        env = os.environ if env is None else env
        dedup = DedupConfig.from_env(env)  # rule "error": raises before anything else is read
        warn: list[str] = []
        precision = ie_precision(env, warn)
        act_prec, act = ie_act_prec(env, warn)
        affinity = ie_affinity(env, warn)
        return cls(precision_expected=precision, require_model=ie_require_model(env, warn),
                   bytes_per_token=ie_bytes_per_token(env, warn), stride_bytes=ie_stride_bytes(env, warn),
                   verify_touch=ie_verify_touch(env, warn), dedup=dedup.enabled,
                   act_prec=act_prec, act=act, act_prec_set=bool(_raw(env, "IE_ACT_PREC")), affinity=affinity,
                   warnings=tuple(warn))

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
