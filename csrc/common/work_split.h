// How a parallel loop over items (GEMV row steps, rows8 tiles) shares them
// among its threads: each thread starts on its own contiguous share, as a
// static split would, so that it streams one run of memory; a thread whose
// share is done takes half of another share still unclaimed and goes on
// forward from there: the front half of the share that begins where it
// stopped, if one does, else the back half of the largest.
//
// Why: a decode step is ~33 short parallel regions, each ended by a
// barrier. With a static split the two halves end at different times on a
// shared machine (interrupts, a neighbour's memory traffic, the master's
// Python work between tokens), and a profile of `make bench-decode` showed
// the worker thread spending 13% of its time waiting in libgomp.
//
// Why the front half where it continues the thief's run: a thread that
// runs a job alone (the pool's back-off on a busy machine, a worker that
// never came) then streams every share in order, as one thread's split
// would. Taking back halves, it jumped backwards log2(share) times per
// share, and each jump restarted the hardware prefetcher's stream: the
// int4w matrices of a SmolLM2 decode step took 19% more CPU time than
// under a one-thread split (perf, 2 threads run alone against 1 thread).
// A share whose owner is at work does not begin where the thief stopped,
// so the owner keeps its stream and the thief takes the back half.
//
// Every share begins at a multiple of `grain`, and a steal splits at one, so
// claimed pieces stay whole multiples of the grain (but the last item's):
// the rows8 prefill kernels claim tiles in pairs, and an odd tile left by a
// steal (frequent on a busy machine) ran at the one-tile kernel's speed.
//
// A share is one atomic word, (front, back) as two 32-bit indices: the
// owner claims `grain` items from the front, a thief moves the back. An item
// is claimed once and never returns, so a stale (front, back) with front <
// back cannot reappear and compare-exchange is free of ABA.
#pragma once
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <stdexcept>

namespace ie {
// Internal linkage: used by objects built with different ISA flags (see
// gemv/kernels.h).
namespace {

class WorkSplit {
 public:
  // Items [0, n) for nt threads, claimed `grain` at a time by their owner.
  // Throws std::length_error where n does not fit 32 bits (constructed
  // before the parallel region, so the error reaches the caller).
  WorkSplit(int64_t n, int nt, int64_t grain = 1) : nt_(nt < 1 ? 1 : nt), grain_(grain < 1 ? 1 : grain) {
    if (n < 0 || n > int64_t(UINT32_MAX)) throw std::length_error("work split: item count outside 0..2^32-1");
    shares_.reset(new Share[static_cast<size_t>(nt_)]);
    auto start = [&](int t) { return t == nt_ ? n : n * t / nt_ / grain_ * grain_; };
    for (int t = 0; t < nt_; ++t) {
      shares_[t].stop = static_cast<uint32_t>(start(t));
      shares_[t].v.store(pack(shares_[t].stop, static_cast<uint32_t>(start(t + 1))), std::memory_order_relaxed);
    }
  }

  // Thread t's next items [*i0, *i1): from its own share, else from one it
  // took; false when every item is claimed.
  bool next(int t, int64_t* i0, int64_t* i1) {
    for (;;) {
      std::atomic<uint64_t>& s = shares_[t].v;
      uint64_t v = s.load(std::memory_order_relaxed);
      while (front(v) < back(v)) {
        const uint32_t end = back(v) - front(v) > grain_ ? front(v) + static_cast<uint32_t>(grain_) : back(v);
        if (s.compare_exchange_weak(v, pack(end, back(v)), std::memory_order_acq_rel, std::memory_order_relaxed)) {
          *i0 = front(v);
          *i1 = end;
          shares_[t].stop = end;
          return true;
        }
      }
      if (!steal(t)) return false;
    }
  }

 private:
  struct alignas(64) Share {
    std::atomic<uint64_t> v{0};
    uint32_t stop = 0;  // where the owner's last claimed items ended (the owner's alone)
  };
  static uint64_t pack(uint32_t f, uint32_t b) { return uint64_t(b) << 32 | f; }
  static uint32_t front(uint64_t v) { return static_cast<uint32_t>(v); }
  static uint32_t back(uint64_t v) { return static_cast<uint32_t>(v >> 32); }

  // Moves half of another share into thread t's (empty) share: the front
  // half of one that begins where t stopped, else the back half of the
  // largest; false when no share has items left.
  bool steal(int t) {
    const uint32_t at = shares_[t].stop;
    for (;;) {
      int victim = -1;
      uint64_t vv = 0;
      bool on = false;  // the victim's share begins at `at`
      for (int u = 0; u < nt_ && !on; ++u) {
        if (u == t) continue;
        const uint64_t v = shares_[u].v.load(std::memory_order_acquire);
        if (back(v) <= front(v)) continue;
        on = front(v) == at;
        if (on || victim < 0 || back(v) - front(v) > back(vv) - front(vv)) {
          victim = u;
          vv = v;
        }
      }
      if (victim < 0) return false;
      // The split point, a whole number of grains past f (f is one): the
      // front half rounded up, or the back half's start rounded down (all
      // of it where less than two grains are left).
      const uint32_t f = front(vv), b = back(vv), g = static_cast<uint32_t>(grain_);
      const uint32_t m = on ? std::min(b, f + ((b - f + 1) / 2 + g - 1) / g * g) : f + (b - f) / 2 / g * g;
      if (shares_[victim].v.compare_exchange_strong(vv, on ? pack(m, b) : pack(f, m), std::memory_order_acq_rel,
                                                    std::memory_order_relaxed)) {
        // Nobody else writes an empty share, so a store suffices.
        shares_[t].v.store(on ? pack(f, m) : pack(m, b), std::memory_order_release);
        return true;
      }
    }
  }

  int nt_;
  int64_t grain_;
  std::unique_ptr<Share[]> shares_;
};

}  // namespace
}  // namespace ie
