#include "common/thread_pool.h"

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <stdexcept>
#include <string>
#if defined(__linux__)
#include <fcntl.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace ie {
namespace {

// How long a waiting thread spins before it sleeps. A decode step's parallel
// regions follow each other within a few microseconds, so a worker spinning
// this long finds the next one without a wake-up (~5-50 us); a longer gap
// (the next token, Python work) costs one wake-up. On a busy machine a
// spinning thread holds a core that the thread it waits for may need, so
// the spin is kept short.
constexpr std::chrono::microseconds kSpin(30);

// The busy signs and the back-off (thread_pool.h).
//
// Run delay: windows of kWindow (a few decode steps, so that a window holds
// every kind of job). On a quiet 2-core VM, 2 decoding threads waited for a
// CPU 0% of their time in half the windows, under 0.2% in 90%, and up to
// 20% in one window of a hundred (a hiccup of the host); beside one
// CPU-bound process, 45-65% in every window. So the sign is kBusyWindows
// windows in a row above kBusyDelay, and a probe after a back-off costs two
// windows at the busy speed.
//
// Stragglers: a quiet machine's longest wait for a joined worker is one
// claimed piece (microseconds in decode, a GEMM tile of a long prefill: up
// to ~1 ms, which the quarter-of-own-time rule covers) or a hiccup of the
// host (up to ~1.6 ms seen on a 2-vCPU VM); a worker descheduled for a
// CPU-bound neighbour cost 2.6-8 ms (a scheduler slice).
//
// Either sign halves the threads (limit_); a level's wait before the limit
// rises to it again starts at 50 ms (a few decode steps), doubles with each
// rise to it that fails before kGoodWindows windows, and resets only when a
// rise holds that long, so a lucky probe on a busy machine does not bring
// the slow jobs back at once (10 ms with an at-once reset: 2 threads at 0.88
// of one thread's tg128 beside a busy process). One wait for all levels
// kept 4 threads on 2 quiet cores at 1 thread for a second after a hiccup
// at 2: good windows at 2 could not reset a wait that 4 kept doubling.
constexpr std::chrono::milliseconds kWindow(10);
constexpr double kBusyDelay = 0.1;
constexpr uint32_t kBusyWindows = 2;
constexpr uint32_t kGoodWindows = 10;
constexpr std::chrono::microseconds kStragglerWait(2000);
constexpr std::chrono::microseconds kMinSolo(50'000), kMaxSolo(1'000'000);

// level_wait_'s index of a limit (1 .. kMaxThreads).
int level(int limit) { return 31 - __builtin_clz(static_cast<unsigned>(limit)); }

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// Sleeps while *a == v (returns at once if it differs; spurious returns are
// allowed: callers loop).
void futex_wait(std::atomic<uint32_t>& a, uint32_t v) {
#if defined(__linux__)
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&a), FUTEX_WAIT_PRIVATE, v, nullptr, nullptr, 0);
#else
  if (a.load() == v) std::this_thread::sleep_for(std::chrono::microseconds(50));
#endif
}

void futex_wake(std::atomic<uint32_t>& a, int n) {
#if defined(__linux__)
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&a), FUTEX_WAKE_PRIVATE, n, nullptr, nullptr, 0);
#else
  (void)a;
  (void)n;
#endif
}

#if defined(__linux__)
// The run delay in a task's schedstat file ("cpu_ns delay_ns slices"), in
// ns; -1 where it cannot be read.
int64_t read_run_delay(int fd) {
  char buf[128];
  const ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
  if (n <= 0) return -1;
  buf[n] = 0;
  char* p = buf;
  std::strtoull(p, &p, 10);
  char* q = p;
  const unsigned long long d = std::strtoull(p, &q, 10);
  return q == p ? -1 : static_cast<int64_t>(d);
}
#endif

// Spins until done() holds (true) or kSpin has passed (false).
template <class P>
bool spin_until(P done) {
  const auto end = std::chrono::steady_clock::now() + kSpin;
  for (unsigned i = 1;; ++i) {
    if (done()) return true;
    cpu_relax();
    if (i % 64 == 0 && std::chrono::steady_clock::now() > end) return false;
  }
}

}  // namespace

ThreadPool::ThreadPool(int threads)
    : size_(threads), limit_word_(static_cast<uint32_t>(threads)), limit_(threads) {
  if (threads < 1 || threads > kMaxThreads)
    throw std::invalid_argument("threads must be 1.." + std::to_string(kMaxThreads) + ", got " + std::to_string(threads));
  for (auto& w : level_wait_) w = kMinSolo;
  tids_.reset(new std::atomic<int>[static_cast<size_t>(threads)]);
  for (int i = 0; i < threads; ++i) tids_[i].store(0, std::memory_order_relaxed);
  try {
    for (int i = 1; i < threads; ++i) workers_.emplace_back([this, i] { worker(i); });
  } catch (...) {
    stop();  // the workers started so far
    throw;
  }
}

