#include "common/sigbus_report.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>

namespace ie {

namespace {

constexpr size_t kLineBytes = 1024;

// The process-wide state a signal handler needs (see the header): written
// only under `writer`, read by the handler through `current`.
struct SigbusLines {
  char line[2][kLineBytes] = {};
  size_t length[2] = {};
  std::atomic<int> current{-1};  // which buffer is published; -1: none yet
  std::mutex writer;
  bool installed = false;
};

SigbusLines& lines() {
  static SigbusLines state;
  return state;
}

void on_sigbus(int sig, siginfo_t* info, void*) {
  SigbusLines& s = lines();
  const int k = s.current.load(std::memory_order_acquire);
  if (info != nullptr && info->si_code == BUS_ADRERR && k >= 0) {
    ssize_t ignored = ::write(2, s.line[k], s.length[k]);
    (void)ignored;
    ::_exit(1);
  }
  ::signal(sig, SIG_DFL);  // not a file that shrank: the default action, on return the fault repeats
}

}  // namespace

void report_sigbus_as(const std::string& text) {
  SigbusLines& s = lines();
  std::lock_guard<std::mutex> lock(s.writer);
  const int k = s.current.load(std::memory_order_relaxed) == 0 ? 1 : 0;
  const size_t n = std::min(text.size(), kLineBytes - 2);
  std::memcpy(s.line[k], text.data(), n);
  s.line[k][n] = '\n';
  s.length[k] = n + 1;
  s.current.store(k, std::memory_order_release);
  if (!s.installed) {
    struct sigaction sa {};
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGBUS, &sa, nullptr);
    s.installed = true;
  }
}

}  // namespace ie
