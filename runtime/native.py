"""The compiled extension, imported in one place so a missing build gives one clear error."""

from __future__ import annotations

from iekit.formats.errors import IEError

try:
    from . import _native
except ImportError as e:  # pragma: no cover - only on a broken install
    raise IEError(f"the iekit native extension is not built or failed to load ({e}); "
                  "reinstall with `pip install .` or `make setup`") from None



def _user_errors(fn):
    """Native argument errors (e.g. IE_ISA naming an ISA this CPU lacks) are
    user errors: re-raise them as IEError so the CLI prints one line. The
    exception stays a ValueError for Python callers."""

    def wrapped(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except ValueError as e:
            raise NativeArgumentError(str(e)) from None

    wrapped.__doc__ = fn.__doc__
    wrapped.__name__ = fn.__name__
    return wrapped


class NativeArgumentError(IEError, ValueError):
    pass


cpu_features = _user_errors(_native.cpu_features)
stream_sum = _user_errors(_native.stream_sum)
read_bandwidth = _user_errors(_native.read_bandwidth)
fma_peak = _user_errors(_native.fma_peak)
int8_peak = _user_errors(_native.int8_peak)
gemv = _user_errors(_native.gemv)
dequantize = _user_errors(_native.dequantize)
expected_nbytes = _user_errors(_native.expected_nbytes)
quantize_act_q8 = _user_errors(_native.quantize_act_q8)
bench_gemv = _user_errors(_native.bench_gemv)
MAX_BATCH = _native.MAX_BATCH  # activation rows per gemv call, stored layout
MAX_ROWS8_BATCH = _native.MAX_ROWS8_BATCH  # ... and rows8's (a decoder's int8 prefill chunk)
