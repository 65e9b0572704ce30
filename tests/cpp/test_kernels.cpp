// The other kernel families' SIMD variants against their scalar references:
// the streaming read and FMA yardstick, the prefill GEMM micro-kernel, the
// attention loops, Mamba2's scan step, BSR GEMV and dedup reconstruction.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "act/act.h"
#include "attention/attention.h"
#include "bsr/bsr.h"
#include "common/aligned.h"
#include "common/dispatch.h"
#include "common/half.h"
#include "common/isa.h"
#include "dedup/dedup.h"
#include "gemm/gemm.h"
#include "dedup/fused_product.h"
#include "ssm/ssm.h"
#include "stream/stream_read.h"
#include "test.h"

namespace {

using ie::Isa;

}  // namespace

// A family with an avxvnni variant and none at avx512 must not run the VEX
// form on an avx512 machine (Zen 4 has AVX-512 VNNI without AVX-VNNI).
TEST(isa_table_never_falls_from_avx512_to_avxvnni) {
  const int s = 0, a = 1, v = 2, z = 3;
  const ie::IsaTable<int> vex_only = {{&s, &a, &v, nullptr}};
  CHECK(vex_only.pick(Isa::Avx512) == Isa::Avx2);
  CHECK(vex_only.pick(Isa::AvxVnni) == Isa::AvxVnni);
  CHECK(vex_only.pick(Isa::Avx2) == Isa::Avx2);
  const ie::IsaTable<int> all = {{&s, &a, &v, &z}};
  CHECK(all.pick(Isa::Avx512) == Isa::Avx512 && all.ops(Isa::AvxVnni) == 2);
  const ie::IsaTable<int> no_vex = {{&s, &a, nullptr, &z}};
  CHECK(no_vex.pick(Isa::AvxVnni) == Isa::Avx2 && no_vex.pick(Isa::Avx512) == Isa::Avx512);
  // amx (AVX-512 and tiles) falls to avx512's variant, and never to avxvnni's past a missing avx512 one
  CHECK(all.pick(Isa::Amx) == Isa::Avx512 && vex_only.pick(Isa::Amx) == Isa::Avx2);
  const int t = 4;
  const ie::IsaTable<int> tiles = {{&s, &a, &v, &z, &t}};
  CHECK(tiles.pick(Isa::Amx) == Isa::Amx && tiles.pick(Isa::Avx512) == Isa::Avx512);
}

TEST(stream_sum_simd_matches_scalar) {
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (size_t n : {size_t(0), size_t(1), size_t(15), size_t(33), size_t(4096), size_t(100003)}) {
    std::vector<float> x(n);
    double exact = 0;
    for (float& v : x) {
      v = u(rng);
      exact += v;
    }
    for (Isa isa : ie::available_isas())
      for (int threads : {1, 2, 5}) {
        const double s = ie::stream_sum_f32(x.data(), n, threads, isa);
        CHECK(std::fabs(s - exact) <= 1e-5 * (1.0 + static_cast<double>(n)))
            << ie::isa_name(isa) << " n=" << n << " threads=" << threads << ": " << s << " vs " << exact;
      }
  }
}

TEST(fma_yardstick_simd_matches_scalar) {
  const float ref = ie::kStreamScalar.fma_chains(0.25f, 0.999f, 1e-3f, 5000);
  for (Isa isa : ie::available_isas()) {
    const float got = ie::kStreamTable.ops(isa).fma_chains(0.25f, 0.999f, 1e-3f, 5000);
    // Fused (SIMD) vs twice-rounded (scalar) multiply-adds drift apart by ~1e-5 over 5000 steps.
    CHECK(std::fabs(got - ref) <= 1e-4f * std::fabs(ref)) << ie::isa_name(isa) << ": " << got << " vs " << ref;
  }
}

