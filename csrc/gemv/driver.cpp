// GEMV driver: the ISA table, argument checks, the prepared-activation
// cache, and the bit-exact dequantizers (scalar; this file is built with
// -ffp-contract=off like the whole target, so a * b + c is never fused).
#include <algorithm>
#include <cstring>

#include "common/errors.h"
#include "common/half.h"
#include "gemv.h"
#include "kernels.h"

namespace ie {

const IsaTable<GemvOps> kGemvTable = {{&kGemvScalar,
#if IE_HAVE_X86
                                       &kGemvAvx2, &kGemvAvxVnni, &kGemvAvx512, &kGemvAmx
#else
                                       nullptr, nullptr, nullptr, nullptr
#endif
                                       }};

Isa gemv_kernel_isa(Isa isa) { return kGemvTable.pick(isa); }

Act parse_act(const std::string& act) {
  if (act == "f32" || act.empty()) return Act::F32;
  if (act == "int8") return Act::Int8;
  fail("act must be 'f32' or 'int8', got '" + act + "'");
}

const char* act_name(Act act) { return act == Act::Int8 ? "int8" : "f32"; }

void PreparedAct::set(const float* x, int batch, int64_t cols) {
  if (batch < 1 || batch > kMaxRows8Batch)
    fail("batch must be 1.." + std::to_string(kMaxRows8Batch) + ", got " + std::to_string(batch));
  if (cols < 1) fail("activation length must be positive, got " + std::to_string(cols));
  x_ = x;
  batch_ = batch;
  cols_ = cols;
  for (Form& f : forms_) f.ready = false;
}

static_assert(kPrepKinds == 7, "PreparedAct::forms_ holds one slot per Prep kind");

// The form `kind` of x for `isa`'s kernels, built on first use.
const uint8_t* prepared_form(PreparedAct& x, int kind, Isa isa, ThreadPool& pool) {
  if (kind == static_cast<int>(Prep::None)) return nullptr;
  PreparedAct::Form& f = x.forms_[kind];
  if (!f.ready || f.isa != isa) {
    const GemvOps& ops = kGemvTable.ops(isa);
    f.bytes.resize(ops.prep_bytes(static_cast<Prep>(kind), x.batch(), x.cols()));
    ops.prepare(static_cast<Prep>(kind), x.x(), x.batch(), x.cols(), f.bytes.data(), pool);
    f.ready = true;
    f.isa = isa;
  }
  return f.bytes.data();
}

namespace {
void decode_row(const WeightSpec& s, const WeightLayout& lay, const uint8_t* w, int64_t r, float* out) {
  for (int64_t c0 = 0; c0 < s.cols; c0 += 32)
    decode_span(s, lay, w, r, c0, static_cast<int>(std::min<int64_t>(32, s.cols - c0)), out + c0);
}
}  // namespace

void dequantize(const WeightSpec& s, const uint8_t* w, float* out) {
  const WeightLayout lay = weight_layout(s);
  for (int64_t r = 0; r < s.rows; ++r) decode_row(s, lay, w, r, out + r * s.cols);
}

void dequantize_row(const WeightSpec& s, const uint8_t* w, int64_t r, float* out) {
  if (r < 0 || r >= s.rows) fail("dequantize_row: row " + std::to_string(r) + " of " + std::to_string(s.rows));
  decode_row(s, weight_layout(s), w, r, out);
}

void quantize_act_q8(const float* x, int64_t n, int8_t* q, float* d, Isa isa, int block) {
  if (block != 32 && block != 256) fail("int8 activation quantization: block must be 32 or 256, got " + std::to_string(block));
  if (n % block != 0)
    fail("int8 activation quantization needs a multiple of " + std::to_string(block) + " elements, got " + std::to_string(n));
  kGemvTable.ops(isa).quantize_q8(x, n, q, d, block);
}

bool gemv_uses_rows8(const WeightSpec& s, Act act, Isa isa) {
  return act == Act::Int8 && rows8_applies(s) && kGemvTable.ops(isa).gemv_rows8 != nullptr;
}

bool gemv_rows8(const Rows8Job* jobs, int n, PreparedAct& x, ThreadPool& pool, Isa isa, GemvScratch* scratch) {
  const GemvOps& ops = kGemvTable.ops(isa);
  if (!ops.gemv_rows8) return false;
  if (n < 1 || n > kMaxRows8Jobs) fail("gemv_rows8: 1.." + std::to_string(kMaxRows8Jobs) + " jobs, got " + std::to_string(n));
  if (x.batch() < 1 || x.batch() > kMaxRows8Batch) fail("gemv_rows8: batch must be 1.." + std::to_string(kMaxRows8Batch));
  size_t pack = 0;  // per thread: two tiles of the largest stored job's matrix (and up)
  for (int i = 0; i < n; ++i) {
    const Rows8Job& j = jobs[i];
    // The message's prefix, made only on a failure (this runs for every product of a decode step).
    auto job = [i] { return "gemv_rows8: job " + std::to_string(i); };
    if (!j.w || j.w->empty() || !j.y) fail(job() + " has no matrix or output");
    if (j.w->spec.cols != x.cols() || (j.up && (j.up->empty() || j.up->spec.cols != x.cols())))
      fail(job() + ": the activation has " + std::to_string(x.cols()) + " columns");
    if (j.up && j.up->spec.rows != j.w->spec.rows) fail("gemv_rows8: gate and up differ in rows");
    // A matrix is a copy (bytes) or a shape over stored bytes, not both or
    // neither; a fused up is read as its gate is.
    auto copy_or_stored = [](const Rows8& m, const uint8_t* stored) { return (stored != nullptr) != (m.bytes.size() != 0); };
    if (!copy_or_stored(*j.w, j.stored))
      fail(job() + (j.stored ? ": w has a copy and stored bytes" : ": w has neither a copy nor stored bytes"));
    if (j.up ? !copy_or_stored(*j.up, j.stored_up) || (j.stored_up != nullptr) != (j.stored != nullptr) : j.stored_up != nullptr)
      fail(job() + ": up must be a copy, or stored bytes, as w is");
    if (j.stored)
      pack = std::max(pack, j.up ? checked_add(packed_up_offset(j), checked_mul(2, j.up->tile_bytes, "rows8 pack"), "rows8 pack")
                                 : checked_mul(2, j.w->tile_bytes, "rows8 pack"));
  }
  pack = (pack + 63) / 64 * 64;
  GemvScratch own;
  GemvScratch& s = scratch ? *scratch : own;
  if (pack) s.bytes.resize(checked_mul(pack, static_cast<size_t>(pool.size()), "rows8 pack"), /*zero=*/false);
  bool reads[2] = {false, false};  // the per-32 form, the per-256 one
  for (int i = 0; i < n; ++i)
    for (const Rows8* m : {jobs[i].w, jobs[i].up})
      if (m) reads[m->act_block == 256] = true;
  const Isa kisa = kGemvTable.pick(isa);
  Rows8Prep prep;
  if (reads[0]) prep.blocks = prepared_form(x, static_cast<int>(Prep::Q8Blocks), kisa, pool);
  if (reads[1]) prep.super = prepared_form(x, static_cast<int>(Prep::Q8Super), kisa, pool);
  ops.gemv_rows8(jobs, n, prep, x.batch(), pool, pack ? s.bytes.data() : nullptr, pack);
  return true;
}

namespace {

void check_gemv(const WeightSpec& s, const PreparedAct& x, Act act) {
  if (x.cols() != s.cols)
    fail("activation has " + std::to_string(x.cols()) + " columns, the matrix " + std::to_string(s.cols));
  if (act == Act::Int8 && !wtype_info(s.type).int8_act)
    fail(std::string("act='int8' applies to ") + wtype_names(false, true, "and") + " weights, not " + wtype_info(s.type).name);
}

// The checked call's kernel run: the activation's form prepared here, before
// the kernel's parallel region (PreparedAct is not thread-safe).
void run_gemv(const WeightSpec& s, const uint8_t* w, const RowSource* src, PreparedAct& x, const float* bias,
              float* y, Act act, ThreadPool& pool, Isa isa, GemvScratch& scratch) {
  if (x.batch() > kMaxBatch)
    fail("batch must be 1.." + std::to_string(kMaxBatch) + " outside the rows8 kernels, got " + std::to_string(x.batch()));
  const GemvOps& ops = kGemvTable.ops(isa);
  GemvArgs a;
  a.spec = s;
  a.lay = weight_layout(s);
  a.w = w;
  a.src = src;
  a.x = x.x();
  a.batch = x.batch();
  a.bias = bias;
  a.y = y;
  a.act = act;
  a.pool = &pool;
  a.prep = prepared_form(x, static_cast<int>(ops.prep_kind(s.type, act)), kGemvTable.pick(isa), pool);
  scratch.bytes.resize(ops.scratch_bytes(a));
  a.scratch = scratch.bytes.data();
  ops.gemv(a);
}

}  // namespace

void gemv(const WeightSpec& s, const uint8_t* w, PreparedAct& x, const float* bias, float* y, Act act, ThreadPool& pool,
          Isa isa, GemvScratch& scratch, const Rows8* rows8) {
  check_gemv(s, x, act);
  if (rows8 && act == Act::Int8) {
    if (rows8->stored.type != s.type || rows8->stored.rows != s.rows || rows8->stored.cols != s.cols)
      fail("gemv: the rows8 copy is of another matrix");
    Rows8Job job;
    job.w = rows8;
    job.bias = bias;
    job.y = y;
    if (gemv_rows8(&job, 1, x, pool, isa)) return;
  }
  run_gemv(s, w, nullptr, x, bias, y, act, pool, isa, scratch);
}

void gemv(const WeightSpec& s, const RowSource& src, PreparedAct& x, const float* bias, float* y, Act act,
          ThreadPool& pool, Isa isa, GemvScratch& scratch) {
  if (src.rows == nullptr) fail("gemv: the row source has no rows function");
  check_gemv(s, x, act);
  run_gemv(s, nullptr, &src, x, bias, y, act, pool, isa, scratch);
}

void gemv(const WeightSpec& s, const uint8_t* w, const float* x, int batch, const float* bias, float* y, Act act,
          int threads, Isa isa, const Rows8* rows8) {
  PreparedAct xa;
  xa.set(x, batch, s.cols);
  GemvScratch scratch;
  ThreadPool pool(threads);
  gemv(s, w, xa, bias, y, act, pool, isa, scratch, rows8);
}

bool gemv_packing(const WeightSpec& s, const uint8_t* w, PreparedAct& x, const float* bias, float* y,
                  ThreadPool& pool, Isa isa, GemvScratch& scratch) {
  check_gemv(s, x, Act::Int8);
  if (!gemv_uses_rows8(s, Act::Int8, isa)) return false;
  if (w == nullptr) fail("gemv_packing: no weights");
  const Rows8 shape = rows8_shape(s);
  Rows8Job job;
  job.w = &shape;
  job.stored = w;
  job.bias = bias;
  job.y = y;
  return gemv_rows8(&job, 1, x, pool, isa, &scratch);
}

bool gemv_packing_swiglu(const WeightSpec& gs, const uint8_t* g, const WeightSpec& us, const uint8_t* u,
                         PreparedAct& x, float* y, ThreadPool& pool, Isa isa, GemvScratch& scratch) {
  check_gemv(gs, x, Act::Int8);
  check_gemv(us, x, Act::Int8);
  if (!gemv_uses_rows8(gs, Act::Int8, isa) || !gemv_uses_rows8(us, Act::Int8, isa)) return false;
  if (g == nullptr || u == nullptr) fail("gemv_packing_swiglu: no weights");
  const Rows8 gate = rows8_shape(gs), up = rows8_shape(us);
  Rows8Job job;
  job.w = &gate;
  job.up = &up;
  job.stored = g;
  job.stored_up = u;
  job.y = y;
  return gemv_rows8(&job, 1, x, pool, isa, &scratch);
}

Layout parse_layout(const std::string& layout, const WeightSpec& s, Act act, Isa isa) {
  if (layout == "stored") return Layout::Stored;
  if (layout != "rows8" && layout != "packing")
    fail("layout must be 'stored', 'rows8' or 'packing', got '" + layout + "'");
  if (!gemv_uses_rows8(s, act, isa)) {
    std::string types;
    for (const WTypeInfo& t : kWeightTypes) {
      WeightSpec probe;
      probe.type = t.type;
      if (rows8_applies(probe)) types += (types.empty() ? "" : ", ") + std::string(t.name);
    }
    fail("layout '" + layout + "' is read by act='int8' GEMVs of " + types +
         " matrices on an ISA with its kernel (avx2), not " + wtype_info(s.type).name + " with act='" +
         act_name(act) + "' on " + isa_name(kGemvTable.pick(isa)));
  }
  return layout == "rows8" ? Layout::Rows8 : Layout::Packing;
}

}  // namespace ie
