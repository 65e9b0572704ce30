// The thread pool (common/thread_pool.h): every item of a job runs once
// whoever runs it, over thousands of jobs back to back (the generation and
// join protocol); each() reaches every thread; errors come back to the
// caller and leave the pool usable.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>
#if defined(__linux__)
#include <sched.h>
#include <unistd.h>
#endif

#include "common/thread_pool.h"
#include "common/work_split.h"
#include "test.h"

TEST(thread_pool_runs_every_item_once) {
  for (int threads : {1, 2, 3, 8}) {
    ie::ThreadPool pool(threads);
    for (int64_t n : {0, 1, 5, 64, 1000}) {
      for (int rep = 0; rep < 300; ++rep) {
        std::vector<std::atomic<int>> count(static_cast<size_t>(n));
        std::atomic<int> bad_slot{0};
        ie::parallel_for(pool, n, 1 + rep % 7, [&](int64_t i0, int64_t i1, int slot) {
          if (slot < 0 || slot >= threads) bad_slot.fetch_add(1);
          for (int64_t i = i0; i < i1; ++i) count[static_cast<size_t>(i)].fetch_add(1);
        });
        int wrong = 0;
        for (auto& c : count) wrong += c.load() != 1;
        CHECK(wrong == 0 && bad_slot.load() == 0) << threads << " threads, n=" << n << ", rep " << rep;
      }
    }
  }
}

TEST(thread_pool_work_split_survives_absent_workers) {
  // A WorkSplit made for the whole pool, run by whichever slots join (the
  // caller's always, a worker's only if it wakes in time; a worker slowed
  // per claim here): the shares of slots that never came are stolen, and
  // every item runs exactly once.
  ie::ThreadPool pool(4);
  for (int rep = 0; rep < 200; ++rep) {
    ie::WorkSplit split(257, pool.size(), 3);
    std::vector<std::atomic<int>> count(257);
    pool.run([&](int slot) {
      int64_t i0, i1;
      while (split.next(slot, &i0, &i1)) {
        if (slot == 1 && rep % 10 == 0) std::this_thread::sleep_for(std::chrono::microseconds(100));
        for (int64_t i = i0; i < i1; ++i) count[static_cast<size_t>(i)].fetch_add(1);
      }
    });
    int wrong = 0;
    for (auto& c : count) wrong += c.load() != 1;
    CHECK(wrong == 0) << "rep " << rep;
  }
}

TEST(thread_pool_each_reaches_every_thread) {
  ie::ThreadPool pool(4);
  for (int rep = 0; rep < 50; ++rep) {
    std::vector<std::atomic<int>> seen(4);
    std::vector<std::thread::id> ids(4);
    pool.each([&](int slot) {
      seen[static_cast<size_t>(slot)].fetch_add(1);
      ids[static_cast<size_t>(slot)] = std::this_thread::get_id();
    });
    std::set<std::thread::id> distinct(ids.begin(), ids.end());
    CHECK(seen[0] == 1 && seen[1] == 1 && seen[2] == 1 && seen[3] == 1 && distinct.size() == 4) << "rep " << rep;
  }
}

TEST(thread_pool_returns_errors_and_stays_usable) {
  ie::ThreadPool pool(3);
  for (int thrower : {0, 1, 2}) {
    std::string what;
    try {
      pool.each([&](int slot) {
        if (slot == thrower) throw std::invalid_argument("slot " + std::to_string(slot));
      });
    } catch (const std::invalid_argument& e) {
      what = e.what();
    }
    CHECK(what == "slot " + std::to_string(thrower)) << what;
    std::atomic<int> n{0};
    pool.each([&](int) { n.fetch_add(1); });
    CHECK(n.load() == 3);
  }
  bool threw = false;
  try {
    ie::ThreadPool bad(0);
  } catch (const std::invalid_argument&) {
    threw = true;
  }
  CHECK(threw);
}

TEST(thread_pool_sleeps_between_jobs) {
  // Idle workers sleep (futex) after a short spin: a pool left alone for a
  // while costs next to no CPU time.
  ie::ThreadPool pool(4);
  pool.each([](int) {});
  const std::clock_t c0 = std::clock();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const double cpu_s = static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC;
  CHECK(cpu_s < 0.05) << "3 idle workers used " << cpu_s << " s of CPU in 0.2 s";
}

