// The native library's threads: a pool that a decoder owns (or a call makes
// for itself), in place of OpenMP's.
//
// Why not OpenMP: its threads spin at every barrier, and a parallel region
// ends only when every thread of the team has arrived. On a machine with
// other work running (a laptop, a CI runner, a shared server) one of our
// threads is often descheduled; the others then spin through their time
// slices waiting for it, and a decode step of ~200 regions took 100x longer
// (issue 49: 3.9 tok/s with 2 threads against 85 with one, on 2 busy cores).
// Its wait policy is an environment variable read once per process, which
// would change a user's other OpenMP code too.
//
// What this pool does instead:
// - A job is open to late arrivals and never waits for a thread that has
//   not started it. run(fn) calls fn(0) on the calling thread at once; a
//   worker that wakes while the job is still open joins with the next slot.
//   Work is claimed from shared counters (WorkSplit, parallel_for), so the
//   caller alone can finish everything; when it has, it closes the job and
//   waits only for the workers that joined, each busy with one claimed piece.
// - Waiting spins briefly (kSpin: a decode step's regions follow each other
//   within microseconds), then sleeps on a futex, so a waiting thread gives
//   its core back to whoever needs it, our descheduled peer included.
// - On a machine with more runnable threads than cores, the pool's threads
//   take turns with the others', and a job with workers is slower than the
//   caller alone: each of our threads runs a share of the time, and a job
//   ends only when its last claimed piece is done. Two signs tell the pool
//   so:
//   - the share of its threads' time spent runnable but waiting for a CPU
//     (Linux's run delay, /proc/.../schedstat), over windows of kWindow:
//     above kBusyDelay in kBusyWindows windows in a row, the machine is
//     oversubscribed. On 2 cores beside one CPU-bound process, 2 decoding
//     threads waited 45-65% of their time; a decode that kept its worker
//     ran at 0.87 of one thread's speed, and the caller seldom waited long
//     for any one piece;
//   - a joined worker that keeps the caller waiting past kStragglerWait and
//     a quarter of the caller's own time in the job (descheduled holding
//     the piece it claimed: a whole time slice of the other process).
//   Then the pool halves the threads its jobs may use (limit(); at 1 the
//   caller runs them alone, and the workers sleep, leaving their cores to
//   the others) for a back-off period, then doubles them again to see. Each
//   level has its own period (kMinSolo .. kMaxSolo): it doubles each time a
//   rise to that level fails, and resets when one holds for kGoodWindows
//   windows, so a hiccup at a level that held comes back at once, while a
//   level the cores cannot hold is tried less and less often.
//   So --threads on a busy machine is not slower than one thread, more
//   threads than free cores settle at what the cores hold (8 threads on 2
//   quiet cores: 2, not 1), and a quiet machine keeps every thread.
// - each(fn) is the strict form for setup (pinning, first touch, bandwidth
//   measurement): fn(slot) runs once on every thread of the pool.
//
// No global state: each pool is an object; a Decoder holds one for its life.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace ie {