TEST(gemm_tile_simd_matches_scalar) {
  std::mt19937 rng(2);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  constexpr int kOut = ie::kTileRows * ie::kPanel, kMax = ie::kMaxPanelsPerCall;
  for (int64_t cols : {int64_t(1), int64_t(7), int64_t(64), int64_t(577)}) {
    const int64_t ld = cols + 3;  // weight rows of a wider matrix, as the driver's column blocks see them
    const int64_t pstride = (cols + 1) * ie::kPanel;  // panels apart, as in the driver's panel array
    std::vector<float> wt(ie::kTileRows * ld), bound(kMax * kOut, 0.f);
    ie::AlignedArray<float> panel_buf(static_cast<size_t>(kMax * pstride));  // the kernel loads panels aligned
    float* panel = panel_buf.data();
    for (float& v : wt) v = u(rng);
    for (int64_t i = 0; i < kMax * pstride; ++i) panel[i] = u(rng);
    float ref[kMax * kOut], got[kMax * kOut], split[kMax * kOut];
    for (int q = 0; q < kMax; ++q) {
      ie::kGemmScalar.tile(wt.data(), ld, panel + q * pstride, pstride, cols, ref + q * kOut, true);
      for (int r = 0; r < ie::kTileRows; ++r)
        for (int j = 0; j < ie::kPanel; ++j)
          for (int64_t c = 0; c < cols; ++c)
            bound[q * kOut + r * ie::kPanel + j] += std::fabs(wt[r * ld + c] * panel[q * pstride + c * ie::kPanel + j]);
    }
    for (Isa isa : ie::available_isas()) {
      const ie::GemmOps& ops = ie::kGemmTable.ops(isa);
      CHECK(ops.panels >= 1 && ops.panels <= kMax) << ie::isa_name(isa) << ": panels " << ops.panels;
      const int nout = ops.panels * kOut;
      std::fill_n(got, kMax * kOut, 42.f);  // first=true must not read what is there
      ops.tile(wt.data(), ld, panel, pstride, cols, got, true);
      for (int i = 0; i < nout; ++i)
        CHECK(std::fabs(got[i] - ref[i]) <= 1e-5f * bound[i] + 1e-30f)
            << ie::isa_name(isa) << " cols=" << cols << " i=" << i << ": " << got[i] << " vs " << ref[i];
      for (int i = nout; i < kMax * kOut; ++i) CHECK(got[i] == 42.f) << ie::isa_name(isa) << ": wrote past its panels";
      // Continuing from stored accumulators is the same chain: bit-identical to one call.
      const int64_t k1 = cols / 3;
      ops.tile(wt.data(), ld, panel, pstride, k1, split, true);
      ops.tile(wt.data() + k1, ld, panel + k1 * ie::kPanel, pstride, cols - k1, split, false);
      CHECK(std::memcmp(split, got, nout * sizeof(float)) == 0) << ie::isa_name(isa) << " cols=" << cols << ": split at " << k1;
    }
  }
}

// The f16 KV cache's writes: every ISA writes the same halves as the scalar
// reference, which is IEEE's rounding to nearest even with saturation at
// +-65504 (NaN kept); every finite half survives a round trip.
TEST(attention_f16_cache_conversions) {
  std::vector<float> src;
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    const float f = ie::f16_to_f32(static_cast<uint16_t>(h));
    src.push_back(f);
    src.push_back(std::nextafter(f, 0.f));  // just below: a rounding case
  }
  for (float f : {65504.f, 65519.f, 65520.f, 1e9f, -1e9f, INFINITY, -INFINITY, 1e-30f, -1e-30f, 2.98e-8f, 2.99e-8f})
    src.push_back(f);
  std::mt19937 rng(5);
  std::normal_distribution<float> g(0.f, 4.f);
  for (int i = 0; i < 1001; ++i) src.push_back(g(rng));  // an odd count: every SIMD variant has a tail
  const int n = static_cast<int>(src.size());
  std::vector<uint16_t> ref(n);
  ie::kAttnScalar.narrow(src.data(), n, ref.data());
  for (int i = 0; i < n; ++i) {
    const float x = src[i], back = ie::f16_to_f32(ref[i]);
    if (std::isnan(x)) {
      CHECK(std::isnan(back)) << "NaN at " << i << " came back as " << back;
    } else if (std::fabs(x) >= 65504.f) {
      CHECK(back == std::copysign(65504.f, x)) << x << " saturates to " << back;
    } else {
      // Nearest: no other half is closer (ties to the even code).
      auto dist = [&](int h) {  // to the half with code h (a NaN code or one past the ends: no rival)
        const float f = ie::f16_to_f32(static_cast<uint16_t>(h & 0xffff));
        return std::isnan(f) ? INFINITY : std::fabs(f - x);
      };
      CHECK(dist(ref[i]) <= dist(ref[i] + 1) && dist(ref[i]) <= dist(ref[i] - 1)) << x << " -> " << back;
      if ((ref[i] & 0x7c00u) != 0x7c00u && static_cast<uint32_t>(i) < 0x20000u && i % 2 == 0) {
        CHECK(back == x) << "half " << i / 2 << " does not survive a round trip";
      }
    }
  }
  for (Isa isa : ie::available_isas()) {
    std::vector<uint16_t> got(n);
    ie::kAttnTable.ops(isa).narrow(src.data(), n, got.data());
    CHECK(got == ref) << ie::isa_name(isa) << ": narrow differs from the scalar reference";
  }
}

