// GEMV: every SIMD variant against the scalar reference, over every weight
// type, both activation precisions, batches 1..8 and shapes with tails;
// prepared activations reused across matrices give the same bits as fresh
// ones; the int8 activation quantizers agree bit for bit.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "common/isa.h"
#include "common/weight_types.h"
#include "gemv/gemv.h"
#include "test.h"

namespace {

using ie::Act;
using ie::Isa;
using ie::WeightSpec;

std::vector<float> random_x(size_t n, uint64_t seed) {
  std::vector<float> x(n);
  for (float& v : x) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    v = static_cast<float>(static_cast<int64_t>(seed >> 40) - (1 << 23)) * 0x1p-23f;
  }
  return x;
}

struct Shape {
  int64_t rows, cols, group;  // group: int4w group size (0 = whole row)
  bool symmetric;
  const char* scale;
};

std::vector<WeightSpec> specs() {
  const Shape shapes[] = {{1, 32, 32, true, "f16"},    {7, 96, 32, false, "f16"},  {13, 160, 0, true, "f32"},
                          {64, 256, 64, true, "f16"},  {33, 384, 128, false, "f32"}, {5, 192, 96, true, "f16"},
                          {17, 64, 0, false, "f16"},   {9, 1056, 32, true, "f16"},  {3, 512, 0, true, "f16"},
                          {6, 768, 256, false, "f32"}};
  std::vector<WeightSpec> out;
  for (const ie::WTypeInfo& t : ie::kWeightTypes) {
    for (const Shape& s : shapes) {
      if (s.cols % t.block_elems != 0) continue;  // q4_k: whole 256-element super-blocks
      const int64_t g = t.type == ie::WType::Int4w ? (s.group ? s.group : s.cols) : 0;
      out.push_back(ie::make_weight_spec(t.name, s.rows, s.cols, g, s.symmetric, s.scale));
    }
    if (!t.quantized) out.push_back(ie::make_weight_spec(t.name, 11, 37, 0, true, "f16"));  // odd float tails
  }
  return out;
}

std::string label(const WeightSpec& s, Act act, int batch, Isa isa) {
  return std::string(ie::wtype_info(s.type).name) + " [" + std::to_string(s.rows) + "x" + std::to_string(s.cols) +
         "] g" + std::to_string(s.group_size) + (s.symmetric ? " sym" : " aff") + (s.scale_f32 ? " f32s" : " f16s") +
         " act=" + ie::act_name(act) + " batch=" + std::to_string(batch) + " isa=" + ie::isa_name(isa);
}

// |y - ref| within float32 summation noise of sum |w x| (dequantized w).
void expect_close(const std::vector<float>& y, const std::vector<float>& ref, const std::vector<float>& mag,
                  const std::string& what) {
  for (size_t i = 0; i < y.size(); ++i) {
    const double tol = 2e-5 * mag[i] + 1e-30;
    if (!(std::fabs(double(y[i]) - ref[i]) <= tol)) {
      CHECK(false) << what << " element " << i << ": " << y[i] << " vs scalar " << ref[i] << " (tol " << tol << ")";
      return;
    }
  }
}

}  // namespace

TEST(gemv_simd_matches_scalar) {
  for (const WeightSpec& s : specs()) {
    std::vector<uint8_t> w(ie::weight_nbytes(s));
    ie::fill_random_weights(s, w.data(), 7 + s.rows);
    std::vector<float> dq(static_cast<size_t>(s.rows * s.cols));
    ie::dequantize(s, w.data(), dq.data());
    for (Act act : {Act::F32, Act::Int8}) {
      if (act == Act::Int8 && !ie::wtype_info(s.type).int8_act) continue;
      for (int batch : {1, 2, 3, 8}) {
        const std::vector<float> x = random_x(static_cast<size_t>(batch * s.cols), 99 + batch);
        const std::vector<float> bias = random_x(static_cast<size_t>(s.rows), 5);
        std::vector<float> mag(static_cast<size_t>(batch * s.rows));
        for (int b = 0; b < batch; ++b)
          for (int64_t r = 0; r < s.rows; ++r) {
            double m = std::fabs(bias[r]);
            for (int64_t c = 0; c < s.cols; ++c) m += std::fabs(dq[r * s.cols + c] * x[b * s.cols + c]);
            mag[b * s.rows + r] = static_cast<float>(m);
          }
        std::vector<float> ref(mag.size());
        ie::gemv(s, w.data(), x.data(), batch, bias.data(), ref.data(), act, 1, Isa::Scalar);
        for (Isa isa : ie::available_isas()) {
          for (int threads : {1, 3}) {
            std::vector<float> y(mag.size(), NAN);
            ie::gemv(s, w.data(), x.data(), batch, bias.data(), y.data(), act, threads, isa);
            expect_close(y, ref, mag, label(s, act, batch, isa) + " threads=" + std::to_string(threads));
          }
        }
      }
    }
  }
}

