#include <cuda_runtime.h>

#include "cuda/device_info.h"

namespace ie::cuda {

std::vector<DeviceInfo> device_list_raw() {
  std::vector<DeviceInfo> out;
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return out;
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
    out.push_back({i, p.name, p.totalGlobalMem, p.major, p.minor});
  }
  return out;
}

}  // namespace ie::cuda