// scores_f16 and mix_f16 read an f16 cache as scores and mix read its halves
// widened to floats: the same floats, bit for bit, on every ISA.
TEST(attention_over_an_f16_cache_is_attention_over_its_halves) {
  std::mt19937 rng(4);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (int d : {7, 16, 64, 80, 131}) {
    const int n = 45, nq = 7;
    const size_t stride = static_cast<size_t>(d) + 3;
    std::vector<float> qs(static_cast<size_t>(nq) * d), p(static_cast<size_t>(nq) * n), wide(n * stride);
    std::vector<uint16_t> half(n * stride);
    for (float& v : qs) v = u(rng);
    for (float& v : p) v = std::fabs(u(rng));
    for (size_t i = 0; i < half.size(); ++i) {
      half[i] = ie::f16_to_cache(4.f * u(rng));
      wide[i] = ie::f16_to_f32(half[i]);
    }
    std::vector<const float*> q(nq), pr(nq);
    for (int r = 0; r < nq; ++r) {
      q[r] = qs.data() + static_cast<size_t>(r) * d;
      pr[r] = p.data() + static_cast<size_t>(r) * n;
    }
    for (Isa isa : ie::available_isas()) {
      const ie::AttnOps& ops = ie::kAttnTable.ops(isa);
      const std::string at = std::string(ie::isa_name(isa)) + " d=" + std::to_string(d);
      std::vector<float> want(nq * n), got(nq * n), want_o(nq * d, 0.5f), got_o(nq * d, 0.5f);
      std::vector<float*> w(nq), g(nq), wo(nq), go(nq);
      for (int r = 0; r < nq; ++r) {
        w[r] = want.data() + r * n;
        g[r] = got.data() + r * n;
        wo[r] = want_o.data() + r * d;
        go[r] = got_o.data() + r * d;
      }
      ops.scores(q.data(), nq, wide.data(), stride, n, d, 0.125f, w.data());
      ops.scores_f16(q.data(), nq, half.data(), stride, n, d, 0.125f, g.data());
      CHECK(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)) == 0) << at << ": scores_f16";
      ops.mix(pr.data(), nq, wide.data(), stride, n, d, wo.data());
      ops.mix_f16(pr.data(), nq, half.data(), stride, n, d, go.data());
      CHECK(std::memcmp(want_o.data(), got_o.data(), want_o.size() * sizeof(float)) == 0) << at << ": mix_f16";
    }
  }
}

TEST(act_simd_matches_scalar) {
  // SiLU(g) * u, SiLU alone (u null), GELU-tanh(g) * u and GELU-tanh alone (an MLP without a gate: StarCoder2's)
  // over rows of every tail length, in place and out of place,
  // g from -100 to 100 (exp's clamp, the sigmoid's two branches) and NaN: within a few ulps of the scalar reference.
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> wide(-12.f, 12.f), one(-1.f, 1.f);
  for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{15}, size_t{16}, size_t{17}, size_t{100}}) {
    std::vector<float> g(n + 1, 42.f), u(n);
    for (size_t i = 0; i < n; ++i) g[i] = i == 3 ? 100.f : i == 5 ? -100.f : wide(rng);
    for (float& v : u) v = one(rng);
    if (n > 9) g[9] = std::numeric_limits<float>::quiet_NaN();
    for (Isa isa : ie::available_isas()) {
      const ie::ActOps& ops = ie::kActTable.ops(isa);
      for (int kind = 0; kind < 4; ++kind) {
        std::vector<float> ref(n + 1, 42.f), got(n + 1, 42.f), inplace = g;
        const float* uu = kind % 2 ? nullptr : u.data();
        auto f = kind >= 2 ? &ie::ActOps::gelu_tanh_mul : &ie::ActOps::silu_mul;
        (ie::kActScalar.*f)(ref.data(), g.data(), uu, n);
        (ops.*f)(got.data(), g.data(), uu, n);
        (ops.*f)(inplace.data(), inplace.data(), uu, n);
        const std::string at = std::string(ie::isa_name(isa)) + " kind " + std::to_string(kind) + " n=" +
                               std::to_string(n);
        for (size_t i = 0; i < n; ++i) {
          if (std::isnan(ref[i])) {
            CHECK(std::isnan(got[i]) && std::isnan(inplace[i])) << at << ": NaN at " << i;
            continue;
          }
          // (the scalar GELU's 1 + tanh cancels for negative g: its error there is the reference's, |g u| ulps;
          // exp clamped below -87 leaves ~1e-38 where the reference's underflows to 0)
          const float slack = (kind >= 2 ? 2e-7f * std::fabs(g[i] * (uu ? u[i] : 1.f)) : 0.f) + 1e-30f;
          CHECK(std::fabs(got[i] - ref[i]) <= 4e-7f * std::fabs(ref[i]) + slack) << at << ": " << i << " " << got[i]
                                                                                   << " vs " << ref[i];
          CHECK(inplace[i] == got[i]) << at << ": in place differs at " << i;
        }
        CHECK(got[n] == 42.f && inplace[n] == 42.f) << at << ": wrote past n";
      }
    }
  }
}

