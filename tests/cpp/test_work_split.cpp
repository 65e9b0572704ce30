// How parallel loops share their items (common/work_split.h) and the
// storage they stream (common/aligned.h).
#include <omp.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <thread>
#include <vector>

#include "common/aligned.h"
#include "common/work_split.h"
#include "test.h"

namespace {

// Runs `threads` OpenMP threads over a WorkSplit made for `nt`; thread 0
// sleeps per claim (a thread slowed by the machine). Returns per item how
// many times it was claimed, and per thread how many items it ran.
void run_split(int64_t n, int nt, int threads, int64_t grain, std::vector<int>* claimed, std::vector<int64_t>* ran) {
  ie::WorkSplit split(n, nt, grain);
  std::vector<std::atomic<int>> count(static_cast<size_t>(n));
  ran->assign(static_cast<size_t>(threads), 0);
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num();
    int64_t i0, i1;
    while (split.next(t, &i0, &i1)) {
      if (t == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
      for (int64_t i = i0; i < i1; ++i) count[static_cast<size_t>(i)].fetch_add(1);
      (*ran)[static_cast<size_t>(t)] += i1 - i0;
    }
  }
  claimed->clear();
  for (auto& c : count) claimed->push_back(c.load());
}

}  // namespace

TEST(work_split_claims_every_item_once) {
  for (int64_t n : {0, 1, 7, 64, 1001})
    for (int nt : {1, 2, 3, 8})
      for (int64_t grain : {1, 4}) {
        std::vector<int> claimed;
        std::vector<int64_t> ran;
        run_split(n, nt, nt, grain, &claimed, &ran);
        for (int64_t i = 0; i < n; ++i)
          CHECK(claimed[static_cast<size_t>(i)] == 1)
              << "n=" << n << " nt=" << nt << " grain=" << grain << " item " << i << " claimed "
              << claimed[static_cast<size_t>(i)] << " times";
      }
}

TEST(work_split_moves_work_off_a_slow_thread) {
  // Thread 0 sleeps 200 us per item: the other threads take most of its share.
  std::vector<int> claimed;
  std::vector<int64_t> ran;
  run_split(400, 2, 2, 1, &claimed, &ran);
  CHECK(ran[0] + ran[1] == 400);
  CHECK(ran[1] > 300) << "thread 1 ran " << ran[1] << " of 400 items (its own share is 200)";
}

TEST(work_split_runs_shares_of_threads_that_never_came) {
  // Made for 4 threads, run by 2 (an OpenMP runtime may grant fewer): the
  // shares of threads 2 and 3 are taken by the others.
  std::vector<int> claimed;
  std::vector<int64_t> ran;
  run_split(1000, 4, 2, 1, &claimed, &ran);
  for (int64_t i = 0; i < 1000; ++i) CHECK(claimed[static_cast<size_t>(i)] == 1) << "item " << i;
}

TEST(work_split_refuses_counts_past_32_bits) {
  bool threw = false;
  try {
    ie::WorkSplit split(int64_t(1) << 32, 2);
  } catch (const std::length_error&) {
    threw = true;
  }
  CHECK(threw);
}

TEST(aligned_array_gives_large_arrays_2mib_alignment) {
  ie::AlignedArray<uint8_t> small(4096), large(size_t(3) << 20), resized(16);
  resized.resize(size_t(5) << 20);
  CHECK(reinterpret_cast<uintptr_t>(small.data()) % 64 == 0);
  CHECK(reinterpret_cast<uintptr_t>(large.data()) % (size_t(2) << 20) == 0);
  CHECK(reinterpret_cast<uintptr_t>(resized.data()) % (size_t(2) << 20) == 0);
  bool zero = true;
  for (size_t i = 0; i < resized.size(); i += 4093) zero = zero && resized[i] == 0;
  CHECK(zero) << "resize() zeroes new storage";
}
