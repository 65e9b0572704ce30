// bench_gemv: time GEMVs whose weights stream from DRAM, not the LLC; and
// the random weights it streams (also the C++ tests' inputs).

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <stdexcept>
#include <vector>

#include "common/aligned.h"
#include "gemv.h"
#include "kernels.h"

namespace ie {

namespace {

inline uint64_t splitmix(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Finite random values of each stored kind.
inline uint16_t rand_scale_f16(uint64_t& s) {  // f16 in [~1e-3, ~1e-2]: bits 0x1419..0x211F
  return static_cast<uint16_t>(0x1419 + splitmix(s) % (0x211F - 0x1419 + 1));
}
inline float rand_unit(uint64_t& s) { return static_cast<float>(splitmix(s) >> 40) * 0x1p-24f; }  // [0, 1)

void put16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, 2); }
void put32f(uint8_t* p, float v) { std::memcpy(p, &v, 4); }

void fill_bytes(uint8_t* p, size_t n, uint64_t& s) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const uint64_t v = splitmix(s);
    std::memcpy(p + i, &v, 8);
  }
  for (; i < n; ++i) p[i] = static_cast<uint8_t>(splitmix(s));
}

// Rows [r0, r1) of a random weight matrix (every plane), so each thread
// first-touches the pages it will read.
void fill_rows(const WeightSpec& s, const WeightLayout& l, uint8_t* w, int64_t r0, int64_t r1, uint64_t seed) {
  for (int64_t r = r0; r < r1; ++r) {
    uint64_t st = seed * 0x100000001B3ull + static_cast<uint64_t>(r);
    uint8_t* row = w + r * l.row_bytes;
    switch (s.type) {
      case WType::F32:
        for (int64_t c = 0; c < s.cols; ++c) put32f(row + c * 4, 2.f * rand_unit(st) - 1.f);
        break;
      case WType::F16:  // sign, exponent 5..14 (|v| in [2^-10, 2)), random mantissa
      case WType::BF16:
        for (int64_t c = 0; c < s.cols; ++c) {
          const uint64_t v = splitmix(st);
          const uint16_t h = s.type == WType::F16
                                 ? static_cast<uint16_t>(((v & 1) << 15) | ((5 + (v >> 1) % 10) << 10) | ((v >> 8) & 0x3FF))
                                 : static_cast<uint16_t>(((v & 1) << 15) | ((117 + (v >> 1) % 10) << 7) | ((v >> 8) & 0x7F));
          put16(row + c * 2, h);
        }
        break;
      case WType::Q4_0:
      case WType::Q4_1:
      case WType::Q5_0:
      case WType::Q5_1:
      case WType::Q8_0:
      case WType::IQ4_NL:
        fill_bytes(row, l.row_bytes, st);
        for (int64_t b = 0; b < s.cols / 32; ++b) {
          uint8_t* blk = row + b * l.block_bytes;
          put16(blk, rand_scale_f16(st));
          if (s.type == WType::Q4_1 || s.type == WType::Q5_1) put16(blk + 2, static_cast<uint16_t>(0x8000 | rand_scale_f16(st)));
        }
        break;
      case WType::MXFP4:  // random codes under E8M0 scales 2^-8 .. 2^-1
        fill_bytes(row, l.row_bytes, st);
        for (int64_t b = 0; b < s.cols / 32; ++b) row[b * l.block_bytes] = static_cast<uint8_t>(119 + splitmix(st) % 8);
        break;
      case WType::Q1_0:  // random signs under a random f16 d per 128
        fill_bytes(row, l.row_bytes, st);
        for (int64_t b = 0; b < s.cols / 128; ++b) put16(row + b * l.block_bytes, rand_scale_f16(st));
        break;
      case WType::NVFP4:  // random codes under UE4M3 scales 2^-7 .. 2^-1 (exponents 1 .. 7)
        fill_bytes(row, l.row_bytes, st);
        for (int64_t b = 0; b < s.cols / 64; ++b)
          for (int k = 0; k < 4; ++k) row[b * l.block_bytes + k] = static_cast<uint8_t>(8 + splitmix(st) % 56);
        break;
      case WType::Q4_K:  // random codes and 6-bit sub-scales/mins under random f16 d, dmin
      case WType::Q5_K:
      case WType::Q2_K:  // (4-bit ones, d and dmin at 80)
        fill_bytes(row, l.row_bytes, st);
        for (int64_t b = 0; b < s.cols / 256; ++b) {
          uint8_t* blk = row + b * l.block_bytes + (s.type == WType::Q2_K ? kQ2kD : 0);
          put16(blk, rand_scale_f16(st));
          put16(blk + 2, rand_scale_f16(st));
        }
        break;
      case WType::IQ4_XS:  // random codes and 6-bit sub-scales under a random f16 d
      case WType::IQ4_XSH:  // the same, and random grid shifts
      case WType::IQ3_S:   // random indices, signs and 4-bit sub-scales under a random f16 d
      case WType::IQ3_XXS:  // the same
      case WType::IQ2_XXS:
      case WType::IQ2_XS:
      case WType::IQ2_S:
      case WType::IQ1_S:
      case WType::Q6_K:    // random codes and int8 sub-scales under a random f16 d (at 208)
      case WType::Q3_K:    // random codes and 6-bit sub-scales under a random f16 d (at 108)
        fill_bytes(row, l.row_bytes, st);
        for (int64_t b = 0; b < s.cols / 256; ++b)
          put16(row + b * l.block_bytes + (s.type == WType::Q6_K ? kQ6kD : s.type == WType::Q3_K ? kQ3kD : 0),
                rand_scale_f16(st));
        break;
      case WType::IQ1_M:  // random codes and sub-scales, a random f16 d in the scale words' top nibbles
        fill_bytes(row, l.row_bytes, st);
        for (int64_t b = 0; b < s.cols / 256; ++b) {
          uint8_t* sc = row + b * l.block_bytes + kIq1mScales;
          const uint16_t d = rand_scale_f16(st);
          for (int k = 0; k < 4; ++k)
            put16(sc + 2 * k, static_cast<uint16_t>((load_u16(sc + 2 * k) & 0x0FFF) | ((d >> (4 * k)) & 0xF) << 12));
        }
        break;
      case WType::Int4w: {
        fill_bytes(row, l.row_bytes, st);
        const size_t sb = l.scale_bytes;
        uint8_t* sp = w + l.scales_off + r * l.groups * sb;
        uint8_t* mp = w + l.mins_off + r * l.groups * sb;
        for (int64_t g = 0; g < l.groups; ++g) {
          if (s.scale_f32) put32f(sp + g * 4, 1e-3f + 9e-3f * rand_unit(st));
          else put16(sp + g * 2, rand_scale_f16(st));
          if (!s.symmetric) {
            if (s.scale_f32) put32f(mp + g * 4, -1e-2f * rand_unit(st));
            else put16(mp + g * 2, static_cast<uint16_t>(0x8000 | rand_scale_f16(st)));
          }
        }
        break;
      }
    }
  }
}

}  // namespace

