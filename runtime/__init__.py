"""ierun: the native runtime (C++ kernels via pybind11) and its command line."""
