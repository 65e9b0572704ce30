// 64-byte aligned, owning, zero-initialised storage: the one aligned buffer
// of the native library (kernel scratch, benchmark weights, loaded BSR
// arrays, rebuilt dedup tensors). Never null, even when empty, so numpy
// views of it are always valid; resize() keeps the storage when it is
// already large enough, so scratch reused across calls allocates once.
// Benchmarks pass zero = false so that the pages are first touched by the
// threads that will read them, not by a memset on the calling thread.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <utility>

namespace ie {

template <class T>
class AlignedArray {
 public:
  AlignedArray() = default;
  // Throws std::bad_alloc.
  explicit AlignedArray(size_t n, bool zero = true) { resize(n, zero); }
  AlignedArray(AlignedArray&& o) noexcept
      : p_(std::move(o.p_)), n_(std::exchange(o.n_, 0)), cap_(std::exchange(o.cap_, 0)) {}
  AlignedArray& operator=(AlignedArray&& o) noexcept {
    p_ = std::move(o.p_);
    n_ = std::exchange(o.n_, 0);
    cap_ = std::exchange(o.cap_, 0);
    return *this;
  }
  // n elements, zeroed when the storage is new (unless !zero); existing
  // storage that is large enough is kept as it is (callers overwrite it).
  void resize(size_t n, bool zero = true) {
    if (n > cap_ || !p_) {
      if (n > (SIZE_MAX - 128) / sizeof(T)) throw std::bad_alloc();
      const size_t bytes = (n * sizeof(T) + 63) / 64 * 64 + (n == 0 ? 64 : 0);
      void* p = std::aligned_alloc(64, bytes);
      if (!p) throw std::bad_alloc();
      if (zero) std::memset(p, 0, bytes);
      p_.reset(static_cast<T*>(p));
      cap_ = n;
    }
    n_ = n;
  }
  T* data() { return p_.get(); }
  const T* data() const { return p_.get(); }
  size_t size() const { return n_; }
  T& operator[](size_t i) { return p_.get()[i]; }
  const T& operator[](size_t i) const { return p_.get()[i]; }

 private:
  struct Free {
    void operator()(T* p) const { std::free(p); }
  };
  std::unique_ptr<T, Free> p_;
  size_t n_ = 0, cap_ = 0;
};

}  // namespace ie
