// The fused dedup GEMV (dedup_gemv.h): the stored-format GEMV over a
// RowSource that rebuilds each step's rows into a per-thread buffer.
#include "fused_product.h"

#include <algorithm>
#include <atomic>
#include <string>

#include "common/errors.h"
#include "gemm/gemm.h"

namespace ie {

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
  m.planes.push_back({0, lay.row_bytes});
  if (s.type == WType::Int4w) {  // scales and mins: planes after the codes
    const size_t per_row = static_cast<size_t>(lay.groups) * lay.scale_bytes;
    m.planes.push_back({lay.scales_off, per_row});
    if (!s.symmetric) m.planes.push_back({lay.mins_off, per_row});
  }
  return m;
}

namespace {

struct RowCtx {
  const DedupMatrix* m;
  DedupGemvScratch* s;
  Isa isa;
  std::atomic<bool> bad{false};
};

// The next step's default bytes [a, a + nb) and the mask words after the
// cursor into L2 (T1), as the plain kernels prefetch their next rows: with
// the hardware prefetchers alone the default's stream waits on DRAM while a
// step is multiplied (a gate_proj member took 1.4x the plain GEMV's time
// without, 1.04x with).
void prefetch_next(const dedup::MemberView& v, const dedup::Cursor& c, size_t a, size_t nb) {
  const size_t b = std::min(v.nbytes, a + nb);
  for (size_t o = a; o < b; o += 64) __builtin_prefetch(v.def + o, 0, 2);
  const size_t w = std::min<size_t>(c.w, v.mask.nwords);
  __builtin_prefetch(v.mask.words + 8 * w, 0, 2);
  __builtin_prefetch(v.mask.words + 8 * w + 64, 0, 2);
}

// RowSource::rows: rows [r0, r0 + n) of the member, plane by plane, into
// thread t's buffer. The cursors carry over from the thread's previous step;
// a thread's first step finds them from the chunk prefix table.
const uint8_t* member_rows(void* ctx, int t, int64_t r0, int n) {
  RowCtx& c = *static_cast<RowCtx*>(ctx);
  DedupGemvScratch::Thread& st = c.s->threads[static_cast<size_t>(t)];
  const dedup::MemberView& v = c.m->src;
  uint8_t* out = st.buf.data();
  for (size_t i = 0; i < c.m->planes.size(); ++i) {
    const size_t a = c.m->planes[i].off + static_cast<size_t>(r0) * c.m->planes[i].per_row;
    const size_t nb = static_cast<size_t>(n) * c.m->planes[i].per_row;
    if (st.next_row != r0) st.c[i] = dedup::cursor_at(v, a);
    if (!dedup::reconstruct_range(v, st.c[i], a, a + nb, out, c.isa)) {
      c.bad.store(true, std::memory_order_relaxed);
      st.next_row = -1;
      return nullptr;
    }
    out += nb;
    prefetch_next(v, st.c[i], a + nb, nb);
  }
  st.next_row = r0 + n;
  return st.buf.data();
}

// Runs `product` with a RowSource over the member (thread buffers sized
// and cursors reset first), then reports a malformed store.
template <class F>
void with_source(const DedupMatrix& m, int threads, Isa isa, DedupGemvScratch& scratch, F product) {
  size_t step_bytes = 0;
  for (const DedupMatrix::Plane& p : m.planes) step_bytes += kMaxStepRows * p.per_row;
  scratch.threads.resize(static_cast<size_t>(threads));
  for (DedupGemvScratch::Thread& st : scratch.threads) {
    if (st.buf.size() < step_bytes) st.buf.resize(step_bytes, false);
    st.next_row = -1;
  }
  RowCtx ctx{&m, &scratch, isa};
  RowSource src;
  src.rows = member_rows;
  src.ctx = &ctx;
  product(src);
  if (ctx.bad.load()) fail("dedup GEMV: mask bits and exceptions disagree (malformed store)");
}

}  // namespace

void gemv_dedup(const DedupMatrix& m, PreparedAct& x, const float* bias, float* y, Act act, ThreadPool& pool, Isa isa,
                DedupGemvScratch& scratch) {
  with_source(m, pool.size(), isa, scratch,
              [&](const RowSource& src) { gemv(m.spec, src, x, bias, y, act, pool, isa, scratch.gemv); });
}

void gemm_dedup(const DedupMatrix& m, const float* x, int n, const float* bias, float* y, ThreadPool& pool, Isa isa,
                DedupGemvScratch& scratch, GemmScratch& gemm_scratch) {
  with_source(m, pool.size(), isa, scratch,
              [&](const RowSource& src) { gemm(m.spec, src, x, n, bias, y, pool, isa, gemm_scratch); });
}

}  // namespace ie
