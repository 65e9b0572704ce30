// Matrix-vector products y = W x (+ bias) with the weights kept in their
// stored format (common/weight_types.h, docs/formats/quant.md) and
// dequantized inside the dot product; plus the bit-exact dequantizers.
//
// W is [rows, cols]; x is [batch, cols] float32 with 1 <= batch <= 8 (each
// weight row is read once for all batch rows); y is [batch, rows] float32.
// Accumulation is float32. Rows are shared by a ThreadPool's threads
// (common/thread_pool.h), each starting on a contiguous range.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/aligned.h"
#include "common/isa.h"
#include "common/thread_pool.h"
#include "common/weight_types.h"
#include "rows8.h"

namespace ie {

// act=F32: x is used as given (the precise default).
// act=Int8: x is first quantized per 32-element block to int8 with one float
// scale (d = max|x| / 127, q = round_half_away(x * (1/d))), then the products
// are integer dot products (weight types with int8_act only).
enum class Act { F32, Int8 };
Act parse_act(const std::string& act);
const char* act_name(Act act);

constexpr int kMaxBatch = 8;
// Activation rows one gemv_rows8 call takes (a PreparedAct holds up to
// this many): a decoder's int8 prefill chunk, 64 tokens for a dense model
// and 512 for one with experts (decoder.cpp, kDenseRows8Chunk). Its kernels
// pass four to sixteen rows at a time over a tile that stays in L1, so a
// chunk reads each weight tile from memory once, and the threads meet an
// eighth as often as with chunks of kMaxBatch (SmolLM2 int4w pp512, 8 ->
// 32: +7-10% on 1 and 2 threads; q4_0, 32 -> 64: +4-5% on 2 threads, 128
// no further). The stored-layout kernels take kMaxBatch rows at most.
constexpr int kMaxRows8Batch = 512;
// The activation rows one GEMV call may take: rows8's, or the stored layout's.
constexpr int max_batch(bool rows8) { return rows8 ? kMaxRows8Batch : kMaxBatch; }

// An activation x [batch, cols] as every GEMV that reads it needs it: the
// int8 quantization and the SIMD lane orders are built by the first matrix
// that needs each form and reused by the next ones (q/k/v, gate/up), like
// ggml's vec_dot_type. The storage is kept across set() calls, so a decoder
// step allocates nothing once warm. Not thread-safe; the caller keeps x
// alive and unchanged until the next set().
class PreparedAct {
 public:
  void set(const float* x, int batch, int64_t cols);
  const float* x() const { return x_; }
  int batch() const { return batch_; }
  int64_t cols() const { return cols_; }

