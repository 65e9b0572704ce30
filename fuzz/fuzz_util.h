// Shared by the libFuzzer harnesses: a private scratch directory per
// process (under $TMPDIR; fuzz/run.py points that at a directory of its own
// and removes it when the target ends) for loaders that take paths, and
// a little-endian reader for the harnesses' explicit input encodings.
#pragma once
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace iefuzz {

inline const std::string& scratch_dir() {
  static const std::string dir = [] {
    const char* t = std::getenv("TMPDIR");
    std::string tmpl = std::string(t && *t ? t : "/tmp") + "/iefuzz.XXXXXX";
    if (!::mkdtemp(&tmpl[0])) std::abort();
    return tmpl;
  }();
  return dir;
}

inline std::string write_file(const std::string& name, const uint8_t* data, size_t n) {
  const std::string path = scratch_dir() + "/" + name;
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) std::abort();
  if (n && std::fwrite(data, 1, n, f) != n) std::abort();
  std::fclose(f);
  return path;
}

// Reads fixed-width little-endian fields; past the end it yields zeros and
// sets `short_input`, so every input decodes to something.
class Reader {
 public:
  Reader(const uint8_t* p, size_t n) : p_(p), n_(n) {}
  template <class T>
  T get() {
    T v{};
    if (n_ - off_ >= sizeof(T)) std::memcpy(&v, p_ + off_, sizeof(T));
    else short_input = true;
    off_ = n_ - off_ >= sizeof(T) ? off_ + sizeof(T) : n_;
    return v;
  }
  const uint8_t* rest() const { return p_ + off_; }
  size_t rest_size() const { return n_ - off_; }
  void skip(size_t k) { off_ += k < n_ - off_ ? k : n_ - off_; }
  bool short_input = false;

 private:
  const uint8_t* p_;
  size_t n_, off_ = 0;
};

}  // namespace iefuzz