ThreadPool::~ThreadPool() { stop(); }

void ThreadPool::stop() {
  stop_.store(true, std::memory_order_release);
  publish_limit(size_);  // workers past the limit come to gen_, and see the stop there
  gen_.fetch_add(1, std::memory_order_seq_cst);
  futex_wake(gen_, INT_MAX);
  for (std::thread& w : workers_)
    if (w.joinable()) w.join();
  workers_.clear();
#if defined(__linux__)
  for (int fd : fds_)
    if (fd >= 0) close(fd);
#endif
  fds_.clear();
}

int64_t ThreadPool::run_delay_ns() {
#if defined(__linux__)
  if (no_delay_) return -1;
  if (fds_.empty()) fds_.assign(static_cast<size_t>(size_), -1);
  const int tid = static_cast<int>(syscall(SYS_gettid));
  const int was = tids_[0].load(std::memory_order_relaxed);
  if (tid != was) {  // the first reading, or another thread calls the pool now: its own delay from here on
    if (fds_[0] >= 0) close(fds_[0]);
    fds_[0] = -1;
    tids_[0].store(tid, std::memory_order_relaxed);
  }
  int64_t sum = 0;
  for (int i = 0; i < limit_; ++i) {
    int& fd = fds_[static_cast<size_t>(i)];
    if (fd < 0) {
      const int t = tids_[i].load(std::memory_order_acquire);
      if (t == 0) return -1;  // a worker not started yet
      fd = open(("/proc/self/task/" + std::to_string(t) + "/schedstat").c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) {
        no_delay_ = true;  // no schedstat here: the straggler sign alone
        return -1;
      }
    }
    const int64_t d = read_run_delay(fd);
    if (d < 0) {
      no_delay_ = true;
      return -1;
    }
    sum += d;
  }
  return was != 0 && tid != was ? -1 : sum;
#else
  return -1;
#endif
}

bool ThreadPool::busy_window(std::chrono::steady_clock::time_point now) {
  if (!window_open_) {
    // A pool's first window takes its first reading when it ends (a pool made for one short call reads
    // none); a window after a back-off starts from a reading, so that a probe costs two windows.
    window_open_ = true;
    window_start_ = now;
    window_delay_ = fds_.empty() ? -1 : run_delay_ns();
    return false;
  }
  if (now - window_start_ < kWindow) return false;
  const int64_t d = run_delay_ns();
  bool busy = false;
  const double ns = std::chrono::duration<double, std::nano>(now - window_start_).count();
  if (d >= 0 && window_delay_ >= 0 && static_cast<double>(d - window_delay_) > kBusyDelay * limit_ * ns) {
    busy = ++busy_windows_ >= kBusyWindows;
  } else {
    busy_windows_ = 0;
    if (++good_windows_ == kGoodWindows && raised_) {  // the rise to this limit held
      level_wait_[level(limit_)] = kMinSolo;
      raised_ = false;
    }
  }
  window_start_ = now;
  window_delay_ = d;
  return busy;
}

void ThreadPool::publish_limit(int limit) {
  const uint32_t was = limit_word_.exchange(static_cast<uint32_t>(limit), std::memory_order_seq_cst);
  if (static_cast<uint32_t>(limit) > was) futex_wake(limit_word_, INT_MAX);
}

void ThreadPool::back_off(std::chrono::steady_clock::time_point now) {
  if (raised_ && good_windows_ < kGoodWindows) {  // the rise to this limit failed
    auto& w = level_wait_[level(limit_)];
    w = std::min(w * 2, kMaxSolo);
  }
  raised_ = false;
  limit_ = std::max(1, limit_ / 2);
  publish_limit(limit_);
  next_probe_ = now + level_wait_[level(std::min(size_, 2 * limit_))];
  good_windows_ = 0;
  busy_windows_ = 0;
  window_open_ = false;
}

void ThreadPool::record(std::exception_ptr e) {
  std::lock_guard<std::mutex> lock(error_mu_);
  if (!error_) error_ = e;
}