TEST(gemv_prepared_activation_reused_across_matrices) {
  // One PreparedAct and one scratch for a run of matrices of different types
  // and int4w group sizes (as a decoder step does): each result is bit-identical to a fresh call.
  const int64_t cols = 256;
  const WeightSpec mats[] = {ie::make_weight_spec("int4w", 40, cols, 64, true, "f16"),
                             ie::make_weight_spec("q4_0", 24, cols, 0, true, "f16"),
                             ie::make_weight_spec("int4w", 8, cols, 128, false, "f32"),
                             ie::make_weight_spec("q8_0", 16, cols, 0, true, "f16"),
                             ie::make_weight_spec("q4_1", 12, cols, 0, true, "f16"),
                             ie::make_weight_spec("f16", 9, cols, 0, true, "f16")};
  for (Isa isa : ie::available_isas()) {
    for (Act act : {Act::F32, Act::Int8}) {
      for (int batch : {1, 4}) {
        const std::vector<float> x = random_x(static_cast<size_t>(batch * cols), 3);
        ie::PreparedAct xa;
        ie::GemvScratch scratch;
        ie::ThreadPool pool(2);
        xa.set(x.data(), batch, cols);
        for (int round = 0; round < 2; ++round) {
          for (const WeightSpec& s : mats) {
            const Act a = ie::wtype_info(s.type).int8_act ? act : Act::F32;
            std::vector<uint8_t> w(ie::weight_nbytes(s));
            ie::fill_random_weights(s, w.data(), 11);
            std::vector<float> fresh(static_cast<size_t>(batch * s.rows)), reused(fresh.size());
            ie::gemv(s, w.data(), x.data(), batch, nullptr, fresh.data(), a, 2, isa);
            ie::gemv(s, w.data(), xa, nullptr, reused.data(), a, pool, isa, scratch);
            CHECK(std::memcmp(fresh.data(), reused.data(), fresh.size() * 4) == 0) << label(s, a, batch, isa);
          }
        }
      }
    }
  }
}

TEST(gemv_activation_quantizers_agree) {
  for (Isa isa : ie::available_isas()) {
    for (int64_t n : {32, 64, 96, 4096}) {
      std::vector<float> x = random_x(static_cast<size_t>(n), static_cast<uint64_t>(n));
      x[0] = 0.f;
      if (n >= 64)
        for (int j = 32; j < 64; ++j) x[j] = 0.f;  // an all-zero block: d = 0
      std::vector<int8_t> q0(n), q1(n);
      std::vector<float> d0(n / 32), d1(n / 32);
      ie::quantize_act_q8(x.data(), n, q0.data(), d0.data(), Isa::Scalar);
      ie::quantize_act_q8(x.data(), n, q1.data(), d1.data(), isa);
      CHECK(std::memcmp(q0.data(), q1.data(), n) == 0) << ie::isa_name(isa) << " n=" << n;
      CHECK(std::memcmp(d0.data(), d1.data(), n / 32 * 4) == 0) << ie::isa_name(isa) << " n=" << n;
    }
  }
}

TEST(gemv_activation_quantizers_agree_on_nonfinite_input) {
  // NaN and inf activations (from NaN weights upstream) are defined and the
  // same in every variant (and free of UB: the sanitizer build runs this).
  for (Isa isa : ie::available_isas()) {
    for (int pattern = 0; pattern < 5; ++pattern) {
      std::vector<float> x = random_x(64, static_cast<uint64_t>(pattern) + 1);
      if (pattern == 0) x[3] = NAN;
      if (pattern == 1) x[0] = INFINITY, x[40] = -INFINITY;
      if (pattern == 2)
        for (int j = 0; j < 32; ++j) x[j] = NAN;
      if (pattern == 3) x[31] = NAN, x[32] = INFINITY;
      if (pattern == 4)  // a subnormal scale: 1 / d overflows to inf
        for (int j = 0; j < 32; ++j) x[j] = (j % 3 - 1) * 1e-43f;
      std::vector<int8_t> q0(64), q1(64);
      std::vector<float> d0(2), d1(2);
      ie::quantize_act_q8(x.data(), 64, q0.data(), d0.data(), Isa::Scalar);
      ie::quantize_act_q8(x.data(), 64, q1.data(), d1.data(), isa);
      CHECK(std::memcmp(q0.data(), q1.data(), 64) == 0) << ie::isa_name(isa) << " pattern " << pattern;
      CHECK(std::memcmp(d0.data(), d1.data(), 8) == 0) << ie::isa_name(isa) << " pattern " << pattern;
    }
  }
}