TEST(xielu_simd_matches_scalar) {
  // Apertus's xIELU over rows of every tail length, in place: x from -100 to 100 (exp's clamp), around 0 (where
  // exp(x) - 1 would cancel and expm1 does not), between eps and 0, NaN; the Hub's parameters and a wide eps. Each
  // variant within a few ulps of the scalar reference (std::expm1), plus the rounding of beta x's sum.
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> wide(-12.f, 12.f), tiny(-1e-3f, 1e-3f);
  const ie::Xielu hub = ie::Xielu::from_raw(0.6f, -0.4f, 0.5f, -1e-6f), cut = ie::Xielu::from_raw(-0.8f, 0.9f, 0.3f, -0.5f);
  CHECK(std::fabs(hub.alpha_p - std::log1p(std::exp(0.6f))) < 1e-7f && std::fabs(hub.alpha_n - 0.5f -
        std::log1p(std::exp(-0.4f))) < 1e-7f) << "from_raw: softplus";
  for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{15}, size_t{16}, size_t{17}, size_t{100}}) {
    std::vector<float> x(n + 1, 42.f);
    for (size_t i = 0; i < n; ++i) x[i] = i == 3 ? 100.f : i == 5 ? -100.f : i == 6 ? -0.25f : i % 3 ? wide(rng) : tiny(rng);
    if (n > 9) x[9] = std::numeric_limits<float>::quiet_NaN();
    for (const ie::Xielu& p : {hub, cut}) {
      std::vector<float> ref = x;
      ie::kActScalar.xielu(ref.data(), n, p);
      for (Isa isa : ie::available_isas()) {
        std::vector<float> got = x;
        ie::kActTable.ops(isa).xielu(got.data(), n, p);
        const std::string at = std::string(ie::isa_name(isa)) + " n=" + std::to_string(n) + " eps=" + std::to_string(p.eps);
        for (size_t i = 0; i < n; ++i) {
          if (std::isnan(ref[i])) {
            CHECK(std::isnan(got[i])) << at << ": NaN at " << i;
            continue;
          }
          const float slack = 2e-7f * (std::fabs(p.beta * x[i]) + std::fabs(p.alpha_n * x[i])) + 1e-30f;
          CHECK(std::fabs(got[i] - ref[i]) <= 4e-7f * std::fabs(ref[i]) + slack) << at << ": " << i << " x=" << x[i]
                                                                                   << " " << got[i] << " vs " << ref[i];
        }
        CHECK(got[n] == 42.f) << at << ": wrote past n";
      }
    }
  }
}

TEST(ssm_step_simd_matches_scalar) {
  // Granite 4's state (N 128) and GraniteMoeHybridConfig's default (256), tails of every length, one row; each
  // variant's state and outputs within a few ulps of the scalar reference's, run for three tokens in a row (each
  // step reads the state the one before wrote).
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (int N : {1, 7, 8, 15, 16, 17, 33, 128, 256}) {
    for (int P : {1, 3, 64}) {
      std::vector<float> s0(static_cast<size_t>(P) * N), dx(P), B(N), C(N);
      for (float& v : s0) v = u(rng);
      for (Isa isa : ie::available_isas()) {
        const ie::SsmOps& ops = ie::kSsmTable.ops(isa);
        std::vector<float> ref = s0, got = s0, y_ref(P + 1, 42.f), y_got(P + 1, 42.f);
        for (int token = 0; token < 3; ++token) {
          for (float& v : dx) v = u(rng);
          for (float& v : B) v = u(rng);
          for (float& v : C) v = u(rng);
          const float decay = 0.5f + 0.4f * std::fabs(u(rng));
          ie::kSsmScalar.step(ref.data(), P, N, decay, dx.data(), B.data(), C.data(), y_ref.data());
          ops.step(got.data(), P, N, decay, dx.data(), B.data(), C.data(), y_got.data());
          const std::string at = std::string(ie::isa_name(isa)) + " N=" + std::to_string(N) + " P=" +
                                 std::to_string(P) + " token " + std::to_string(token);
          for (size_t i = 0; i < ref.size(); ++i)
            CHECK(std::fabs(got[i] - ref[i]) <= 1e-6f * (std::fabs(ref[i]) + 1.f)) << at << ": state " << i;
          for (int p = 0; p < P; ++p) {
            float bound = 0.f;
            for (int n = 0; n < N; ++n) bound += std::fabs(ref[static_cast<size_t>(p) * N + n] * C[n]);
            CHECK(std::fabs(y_got[p] - y_ref[p]) <= 2e-6f * bound + 1e-30f) << at << ": y[" << p << "]";
          }
          CHECK(y_got[P] == 42.f) << at << ": wrote past P outputs";
        }
      }
    }
  }
}

