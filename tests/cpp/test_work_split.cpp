// How parallel loops share their items (common/work_split.h) and the
// storage they stream (common/aligned.h).
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "common/aligned.h"
#include "common/work_split.h"
#include "test.h"

namespace {

// Runs `threads` threads over a WorkSplit made for `nt`; thread 0
// sleeps per claim (a thread slowed by the machine). Returns per item how
// many times it was claimed, and per thread how many items it ran; counts
// in *unaligned the pieces that do not begin at a multiple of the grain.
void run_split(int64_t n, int nt, int threads, int64_t grain, std::vector<int>* claimed, std::vector<int64_t>* ran,
               int* unaligned = nullptr) {
  ie::WorkSplit split(n, nt, grain);
  std::vector<std::atomic<int>> count(static_cast<size_t>(n));
  std::atomic<int> odd{0};
  ran->assign(static_cast<size_t>(threads), 0);
  auto body = [&](int t) {
    int64_t i0, i1;
    while (split.next(t, &i0, &i1)) {
      if (i0 % grain != 0 || (i1 % grain != 0 && i1 != n)) odd.fetch_add(1);
      if (t == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
      for (int64_t i = i0; i < i1; ++i) count[static_cast<size_t>(i)].fetch_add(1);
      (*ran)[static_cast<size_t>(t)] += i1 - i0;
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(body, t);
  body(0);
  for (std::thread& th : pool) th.join();
  claimed->clear();
  for (auto& c : count) claimed->push_back(c.load());
  if (unaligned) *unaligned = odd.load();
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

TEST(work_split_keeps_pieces_whole_grains) {
  // Steals split at a multiple of the grain (rows8's tile pairs stay pairs),
  // while thread 0 is slow and the others take from it, and with more
  // shares than threads.
  for (int64_t n : {2, 9, 64, 301, 1000})
    for (int nt : {2, 3, 4})
      for (int64_t grain : {2, 3, 4}) {
        std::vector<int> claimed;
        std::vector<int64_t> ran;
        int unaligned = -1;
        run_split(n, nt, nt == 4 ? 2 : nt, grain, &claimed, &ran, &unaligned);
        CHECK(unaligned == 0) << "n=" << n << " nt=" << nt << " grain=" << grain << ": " << unaligned
                              << " pieces not on the grain";
        for (int64_t i = 0; i < n; ++i) CHECK(claimed[static_cast<size_t>(i)] == 1) << "n=" << n << " item " << i;
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
  // Made for 4 threads, run by 2 (a pool's workers that never joined a job):
  // the shares of threads 2 and 3 are taken by the others.
  std::vector<int> claimed;
  std::vector<int64_t> ran;
  run_split(1000, 4, 2, 1, &claimed, &ran);
  for (int64_t i = 0; i < 1000; ++i) CHECK(claimed[static_cast<size_t>(i)] == 1) << "item " << i;
}

TEST(work_split_run_by_one_thread_streams_in_order) {
  // A job that one thread runs alone (the pool's back-off, workers that never
  // came) claims every item in order, as a one-thread split would: each range
  // starts where the last one ended. (Taking back halves, it jumped backwards
  // and restarted the prefetcher's stream at every steal.)
  for (int64_t n : {1, 7, 64, 1001})
    for (int nt : {2, 3, 8})
      for (int64_t grain : {1, 4}) {
        ie::WorkSplit split(n, nt, grain);
        int64_t i0, i1, at = 0;
        while (split.next(0, &i0, &i1)) {
          CHECK(i0 == at) << "n=" << n << " nt=" << nt << " grain=" << grain << ": claimed " << i0 << ".." << i1
                          << " after " << at;
          at = i1;
        }
        CHECK(at == n) << "n=" << n << " nt=" << nt << ": ended at " << at;
      }
}

TEST(work_split_thief_leaves_a_working_owner_its_stream) {
  // Thread 1 has started its share; thread 0, done with its own, takes the
  // back half, and thread 1 goes on where it was.
  ie::WorkSplit split(100, 2, 1);
  int64_t i0 = -1, i1 = -1;
  CHECK(split.next(1, &i0, &i1) && i0 == 50 && i1 == 51);
  while (split.next(0, &i0, &i1) && i0 < 50) {
  }
  CHECK(i0 == 75 && i1 == 76) << "thief took " << i0 << ".." << i1 << ", expected the back half from 75";
  CHECK(split.next(1, &i0, &i1) && i0 == 51) << "owner went on at " << i0;
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

namespace {

// The smaps "THPeligible" flag (0/1) of the mapping holding address p; -1
// where the kernel does not report it.
int thp_eligible(const void* p) {
  std::ifstream f("/proc/self/smaps");
  std::string line;
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  bool inside = false;
  while (std::getline(f, line)) {
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2 && line.find('-') < line.find(' ')) {
      inside = a >= lo && a < hi;
    } else if (inside && line.rfind("THPeligible:", 0) == 0) {
      return std::stoi(line.substr(12));
    }
  }
  return -1;
}

// Transparent huge pages given only where asked (the default "madvise" mode).
bool thp_madvise_mode() {
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string mode;
  std::getline(f, mode);
  return mode.find("[madvise]") != std::string::npos;
}

}  // namespace

TEST(aligned_array_asks_huge_pages_for_a_whole_tail_worth_it) {
  // 2048 x 5632 int4w g64 (the bench model's gate/up): 5.84 MiB, padded to 6.
  ie::AlignedArray<uint8_t> mlp(size_t(2048) * 5632 / 2 + size_t(2048) * 88 * 2);
  const uint8_t* last = mlp.data() + mlp.size() - 1;
  if (!ie::kAlignedHugeMaps || !thp_madvise_mode() || thp_eligible(mlp.data()) < 0) return;  // nothing to observe
  CHECK(thp_eligible(mlp.data()) == 1);
  CHECK(thp_eligible(last) == 1) << "the last, partial 2 MiB span is asked for whole";
  // 2.125 MiB: whole spans would pad it by 88%, so its tail keeps small pages.
  ie::AlignedArray<uint8_t> q(size_t(2048) * 2048 / 2 + size_t(2048) * 32 * 2);
  CHECK(thp_eligible(q.data()) == 1);
  CHECK(thp_eligible(q.data() + q.size() - 1) == 0) << "a tail that would pad by more than an eighth stays small";
}
