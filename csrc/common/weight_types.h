// The weight types: the one C++ table of what a matrix can be stored as
// (docs/formats/quant.md). Every kernel, binding, benchmark and message
// reads its facts here; formats/weight_table.py is the Python twin, and
// tests/test_weight_types_parity.py holds the two to each other.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/hd.h"

namespace ie {

enum class WType : uint8_t { F32, F16, BF16, Int4w, Q4_0, Q4_1, Q8_0, Q4_K, IQ4_NL, IQ4_XS, Q5_K, Q6_K, Q5_0, Q5_1, MXFP4, Q3_K, Q2_K, IQ3_S, IQ4_XSH, IQ3_XXS, IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S, IQ1_M, NVFP4, Q1_0 };

struct WTypeInfo {
  WType type;
  const char* name;  // the IEBIN dtype
  int block_elems;   // elements per block (1 for plain floats)
  int block_bytes;   // bytes per block in the row; int4w: the packed codes only (scales are planes)
  int code_offset;   // offset of the codes inside a block (after its scale/min)
  bool quantized;
  bool gemv;         // GEMV kernels (scalar + SIMD) exist
  bool int8_act;     // an int8-activation GEMV path exists (act=int8)
  // act=int8: elements per activation scale (0: no such path). 256 for the
  // types whose kernels sum a super-block's sub-blocks as integers under one
  // activation scale (llama.cpp's q8_K): their float work then comes once
  // per super-block, not per 32 (docs/formats/quant.md, "Int8 activations").
  int act_block;
};

inline constexpr WTypeInfo kWeightTypes[] = {
    {WType::F32, "f32", 1, 4, 0, false, true, false, 0},
    {WType::F16, "f16", 1, 2, 0, false, true, false, 0},
    {WType::BF16, "bf16", 1, 2, 0, false, true, false, 0},
    {WType::Int4w, "int4w", 32, 16, 0, true, true, true, 32},
    {WType::Q4_0, "q4_0", 32, 18, 2, true, true, true, 32},
    {WType::Q4_1, "q4_1", 32, 20, 4, true, true, true, 32},
    {WType::Q8_0, "q8_0", 32, 34, 2, true, true, true, 32},
    {WType::Q4_K, "q4_k", 256, 144, 16, true, true, true, 256},
    {WType::IQ4_NL, "iq4_nl", 32, 18, 2, true, true, true, 32},
    {WType::IQ4_XS, "iq4_xs", 256, 136, 8, true, true, true, 256},
    {WType::Q5_K, "q5_k", 256, 176, 48, true, true, true, 256},  // codes: qh (fifth bits) at 16, nibbles at 48
    {WType::Q6_K, "q6_k", 256, 210, 0, true, true, true, 256},   // codes first; int8 scales at 192, d at 208
    {WType::Q5_0, "q5_0", 32, 22, 2, true, true, true, 32},     // codes: fifth bits (u32), then nibbles at 6
    {WType::Q5_1, "q5_1", 32, 24, 4, true, true, true, 32},     // codes: fifth bits (u32), then nibbles at 8
    {WType::MXFP4, "mxfp4", 32, 17, 1, true, true, true, 32},   // E8M0 scale byte, then e2m1 nibbles
    {WType::Q3_K, "q3_k", 256, 110, 0, true, true, true, 256},   // codes first (high bits, low pairs at 32); scales at 96, d at 108
    {WType::Q2_K, "q2_k", 256, 84, 16, true, true, true, 256},   // 16 scale/min bytes, codes at 16, d at 80, dmin at 82
    {WType::IQ3_S, "iq3_s", 256, 110, 2, true, true, true, 256},  // d; index low bytes at 2, high bits at 66; signs at 74, scales at 106
    {WType::IQ4_XSH, "iq4_xsh", 256, 137, 8, true, true, true, 256},  // iq4_xs's 136 bytes, then the grid shift bits at 136
    {WType::IQ3_XXS, "iq3_xxs", 256, 98, 2, true, true, true, 256},   // d; indices at 2; sign/scale words at 66
    {WType::IQ2_XXS, "iq2_xxs", 256, 66, 2, true, true, true, 256},   // d; per sub-block 4 indices, then its sign/scale word
    {WType::IQ2_XS, "iq2_xs", 256, 74, 2, true, true, true, 256},     // d; 32 u16 (index, signs) at 2; 16 scales at 66
    {WType::IQ2_S, "iq2_s", 256, 82, 2, true, true, true, 256},       // d; index low bytes at 2, signs at 34, high bits at 66, scales at 74
    {WType::IQ1_S, "iq1_s", 256, 50, 2, true, true, true, 256},       // d; index low bytes at 2; per 32-block a u16 (high bits, scale, shift) at 34
    {WType::IQ1_M, "iq1_m", 256, 56, 0, true, true, true, 256},       // index low bytes; high bits and shifts at 32; scales and d at 48
    {WType::NVFP4, "nvfp4", 64, 36, 4, true, true, true, 32},        // 4 UE4M3 scales (one per 16), then e2m1 nibbles
    {WType::Q1_0, "q1_0", 128, 18, 2, true, true, true, 32},         // d; 128 sign bits (element 8k + j: bit j of byte k)
};
inline constexpr int kNumWeightTypes = sizeof(kWeightTypes) / sizeof(kWeightTypes[0]);

// The table row of `t` (the enum is the row index, checked at compile time).
constexpr const WTypeInfo& wtype_info(WType t) { return kWeightTypes[static_cast<int>(t)]; }
constexpr bool table_in_enum_order() {
  for (int i = 0; i < kNumWeightTypes; ++i)
    if (static_cast<int>(kWeightTypes[i].type) != i) return false;
  return true;
}
static_assert(table_in_enum_order(), "kWeightTypes must list the types in WType order");

// The two ternary codebook types (iq1_s, iq1_m), and the types of signed
// codebook values under a scale per 16 weights, which share the
// sixteen-sub-block kernels and q6_k's rows8 header: iq2_xs, iq2_s and those.
IE_HD constexpr bool iq1_values(WType t) { return t == WType::IQ1_S || t == WType::IQ1_M; }
IE_HD constexpr bool half_scaled_book(WType t) { return t == WType::IQ2_XS || t == WType::IQ2_S || iq1_values(t); }

// wtype_info(t).act_block, out of line: for the ISA objects, where reading
// the table at run time would emit it as a symbol of theirs
// (tests/cpp/check_isa_symbols.py).
int wtype_act_block(WType t);

// The table row named `name` (the IEBIN dtype), or null.
const WTypeInfo* find_wtype(const std::string& name);

// "f32, f16, ... or q8_0" ("and" with conj = "and") of the rows matching a filter, for messages.
std::string wtype_names(bool quantized_only = false, bool int8_act_only = false, const char* conj = "or");

// A stored matrix: type, [rows, cols] and the int4w parameters.
struct WeightSpec {
  WType type = WType::F32;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t group_size = 0;  // int4w: elements per scale (multiple of 32 dividing cols); blocks: block_elems; floats: 0
  bool symmetric = true;   // int4w only
  bool scale_f32 = false;  // int4w only: scales (and mins) stored as f32 instead of f16
  // nvfp4 only: the matrix is its blocks' values times this (NVFP4's second-level, per-tensor f32 scale;
  // llama.cpp's `.scale` tensor beside the weight), which decode_span and the GEMVs apply; 1 for every other type.
  float scale = 1.f;
};

// Parses and validates a weight description, including that every byte
// count of the stored matrix fits in size_t and int64. Throws
// std::invalid_argument with a one-line message naming the parameter.
// tensor_scale: WeightSpec::scale, finite, positive, a float32 value; other than 1 for nvfp4 only.
WeightSpec make_weight_spec(const std::string& dtype, int64_t rows, int64_t cols, int64_t group_size,
                            bool symmetric, const std::string& scale_dtype, double tensor_scale = 1.0);

// Byte geometry of a stored weight matrix (docs/formats/quant.md).
struct WeightLayout {
  size_t row_bytes = 0;    // one row; int4w: one row of the qs plane
  size_t block_bytes = 0;  // per-block formats (all quantized types but int4w): bytes per block, else 0
  size_t block_qs = 0;     // offset of the codes inside a block
  int64_t groups = 0;      // int4w: groups per row (G)
  size_t scale_bytes = 0;  // int4w: 2 (f16) or 4 (f32)
  size_t scales_off = 0;   // int4w: offset of the scales plane
  size_t mins_off = 0;     // int4w affine: offset of the mins plane
  size_t nbytes = 0;
};

// For a spec from make_weight_spec (whose sizes are known not to overflow).
WeightLayout weight_layout(const WeightSpec& s);
inline size_t weight_nbytes(const WeightSpec& s) { return weight_layout(s).nbytes; }

}  // namespace ie