TEST(ssm_channels_simd_matches_scalar) {
  // Mamba 1's step over a run of channels: states of 16 (Mamba's, Falcon Mamba's) and tails of every length around
  // a vector's; rates and time steps as trained models have them (A = -exp(A_log) from -1 to -N, dt from softplus);
  // each variant's states and outputs within a few ulps of the scalar reference's, three tokens in a row.
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (int N : {1, 7, 8, 15, 16, 17, 33}) {
    for (int n_ch : {1, 5, 64}) {
      std::vector<float> h0(static_cast<size_t>(n_ch) * N), A(h0.size()), dt(n_ch), x(n_ch), B(N), C(N);
      for (float& v : h0) v = u(rng);
      for (size_t i = 0; i < A.size(); ++i) A[i] = -static_cast<float>(1 + i % N) * (1.f + 0.1f * u(rng));
      for (Isa isa : ie::available_isas()) {
        const ie::SsmOps& ops = ie::kSsmTable.ops(isa);
        std::vector<float> ref = h0, got = h0, y_ref(n_ch + 1, 42.f), y_got(n_ch + 1, 42.f);
        for (int token = 0; token < 3; ++token) {
          for (float& v : dt) v = std::log1p(std::exp(3.f * u(rng)));
          for (float& v : x) v = u(rng);
          for (float& v : B) v = u(rng);
          for (float& v : C) v = u(rng);
          ie::kSsmScalar.channels(ref.data(), n_ch, N, dt.data(), x.data(), A.data(), B.data(), C.data(), y_ref.data());
          ops.channels(got.data(), n_ch, N, dt.data(), x.data(), A.data(), B.data(), C.data(), y_got.data());
          const std::string at = std::string(ie::isa_name(isa)) + " N=" + std::to_string(N) + " channels=" +
                                 std::to_string(n_ch) + " token " + std::to_string(token);
          for (size_t i = 0; i < ref.size(); ++i)
            CHECK(std::fabs(got[i] - ref[i]) <= 2e-6f * (std::fabs(ref[i]) + 1.f)) << at << ": state " << i;
          for (int c = 0; c < n_ch; ++c) {
            float bound = 0.f;
            for (int k = 0; k < N; ++k) bound += std::fabs(ref[static_cast<size_t>(c) * N + k] * C[k]);
            CHECK(std::fabs(y_got[c] - y_ref[c]) <= 4e-6f * bound + 1e-30f) << at << ": y[" << c << "]";
          }
          CHECK(y_got[n_ch] == 42.f) << at << ": wrote past the channels' outputs";
        }
      }
    }
  }
}

