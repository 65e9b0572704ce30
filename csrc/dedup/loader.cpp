// The dedup runtime loader: maps the three blobs, re-validates every number
// it was given against them (the "Loader rules" of docs/formats/dedup.md),
// and serves tensors from an LRU cache of reconstructed payloads.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>

#include "common/errors.h"
#include "common/regular_file.h"
#include "common/thread_pool.h"
#include "dedup.h"

namespace ie::dedup {

namespace {

const char* const kBlobKeys[3] = {"defaults", "masks", "exceptions"};

std::string real_path(const std::string& p) {
  char* r = ::realpath(p.c_str(), nullptr);
  if (!r) return {};
  std::string out(r);
  std::free(r);
  return out;
}

// Same rules as formats/paths.py: relative, no '..', no backslash or NUL,
// and the resolved target (symlinks followed) inside the model directory.
std::string resolve_inside(const std::string& root_real, const std::string& rel, const std::string& label,
                           const std::string& field) {
  if (rel.empty()) fail_at(label, field, "must be a non-empty relative path");
  if (rel.find('\\') != std::string::npos || rel.find('\0') != std::string::npos)
    fail_at(label, field, "'" + rel + "': backslashes and NUL are not allowed in paths");
  if (rel[0] == '/') fail_at(label, field, "'" + rel + "' is absolute; paths must be relative to the model directory");
  size_t s = 0;
  while (s <= rel.size()) {
    const size_t e = std::min(rel.find('/', s), rel.size());
    if (rel.compare(s, e - s, "..") == 0 && e - s == 2)
      fail_at(label, field, "'" + rel + "' contains '..' and would escape the model directory");
    s = e + 1;
  }
  const std::string target = real_path(root_real + "/" + rel);
  if (target.empty()) fail_at(label, field, "'" + rel + "' does not exist in " + root_real + " (" + std::strerror(errno) + ")");
  if (target != root_real && target.compare(0, root_real.size() + 1, root_real + "/") != 0)
    fail_at(label, field, "'" + rel + "' resolves outside the model directory (to " + target + ")");
  return target;
}

}  // namespace

// A read-only mapping of a whole blob file (none for an empty file).
class MappedFile {
 public:
  MappedFile(const std::string& path, const std::string& label, int64_t expected) {
    std::string why;
    struct stat st {};
    const int fd = open_regular_file(path, &st, &why);
    if (fd < 0) fail_at(path, "(file)", why);
    size_ = static_cast<size_t>(st.st_size);
    if (static_cast<int64_t>(size_) != expected) {
      ::close(fd);
      fail_at(path, "(size)", "file is " + std::to_string(size_) + " bytes but " + label + " says " +
                               std::to_string(expected) + " (truncated or replaced?)");
    }
    if (size_ > 0) {
      void* p = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0);
      if (p == MAP_FAILED) {
        ::close(fd);
        fail_at(path, "(file)", std::string("mmap failed: ") + std::strerror(errno));
      }
      data_ = static_cast<const uint8_t*>(p);
    }
    ::close(fd);  // the mapping keeps the file
  }
  ~MappedFile() {
    if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
  }
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

DedupStore::DedupStore(const StoreSpec& spec, size_t cache_bytes, int threads, bool debug, Isa isa)
    : spec_(spec), capacity_(cache_bytes), threads_(threads > 0 ? threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()))),
      debug_(debug), isa_(isa) {
  st_.capacity_bytes = capacity_;
  validate_and_index();
}

DedupStore::~DedupStore() = default;

void DedupStore::log(const char* fmt, ...) const {
  if (!debug_) return;
  std::va_list ap;
  va_start(ap, fmt);
  std::fputs("ie-dedup: ", stderr);
  std::vfprintf(stderr, fmt, ap);
  std::fputc('\n', stderr);
  va_end(ap);
}

