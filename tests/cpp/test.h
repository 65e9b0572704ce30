// A minimal test harness for the native library: TEST(name) registers a
// case, CHECK(cond) << "context" records a failure and goes on. No third-
// party framework, so `make test-native` needs nothing beyond the compiler.
#pragma once
#include <functional>
#include <sstream>
#include <string>
#include <vector>

namespace iet {

struct Case {
  const char* name;
  std::function<void()> fn;
};
std::vector<Case>& registry();
void record_failure(const char* file, int line, const std::string& what);

struct Register {
  Register(const char* name, std::function<void()> fn) { registry().push_back({name, std::move(fn)}); }
};

// Collects a failure message; reports it when destroyed.
class Failure {
 public:
  Failure(const char* file, int line, const char* expr) : file_(file), line_(line) { msg_ << expr; }
  ~Failure() { record_failure(file_, line_, msg_.str()); }
  template <class T>
  Failure& operator<<(const T& v) {
    msg_ << (first_ ? ": " : "") << v;
    first_ = false;
    return *this;
  }

 private:
  const char* file_;
  int line_;
  bool first_ = true;
  std::ostringstream msg_;
};

}  // namespace iet

#define IET_CAT2(a, b) a##b
#define IET_CAT(a, b) IET_CAT2(a, b)
#define TEST(name)                                                          \
  static void name();                                                       \
  static const iet::Register IET_CAT(reg_, name)(#name, name);             \
  static void name()
#define CHECK(cond) \
  if (cond) {       \
  } else            \
    iet::Failure(__FILE__, __LINE__, #cond)