TEST(attention_simd_matches_scalar) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (int d : {1, 7, 8, 16, 64, 80, 96, 131}) {
    for (int n : {0, 1, 7, 8, 9, 33, 47}) {
      for (int nq : {1, 2, 3, 4, 7, 13}) {
        const size_t stride = static_cast<size_t>(d) + 5;  // rows of a wider cache, as in grouped heads
        const size_t ld = static_cast<size_t>(n) + 2;      // rows of scores wider than n: the kernels stay in theirs
        std::vector<float> qs(static_cast<size_t>(nq) * d), kv(static_cast<size_t>(n) * stride + d);
        for (float& v : qs) v = u(rng);
        for (float& v : kv) v = u(rng);
        std::vector<const float*> q(nq);
        for (int r = 0; r < nq; ++r) q[r] = qs.data() + static_cast<size_t>(r) * d;
        // Row r of a buffer of nq rows of ld floats (and one more float after them).
        auto rows = [&](std::vector<float>& buf, size_t width) {
          std::vector<float*> rp(nq);
          for (int r = 0; r < nq; ++r) rp[r] = buf.data() + r * width;
          return rp;
        };
        std::vector<float> ref(nq * ld + 1, 42.f), got(nq * ld + 1, 42.f), one(ld, 42.f);
        ie::kAttnScalar.scores(q.data(), nq, kv.data(), stride, n, d, 0.125f, rows(ref, ld).data());
        // mix adds onto what o holds: both start from the same values. Row 1 of p is all
        // zeros (a query that sees none of the block): its output must not change.
        std::vector<float> p(nq * ld);
        for (float& v : p) v = std::fabs(u(rng));
        if (nq > 1) std::fill_n(p.begin() + ld, ld, 0.f);
        std::vector<float*> pr = rows(p, ld), pr_split(nq);
        for (int r = 0; r < nq; ++r) pr_split[r] = pr[r] + n / 3;
        std::vector<float> o0(static_cast<size_t>(nq) * d);
        for (float& v : o0) v = u(rng);
        // The SIMD variants differ in tile size only (attention/tiles.h): the same floats, bit for bit.
        std::vector<float> simd_scores, simd_mix;
        for (Isa isa : ie::available_isas()) {
          const ie::AttnOps& ops = ie::kAttnTable.ops(isa);
          const std::string at = std::string(ie::isa_name(isa)) + " d=" + std::to_string(d) + " n=" + std::to_string(n) +
                                  " nq=" + std::to_string(nq);
          std::fill(got.begin(), got.end(), 42.f);
          ops.scores(q.data(), nq, kv.data(), stride, n, d, 0.125f, rows(got, ld).data());
          for (int r = 0; r < nq; ++r) {
            for (size_t t = n; t < ld; ++t) CHECK(got[r * ld + t] == 42.f) << at << ": scores wrote past n in row " << r;
            // A score does not depend on the tile it was computed in.
            float* one_row = one.data();
            ops.scores(q.data() + r, 1, kv.data(), stride, n, d, 0.125f, &one_row);
            CHECK(std::memcmp(one.data(), got.data() + r * ld, n * sizeof(float)) == 0) << at << ": row " << r << " alone differs";
            for (int t = 0; t < n; ++t) {
              float bound = 0.f;
              for (int i = 0; i < d; ++i) bound += std::fabs(q[r][i] * kv[t * stride + i]);
              CHECK(std::fabs(got[r * ld + t] - ref[r * ld + t]) <= 1e-6f * bound + 1e-30f) << at << " r=" << r << " t=" << t;
            }
          }
          CHECK(got[nq * ld] == 42.f) << at << ": scores wrote past the last row";
          std::vector<float> ref_o = o0, got_o = o0, split = o0;
          ie::kAttnScalar.mix(pr.data(), nq, kv.data(), stride, n, d, rows(ref_o, d).data());
          ops.mix(pr.data(), nq, kv.data(), stride, n, d, rows(got_o, d).data());
          for (int r = 0; r < nq; ++r)
            for (int i = 0; i < d; ++i) {
              const size_t x = static_cast<size_t>(r) * d + i;
              float bound = std::fabs(o0[x]);
              for (int t = 0; t < n; ++t) bound += std::fabs(p[r * ld + t] * kv[t * stride + i]);
              CHECK(std::fabs(got_o[x] - ref_o[x]) <= 1e-6f * bound + 1e-30f) << at << " r=" << r << " i=" << i;
            }
          if (nq > 1) {
            CHECK(std::memcmp(got_o.data() + d, o0.data() + d, d * sizeof(float)) == 0) << at << ": zero p changed o";
          }
          if (isa != Isa::Scalar) {
            if (simd_scores.empty()) {
              simd_scores = got;
              simd_mix = got_o;
            }
            CHECK(std::memcmp(simd_scores.data(), got.data(), got.size() * sizeof(float)) == 0) << at << ": scores differ from the first SIMD variant's";
            CHECK(std::memcmp(simd_mix.data(), got_o.data(), got_o.size() * sizeof(float)) == 0) << at << ": mix differs from the first SIMD variant's";
          }
          // Runs of t continue one chain: two calls over a split are bit-identical to one.
          const int n1 = n / 3;
          ops.mix(pr.data(), nq, kv.data(), stride, n1, d, rows(split, d).data());
          ops.mix(pr_split.data(), nq, kv.data() + n1 * stride, stride, n - n1, d, rows(split, d).data());
          CHECK(std::memcmp(split.data(), got_o.data(), split.size() * sizeof(float)) == 0) << at << ": split at " << n1;
        }
      }
      // softmax_exp: exponentials of scores spread over [-90, 0] (past the vector exp's clamp at -87).
      // Scores in [-4, 0] for the variants' bit-for-bit check: sums of terms of one size, so that any
      // change in the order of the additions shows.
      std::vector<float> flat(n), simd_exp;  // the first SIMD variant's, then its sum
      for (float& v : flat) v = 2.f * u(rng) - 2.f;
      for (Isa isa : ie::available_isas()) {
        const ie::AttnOps& ops = ie::kAttnTable.ops(isa);
        // max: the largest at every position of the row in turn (the vector lanes, the tail).
        std::vector<float> row(n);
        for (int at = 0; at < n; ++at) {
          for (float& v : row) v = u(rng) - 2.f;
          row[at] = 0.5f;
          CHECK(ops.max(row.data(), n) == 0.5f) << ie::isa_name(isa) << " n=" << n << ": max missed position " << at;
        }
        std::vector<float> e0(n), e1(n);
        for (int t = 0; t < n; ++t) e0[t] = e1[t] = -90.f * static_cast<float>(t) / std::max(1, n - 1) + 3.f;
        const float s0 = ie::kAttnScalar.softmax_exp(e0.data(), n, 3.f), s1 = ops.softmax_exp(e1.data(), n, 3.f);
        CHECK(std::fabs(s1 - s0) <= 1e-6f * s0 + 1e-30f) << ie::isa_name(isa) << " n=" << n << ": sum " << s1 << " vs " << s0;
        for (int t = 0; t < n; ++t) CHECK(std::fabs(e1[t] - e0[t]) <= 3e-7f * e0[t] + 1e-37f) << "t=" << t << ": " << e1[t] << " vs " << e0[t];
        if (isa != Isa::Scalar) {
          std::vector<float> e2 = flat;
          e2.push_back(ops.softmax_exp(e2.data(), n, 0.f));
          if (simd_exp.empty()) simd_exp = e2;
          CHECK(std::memcmp(simd_exp.data(), e2.data(), e2.size() * sizeof(float)) == 0) << ie::isa_name(isa) << " n=" << n << ": softmax differs from the first SIMD variant's";
        }
      }
    }
  }
}

