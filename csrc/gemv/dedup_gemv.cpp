// The fused dedup GEMV (dedup_gemv.h): tiles of rows rebuilt into per-thread
// buffers and multiplied there by the stored-format GEMV.
#include "dedup_gemv.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <stdexcept>
#include <string>

#include "common/errors.h"

namespace ie {

namespace {

// A matrix's planes: (offset in the matrix, bytes per row). One for every
// type but int4w, whose scales and mins are planes after the codes.
std::vector<std::pair<size_t, size_t>> planes_of(const WeightSpec& s, const WeightLayout& lay) {
  std::vector<std::pair<size_t, size_t>> p{{0, lay.row_bytes}};
  if (s.type == WType::Int4w) {
    const size_t per_row = static_cast<size_t>(lay.groups) * lay.scale_bytes;
    p.emplace_back(lay.scales_off, per_row);
    if (!s.symmetric) p.emplace_back(lay.mins_off, per_row);
  }
  return p;
}

}  // namespace

DedupMatrix make_dedup_matrix(const WeightSpec& s, const dedup::MemberView& src) {
  const WeightLayout lay = weight_layout(s);
  if (src.nbytes != lay.nbytes)
    fail("dedup matrix: the member holds " + std::to_string(src.nbytes) + " bytes, a " + wtype_info(s.type).name +
         " [" + std::to_string(s.rows) + ", " + std::to_string(s.cols) + "] matrix " + std::to_string(lay.nbytes));
  if (src.prefix == nullptr || src.prefix->size() != dedup::chunk_count(src.nbytes) + 1)
    fail("dedup matrix: the member's chunk prefix table does not match its size");
  DedupMatrix m;
  m.spec = s;
  m.src = src;
  const auto planes = planes_of(s, lay);
  size_t row_total = 0;
  for (const auto& p : planes) row_total += p.second;
  const int64_t rows = s.rows;
  m.tile_rows = std::min<int64_t>(rows, std::max<int64_t>(8, static_cast<int64_t>(kDedupTileBytes / row_total) / 8 * 8));
  for (int64_t r0 = 0; r0 < rows; r0 += m.tile_rows) {
    const size_t r = static_cast<size_t>(std::min(m.tile_rows, rows - r0));
    std::vector<DedupMatrix::Piece> pieces;
    size_t dst = 0;
    for (const auto& [off, per_row] : planes) {
      const size_t a = off + static_cast<size_t>(r0) * per_row;
      pieces.push_back({a, r * per_row, dst, dedup::exceptions_before(src.mask, *src.prefix, a)});
      dst += r * per_row;
    }
    m.tile_nbytes = std::max(m.tile_nbytes, dst);
    m.tiles.push_back(std::move(pieces));
  }
  m.read_bytes = src.nbytes + dedup::mask_nbytes(src.nbytes) + src.exc_count;
  return m;
}

void gemv_dedup(const DedupMatrix& m, PreparedAct& x, const float* bias, float* y, Act act, int threads, Isa isa,
                DedupGemvScratch& scratch) {
  if (threads < 1) fail("threads must be >= 1, got " + std::to_string(threads));
  if (x.cols() != m.spec.cols)
    fail("activation has " + std::to_string(x.cols()) + " columns, the matrix " + std::to_string(m.spec.cols));
  const size_t tiles = m.tiles.size();
  const int workers = static_cast<int>(std::max<size_t>(1, std::min<size_t>(static_cast<size_t>(threads), tiles)));
  const int batch = x.batch();
  const int64_t rows = m.spec.rows;
  scratch.tile.resize(static_cast<size_t>(workers));
  scratch.gemv.resize(static_cast<size_t>(workers));
  scratch.y.resize(static_cast<size_t>(workers));
  for (int w = 0; w < workers; ++w) {
    scratch.tile[w].resize(m.tile_nbytes, false);
    scratch.y[w].resize(static_cast<size_t>(m.tile_rows) * static_cast<size_t>(batch), false);
  }
  const dedup::MemberView& v = m.src;
  // Returns false when the blobs disagree with the plan.
  auto run = [&](size_t t, int w) -> bool {
    uint8_t* buf = scratch.tile[w].data();
    for (const DedupMatrix::Piece& p : m.tiles[t]) {
      const size_t got = dedup::reconstruct_range(v.def, v.mask, v.exc, v.exc_count, p.k, p.src_off,
                                                  p.src_off + p.nbytes, buf + p.dst_off, isa);
      if (got == dedup::kOverrun) return false;
    }
    const int64_t r0 = static_cast<int64_t>(t) * m.tile_rows, r = std::min(m.tile_rows, rows - r0);
    WeightSpec sub = m.spec;
    sub.rows = r;
    float* yt = scratch.y[w].data();
    gemv(sub, buf, x, nullptr, yt, act, 1, isa, scratch.gemv[w]);
    for (int b = 0; b < batch; ++b)
      for (int64_t i = 0; i < r; ++i)
        y[static_cast<size_t>(b) * rows + r0 + i] = yt[static_cast<size_t>(b) * r + i] + (bias ? bias[r0 + i] : 0.f);
    return true;
  };
  // The first tile runs alone: its GEMV builds the activation's prepared
  // forms (PreparedAct is not thread-safe), which the other tiles then only
  // read; argument errors surface here, outside any parallel region.
  bool ok = run(0, 0);
  std::atomic<bool> bad{!ok};
#pragma omp parallel for num_threads(workers) schedule(static) if (workers > 1)
  for (long long t = 1; t < static_cast<long long>(tiles); ++t) {
    if (bad.load(std::memory_order_relaxed)) continue;
    try {
      if (!run(static_cast<size_t>(t), omp_get_thread_num())) bad.store(true);
    } catch (...) {
      bad.store(true);
    }
  }
  if (bad.load()) fail("dedup GEMV: mask bits and exceptions disagree (malformed store)");
}

}  // namespace ie
