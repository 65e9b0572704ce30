"""The compiled extension, imported in one place so a missing build gives one clear error."""

from __future__ import annotations

from iekit.formats.errors import IEError

try:
    from . import _native
except ImportError as e:  # pragma: no cover - only on a broken install
    raise IEError(f"the iekit native extension is not built or failed to load ({e}); "
                  "reinstall with `pip install .` or `make setup`") from None

cpu_features = _native.cpu_features
stream_sum = _native.stream_sum
read_bandwidth = _native.read_bandwidth
HAS_CUDA = bool(_native.cpu_features()["cuda_build"])
