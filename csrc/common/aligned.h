// 64-byte aligned (2 MiB aligned from 2 MiB up), owning, zero-initialised
// storage: the one aligned buffer of the native library (kernel scratch,
// benchmark weights, the decoder's weight copies, loaded BSR arrays,
// rebuilt dedup tensors). Never null, even when empty, so numpy views of it
// are always valid; resize() keeps the storage when it is already large
// enough, so scratch reused across calls allocates once.
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
#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace ie {

template <class T>
class AlignedArray {
  static constexpr size_t kHuge = size_t(2) << 20;

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
      // Large arrays start on a 2 MiB boundary and their whole 2 MiB spans
      // may take transparent huge pages (Linux's default THP mode only
      // gives them to memory that asks): streaming weights through 4 KiB
      // pages costs a page walk every 64 lines (docs/native.md has the
      // figures). The tail past the last whole span keeps small pages, so
      // no huge page is paid for beyond the array.
      const size_t align = bytes >= kHuge ? kHuge : 64;
      void* p = nullptr;
      if (posix_memalign(&p, align, bytes) != 0) throw std::bad_alloc();
#if defined(__linux__) && defined(MADV_HUGEPAGE)
      if (align == kHuge) madvise(p, bytes / kHuge * kHuge, MADV_HUGEPAGE);
#endif
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
