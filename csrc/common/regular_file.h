// Opening an input that must be a regular file, without blocking on one
// that is not.
//
// open(2) of a FIFO for reading blocks until a writer appears, so checking
// S_ISREG after a plain open comes too late (`ierun verify bsr` on a FIFO
// hung there). The file is opened O_NONBLOCK, checked with fstat, and only
// then switched back to blocking reads.
#pragma once

#include <sys/stat.h>

#include <string>

namespace ie {

// A descriptor (O_RDONLY, O_CLOEXEC) of the regular file at `path`, its
// fstat in `*st` (the size the caller checks), or -1 with `*why` saying what
// it is instead ("not a regular file (a FIFO)") or why it could not be
// opened (strerror).
int open_regular_file(const std::string& path, struct stat* st, std::string* why);

}  // namespace ie