void fill_random_weights(const WeightSpec& s, uint8_t* w, uint64_t seed) {
  fill_rows(s, weight_layout(s), w, 0, s.rows, seed);
}

GemvBench bench_gemv(const WeightSpec& s, Act act, int threads, int batch, size_t min_bytes, int iters, Isa isa,
                     Layout layout) {
  const bool rows8 = layout == Layout::Rows8;
  if (threads < 1) throw std::invalid_argument("threads must be >= 1, got " + std::to_string(threads));
  if (iters < 1) throw std::invalid_argument("iters must be >= 1, got " + std::to_string(iters));
  const int most = max_batch(layout != Layout::Stored);
  if (batch < 1 || batch > most)
    throw std::invalid_argument("batch must be 1.." + std::to_string(most) + ", got " + std::to_string(batch));
  const WeightLayout l = weight_layout(s);
  const size_t nbytes = l.nbytes;
  // The copies are filled (touched) before timing: bounded so that a large
  // min_bytes is an error, not the OOM killer.
  if (min_bytes > (size_t(1) << 36)) throw std::invalid_argument("min_bytes above 64 GiB");
  const int copies = static_cast<int>(std::max<size_t>(1, min_bytes / nbytes + 1));
  std::vector<AlignedArray<uint8_t>> bufs;
  for (int i = 0; i < copies; ++i) bufs.emplace_back(nbytes, /*zero=*/false);
  // First touch with the kernel's own row split.
  ThreadPool pool(threads);
  pool.each([&](int t) {
    int64_t r0, r1;
    thread_rows(s.rows, 4, t, pool.size(), &r0, &r1);
    for (int i = 0; i < copies; ++i) fill_rows(s, l, bufs[i].data(), r0, r1, 1234 + i);
  });
  std::vector<Rows8> packed(static_cast<size_t>(copies));
  if (layout != Layout::Stored && !gemv_uses_rows8(s, act, isa))
    throw std::invalid_argument("the rows8 and packing layouts are read by act=int8 GEMVs of " +
                                wtype_names(true, true, "and") + " matrices on an ISA with its kernel");
  if (rows8) {
    // The copies replace the stored ones (packed by the threads that read them), so the
    // stored bytes are not resident twice.
    for (int i = 0; i < copies; ++i) {
      packed[static_cast<size_t>(i)] = pack_rows8(s, bufs[static_cast<size_t>(i)].data(), pool);
      bufs[static_cast<size_t>(i)] = AlignedArray<uint8_t>();
    }
  }
  std::vector<float> x(static_cast<size_t>(batch * s.cols)), y(static_cast<size_t>(batch * s.rows));
  uint64_t st = 42;
  for (float& v : x) v = 2.f * rand_unit(st) - 1.f;

  PreparedAct xa;
  GemvScratch scratch;
  auto run = [&](size_t c) {
    if (layout == Layout::Packing)
      gemv_packing(s, bufs[c].data(), xa, nullptr, y.data(), pool, isa, scratch);
    else
      gemv(s, bufs[c].data(), xa, nullptr, y.data(), act, pool, isa, scratch, rows8 ? &packed[c] : nullptr);
  };
  for (int i = 0; i < copies; ++i) {
    xa.set(x.data(), batch, s.cols);
    run(static_cast<size_t>(i));
  }
  std::vector<double> ms;
  for (int it = 0; it < iters; ++it) {
    const size_t c = static_cast<size_t>((it + 1) % copies);  // warm-up ended on copy copies-1
    const auto t0 = std::chrono::steady_clock::now();
    xa.set(x.data(), batch, s.cols);  // a new activation each call: its preparation is timed
    run(c);
    const auto t1 = std::chrono::steady_clock::now();
    ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  GemvBench r;
  r.iters = iters;
  r.copies = copies;
  r.weight_bytes = nbytes;
  r.times_ms = ms;
  for (double v : ms) r.ms_mean += v / iters;
  std::sort(ms.begin(), ms.end());
  r.ms_median = ms[ms.size() / 2];
  r.ms_min = ms.front();
  for (float v : y) r.checksum += v;
  return r;
}

}  // namespace ie
