// Dedup reconstruction on a CUDA device (docs/formats/dedup.md, docs/cuda.md):
// a member's default, line mask and exceptions uploaded as they are in the
// blobs, rebuilt on the device bit for bit as dedup::reconstruct does.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/buffer.h"
#include "dedup/dedup.h"

namespace ie::cuda {

struct DeviceMember {
  DeviceBuffer def, words, lines, exc, prefix;  // prefix: (w, k) u64 pairs at each 64 KiB chunk
  size_t nbytes = 0, nwords = 0, exc_count = 0, chunks = 0;
};

// Copies a validated member's regions (its store's prefix table included).
DeviceMember upload_member(const dedup::MemberView& v);

// out (device, m.nbytes bytes) = the member. Synchronizes `stream`; throws
// std::invalid_argument when the mask asks for more words or exceptions
// than the member has (never on a validated member).
void reconstruct(const DeviceMember& m, uint8_t* out, cudaStream_t stream);

}  // namespace ie::cuda