TEST(bsr_simd_matches_scalar) {
  std::mt19937 rng(2);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  struct Case {
    uint64_t rows, cols, br, bc;
    double density;
  };
  for (const Case& c : {Case{64, 64, 16, 16, 0.3}, Case{37, 53, 8, 8, 0.5}, Case{10, 13, 4, 8, 0.7},
                        Case{5, 3, 4, 4, 1.0}, Case{100, 40, 1, 16, 0.2}, Case{48, 200, 16, 24, 0.1}}) {
    const uint64_t nbr = (c.rows + c.br - 1) / c.br, nbc = (c.cols + c.bc - 1) / c.bc;
    std::vector<uint32_t> row_ptr{0}, col_idx;
    std::vector<float> values;
    for (uint64_t i = 0; i < nbr; ++i) {
      for (uint64_t j = 0; j < nbc; ++j) {
        if (std::generate_canonical<double, 32>(rng) >= c.density) continue;
        col_idx.push_back(static_cast<uint32_t>(j));
        for (uint64_t r = 0; r < c.br; ++r)
          for (uint64_t k = 0; k < c.bc; ++k) {
            const bool inside = i * c.br + r < c.rows && j * c.bc + k < c.cols;
            values.push_back(inside ? u(rng) : 0.f);  // padding must be +0.0
          }
      }
      row_ptr.push_back(static_cast<uint32_t>(col_idx.size()));
    }
    ie::BsrMatrix m;
    ie::BsrError err;
    const ie::BsrStatus st = ie::bsr_from_arrays(c.rows, c.cols, c.br, c.bc, row_ptr.data(), row_ptr.size(),
                                                 col_idx.data(), col_idx.size(), values.data(), values.size(),
                                                 false, &m, &err);
    CHECK(st == ie::BsrStatus::Ok) << err.message;
    if (st != ie::BsrStatus::Ok) continue;
    for (int batch : {1, 3, 8}) {
      std::vector<float> x(batch * c.cols), bias(c.rows), ref(batch * c.rows);
      for (float& v : x) v = u(rng);
      for (float& v : bias) v = u(rng);
      ie::bsr_gemv(m, x.data(), batch, bias.data(), ref.data(), 1, Isa::Scalar);
      for (Isa isa : ie::available_isas())
        for (int threads : {1, 2, 7}) {
          std::vector<float> y(ref.size(), NAN);
          ie::bsr_gemv(m, x.data(), batch, bias.data(), y.data(), threads, isa);
          for (size_t i = 0; i < y.size(); ++i) {
            if (!(std::fabs(y[i] - ref[i]) <= 1e-5f * (1.f + std::fabs(ref[i])))) {
              CHECK(false) << ie::isa_name(isa) << " " << c.rows << "x" << c.cols << " b" << c.br << "x" << c.bc
                           << " batch " << batch << " threads " << threads << " y[" << i << "] " << y[i] << " vs "
                           << ref[i];
              break;
            }
          }
        }
    }
  }
}

// The line mask (words, then line bits) of a byte mask over n bytes: the
// format's encoder, written out here so the kernels are tested against an
// encoding that is not their own code.
std::vector<uint8_t> line_mask_of(const std::vector<uint8_t>& bytes, size_t n) {
  namespace dd = ie::dedup;
  std::vector<uint8_t> words, lines(dd::line_bits_nbytes(n), 0);
  for (size_t l = 0; l < dd::line_count(n); ++l) {
    uint8_t w[8] = {};
    for (size_t j = 0; j < 8 && 8 * l + j < bytes.size(); ++j) w[j] = bytes[8 * l + j];
    if (std::any_of(w, w + 8, [](uint8_t b) { return b != 0; })) {
      words.insert(words.end(), w, w + 8);
      lines[l / 8] |= static_cast<uint8_t>(1u << (l % 8));
    }
  }
  words.insert(words.end(), lines.begin(), lines.end());
  return words;
}

// A member view over an n-byte default, a line mask and its exceptions,
// checked (the loader's rules) with its prefix table in `prefix`.
ie::dedup::MemberView member_view(const std::vector<uint8_t>& def, const std::vector<uint8_t>& region,
                                  const std::vector<uint8_t>& exc, std::vector<ie::dedup::Cursor>* prefix) {
  namespace dd = ie::dedup;
  dd::MemberView v;
  v.def = def.data();
  v.nbytes = def.size();
  dd::split_line_mask(region.data(), region.size(), def.size(), &v.mask);
  v.exc = exc.data();
  v.exc_count = exc.size();
  v.prefix = prefix;
  const auto bad = dd::check_line_mask(v.mask, exc.size(), prefix);
  CHECK(bad.second.empty()) << bad.first << ": " << bad.second;
  return v;
}

