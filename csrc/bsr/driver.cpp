// BSR GEMV driver: x padded to whole blocks, block rows split over threads
// by work, the variant chosen from the ISA table.
#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "common/thread_pool.h"
#include "bsr.h"

namespace ie {

const IsaTable<BsrOps> kBsrTable = {{&kBsrScalar,
#if IE_HAVE_X86
                                     &kBsrAvx2,
#else
                                     nullptr,
#endif
                                     nullptr, nullptr}};

Isa bsr_kernel_isa(Isa isa) { return kBsrTable.pick(isa); }

namespace {

// First block row of thread t's share when the work of a block row is its
// blocks + 1 (so runs of empty rows are shared too): f(i) = row_ptr[i] + i.
uint64_t split_point(const BsrMatrix& m, int t, int nt) {
  const uint64_t nbr = m.n_block_rows;
  if (t <= 0) return 0;
  if (t >= nt) return nbr;
  const uint64_t total = m.nnzb + nbr;
  const uint64_t target = total * static_cast<uint64_t>(t) / static_cast<uint64_t>(nt);
  uint64_t lo = 0, hi = nbr;  // smallest i in [0, nbr] with f(i) >= target
  while (lo < hi) {
    const uint64_t mid = lo + (hi - lo) / 2;
    if (uint64_t(m.row_ptr[mid]) + mid < target) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

}  // namespace

void bsr_gemv(const BsrMatrix& m, const float* x, int batch, const float* bias, float* y, int threads, Isa isa) {
  if (batch < 1 || batch > kBsrMaxBatch)
    throw std::invalid_argument("batch must be 1.." + std::to_string(kBsrMaxBatch) + ", got " + std::to_string(batch));
  if (threads < 1) throw std::invalid_argument("threads must be >= 1, got " + std::to_string(threads));
  if (m.n_block_rows == 0) return;
  // x zero-extended to whole blocks (16-float aligned stride), so no kernel clips
  // columns: at most block_cols - 1 floats more than x (see bsr_width).
  const size_t padded = static_cast<size_t>(m.n_block_cols - 1) * m.block_cols + bsr_width(m);
  const size_t xstride = (padded + 15) / 16 * 16;
  AlignedArray<float> xpad(xstride * batch);
  for (int b = 0; b < batch; ++b) std::memcpy(xpad.data() + b * xstride, x + b * m.cols, 4 * m.cols);
  const auto rows = kBsrTable.ops(isa).rows;
  const int nt_max = static_cast<int>(std::min<uint64_t>(threads, m.n_block_rows));
  // Per thread: acc then lanes, each starting on a cache line.
  const size_t acc_n = static_cast<size_t>(batch) * bsr_acc_rows(m);
  const size_t acc_stride = (acc_n + 15) / 16 * 16;
  const size_t scratch = acc_stride * 9;
  AlignedArray<float> acc(scratch * nt_max);
  ThreadPool pool(nt_max);
  pool.each([&](int t) {
    const int nt = pool.size();
    BsrRowsArgs a;
    a.m = &m;
    a.xpad = xpad.data();
    a.xstride = xstride;
    a.batch = batch;
    a.bias = bias;
    a.y = y;
    a.acc = acc.data() + scratch * t;
    a.lanes = a.acc + acc_stride;
    const uint64_t br0 = split_point(m, t, nt), br1 = split_point(m, t + 1, nt);
    if (br1 > br0) rows(a, br0, br1);
  });
}

}  // namespace ie