namespace {

// A job whose slot 0 waits (up to 1 s) for a worker to join; the worker
// then takes `worker_ms`. Returns whether a worker joined; the time slot 0
// returned into *own_end where given.
bool job_with_worker(ie::ThreadPool& pool, int worker_ms,
                     std::atomic<std::chrono::steady_clock::rep>* own_end = nullptr) {
  std::atomic<bool> joined{false};
  pool.run([&](int slot) {
    if (slot != 0) {
      joined = true;
      std::this_thread::sleep_for(std::chrono::milliseconds(worker_ms));
      return;
    }
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    while (!joined && std::chrono::steady_clock::now() < end) std::this_thread::yield();
    if (own_end) *own_end = std::chrono::steady_clock::now().time_since_epoch().count();
  });
  return joined;
}

}  // namespace

TEST(thread_pool_backs_off_while_a_worker_stalls) {
  // A joined worker that keeps the caller waiting milliseconds (a thread
  // descheduled on a busy machine) sends the next jobs to the caller alone
  // for a while; after the back-off the workers are used again.
  ie::ThreadPool pool(2);
  CHECK(job_with_worker(pool, 0) && pool.solo_jobs() == 0);
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  std::atomic<Clock::rep> own_end{0};
  CHECK(job_with_worker(pool, 8, &own_end));  // the caller waits ~8 ms for it (> 2 ms)
  const auto stalled = Clock::now();
  // The back-off also asks that wait to be over a quarter of the caller's own time, which includes
  // waiting for the worker to join: on a loaded machine that can take longer than 32 ms.
  const auto own = Clock::duration(own_end.load()) - start.time_since_epoch();
  const auto waited = stalled.time_since_epoch() - Clock::duration(own_end.load());
  const bool stall_counts = waited > std::chrono::milliseconds(4) && waited * 3 > own;
  std::atomic<int> others{0};
  pool.run([&](int slot) { others += slot != 0; });
  if (stall_counts && Clock::now() - stalled < std::chrono::milliseconds(40)) {  // inside the 50 ms back-off
    CHECK(others == 0 && pool.solo_jobs() == 1) << "solo jobs " << pool.solo_jobs();
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(80));  // past the first back-off (50 ms)
  CHECK(job_with_worker(pool, 0)) << "the workers are used again after the back-off";
}

#if defined(__linux__)
namespace {

// Busy for `us` microseconds: a piece of CPU-bound work.
void spin_us(int us) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::microseconds(us);
  while (std::chrono::steady_clock::now() < end) {
  }
}

// The first n CPUs this process may use, and its affinity to restore
// after; false (with a note) where there are fewer, or no schedstat for the
// pool's run-delay sign to read.
bool pick_cpus(int n, cpu_set_t* saved, cpu_set_t* set) {
  if (access("/proc/thread-self/schedstat", R_OK) != 0) {
    std::printf("  (skipped: no schedstat here)\n");
    return false;
  }
  if (sched_getaffinity(0, sizeof *saved, saved) != 0) return false;
  CPU_ZERO(set);
  int got = 0;
  for (int cpu = 0; cpu < CPU_SETSIZE && got < n; ++cpu)
    if (CPU_ISSET(cpu, saved)) {
      CPU_SET(cpu, set);
      ++got;
    }
  if (got < n) std::printf("  (skipped: fewer than %d CPUs)\n", n);
  return got == n;
}

// Whether the test's threads could be pinned (a note where not: the test
// then checks nothing).
bool pinned_or_note(bool pinned) {
  if (!pinned) std::printf("  (skipped: sched_setaffinity refused)\n");
  return pinned;
}

// Pins every thread of `pool` to `cpus`, then runs jobs of 80 pieces of
// 0.5 ms until done() or max_jobs of them: the jobs run, or -1 (with a
// note) where pinning was refused and the test can check nothing.
template <class Done>
int pin_and_load(ie::ThreadPool& pool, const cpu_set_t& cpus, int max_jobs, Done done) {
  std::atomic<bool> pinned{true};
  pool.each([&](int) {
    if (sched_setaffinity(0, sizeof cpus, &cpus) != 0) pinned = false;
  });
  if (!pinned_or_note(pinned)) return -1;
  int jobs = 0;
  for (; jobs < max_jobs && !done(); ++jobs)
    ie::parallel_for(pool, 80, 1, [&](int64_t, int64_t, int) { spin_us(500); });
  return jobs;
}

}  // namespace

