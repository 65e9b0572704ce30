// Zero-filled storage whose pages cost memory only once written: an
// anonymous mapping, which the kernel backs with real pages on first write.
// For large buffers used from the front, such as a KV cache sized for the
// whole context window: a 135M model with an 8192-token window holds a
// 377 MB cache of which a short chat touches a few MB, and a memset (or a
// zero-initialised vector) would make every page resident up front.
#pragma once
#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <new>
#include <utility>

namespace ie {

template <class T>
class ZeroPages {
 public:
  ZeroPages() = default;
  // n zero elements; throws std::bad_alloc.
  explicit ZeroPages(size_t n) {
    if (n == 0) return;
    if (n > SIZE_MAX / sizeof(T)) throw std::bad_alloc();
    void* p = mmap(nullptr, n * sizeof(T), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    p_ = static_cast<T*>(p);
    n_ = n;
  }
  ZeroPages(ZeroPages&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  ZeroPages& operator=(ZeroPages&& o) noexcept {
    if (this != &o) {
      release();
      p_ = std::exchange(o.p_, nullptr);
      n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }
  ZeroPages(const ZeroPages&) = delete;
  ZeroPages& operator=(const ZeroPages&) = delete;
  ~ZeroPages() { release(); }

  T* data() { return p_; }
  const T* data() const { return p_; }
  size_t size() const { return n_; }

 private:
  void release() {
    if (p_) munmap(p_, n_ * sizeof(T));
  }
  T* p_ = nullptr;
  size_t n_ = 0;
};

}  // namespace ie
