// The native loaders' error contracts: the BSR loader leaves its output
// zeroed (nothing allocated) on every error and names the rule; the dedup
// loader refuses a broken spec with a "FILE: FIELD: message" line; the
// decoder refuses configurations it cannot run.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

#include "bsr/bsr.h"
#include "decoder/decoder.h"
#include "dedup/dedup.h"
#include "test.h"

namespace {

const char* const kGoldenBsr = "golden/bsr/hand_8x8_b4x4.bsr";

std::vector<char> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(f), {});
}

std::string write_temp(const std::vector<char>& bytes, const std::string& name) {
  const std::string path = std::string(std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp") + "/ie_test_" + name;
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return path;
}

bool zeroed(const ie::BsrMatrix& m) {
  return m.rows == 0 && m.cols == 0 && m.nnzb == 0 && m.row_ptr.size() == 0 && m.col_idx.size() == 0 &&
         m.values.size() == 0;
}

// Loads `path` into a matrix that already holds a valid load, so "zeroed on
// error" is a real check, not the default state.
ie::BsrStatus load_over_valid(const std::string& path, ie::BsrMatrix* m, ie::BsrError* err) {
  ie::BsrError ok;
  if (ie::bsr_load(kGoldenBsr, false, m, &ok) != ie::BsrStatus::Ok) return ie::BsrStatus::Io;
  return ie::bsr_load(path, false, m, err);
}

}  // namespace

TEST(bsr_loader_zeroes_output_on_error) {
  const std::vector<char> good = read_file(kGoldenBsr);
  CHECK(good.size() > 96) << "golden file missing (run from the repository root)";
  if (good.size() <= 96) return;
  struct Bad {
    const char* name;
    std::vector<char> bytes;
    ie::BsrStatus want;
  };
  std::vector<Bad> cases;
  cases.push_back({"truncated_header", std::vector<char>(good.begin(), good.begin() + 40), ie::BsrStatus::Truncated});
  cases.push_back({"truncated_payload", std::vector<char>(good.begin(), good.end() - 4), ie::BsrStatus::FileSize});
  std::vector<char> magic = good;
  magic[0] = 'X';
  cases.push_back({"bad_magic", magic, ie::BsrStatus::BadMagic});
  std::vector<char> payload = good;
  payload.back() ^= 0x40;  // a value byte: the CRC no longer matches
  cases.push_back({"crc", payload, ie::BsrStatus::Crc});
  std::vector<char> longer = good;
  longer.push_back(0);
  cases.push_back({"trailing_byte", longer, ie::BsrStatus::FileSize});
  for (const Bad& c : cases) {
    ie::BsrMatrix m;
    ie::BsrError err;
    const ie::BsrStatus st = load_over_valid(write_temp(c.bytes, c.name), &m, &err);
    CHECK(st == c.want) << c.name << ": got " << ie::bsr_status_name(st) << " (" << err.field << ": " << err.message
                        << ")";
    CHECK(zeroed(m)) << c.name;
    CHECK(!err.field.empty() && !err.message.empty()) << c.name;
    std::remove(write_temp({}, c.name).c_str());
  }
  ie::BsrMatrix m;
  ie::BsrError err;
  CHECK(load_over_valid("/nonexistent/dir/x.bsr", &m, &err) == ie::BsrStatus::Io);
  CHECK(zeroed(m));
}

TEST(bsr_from_arrays_zeroes_output_on_error) {
  const uint32_t row_ptr[] = {0, 2};
  const uint32_t descending[] = {1, 0};
  const uint32_t out_of_range[] = {0, 5};
  const std::vector<float> values(2 * 4, 1.f);
  for (const uint32_t* cols : {descending, out_of_range}) {
    ie::BsrMatrix m;
    ie::BsrError err;
    const uint32_t ok_cols[] = {0, 1};
    CHECK(ie::bsr_from_arrays(2, 4, 2, 2, row_ptr, 2, ok_cols, 2, values.data(), values.size(), false, &m, &err) ==
          ie::BsrStatus::Ok);
    const ie::BsrStatus st =
        ie::bsr_from_arrays(2, 4, 2, 2, row_ptr, 2, cols, 2, values.data(), values.size(), false, &m, &err);
    CHECK(st == (cols == descending ? ie::BsrStatus::ColOrder : ie::BsrStatus::ColIdx)) << ie::bsr_status_name(st);
    CHECK(zeroed(m));
  }
}