TEST(dedup_simd_matches_scalar) {
  namespace dd = ie::dedup;
  std::mt19937_64 rng(3);
  for (size_t n : {size_t(1), size_t(63), size_t(64), size_t(1000), size_t(dd::kChunk + 77), size_t(3 * dd::kChunk)}) {
    // 0.0025: about 9.5 of a block's 64 lines differ, so blocks fall on both
    // sides of the walk's sparse/dense threshold (8, range.h).
    for (double density : {0.0, 0.001, 0.0025, 0.01, 0.3, 1.0}) {
      std::vector<uint8_t> def(n), want(n), mask((n + 7) / 8, 0), exc;
      for (size_t i = 0; i < n; ++i) {
        def[i] = static_cast<uint8_t>(rng());
        want[i] = def[i];
        if (std::generate_canonical<double, 32>(rng) < density) {
          mask[i / 8] |= static_cast<uint8_t>(1u << (i % 8));
          want[i] = static_cast<uint8_t>(def[i] ^ (1 + rng() % 255));
          exc.push_back(want[i]);
        }
      }
      const std::vector<uint8_t> region = line_mask_of(mask, n);
      std::vector<dd::Cursor> prefix;
      const dd::MemberView v = member_view(def, region, exc, &prefix);
      for (Isa isa : ie::available_isas()) {
        for (int threads : {1, 3})
          for (int stream_stores : {0, 1}) {
            ie::AlignedArray<uint8_t> out(n);  // 64-byte aligned, as non-temporal stores need
            dd::reconstruct(v, out.data(), threads, isa, stream_stores);
            CHECK(std::memcmp(out.data(), want.data(), n) == 0)
                << ie::isa_name(isa) << " n=" << n << " density=" << density << " threads=" << threads;
          }
        // Ranges from anywhere (the fused GEMV's steps): a cursor from the
        // prefix table, then carried from range to range.
        for (size_t a : {size_t(0), size_t(1), size_t(63), size_t(65), n / 3, n - 1}) {
          if (a >= n) continue;
          dd::Cursor c = dd::cursor_at(v, a);
          std::vector<uint8_t> out(n - a);
          size_t p = a;
          for (size_t step : {size_t(7), size_t(4096), size_t(100), size_t(1) << 20}) {
            const size_t e = std::min(n, p + step);
            CHECK(dd::reconstruct_range(v, c, p, e, out.data() + (p - a), isa)) << "range " << p << ".." << e;
            p = e;
          }
          CHECK(p == n && std::memcmp(out.data(), want.data() + a, n - a) == 0)
              << ie::isa_name(isa) << " n=" << n << " density=" << density << " from " << a;
        }
      }
    }
  }
}

// The fused dedup GEMV and GEMM on a hand-made member: equal to gemv() and
// gemm() over the rebuilt bytes (f32, every ISA, 1 and 3 threads); a mask asking for more
// exceptions than the member has is an exception after the parallel
// region, never a read past the exceptions.
TEST(dedup_gemv_matches_gemv_and_refuses_short_exceptions) {
  namespace dd = ie::dedup;
  const int64_t rows = 37, cols = 64;
  ie::WeightSpec s;
  s.type = ie::WType::F32;
  s.rows = rows;
  s.cols = cols;
  const size_t n = ie::weight_nbytes(s);
  std::mt19937_64 rng(11);
  std::vector<float> dw(static_cast<size_t>(rows * cols)), ww;
  for (float& v : dw) v = std::generate_canonical<float, 24>(rng) - 0.5f;
  ww = dw;
  std::vector<uint8_t> mask((n + 7) / 8, 0), exc;
  const uint8_t* def = reinterpret_cast<const uint8_t*>(dw.data());
  uint8_t* want = reinterpret_cast<uint8_t*>(ww.data());
  for (size_t e = 0; e < dw.size(); e += 7) ww[e] = std::generate_canonical<float, 24>(rng);
  for (size_t i = 0; i < n; ++i)
    if (want[i] != def[i]) {
      mask[i / 8] |= static_cast<uint8_t>(1u << (i % 8));
      exc.push_back(want[i]);
    }
  const std::vector<uint8_t> region = line_mask_of(mask, n);
  const std::vector<uint8_t> defv(def, def + n);
  std::vector<dd::Cursor> prefix;
  const dd::MemberView v0 = member_view(defv, region, exc, &prefix);
  dd::MemberView v = v0;
  std::vector<float> x(cols), y(rows), ref(rows);
  for (float& t : x) t = std::generate_canonical<float, 24>(rng);
  for (Isa isa : ie::available_isas())
    for (int threads : {1, 3}) {
      ie::gemv(s, want, x.data(), 1, nullptr, ref.data(), ie::Act::F32, threads, isa);
      ie::PreparedAct xa;
      xa.set(x.data(), 1, cols);
      ie::DedupGemvScratch scratch;
      ie::ThreadPool pool(threads);
      ie::gemv_dedup(ie::make_dedup_matrix(s, v), xa, nullptr, y.data(), ie::Act::F32, pool, isa, scratch);
      CHECK(std::memcmp(y.data(), ref.data(), rows * sizeof(float)) == 0) << ie::isa_name(isa) << " t" << threads;
      // The prefill GEMM over the same steps, 11 activation rows.
      std::vector<float> xs(11 * cols), ys(11 * rows), refs(11 * rows);
      for (float& t : xs) t = std::generate_canonical<float, 24>(rng);
      ie::GemmScratch gs;
      ie::gemm(s, want, xs.data(), 11, nullptr, refs.data(), pool, isa, gs);
      ie::gemm_dedup(ie::make_dedup_matrix(s, v), xs.data(), 11, nullptr, ys.data(), pool, isa, scratch, gs);
      CHECK(std::memcmp(ys.data(), refs.data(), ys.size() * sizeof(float)) == 0) << "gemm " << ie::isa_name(isa);
      dd::MemberView short_v = v;
      short_v.exc_count -= 1;
      std::string err;
      try {
        ie::gemv_dedup(ie::make_dedup_matrix(s, short_v), xa, nullptr, y.data(), ie::Act::F32, pool, isa, scratch);
      } catch (const std::invalid_argument& e) {
        err = e.what();
      }
      CHECK(err.find("mask bits and exceptions disagree") != std::string::npos) << ie::isa_name(isa) << ": " << err;
    }
}
