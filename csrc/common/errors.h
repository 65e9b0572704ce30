// The native library's error convention: a bad argument or a broken rule is
// a std::invalid_argument whose message is one line naming what is wrong
// (pybind11 maps it to ValueError; the CLIs print it as the one error line).
// Loaders whose messages name a file and field build them before calling.
#pragma once
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace ie {

[[noreturn]] inline void fail(const std::string& msg) { throw std::invalid_argument(msg); }

// The project's one-line error for a broken rule of a file: "FILE: FIELD: message".
[[noreturn]] inline void fail_at(const std::string& file, const std::string& field, const std::string& msg) {
  fail(file + ": " + field + ": " + msg);
}

// a * b and a + b, or a one-line error naming `what` when the result does not
// fit: every size product computed from caller-supplied numbers goes through
// these (a wrapped byte count would make a kernel read past a buffer).
inline size_t checked_mul(size_t a, size_t b, const char* what) {
  size_t r;
  if (__builtin_mul_overflow(a, b, &r)) fail(std::string(what) + ": size overflows");
  return r;
}
inline size_t checked_add(size_t a, size_t b, const char* what) {
  size_t r;
  if (__builtin_add_overflow(a, b, &r)) fail(std::string(what) + ": size overflows");
  return r;
}

}  // namespace ie
