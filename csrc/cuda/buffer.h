// Device memory owned by one object (cudaMalloc / cudaFree), move-only, so
// nothing on the device outlives what uses it and nothing leaks on an
// exception. Plain allocations only: never managed memory (docs/cuda.md).
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <utility>

#include "cuda/check.h"

namespace ie::cuda {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t n) : n_(n) {
    if (n) check(cudaMalloc(&p_, n), "cudaMalloc");
  }
  ~DeviceBuffer() {
    if (p_) cudaFree(p_);
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      if (p_) cudaFree(p_);
      p_ = std::exchange(o.p_, nullptr);
      n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  size_t size() const { return n_; }
  void* get() const { return p_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(p_);
  }
  // Synchronous copies of [off, off + n) (checked against the size).
  void upload(const void* src, size_t n, size_t off = 0) {
    if (off > n_ || n > n_ - off) throw std::invalid_argument("DeviceBuffer::upload past the end");
    if (n) check(cudaMemcpy(static_cast<uint8_t*>(p_) + off, src, n, cudaMemcpyHostToDevice), "cudaMemcpy to device");
  }
  void download(void* dst, size_t n, size_t off = 0) const {
    if (off > n_ || n > n_ - off) throw std::invalid_argument("DeviceBuffer::download past the end");
    if (n) check(cudaMemcpy(dst, static_cast<uint8_t*>(p_) + off, n, cudaMemcpyDeviceToHost), "cudaMemcpy to host");
  }

 private:
  void* p_ = nullptr;
  size_t n_ = 0;
};

// A buffer holding a copy of n host bytes.
inline DeviceBuffer to_device(const void* src, size_t n) {
  DeviceBuffer b(n);
  b.upload(src, n);
  return b;
}

}  // namespace ie::cuda