 private:
  friend const uint8_t* prepared_form(PreparedAct& x, int kind, Isa isa, ThreadPool& pool);
  struct Form {
    AlignedArray<uint8_t> bytes;
    bool ready = false;
    Isa isa = Isa::Scalar;
  };
  const float* x_ = nullptr;
  int batch_ = 0;
  int64_t cols_ = 0;
  Form forms_[7];
};

// Per-call kernel scratch, owned by the caller and reused across calls.
struct GemvScratch {
  AlignedArray<uint8_t> bytes;
};

// y[b * rows + r] = sum_c W[r][c] * x[b * cols + c] (+ bias[r]).
// `w` must hold weight_nbytes(s) bytes (any alignment). Throws
// std::invalid_argument for act/dtype combinations that do not exist.
// `rows8`, when given, is pack_rows8(s, w): act=int8 calls read it instead
// of w where `isa` has a kernel for it (gemv_uses_rows8).
void gemv(const WeightSpec& s, const uint8_t* w, PreparedAct& x, const float* bias, float* y, Act act, ThreadPool& pool,
          Isa isa, GemvScratch& scratch, const Rows8* rows8 = nullptr);

// A matrix that never exists whole in memory (a dedup member: default +
// mask + exceptions): the kernel asks it for each step's rows and multiplies
// them where they were built, in the thread's L1, so rebuilding costs one
// extra pass over a few KiB that are already in cache instead of a second
// trip to DRAM. rows(ctx, t, r0, n) returns rows [r0, r0 + n) (n <=
// kMaxStepRows) laid out as an n-row matrix of the same spec
// (weight_layout), valid until thread t's next call, or null when the
// source is malformed (the caller records why, and the kernel skips the
// rows). A thread asks for its rows in increasing order.
constexpr int kMaxStepRows = 4;
struct RowSource {
  const uint8_t* (*rows)(void* ctx, int thread, int64_t r0, int n) = nullptr;
  void* ctx = nullptr;
};

// gemv() over a RowSource: the same kernel on the same bytes, so the same y
// bit for bit. act=int8 uses the stored layout (there is no rows8 copy).
void gemv(const WeightSpec& s, const RowSource& src, PreparedAct& x, const float* bias, float* y, Act act,
          ThreadPool& pool, Isa isa, GemvScratch& scratch);

// Whether a rows8 copy of a matrix of type `s` would be read by gemv calls
// with `act` on `isa` (what a decoder packs at load).
bool gemv_uses_rows8(const WeightSpec& s, Act act, Isa isa);

// One matrix of a gemv_rows8 call: y = W x (+ bias), or with `up` the fused
// SwiGLU y = SiLU(W x) * (up x) (no bias), as a Llama MLP's gate and up
// (with `gelu`, Gemma's GELU(W x) * (up x)).
// With `stored`, w is a rows8_shape() of those stored bytes (and up, with
// `stored_up`, of its own), and each thread packs the one or two tiles it
// multiplies next into a buffer of its own just before (pack_rows8_tiles):
// the copy never exists whole. Why: a mixture's experts are read in place
// (a decoder copies no expert), and in a prefill chunk each gets a few
// tokens; packing per chunk costs a pass over the expert's bytes, which the
// stored-layout kernels make anyway, and buys the rows8 kernels (VNNI, AMX).
struct Rows8Job {
  const Rows8* w = nullptr;
  const Rows8* up = nullptr;
  const float* bias = nullptr;
  float* y = nullptr;
  const uint8_t* stored = nullptr;
  const uint8_t* stored_up = nullptr;
  bool gelu = false;  // with `up`: GELU (tanh's approximation) of w's rows times up's, not SiLU
};
constexpr int kMaxRows8Jobs = 4;

// The decoder's act=int8 products of up to kMaxRows8Jobs matrices reading
// the same x [batch <= kMaxRows8Batch, cols] (q/k/v; gate/up) in one
// parallel region; y is [batch, rows] per job. Returns false, having done
// nothing, where `isa` has no rows8 kernel: the caller then runs gemv() per
// matrix. `scratch` holds the threads' packed tiles of jobs over stored
// bytes (reused across calls; one for this call where null).
bool gemv_rows8(const Rows8Job* jobs, int n, PreparedAct& x, ThreadPool& pool, Isa isa,
                GemvScratch* scratch = nullptr);
// The same for a one-off x (prepares it, and makes scratch and a pool of `threads` for this call).
void gemv(const WeightSpec& s, const uint8_t* w, const float* x, int batch, const float* bias, float* y, Act act,
          int threads, Isa isa, const Rows8* rows8 = nullptr);

// y = W x (+ bias), act=int8, by the rows8 kernels over w as stored, each
// thread packing the tiles it multiplies next (Rows8Job::stored): what a
// decoder runs for a mixture's experts, which it reads in place, over the
// tokens a prefill chunk routes to them. The same y bit for bit as gemv()
// with pack_rows8(s, w). False, having done nothing, where
// gemv_uses_rows8(s, Act::Int8, isa) does not hold.
bool gemv_packing(const WeightSpec& s, const uint8_t* w, PreparedAct& x, const float* bias, float* y,
                  ThreadPool& pool, Isa isa, GemvScratch& scratch);
// y = SiLU(G x) * (U x) the same way, G and U as stored (a mixture's
// expert gate and up): one parallel region whose threads pack both
// matrices' tiles side by side and apply the unit to the tiles' sums in
// registers, as a dense MLP's fused gate and up do (Rows8Job::up), instead
// of two products and a pass over their outputs. False, having done
// nothing, where either matrix has no rows8 kernel on isa.
bool gemv_packing_swiglu(const WeightSpec& gs, const uint8_t* g, const WeightSpec& us, const uint8_t* u,
                         PreparedAct& x, float* y, ThreadPool& pool, Isa isa, GemvScratch& scratch);

// Where a stored job's up tiles start in a thread's pack buffer: after
// w's two, on a cache line.
inline size_t packed_up_offset(const Rows8Job& j) { return (2 * j.w->tile_bytes + 63) / 64 * 64; }

// How a GEMV call reads its matrix: as stored, from a rows8 copy made
// beforehand, or packing tiles as it goes (gemv_packing).
enum class Layout { Stored, Rows8, Packing };

// "stored", "rows8" or "packing" (the last two where gemv_uses_rows8
// holds); anything else, or rows8 where it would not be read, is a
// one-line error.
Layout parse_layout(const std::string& layout, const WeightSpec& s, Act act, Isa isa);

// out[r * cols + c] = W[r][c] exactly as docs/formats/quant.md defines it
// (float32 arithmetic, no fused multiply-add).
void dequantize(const WeightSpec& s, const uint8_t* w, float* out);
// Row r of it alone into out[cols] (an embedding lookup); r in [0, rows).
void dequantize_row(const WeightSpec& s, const uint8_t* w, int64_t r, float* out);

// The act=int8 activation quantizer, one scale per `block` elements (32 or
// 256, a type's act_block; n a multiple of it): q[n], d[n / 32] (each
// 32-block's, repeated within a block of 256).
void quantize_act_q8(const float* x, int64_t n, int8_t* q, float* d, Isa isa, int block = 32);

// The GEMV variant that runs for a resolved `isa` (what benchmarks report).
Isa gemv_kernel_isa(Isa isa);

// Fills a matrix with random finite values of its type (scales in a sane
// range), deterministically from `seed`.
void fill_random_weights(const WeightSpec& s, uint8_t* w, uint64_t seed);

struct GemvBench {
  double ms_median = 0, ms_min = 0, ms_mean = 0;
  size_t weight_bytes = 0;
  int copies = 0;
  int iters = 0;
  double checksum = 0;  // sum of the last y (keeps the work observable)
  std::vector<double> times_ms;  // every timed call, in order
};

// Times `iters` GEMVs over `copies` random weight matrices whose total size
// exceeds `min_bytes`, rotating through them so every call streams its
// weights from DRAM. Weights are first-touched by the same thread layout.
// Each call re-prepares x (a new activation, as in a decoder step).
// Layout::Rows8: time the decoder's layout (pack_rows8 copies; act=int8, an
// ISA with the kernel); Layout::Packing: gemv_packing over the stored
// copies, its packing timed. Both report the stored matrix's bytes.
GemvBench bench_gemv(const WeightSpec& s, Act act, int threads, int batch, size_t min_bytes, int iters,
                     Isa isa, Layout layout = Layout::Stored);

}  // namespace ie
