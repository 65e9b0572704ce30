// CUDA device discovery, compiled only with -DIE_ENABLE_CUDA=ON.
#pragma once
#include <string>
#include <vector>

namespace ie::cuda {

struct DeviceInfo {
  int index;
  std::string name;
  size_t total_mem_bytes;
  int cc_major;
  int cc_minor;
};

// Empty when the driver reports no device (never throws for "no GPU").
std::vector<DeviceInfo> device_list_raw();

}  // namespace ie::cuda