TEST(gemv_argument_errors) {
  auto throws = [](auto fn) {
    try {
      fn();
    } catch (const std::invalid_argument&) {
      return true;
    }
    return false;
  };
  CHECK(throws([] { ie::make_weight_spec("q7_k", 1, 32, 0, true, "f16"); }));
  CHECK(throws([] { ie::make_weight_spec("q4_0", 1, 48, 0, true, "f16"); }));
  CHECK(throws([] { ie::make_weight_spec("int4w", 1, 64, 48, true, "f16"); }));
  CHECK(throws([] { ie::make_weight_spec("int4w", 1, 64, 64, true, "f8"); }));
  CHECK(throws([] { ie::make_weight_spec("f32", 0, 32, 0, true, "f16"); }));
  // Byte counts that wrap size_t or exceed int64 are refused, not truncated.
  CHECK(throws([] { ie::make_weight_spec("f32", int64_t(1) << 32, int64_t(1) << 32, 0, true, "f16"); }));
  CHECK(throws([] { ie::make_weight_spec("f32", 3, int64_t(1) << 62, 0, true, "f16"); }));
  CHECK(throws([] { ie::make_weight_spec("int4w", int64_t(1) << 40, int64_t(1) << 30, 32, false, "f32"); }));
  const WeightSpec s = ie::make_weight_spec("f32", 4, 32, 0, true, "f16");
  std::vector<uint8_t> w(ie::weight_nbytes(s));
  std::vector<float> x(32 * 9), y(4 * 9);
  CHECK(throws([&] { ie::gemv(s, w.data(), x.data(), 9, nullptr, y.data(), Act::F32, 1, Isa::Scalar); }));
  CHECK(throws([&] { ie::gemv(s, w.data(), x.data(), 1, nullptr, y.data(), Act::F32, 0, Isa::Scalar); }));
  CHECK(throws([&] { ie::gemv(s, w.data(), x.data(), 1, nullptr, y.data(), Act::Int8, 1, Isa::Scalar); }));
  ie::PreparedAct xa;
  ie::GemvScratch scratch;
  xa.set(x.data(), 1, 64);
  ie::ThreadPool pool(1);
  CHECK(throws([&] { ie::gemv(s, w.data(), xa, nullptr, y.data(), Act::F32, pool, Isa::Scalar, scratch); }));
}

TEST(gemv_packing_swiglu_is_silu_of_gate_times_up) {
  // An expert's fused gate and up (gemv_packing_swiglu) against its two
  // packing products and SiLU in double: gate and up of different types
  // (their tiles differ in size, so up's start in each thread's buffer is
  // its own), whole and partial tiles, batches that take the pairs and the
  // single tiles. Jobs whose gate and up are not read alike are refused.
  const int64_t cols = 512;
  // (q4_k beside q8_0: gate and up read the activation in different forms, one scale per 256 and per 32)
  const std::pair<const char*, const char*> types[] = {{"q4_k", "q6_k"}, {"q4_0", "mxfp4"}, {"q5_k", "q4_k"},
                                                       {"q4_k", "q8_0"}};
  for (const auto& [gt, ut] : types) {
    for (int64_t rows : {40, 13}) {
      const WeightSpec gs = ie::make_weight_spec(gt, rows, cols, 0, true, "f16");
      const WeightSpec us = ie::make_weight_spec(ut, rows, cols, 0, true, "f16");
      std::vector<uint8_t> g(ie::weight_nbytes(gs)), u(ie::weight_nbytes(us));
      ie::fill_random_weights(gs, g.data(), 21 + rows);
      ie::fill_random_weights(us, u.data(), 22 + rows);
      for (Isa isa : ie::available_isas()) {
        for (int batch : {8, 21}) {
          const std::vector<float> x = random_x(static_cast<size_t>(batch * cols), 31 + batch);
          ie::PreparedAct xa;
          ie::GemvScratch scratch;
          ie::ThreadPool pool(2);
          xa.set(x.data(), batch, cols);
          std::vector<float> yg(static_cast<size_t>(batch * rows)), yu(yg.size()), y(yg.size(), NAN);
          const std::string what = std::string(gt) + "/" + ut + " rows=" + std::to_string(rows) + " batch=" +
                                   std::to_string(batch) + " isa=" + ie::isa_name(isa);
          const bool fused = ie::gemv_packing_swiglu(gs, g.data(), us, u.data(), xa, y.data(), pool, isa, scratch);
          CHECK(fused == ie::gemv_packing(gs, g.data(), xa, nullptr, yg.data(), pool, isa, scratch)) << what;
          if (!fused) continue;  // no rows8 kernel at this level (scalar)
          CHECK(ie::gemv_packing(us, u.data(), xa, nullptr, yu.data(), pool, isa, scratch)) << what;
          for (size_t i = 0; i < y.size(); ++i) {
            const double gv = yg[i], want = gv / (1 + std::exp(-gv)) * yu[i];
            if (!(std::fabs(y[i] - want) <= 1e-5 * std::fabs(want) + 1e-30)) {
              CHECK(false) << what << " element " << i << ": " << y[i] << " vs " << want;
              break;
            }
          }
          const ie::Rows8 gate = ie::rows8_shape(gs), up = ie::rows8_shape(us);
          ie::Rows8Job job;
          job.w = &gate;
          job.up = &up;
          job.y = y.data();
          job.stored = g.data();  // up neither a copy nor stored bytes
          bool refused = false;
          try {
            ie::gemv_rows8(&job, 1, xa, pool, isa, &scratch);
          } catch (const std::invalid_argument& e) {
            refused = std::string(e.what()).find("up must be a copy, or stored bytes, as w is") != std::string::npos;
          }
          CHECK(refused) << what;
        }
      }
    }
  }
}
