// CUDA error handling for host code: every runtime call and every launch is
// checked, and a failure becomes one std::runtime_error line naming the call
// and CUDA's own message (the CLI prints it and exits 1). Compiled only with
// -DIE_ENABLE_CUDA=ON.
#pragma once
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace ie::cuda {

[[noreturn]] inline void throw_cuda(cudaError_t e, const char* what) {
  throw std::runtime_error(std::string("CUDA: ") + what + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) +
                           ")");
}

inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw_cuda(e, what);
}

// After a launch: a bad configuration shows here, a fault in the kernel at
// the next synchronizing call.
inline void check_launch(const char* kernel) { check(cudaGetLastError(), kernel); }

}  // namespace ie::cuda
