#include "weight_types.h"

#include <cmath>
#include <cstring>
#include <iomanip>
#include <sstream>

#include "errors.h"

namespace ie {

std::string wtype_names(bool quantized_only, bool int8_act_only, const char* conj) {
  std::string out, last;
  for (const WTypeInfo& t : kWeightTypes) {
    if ((quantized_only && !t.quantized) || (int8_act_only && !t.int8_act)) continue;
    if (!last.empty()) out += (out.empty() ? "" : ", ") + last;
    last = t.name;
  }
  return out.empty() ? last : out + " " + conj + " " + last;
}

int wtype_act_block(WType t) { return wtype_info(t).act_block; }

const WTypeInfo* find_wtype(const std::string& name) {
  for (const WTypeInfo& t : kWeightTypes)
    if (name == t.name) return &t;
  return nullptr;
}

namespace {

// The layout without overflow checks; make_weight_spec checks its products first.
WeightLayout layout_of(const WeightSpec& s) {
  const WTypeInfo& t = wtype_info(s.type);
  WeightLayout l;
  const size_t rows = static_cast<size_t>(s.rows), cols = static_cast<size_t>(s.cols);
  l.row_bytes = cols / static_cast<size_t>(t.block_elems) * static_cast<size_t>(t.block_bytes);
  if (s.type == WType::Int4w) {
    l.groups = s.cols / s.group_size;
    l.scale_bytes = s.scale_f32 ? 4 : 2;
    l.scales_off = rows * l.row_bytes;
    l.mins_off = l.scales_off + rows * static_cast<size_t>(l.groups) * l.scale_bytes;
    l.nbytes = l.mins_off + (s.symmetric ? 0 : rows * static_cast<size_t>(l.groups) * l.scale_bytes);
    return l;
  }
  if (t.quantized) {
    l.block_bytes = static_cast<size_t>(t.block_bytes);
    l.block_qs = static_cast<size_t>(t.code_offset);
  }
  l.nbytes = rows * l.row_bytes;
  return l;
}

}  // namespace

WeightSpec make_weight_spec(const std::string& dtype, int64_t rows, int64_t cols, int64_t group_size,
                            bool symmetric, const std::string& scale_dtype, double tensor_scale) {
  const WTypeInfo* t = find_wtype(dtype);
  if (t == nullptr) fail("unknown weight dtype '" + dtype + "' (expected " + wtype_names() + ")");
  if (rows < 1 || cols < 1)
    fail(dtype + ": rows and cols must be positive, got [" + std::to_string(rows) + ", " + std::to_string(cols) + "]");
  WeightSpec s;
  s.type = t->type;
  s.rows = rows;
  s.cols = cols;
  if (cols % t->block_elems != 0)
    fail(dtype + ": cols must be a multiple of " + std::to_string(t->block_elems) + ", got " + std::to_string(cols));
  if (!t->quantized) {
    if (group_size != 0) fail(dtype + ": group_size applies to int4w only, got " + std::to_string(group_size));
  } else if (s.type != WType::Int4w) {
    if (group_size != 0 && group_size != t->block_elems)
      fail(dtype + " has fixed " + std::to_string(t->block_elems) + "-element blocks; group_size must be 0 or " +
           std::to_string(t->block_elems) + ", got " + std::to_string(group_size));
    s.group_size = t->block_elems;
  } else {
    // docs/formats/quant.md names 32, 64, 128 and cols; any multiple of 32 dividing cols works.
    if (group_size <= 0) fail("int4w needs group_size (32, 64, 128 or cols)");
    if (group_size % 32 != 0) fail("int4w group_size must be a multiple of 32, got " + std::to_string(group_size));
    if (cols % group_size != 0)
      fail("int4w group_size " + std::to_string(group_size) + " does not divide cols " + std::to_string(cols));
    s.group_size = group_size;
    s.symmetric = symmetric;
    if (scale_dtype == "f16") s.scale_f32 = false;
    else if (scale_dtype == "f32") s.scale_f32 = true;
    else fail("int4w scale_dtype must be 'f16' or 'f32', got '" + scale_dtype + "'");
  }
  // Every byte count of the layout, checked: the largest is nbytes, and
  // kernels index rows * row_bytes and rows * groups * scale_bytes.
  const std::string what = dtype + " [" + std::to_string(rows) + ", " + std::to_string(cols) + "]";
  const size_t row_bytes = checked_mul(static_cast<size_t>(cols) / static_cast<size_t>(t->block_elems),
                                       static_cast<size_t>(t->block_bytes), what.c_str());
  size_t total = checked_mul(static_cast<size_t>(rows), row_bytes, what.c_str());
  if (s.type == WType::Int4w) {
    const size_t plane = checked_mul(checked_mul(static_cast<size_t>(rows), static_cast<size_t>(cols / group_size),
                                                 what.c_str()),
                                     s.scale_f32 ? 4 : 2, what.c_str());
    total = checked_add(total, checked_mul(plane, s.symmetric ? 1 : 2, what.c_str()), what.c_str());
  }
  if (total > static_cast<size_t>(INT64_MAX)) fail(what + ": size overflows");
  const float ts = static_cast<float>(tensor_scale);
  std::ostringstream got;
  got << std::setprecision(17) << tensor_scale;
  if (!(std::isfinite(tensor_scale) && tensor_scale > 0 && static_cast<double>(ts) == tensor_scale && ts > 0))
    fail(dtype + ": tensor_scale must be a positive finite float32 value, got " + got.str());
  if (ts != 1.f && s.type != WType::NVFP4) fail(dtype + ": tensor_scale applies to nvfp4 only, got " + got.str());
  s.scale = ts;
  return s;
}

WeightLayout weight_layout(const WeightSpec& s) { return layout_of(s); }

}  // namespace ie
