// Dedup reconstruction kernel (dedup.h). One CTA per 64 KiB chunk, one
// thread per 64-byte line: a block-wide scan of the line bits gives each
// line its word, a scan of the words' popcounts its first exception, both
// from the chunk's cursor in the prefix table; the thread then writes its
// line from the default and the exceptions. Every index is checked against
// what the member has, so a malformed member sets a flag, never reads past
// a buffer.
#include <cub/block/block_scan.cuh>

#include "common/errors.h"
#include "cuda/dedup.h"

namespace ie::cuda {
namespace {

constexpr int kLinesPerChunk = static_cast<int>(dedup::kChunk / dedup::kLine);  // 1024
static_assert(dedup::kChunk % dedup::kLine == 0, "chunks hold whole lines");

struct Member {
  const uint8_t* def;
  const uint64_t* words;
  const uint8_t* lines;
  const uint8_t* exc;
  const uint64_t* prefix;  // [2 * (chunks + 1)]: w, k
  size_t nbytes, nwords, exc_count;
};

__global__ void __launch_bounds__(kLinesPerChunk) reconstruct_kernel(Member m, uint8_t* out, int* bad) {
  using Scan = cub::BlockScan<uint32_t, kLinesPerChunk>;
  __shared__ typename Scan::TempStorage scan;
  const size_t chunk = blockIdx.x, line = chunk * kLinesPerChunk + threadIdx.x;
  const size_t p0 = line * dedup::kLine;
  const bool inside = p0 < m.nbytes;
  const uint32_t has = inside ? (m.lines[line / 8] >> (line % 8)) & 1u : 0u;
  uint32_t wo;
  Scan(scan).ExclusiveSum(has, wo);
  __syncthreads();  // the scan storage is reused
  const uint64_t w0 = m.prefix[2 * chunk], k0 = m.prefix[2 * chunk + 1];
  uint64_t word = 0;
  if (has) {
    if (w0 + wo < m.nwords) word = m.words[w0 + wo];
    else atomicExch(bad, 1);
  }
  uint32_t ko;
  Scan(scan).ExclusiveSum(static_cast<uint32_t>(__popcll(word)), ko);
  if (!inside) return;
  const size_t n = m.nbytes - p0 < dedup::kLine ? m.nbytes - p0 : dedup::kLine;
  uint64_t k = k0 + ko;
  if (k + __popcll(word) > m.exc_count) {
    atomicExch(bad, 1);
    return;
  }
  for (size_t j = 0; j < n; ++j) out[p0 + j] = (word >> j) & 1 ? m.exc[k++] : m.def[p0 + j];
}

}  // namespace

DeviceMember upload_member(const dedup::MemberView& v) {
  if (v.prefix == nullptr || v.prefix->size() != dedup::chunk_count(v.nbytes) + 1)
    fail("upload_member: the member's prefix table does not match its size");
  DeviceMember m;
  m.nbytes = v.nbytes;
  m.nwords = v.mask.nwords;
  m.exc_count = v.exc_count;
  m.chunks = dedup::chunk_count(v.nbytes);
  m.def = to_device(v.def, v.nbytes);
  m.words = to_device(v.mask.words, 8 * v.mask.nwords);
  m.lines = to_device(v.mask.lines, dedup::line_bits_nbytes(v.nbytes));
  m.exc = to_device(v.exc, v.exc_count);
  std::vector<uint64_t> prefix;
  prefix.reserve(2 * v.prefix->size());
  for (const dedup::Cursor& c : *v.prefix) {
    prefix.push_back(c.w);
    prefix.push_back(c.k);
  }
  m.prefix = to_device(prefix.data(), 8 * prefix.size());
  return m;
}

void reconstruct(const DeviceMember& m, uint8_t* out, cudaStream_t stream) {
  if (out == nullptr) fail("reconstruct: null device pointer");
  if (m.nbytes == 0) return;
  if (m.chunks > 0x7fffffff) fail("reconstruct: member too large for one launch");
  DeviceBuffer bad(sizeof(int));
  check(cudaMemsetAsync(bad.get(), 0, sizeof(int), stream), "cudaMemsetAsync");
  const Member k{m.def.as<uint8_t>(), m.words.as<uint64_t>(), m.lines.as<uint8_t>(), m.exc.as<uint8_t>(),
                 m.prefix.as<uint64_t>(), m.nbytes, m.nwords, m.exc_count};
  reconstruct_kernel<<<static_cast<unsigned>(m.chunks), kLinesPerChunk, 0, stream>>>(k, out, bad.as<int>());
  check_launch("dedup reconstruct kernel");
  int flag = 0;
  check(cudaMemcpyAsync(&flag, bad.get(), sizeof(int), cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync");
  check(cudaStreamSynchronize(stream), "dedup reconstruct");
  if (flag) fail("reconstruct: the mask asks for more words or exceptions than the member has");
}

}  // namespace ie::cuda