TEST(thread_pool_goes_solo_while_its_threads_wait_for_a_cpu) {
  // The pool's two threads and a CPU-bound thread pinned to one CPU: each of
  // them waits for it most of the time (run delay), and after two 10 ms
  // windows of that the pool runs its jobs on the caller alone. The jobs are
  // ~40 ms of work each, so that the other sign (a caller waiting past 2 ms
  // and a quarter of its own time for one straggling piece) cannot be what
  // fires: no piece takes over 1 ms.
  cpu_set_t saved, one;
  if (!pick_cpus(1, &saved, &one)) return;
  std::atomic<bool> stop{false}, hog_pinned{true};
  std::thread hog([&] {
    if (sched_setaffinity(0, sizeof one, &one) != 0) hog_pinned = false;
    while (!stop.load(std::memory_order_relaxed)) {
    }
  });
  {
    ie::ThreadPool pool(2);
    const int jobs = pin_and_load(pool, one, 30, [&] { return pool.solo_jobs() > 0; });
    if (jobs >= 0 && pinned_or_note(hog_pinned)) {
      CHECK(pool.solo_jobs() > 0) << "still using its worker after " << jobs << " jobs of ~40 ms on one shared CPU";
    }
  }
  stop = true;
  hog.join();
  sched_setaffinity(0, sizeof saved, &saved);
}

TEST(thread_pool_settles_at_the_threads_the_cores_hold) {
  // Four threads pinned to two CPUs (more threads than free cores: --threads
  // 8 on a 2-core laptop) wait for a CPU about half their time. The pool
  // halves its threads to two, where they stop waiting, not to one, and the
  // jobs then use two slots only.
  cpu_set_t saved, two;
  if (!pick_cpus(2, &saved, &two)) return;
  {
    ie::ThreadPool pool(4);
    const int jobs = pin_and_load(pool, two, 40, [&] { return pool.limit() != 4; });
    if (jobs >= 0) {
      CHECK(pool.limit() == 2) << "threads in use " << pool.limit() << " after " << jobs << " jobs";
      std::atomic<int> top{0}, ran_with{0};
      std::atomic<int> next{0};
      pool.run([&](int slot) {
        // the caller's slot (always run) reads the limit its own dispatch set, before any back-off at the end
        if (slot == 0) ran_with.store(pool.limit());
        while (next.fetch_add(1) < 80) {
          spin_us(100);
          for (int t = top.load(); slot > t && !top.compare_exchange_weak(t, slot);) {
          }
        }
      });
      // No slot at or past the limit the job ran with. That is 2, unless the back-off's probe came due at
      // this very job (twice the threads for one job): under outside load the settling above takes longer,
      // and slots 2 and 3 were seen here beside CI runs. The limit is read inside the job, since a
      // straggler at the job's end halves it again before the call returns (read after it, the probe's job
      // looked like a job limited to 2 that slot 3 had joined).
      CHECK(top.load() < ran_with.load()) << "slot " << top.load() << " joined a job limited to "
                                          << ran_with.load() << " threads";
      // each() wakes the sleeping workers past the limit too, and leaves the limit as it found it. Read
      // after the job above: a neighbour that takes one of the two CPUs during it rightly halves the limit
      // again (seen once in `make test` on a shared VM: 1 here), which is not each()'s doing.
      const int before = pool.limit();
      std::atomic<int> ran{0};
      pool.each([&](int) { ran.fetch_add(1); });
      CHECK(ran.load() == 4 && pool.limit() == before)
          << ran.load() << " threads ran each(), limit " << before << " -> " << pool.limit();
    }
  }
  sched_setaffinity(0, sizeof saved, &saved);
}
#endif

TEST(thread_pool_stops_while_workers_arrive_late) {
  // Pools made, given one short job and destroyed at once, many times: a
  // worker that arrives after the job closed and reads the generation stop()
  // made must still see the stop (it once slept through it: the fuzzer's
  // timeout in fuzz_gemv, fuzz/regressions/fuzz_gemv/pool-stop-race).
  std::atomic<int> ran{0};
  for (int i = 0; i < 20000; ++i) {
    ie::ThreadPool pool(1 + i % 4);
    pool.run([&](int slot) { ran += slot == 0; });
  }
  CHECK(ran == 20000);
}