TEST(dedup_loader_refuses_broken_specs) {
  namespace dd = ie::dedup;
  auto message = [](const dd::StoreSpec& s) -> std::string {
    try {
      dd::DedupStore store(s, 1 << 20, 1, false, ie::Isa::Scalar);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "";
  };
  dd::StoreSpec s;
  s.model_dir = "golden/dedup/model/dedup_out";
  s.blob_names = {"model.defaults.bin", "model.masks.bin", "model.exceptions.bin"};
  s.blob_sizes = {4096, 1792, 359};
  dd::StoreSpec missing_dir = s;
  missing_dir.model_dir = "/nonexistent/model";
  CHECK(message(missing_dir).find("/nonexistent/model: (dir): ") == 0) << message(missing_dir);
  dd::StoreSpec escape = s;
  escape.blob_names[1] = "../../../../etc/passwd";
  CHECK(message(escape).find("model.dedup.json: blobs.masks.name: ") == 0) << message(escape);
  dd::StoreSpec align = s;
  align.alignment = 48;
  CHECK(message(align).find("model.dedup.json: alignment: ") == 0) << message(align);
  dd::StoreSpec size = s;
  size.blob_sizes[0] = 4095;
  CHECK(message(size).find("model.defaults.bin: (size): ") != std::string::npos) << message(size);
}

TEST(decoder_refuses_configs_it_cannot_run) {
  ie::DecoderConfig c;
  c.n_layers = 1;
  c.hidden = 64;
  c.n_heads = 3;
  c.n_kv_heads = 2;  // 3 heads are not a multiple of 2 KV heads
  c.head_dim = 16;
  c.inter = 32;
  c.vocab = 10;
  c.max_ctx = 8;
  c.inv_freq.assign(8, 1.f);
  c.windows.assign(1, 0);
  auto refuses = [](const ie::DecoderConfig& cfg, const char* needle) {
    try {
      ie::Decoder d(cfg, ie::DecoderWeights{}, ie::Act::F32, 1, ie::Isa::Scalar);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what()).find(needle) != std::string::npos;
    }
    return false;
  };
  CHECK(refuses(c, "num_key_value_heads"));
  c.n_kv_heads = 1;
  ie::DecoderConfig bad = c;
  bad.windows.assign(2, 0);  // one per layer
  CHECK(refuses(bad, "windows must hold one value per layer"));
  bad = c;
  bad.n_experts = 4;
  bad.top_k = 5;  // more experts per token than there are
  bad.expert_inter = 32;
  CHECK(refuses(bad, "top_k 5 is outside 1..n_experts (4)"));
  bad.top_k = 2;
  bad.glu = ie::Glu::GptOss;
  bad.swiglu_limit = 0.f;
  CHECK(refuses(bad, "swiglu_limit must be a positive number"));
  bad = c;
  bad.rope_scale = -1.f;
  CHECK(refuses(bad, "rope_scale"));
  bool threw = false;
  c.max_ctx = 1 << 30;
  c.n_layers = 1 << 20;  // a KV cache whose byte count overflows
  threw = false;
  try {
    ie::Decoder d(c, ie::DecoderWeights{}, ie::Act::F32, 1, ie::Isa::Scalar);
  } catch (const std::invalid_argument&) {
    threw = true;
  }
  CHECK(threw);
}

TEST(attention_split_covers_every_query_once_in_bounded_items) {
  for (int b : {1, 2, 3, 7, 8, 9, 33, 256})
    for (int n_kv : {1, 2, 3, 8})
      for (int group : {1, 2, 3, 4, 7, 33, 64})
        for (int threads : {1, 2, 3, 16}) {
          const ie::AttnSplit s = ie::attn_split(b, n_kv, group, threads);
          const std::string at = "b=" + std::to_string(b) + " n_kv=" + std::to_string(n_kv) + " group=" +
                                 std::to_string(group) + " threads=" + std::to_string(threads);
          CHECK(s.tj >= 1 && s.th >= 1 && s.tj * s.th <= ie::kAttnItemQueries) << at << ": tj " << s.tj << " th " << s.th;
          // jparts ranges of tj tokens (the last may be shorter) cover 0..b, none empty; likewise heads.
          CHECK(s.jparts * s.tj >= b && (s.jparts - 1) * s.tj < b) << at << ": jparts " << s.jparts << " tj " << s.tj;
          CHECK(s.hparts * s.th >= group && (s.hparts - 1) * s.th < group) << at << ": hparts " << s.hparts << " th " << s.th;
          if (b == 1 && n_kv >= threads && group <= ie::kAttnItemQueries) {
            CHECK(s.th == group) << at << ": a decode step with a KV head per thread splits a head's queries";
          }
          // Equal-sized ranges cannot always make exactly the items wanted (two per thread for a
          // chunk): never fewer than half of them, or than every query alone.
          if (b > 1) {
            CHECK(2 * n_kv * s.jparts * s.hparts >= std::min(2 * threads, b * n_kv * group)) << at << ": too few items";
          }
        }
  bool refused = false;
  try {
    ie::attn_split(1, 0, 1, 1);
  } catch (const std::invalid_argument&) {
    refused = true;
  }
  CHECK(refused) << "attn_split accepted n_kv 0";
}