class ThreadPool {
 public:
  static constexpr int kMaxThreads = 4096;
  // threads in 1..kMaxThreads: the caller plus threads - 1 workers.
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return size_; }
  // Jobs run by the caller alone since the pool was made, because the
  // machine was busy (see above); for benchmarks' reports.
  uint64_t solo_jobs() const { return solo_jobs_; }
  // The threads the next job may use, the caller's included (size() unless
  // the machine was busy, see above).
  int limit() const { return limit_; }

  // fn(slot), slot in [0, size()): slot 0 on this thread, now; others on
  // workers that arrive before this thread has returned from fn(0). fn must
  // claim its work from shared state so that slot 0 alone finishes it. An
  // exception from any call is rethrown here once every call has returned.
  template <class F>
  void run(F&& fn) {
    dispatch(&fn, &call<std::remove_reference_t<F>>, false);
  }

  // fn(slot) once on every thread, slots 0..size()-1; returns when all have.
  template <class F>
  void each(F&& fn) {
    dispatch(&fn, &call<std::remove_reference_t<F>>, true);
  }

 private:
  using Call = void (*)(void*, int);
  template <class F>
  static void call(void* fn, int slot) {
    (*static_cast<F*>(fn))(slot);
  }
  void dispatch(void* fn, Call call, bool all);
  // Whether the window (kWindow) that ends at `now` showed the threads
  // waiting for a CPU (thread_pool.cpp); opens the next window.
  bool busy_window(std::chrono::steady_clock::time_point now);
  // The run delay in ns summed over the threads under limit_ (the others
  // sleep); -1 where it cannot be read now (no schedstat; a worker not
  // started; a new calling thread, whose delay no earlier reading holds).
  int64_t run_delay_ns();
  // Half the threads for the next jobs, from `now` for the back-off period.
  void back_off(std::chrono::steady_clock::time_point now);
  // Sets the workers' limit_word_, waking those it lets in.
  void publish_limit(int limit);
  void worker(int index);
  void stop();
  void record(std::exception_ptr e);

  // state_: generation (high 32 bits), open (bit 31), slots taken (low bits).
  static constexpr uint64_t kOpen = uint64_t(1) << 31;
  static constexpr uint64_t kJoined = kOpen - 1;

  const int size_;
  std::vector<std::thread> workers_;
  alignas(64) std::atomic<uint64_t> state_{0};
  alignas(64) std::atomic<uint32_t> gen_{0};  // the futex workers sleep on
  std::atomic<int> sleepers_{0};
  alignas(64) std::atomic<uint32_t> done_{0};  // calls finished by workers; the caller's futex
  std::atomic<bool> caller_sleeps_{false};
  std::atomic<bool> stop_{false};
  // The threads a job may use, the caller's included: limit_, or size()
  // for each() and stop(); constant while a job is open, so workers also
  // cap a job's slots with it. Workers 1 .. limit - 1 wait for jobs on
  // gen_; those at or past it sleep on this futex until it rises, so a
  // job's wake-up reaches no thread that may not join it.
  alignas(64) std::atomic<uint32_t> limit_word_;
  void* fn_ = nullptr;
  Call call_ = nullptr;
  // Each thread's id for its run delay: the caller's (the thread that last
  // read it; 0 before), then the workers' (0 until started).
  std::unique_ptr<std::atomic<int>[]> tids_;
  // The caller's own (the back-off needs no atomics).
  int limit_;  // threads the next jobs may use (the back-off's)
  std::chrono::steady_clock::time_point next_probe_{};  // when limit_ < size_ doubles again
  // Per level (the bit length of a limit less one: 1, 2-3, 4-7, ...): the
  // wait before the limit rises to it again.
  std::chrono::microseconds level_wait_[32 - __builtin_clz(unsigned(kMaxThreads))];
  bool raised_ = false;  // limit_ rose and has not yet held for kGoodWindows windows
  bool window_open_ = false;
  std::chrono::steady_clock::time_point window_start_{};
  int64_t window_delay_ = -1;  // the threads' run delay when the window began (-1: unknown)
  uint32_t good_windows_ = 0;  // windows in a row that went well at this limit
  uint32_t busy_windows_ = 0;  // windows in a row whose threads waited for a CPU
  uint64_t solo_jobs_ = 0;
  // The threads' schedstat files (tids_' order), opened on first use. None
  // where they cannot be read (then only the straggler sign counts).
  std::vector<int> fds_;
  bool no_delay_ = false;
  std::mutex error_mu_;
  std::exception_ptr error_;
};

// Items [0, n) in pieces of `grain` claimed in order by whoever is free:
// fn(i0, i1, slot). One piece or less runs on the calling thread alone,
// with no worker woken.
template <class F>
void parallel_for(ThreadPool& pool, int64_t n, int64_t grain, F&& fn) {
  if (grain < 1) grain = 1;
  if (n <= grain || pool.size() == 1) {
    if (n > 0) fn(int64_t(0), n, 0);
    return;
  }
  std::atomic<int64_t> next{0};
  pool.run([&](int slot) {
    for (int64_t i0; (i0 = next.fetch_add(grain, std::memory_order_relaxed)) < n;)
      fn(i0, i0 + grain < n ? i0 + grain : n, slot);
  });
}

}  // namespace ie
