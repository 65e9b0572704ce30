// One line instead of a crash when a mapped model file shrinks under the
// runtime.
//
// ierun maps model.ie.bin (and dedup blobs) and reads them in place; a file
// truncated while it is mapped turns the next read of a page past the new
// end into SIGBUS (BUS_ADRERR), which killed the process with no word about
// why. `report_sigbus_as(line)` installs a handler that writes `line` to
// stderr and exits 1 for that fault; any other SIGBUS keeps its default
// action (a core dump that names a real bug). A signal handler can only
// reach static storage, so the line lives in one of two fixed buffers and is
// published with an atomic index: a handler never reads a half-written line.
#pragma once

#include <string>

namespace ie {

// Installs the handler (once per process) and makes `line` (truncated to
// 1023 bytes, a newline added) what it prints. Thread-safe.
void report_sigbus_as(const std::string& line);

}  // namespace ie
