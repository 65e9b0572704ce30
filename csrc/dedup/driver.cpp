// Dedup reconstruction: the scalar reference body, the ISA table and the
// portable driver (chunk prefix table, OpenMP split).
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <stdexcept>
#include <string>

#include "dedup.h"

namespace ie::dedup {

size_t reconstruct_chunk_scalar(const uint8_t* def, const uint8_t* mask, const uint8_t* exc, size_t exc_avail,
                                uint8_t* out, size_t n, bool /*stream_stores*/) {
  // The definition, one mask byte (8 output bytes) at a time; a zero mask
  // byte is a plain copy, which is the only shortcut taken.
  size_t k = 0;
  for (size_t i = 0; i < n; i += 8) {
    const size_t len = std::min<size_t>(8, n - i);
    const unsigned m = mask[i >> 3];
    if (m == 0) {
      std::memcpy(out + i, def + i, len);
      continue;
    }
    for (size_t j = 0; j < len; ++j) {
      if (m >> j & 1u) {
        if (k == exc_avail) return kOverrun;
        out[i + j] = exc[k++];
      } else {
        out[i + j] = def[i + j];
      }
    }
  }
  return k;
}

const DedupOps kDedupScalar = {reconstruct_chunk_scalar};

const IsaTable<DedupOps> kDedupTable = {{&kDedupScalar,
#if IE_HAVE_X86
                                         &kDedupAvx2, &kDedupAvx512
#else
                                         nullptr, nullptr
#endif
}};

Isa kernel_isa(Isa isa) { return kDedupTable.pick(isa); }

uint64_t popcount_bytes(const uint8_t* p, size_t nbytes) {
  uint64_t total = 0;
  size_t i = 0;
  for (; i + 8 <= nbytes; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    total += static_cast<uint64_t>(__builtin_popcountll(w));
  }
  for (; i < nbytes; ++i) total += static_cast<uint64_t>(__builtin_popcount(p[i]));
  return total;
}

std::vector<uint64_t> chunk_prefix(const uint8_t* mask, size_t n) {
  const size_t chunks = chunk_count(n);
  std::vector<uint64_t> prefix(chunks + 1, 0);
  const size_t mbytes = mask_nbytes(n);
  for (size_t c = 0; c < chunks; ++c) {
    const size_t a = c * (kChunk / 8), b = std::min(mbytes, a + kChunk / 8);
    prefix[c + 1] = prefix[c] + popcount_bytes(mask + a, b - a);
  }
  return prefix;
}

uint64_t exceptions_before(const uint8_t* mask, const std::vector<uint64_t>& prefix, size_t a) {
  const size_t c = a / kChunk;
  uint64_t k = prefix.at(c);
  const size_t from = c * (kChunk / 8);
  k += popcount_bytes(mask + from, a / 8 - from);
  if (a % 8) k += static_cast<uint64_t>(__builtin_popcount(mask[a / 8] & ((1u << (a % 8)) - 1u)));
  return k;
}

size_t reconstruct_range(const uint8_t* def, const uint8_t* mask, const uint8_t* exc, size_t exc_count, size_t k,
                         size_t a, size_t b, uint8_t* out, Isa isa) {
  if (k > exc_count) return kOverrun;
  const size_t k0 = k;
  size_t i = a;
  for (; i < b && i % 8; ++i) {  // head: the rest of a partly used mask byte
    if (mask[i / 8] >> (i % 8) & 1u) {
      if (k == exc_count) return kOverrun;
      out[i - a] = exc[k++];
    } else {
      out[i - a] = def[i];
    }
  }
  if (i < b) {
    const size_t got = kDedupTable.ops(isa).chunk(def + i, mask + i / 8, exc + k, exc_count - k, out + (i - a), b - i,
                                                  false);
    if (got == kOverrun) return kOverrun;
    k += got;
  }
  return k - k0;
}

namespace {

// Below this, non-temporal stores cost more than they save: the output is
// likely read again soon and fits in the last-level cache.
constexpr size_t kStreamStoreMin = size_t(8) << 20;

}  // namespace

void reconstruct(const uint8_t* def, const uint8_t* mask, const uint8_t* exc, size_t exc_count,
                 const std::vector<uint64_t>& prefix, uint8_t* out, size_t n, int threads, Isa isa,
                 int stream_stores) {
  const size_t chunks = chunk_count(n);
  if (prefix.size() != chunks + 1 || prefix[0] != 0 || prefix.back() != exc_count)
    throw std::invalid_argument("dedup: chunk prefix table does not match the tensor (" +
                                std::to_string(prefix.size()) + " entries for " + std::to_string(chunks) +
                                " chunks, total " + std::to_string(prefix.empty() ? 0 : prefix.back()) +
                                " vs " + std::to_string(exc_count) + " exceptions)");
  for (size_t c = 0; c < chunks; ++c) {
    if (prefix[c + 1] < prefix[c]) throw std::invalid_argument("dedup: chunk prefix table is not monotone");
  }
  const bool aligned = (reinterpret_cast<uintptr_t>(out) & 31) == 0;
  const bool nt = aligned && (stream_stores < 0 ? n >= kStreamStoreMin : stream_stores > 0);
  const auto chunk = kDedupTable.ops(isa).chunk;
  int workers = std::max(1, std::min<int>(threads, static_cast<int>(std::min<size_t>(chunks, 1 << 20))));
  std::atomic<bool> bad{false};
#pragma omp parallel for num_threads(workers) schedule(static) if (workers > 1)
  for (long long c = 0; c < static_cast<long long>(chunks); ++c) {
    const size_t a = static_cast<size_t>(c) * kChunk, b = std::min(n, a + kChunk);
    const size_t k0 = prefix[c], k1 = prefix[c + 1];
    const size_t got = chunk(def + a, mask + a / 8, exc + k0, exc_count - k0, out + a, b - a, nt);
    if (got != k1 - k0) bad.store(true, std::memory_order_relaxed);
  }
  if (bad.load()) throw std::invalid_argument("dedup: mask bits and exceptions disagree (malformed input)");
}

}  // namespace ie::dedup