void ThreadPool::dispatch(void* fn, Call call, bool all) {
  if (size_ == 1) {
    call(fn, 0);
    return;
  }
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  int limit = size_;
  if (!all) {
    if (limit_ < size_ && start >= next_probe_) {  // the back-off is over: twice the threads, from a fresh window
      limit_ = std::min(size_, 2 * limit_);
      publish_limit(limit_);
      next_probe_ = start + level_wait_[level(std::min(size_, 2 * limit_))];  // for the next level, once this holds
      raised_ = true;
      good_windows_ = 0;
      window_open_ = false;
    }
    if (limit_ > 1 && busy_window(start)) back_off(start);
    limit = limit_;
    if (limit == 1) {
      ++solo_jobs_;
      call(fn, 0);
      return;
    }
  }
  if (state_.load(std::memory_order_relaxed) & kOpen)  // only this pool's own jobs can see it open
    throw std::logic_error("ThreadPool: a job started another on the same pool (nested parallelism)");
  if (all && limit_ < size_) publish_limit(size_);  // each(): every thread
  fn_ = fn;
  call_ = call;
  const uint32_t g = static_cast<uint32_t>(state_.load(std::memory_order_relaxed) >> 32) + 1;
  state_.store(uint64_t(g) << 32 | kOpen, std::memory_order_release);
  gen_.store(g, std::memory_order_seq_cst);
  // Only threads under the limit sleep here (and one that was, until its next look at the limit).
  if (sleepers_.load(std::memory_order_seq_cst) > 0) futex_wake(gen_, INT_MAX);
  std::exception_ptr mine;
  try {
    call(fn, 0);
  } catch (...) {
    mine = std::current_exception();
  }
  if (all) {
    const uint64_t want = static_cast<uint64_t>(size_ - 1);
    while ((state_.load(std::memory_order_acquire) & kJoined) != want)
      if (!spin_until([&] { return (state_.load(std::memory_order_acquire) & kJoined) == want; }))
        std::this_thread::yield();
  }
  // Close: from here no worker joins; wait for those that did.
  const uint32_t joined = static_cast<uint32_t>(state_.fetch_and(~kOpen, std::memory_order_acq_rel) & kJoined);
  auto finished = [&] { return done_.load(std::memory_order_acquire) == joined; };
  const Clock::time_point own_done = Clock::now();
  if (!finished() && !spin_until(finished)) {
    for (;;) {
      caller_sleeps_.store(true, std::memory_order_seq_cst);
      const uint32_t d = done_.load(std::memory_order_seq_cst);
      if (d == joined) break;
      futex_wait(done_, d);
    }
    caller_sleeps_.store(false, std::memory_order_relaxed);
  }
  done_.store(0, std::memory_order_relaxed);  // every joined call has returned; none can join this job
  if (all && limit_ < size_) publish_limit(limit_);
  if (!all) {
    const Clock::time_point end = Clock::now();
    if (end - own_done > kStragglerWait && (end - own_done) * 4 > own_done - start) back_off(end);
  }
  if (mine) std::rethrow_exception(mine);
  std::exception_ptr theirs;
  {
    std::lock_guard<std::mutex> lock(error_mu_);
    std::swap(theirs, error_);
  }
  if (theirs) std::rethrow_exception(theirs);
}

void ThreadPool::worker(int index) {
#if defined(__linux__)
  tids_[index].store(static_cast<int>(syscall(SYS_gettid)), std::memory_order_release);
#endif
  uint32_t seen = 0;
  for (;;) {
    const uint32_t limit = limit_word_.load(std::memory_order_seq_cst);
    if (static_cast<uint32_t>(index) >= limit) {  // past the back-off's limit: sleep until it rises
      futex_wait(limit_word_, limit);
      continue;
    }
    // stop_ counts as a change: a worker may have taken stop()'s own
    // generation as `seen` (read after a job it arrived too late for), and
    // must not then sleep through the wake-up that generation came with.
    auto changed = [&] {
      return gen_.load(std::memory_order_acquire) != seen || stop_.load(std::memory_order_acquire);
    };
    if (!changed() && !spin_until(changed)) {
      sleepers_.fetch_add(1, std::memory_order_seq_cst);
      // seq_cst: against the dispatcher's store of gen_ and load of sleepers_ (no lost wake-up)
      while (gen_.load(std::memory_order_seq_cst) == seen && !stop_.load(std::memory_order_seq_cst))
        futex_wait(gen_, seen);
      sleepers_.fetch_sub(1, std::memory_order_relaxed);
    }
    if (stop_.load(std::memory_order_acquire)) return;
    seen = gen_.load(std::memory_order_acquire);
    uint64_t s = state_.load(std::memory_order_acquire);
    int slot = -1;
    while (static_cast<uint32_t>(s >> 32) == seen && (s & kOpen)) {
      // a job under a lower limit than this thread saw (it fell while the thread waited on gen_)
      if ((s & kJoined) + 1 >= limit_word_.load(std::memory_order_relaxed)) break;
      if (state_.compare_exchange_weak(s, s + 1, std::memory_order_acq_rel, std::memory_order_acquire)) {
        slot = static_cast<int>(s & kJoined) + 1;
        break;
      }
    }
    if (slot < 0) continue;  // closed (or superseded) before this thread arrived
    try {
      call_(fn_, slot);
    } catch (...) {
      record(std::current_exception());
    }
    done_.fetch_add(1, std::memory_order_seq_cst);
    if (caller_sleeps_.load(std::memory_order_seq_cst)) futex_wake(done_, 1);
  }
}

}  // namespace ie