void DedupStore::validate_and_index() {
  const StoreSpec& s = spec_;
  const std::string& L = s.index_label;
  struct stat st {};
  if (::stat(s.model_dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    fail_at(s.model_dir, "(dir)", "model directory does not exist or is not a directory");
  const std::string root = real_path(s.model_dir);

  // Rule: alignment is a power of two in [1, 2^20].
  const int64_t A = s.alignment;
  if (A < 1 || A > (int64_t(1) << 20) || (A & (A - 1)))
    fail_at(L, "alignment", "must be a power of two between 1 and 2^20, got " + std::to_string(A));

  // Rule: blob paths stay inside the model directory and name three
  // different files; sizes match the index.
  std::string paths[3];
  for (int b = 0; b < 3; ++b) {
    const std::string field = std::string("blobs.") + kBlobKeys[b];
    if (s.blob_sizes[b] < 0) fail_at(L, field + ".nbytes", "must be >= 0");
    const std::string path = resolve_inside(root, s.blob_names[b], L, field + ".name");
    for (int o = 0; o < b; ++o)
      if (paths[o] == path) fail_at(L, field + ".name", "'" + s.blob_names[b] + "' is the same file as blobs." + kBlobKeys[o]);
    paths[b] = path;
    blobs_[b] = std::make_unique<MappedFile>(path, L + " " + field + ".nbytes", s.blob_sizes[b]);
    log("mapped %s = %s (%zu bytes)", kBlobKeys[b], path.c_str(), blobs_[b]->size());
  }

  // Rule: the arrays describe the same members / groups.
  const size_t M = s.names.size(), G = s.group_nbytes.size();
  if (s.member_group.size() != M || s.mask_offset.size() != M || s.mask_nbytes.size() != M ||
      s.exc_offset.size() != M || s.exc_count.size() != M)
    fail_at(L, "groups", "member arrays have different lengths (internal: names/group/mask/exceptions)");
  if (s.group_default_offset.size() != G) fail_at(L, "groups", "group arrays have different lengths");

  // Rule: every group holds at least one byte; its default lies inside the
  // defaults blob at an aligned offset.
  std::vector<std::tuple<uint64_t, uint64_t, std::string>> spans[3];  // (start, end, field)
  auto region = [&](int b, int64_t off, int64_t len, const std::string& field) {
    if (off < 0) fail_at(L, field + ".offset", "must be >= 0, got " + std::to_string(off));
    if (len < 0) fail_at(L, field, "negative length " + std::to_string(len));
    if (off % A) fail_at(L, field + ".offset", "offset " + std::to_string(off) + " is not a multiple of alignment " + std::to_string(A));
    if (off > s.blob_sizes[b] || len > s.blob_sizes[b] - off)
      fail_at(L, field + ".offset", "bytes [" + std::to_string(off) + ", " + std::to_string(off) + "+" + std::to_string(len) +
                                     ") run past the end of " + s.blob_names[b] + " (" + std::to_string(s.blob_sizes[b]) + " bytes)");
    if (len > 0) spans[b].emplace_back(uint64_t(off), uint64_t(off) + uint64_t(len), field);
  };
  // Rule: every member names an existing group and every group has a member.
  std::vector<size_t> members_in(G, 0);
  for (size_t i = 0; i < M; ++i) {
    const int64_t g = s.member_group[i];
    if (g < 0 || static_cast<size_t>(g) >= G)
      fail_at(L, "groups", "member '" + s.names[i] + "' names group " + std::to_string(g) + " of " + std::to_string(G));
    ++members_in[g];
  }
  for (size_t g = 0; g < G; ++g)
    if (members_in[g] == 0) fail_at(L, "groups[" + std::to_string(g) + "].members", "a group needs at least one member");
  std::fill(members_in.begin(), members_in.end(), 0);
  for (size_t g = 0; g < G; ++g) {
    const std::string f = "groups[" + std::to_string(g) + "]";
    if (s.group_nbytes[g] < 1) fail_at(L, f + ".nbytes", "must be >= 1, got " + std::to_string(s.group_nbytes[g]));
    region(0, s.group_default_offset[g], s.group_nbytes[g], f + ".default");
  }
  std::vector<std::string> mfield(M);
  for (size_t i = 0; i < M; ++i) {
    const int64_t g = s.member_group[i];
    mfield[i] = "groups[" + std::to_string(g) + "].members[" + std::to_string(members_in[g]++) + "]";
    const std::string& f = mfield[i];
    // Rule: names are non-empty and unique.
    if (s.names[i].empty()) fail_at(L, f + ".name", "must be a non-empty string");
    if (!index_.emplace(s.names[i], i).second) fail_at(L, f + ".name", "duplicate member name '" + s.names[i] + "'");
    const int64_t n = s.group_nbytes[g];
    // Rule: a mask region is whole words, then the line bits.
    const int64_t lb = static_cast<int64_t>(line_bits_nbytes(static_cast<size_t>(n)));
    if (s.mask_nbytes[i] < lb || (s.mask_nbytes[i] - lb) % 8 != 0 || (s.mask_nbytes[i] - lb) / 8 > static_cast<int64_t>(line_count(static_cast<size_t>(n))))
      fail_at(L, f + ".mask.nbytes", "a " + std::to_string(n) + "-byte tensor's mask is " + std::to_string(lb) +
                                         " bytes of line bits after up to " + std::to_string(line_count(static_cast<size_t>(n))) +
                                         " 8-byte words, got " + std::to_string(s.mask_nbytes[i]));
    region(1, s.mask_offset[i], s.mask_nbytes[i], f + ".mask");
    // Rule: at most one exception per byte.
    if (s.exc_count[i] < 0 || s.exc_count[i] > n)
      fail_at(L, f + ".exceptions.count", "must be in [0, " + std::to_string(n) + "] (the group's nbytes), got " + std::to_string(s.exc_count[i]));
    region(2, s.exc_offset[i], s.exc_count[i], f + ".exceptions");
  }

  // Rule: no two regions of one blob overlap; bytes no region covers
  // (alignment padding) are zero, so no byte of a blob is unaccounted for.
  for (int b = 0; b < 3; ++b) {
    auto& sp = spans[b];
    std::sort(sp.begin(), sp.end());
    const uint8_t* base = blobs_[b]->data();
    uint64_t covered = 0;
    for (size_t j = 0; j < sp.size(); ++j) {
      const auto& [a, e, field] = sp[j];
      if (j > 0 && a < std::get<1>(sp[j - 1]))
        fail_at(L, field + ".offset", "overlaps " + std::get<2>(sp[j - 1]) + " in " + s.blob_names[b] + " (offset " +
                                       std::to_string(a) + " < end " + std::to_string(std::get<1>(sp[j - 1])) + ")");
      for (uint64_t p = covered; p < a; ++p)
        if (base[p]) fail_at(s.blob_names[b], "(padding)", "byte " + std::to_string(p) + " between regions is not zero");
      covered = e;
    }
    for (uint64_t p = covered; p < blobs_[b]->size(); ++p)
      if (base[p]) fail_at(s.blob_names[b], "(padding)", "byte " + std::to_string(p) + " after the last region is not zero");
  }

  // Rule: each mask is well formed (dedup.h, check_line_mask): its words
  // are the lines its line bits name, none zero, no bit past the tensor, and
  // their popcount is the exception count. The per-chunk cursors become the
  // prefix table that lets reconstruction start anywhere.
  prefix_.assign(M, {});
  std::vector<std::pair<std::string, std::string>> bad(M);
  ThreadPool pool(threads_);
  parallel_for(pool, static_cast<int64_t>(M), 1, [&](int64_t i0, int64_t i1, int) {
    for (size_t i = static_cast<size_t>(i0); i < static_cast<size_t>(i1); ++i) {
      LineMask m;
      split_line_mask(blobs_[1]->data() + s.mask_offset[i], static_cast<size_t>(s.mask_nbytes[i]),
                      static_cast<size_t>(s.group_nbytes[s.member_group[i]]), &m);  // sizes checked above
      bad[i] = check_line_mask(m, static_cast<uint64_t>(s.exc_count[i]), &prefix_[i]);
    }
  });
  for (size_t i = 0; i < M; ++i)
    if (!bad[i].second.empty()) fail_at(L, mfield[i] + "." + bad[i].first, "member '" + s.names[i] + "': " + bad[i].second);
  log("validated %zu groups, %zu members (alignment %lld, kernel %s, %d threads, cache %zu bytes)", G, M,
      static_cast<long long>(A), isa_name(isa_), threads_, capacity_);
}

size_t DedupStore::nbytes(const std::string& name) const {
  const auto it = index_.find(name);
  if (it == index_.end()) throw std::out_of_range("dedup: no grouped tensor named '" + name + "'");
  return static_cast<size_t>(spec_.group_nbytes[spec_.member_group[it->second]]);
}

BufferPtr DedupStore::get(const std::string& name) {
  const auto it = index_.find(name);
  if (it == index_.end()) throw std::out_of_range("dedup: no grouped tensor named '" + name + "'");
  const size_t i = it->second;
  std::lock_guard<std::mutex> lock(mu_);
  if (auto c = cache_.find(i); c != cache_.end()) {
    ++st_.hits;
    lru_.splice(lru_.begin(), lru_, c->second.pos);
    log("cache hit  %s", name.c_str());
    return c->second.buf;
  }
  ++st_.misses;
  const StoreSpec& s = spec_;
  const int64_t g = s.member_group[i];
  const size_t n = static_cast<size_t>(s.group_nbytes[g]);
  auto buf = std::make_shared<Buffer>(n);
  reconstruct(view_at(i), buf->data, n >= (size_t(1) << 20) ? threads_ : 1, isa_);
  st_.reconstructed_bytes += n;
  if (n > capacity_) {
    ++st_.bypasses;
    log("cache miss %s (%zu bytes): larger than the cache (%zu bytes), not cached", name.c_str(), n, capacity_);
    return buf;
  }
  while (st_.cached_bytes + n > capacity_ && !lru_.empty()) {
    const size_t victim = lru_.back();
    lru_.pop_back();
    const size_t vn = cache_.at(victim).buf->size;
    cache_.erase(victim);
    st_.cached_bytes -= vn;
    ++st_.evictions;
    log("evict      %s (%zu bytes)", s.names[victim].c_str(), vn);
  }
  lru_.push_front(i);
  cache_.emplace(i, Entry{buf, lru_.begin()});
  st_.cached_bytes += n;
  log("cache miss %s (%zu bytes): reconstructed and cached (%zu of %zu bytes used)", name.c_str(), n,
      st_.cached_bytes, capacity_);
  return buf;
}

MemberView DedupStore::view(const std::string& name) const {
  const auto it = index_.find(name);
  if (it == index_.end()) throw std::out_of_range("dedup: no grouped tensor named '" + name + "'");
  return view_at(it->second);
}

MemberView DedupStore::view_at(size_t i) const {
  const StoreSpec& s = spec_;
  const int64_t g = s.member_group[i];
  MemberView v;
  v.def = blobs_[0]->data() + s.group_default_offset[g];
  v.nbytes = static_cast<size_t>(s.group_nbytes[g]);
  split_line_mask(blobs_[1]->data() + s.mask_offset[i], static_cast<size_t>(s.mask_nbytes[i]), v.nbytes, &v.mask);
  v.exc = blobs_[2]->data() ? blobs_[2]->data() + s.exc_offset[i] : nullptr;
  v.exc_count = static_cast<size_t>(s.exc_count[i]);
  v.prefix = &prefix_[i];
  return v;
}

void DedupStore::count_fused(size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  ++st_.fused_calls;
  st_.fused_bytes += bytes;
}

StoreStats DedupStore::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  StoreStats out = st_;
  out.entries = cache_.size();
  return out;
}

void DedupStore::clear_cache() {
  std::lock_guard<std::mutex> lock(mu_);
  cache_.clear();
  lru_.clear();
  st_.cached_bytes = 0;
}

}  // namespace ie::dedup
