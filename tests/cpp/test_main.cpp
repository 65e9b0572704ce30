// Runs every registered case; exit 0 only when all pass. An optional
// argument runs only the cases whose name contains it.
#include <cstdio>
#include <cstring>
#include <exception>

#include "test.h"

namespace iet {

std::vector<Case>& registry() {
  static std::vector<Case> cases;
  return cases;
}

static int g_failures = 0;

void record_failure(const char* file, int line, const std::string& what) {
  if (++g_failures <= 50) std::fprintf(stderr, "%s:%d: FAILED %s\n", file, line, what.c_str());
}

}  // namespace iet

int main(int argc, char** argv) {
  int ran = 0, failed = 0;
  for (const iet::Case& c : iet::registry()) {
    if (argc > 1 && std::strstr(c.name, argv[1]) == nullptr) continue;
    const int before = iet::g_failures;
    try {
      c.fn();
    } catch (const std::exception& e) {
      iet::record_failure(c.name, 0, std::string("uncaught exception: ") + e.what());
    }
    ++ran;
    const bool ok = iet::g_failures == before;
    failed += ok ? 0 : 1;
    std::printf("%-48s %s\n", c.name, ok ? "ok" : "FAILED");
  }
  std::printf("%d passed, %d failed\n", ran - failed, failed);
  return failed == 0 && ran > 0 ? 0 : 1;
}
