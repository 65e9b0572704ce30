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

// Large arrays come from their own anonymous mapping on Linux, except in
// sanitizer builds, whose allocator guards the ends of malloc'd blocks.
#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(memory_sanitizer)
#define IE_ALIGNED_MALLOC_ONLY 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define IE_ALIGNED_MALLOC_ONLY 1
#endif
#if defined(__linux__) && defined(MADV_HUGEPAGE) && !defined(IE_ALIGNED_MALLOC_ONLY)
#define IE_ALIGNED_HUGE_MAP 1
#endif

namespace ie {

// Whether arrays of 2 MiB and more get their own huge-page mappings in this
// build (tests skip what they cannot observe in sanitizer builds).
#if defined(IE_ALIGNED_HUGE_MAP)
inline constexpr bool kAlignedHugeMaps = true;
#else
inline constexpr bool kAlignedHugeMaps = false;
#endif

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
      if (n > (SIZE_MAX - 3 * kHuge) / sizeof(T)) throw std::bad_alloc();
      const size_t bytes = (n * sizeof(T) + 63) / 64 * 64 + (n == 0 ? 64 : 0);
      size_t mapped = 0;
      T* fresh = bytes >= kHuge ? map_huge(bytes, zero, &mapped) : alloc_small(bytes, zero);
      p_.reset(fresh);  // the old storage goes with the old deleter's state
      p_.get_deleter().mapped = mapped;
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
    size_t mapped = 0;  // bytes of an own mapping; 0: from posix_memalign
    void operator()(T* p) const {
#if defined(IE_ALIGNED_HUGE_MAP)
      if (mapped) {
        munmap(p, mapped);
        return;
      }
#endif
      std::free(p);
    }
  };

  static T* alloc_small(size_t bytes, bool zero, size_t align = 64) {
    void* p = nullptr;
    if (posix_memalign(&p, align, bytes) != 0) throw std::bad_alloc();
    if (zero) std::memset(p, 0, bytes);
    return static_cast<T*>(p);
  }

  // Arrays of 2 MiB and more stream through transparent huge pages, which
  // Linux's default THP mode (madvise) gives only to memory that asks:
  // streaming weights through 4 KiB pages costs a page walk every 64 lines
  // (docs/native.md has the figures). Each gets a fresh mapping, 2 MiB
  // aligned: a block posix_memalign reuses may already be backed by small
  // pages, which MADV_HUGEPAGE does not replace, and that held a fifth of
  // the decoder's eligible spans in small pages. The last, partial 2 MiB
  // span is asked for whole when the padding is at most an eighth of the
  // array (gate/up/down of a 2048 x 5632 int4w Llama: 5.84 MiB -> 6), else
  // it keeps small pages: no array pays more than an eighth for its pages.
  // A fresh mapping is zero already.
  static T* map_huge(size_t bytes, bool zero, size_t* mapped) {
#if defined(IE_ALIGNED_HUGE_MAP)
    const size_t whole = (bytes + kHuge - 1) / kHuge * kHuge;
    const size_t len = whole - bytes <= bytes / 8 ? whole : (bytes + 4095) / 4096 * 4096;
    void* raw = mmap(nullptr, len + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) throw std::bad_alloc();
    const uintptr_t r = reinterpret_cast<uintptr_t>(raw), a = (r + kHuge - 1) / kHuge * kHuge;
    if (a > r) munmap(raw, a - r);
    if (r + len + kHuge > a + len) munmap(reinterpret_cast<void*>(a + len), r + len + kHuge - (a + len));
    madvise(reinterpret_cast<void*>(a), len / kHuge * kHuge, MADV_HUGEPAGE);
    *mapped = len;
    (void)zero;
    return reinterpret_cast<T*>(a);
#else
    (void)mapped;
    return alloc_small(bytes, zero, kHuge);
#endif
  }

  std::unique_ptr<T, Free> p_;
  size_t n_ = 0, cap_ = 0;
};

}  // namespace ie
