// GEMV on a CUDA device: y = W x (+ bias) with W uploaded in its IEBIN
// bytes, dequantized inside the product, float32 accumulation, batch 1..8
// (docs/cuda.md). Compiled only with -DIE_ENABLE_CUDA=ON.
//
// Three kernels, one per way the bytes are laid out:
//  - planar 4-bit (int4w; q4_0 and q4_1 after the load-time repack in
//    cuda/repack.h): 16-byte code loads, one warp per row group, several
//    rows sharing each x load;
//  - plain floats (f32, f16, bf16): 16-byte loads along the row;
//  - the other block types: a warp copies 1024 elements' worth of one row
//    (whole blocks and super-blocks) into shared memory with 16-byte
//    cp.async copies, the next step's in flight, then each lane decodes
//    one 32-element span with the same device decoder as dequantize(),
//    which is bit-exact with docs/formats/quant.md;
//  - floats whose rows are not 16-byte aligned: that decoder, one span per
//    lane, read from global memory.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "common/weight_types.h"
#include "cuda/buffer.h"

namespace ie::cuda {

constexpr int kMaxBatch = 8;
constexpr size_t kReadSlack = 16;  // zero bytes after each uploaded matrix

// A weight matrix on the device. `spec` is the matrix as stored in the
// file; `kspec` what the kernels read: the same, or the planar int4w twin
// of a q4_0 / q4_1 matrix repacked at upload (cuda/repack.h).
struct DeviceMatrix {
  WeightSpec spec;
  WeightSpec kspec;
  DeviceBuffer bytes;  // weight_nbytes(kspec) bytes, then kReadSlack zero bytes
  bool repacked() const { return kspec.type != spec.type; }
};

// Copies (and repacks where that applies) weight_nbytes(s) host bytes.
DeviceMatrix upload_matrix(const WeightSpec& s, const uint8_t* host);

// x [batch, cols], bias [rows] or null, y [batch, rows]: device pointers;
// 1 <= batch <= kMaxBatch. Asynchronous on `stream`; throws
// std::invalid_argument for a bad batch or null pointers.
void gemv(const DeviceMatrix& m, const float* x, int batch, const float* bias, float* y, cudaStream_t stream);

// The benchmark's tuning knobs (0 = the default): W, the warps that split
// a row group (1, 2, 4 or 8; each warp of the planar 4-bit and blocks
// kernels takes 32 units of a staged x tile, so they cap it at the tile's
// units / 32: planar 4-bit 8 / batch, blocks 4 / batch, at least 1), and
// R, the rows of a group (planar 4-bit only: 1, 2 or 4).
struct GemvTuning {
  int split = 0;
  int rows = 0;
};
void gemv_tuned(const DeviceMatrix& m, const float* x, int batch, const float* bias, float* y, cudaStream_t stream,
                const GemvTuning& tune);

// out [rows, cols] = W exactly as docs/formats/quant.md defines it (the
// stored matrix's values, also for a repacked one). Asynchronous.
void dequantize(const DeviceMatrix& m, float* out, cudaStream_t stream);

// The kernel gemv() runs for m: "planar4", "float", "blocks" or "span".
const char* gemv_kernel_name(const DeviceMatrix& m);

}  // namespace ie::cuda
