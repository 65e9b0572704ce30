// The Llama-family decoder on a CUDA device: the CPU decoder's forward pass
// (decoder/decoder.h: RMSNorm, RoPE, grouped-query attention with an
// optional sliding window, SwiGLU, tied or untied head) with every weight
// uploaded once at construction, the KV cache and activations on the
// device, and one stream the whole step runs on. The matrices go through
// cuda/gemv.h in their stored format, kMaxBatch tokens at a time; a
// single-token step, the decode loop's only shape, is replayed from a CUDA
// graph so the host issues one launch per token. Compiled only with
// -DIE_ENABLE_CUDA=ON.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cuda/buffer.h"
#include "cuda/gemv.h"
#include "decoder/decoder.h"

namespace ie::cuda {

class CudaDecoder {
 public:
  // `w` is read only here: its matrices (mapped file bytes, or dedup members
  // rebuilt by their store) and vectors are copied to the device, the
  // embedding widened to an f32 table. Throws std::invalid_argument naming
  // the first inconsistent dimension, std::runtime_error for a CUDA failure.
  CudaDecoder(const DecoderConfig& cfg, const DecoderWeights& w);
  ~CudaDecoder();
  CudaDecoder(const CudaDecoder&) = delete;
  CudaDecoder& operator=(const CudaDecoder&) = delete;

  // As Decoder::forward: `n` tokens at positions n_past() .. n_past()+n-1;
  // `logits` (host memory) receives [n, vocab] when all_logits, else the
  // last token's [vocab]. Returns once the logits are on the host.
  void forward(const int32_t* tokens, int n, float* logits, bool all_logits);

  // Drops cached positions >= n (prefix reuse between prompts).
  void truncate(int n);
  int n_past() const { return n_past_; }
  const DecoderConfig& config() const { return cfg_; }
  // Device bytes of the weights: matrices as uploaded, the f32 embedding
  // table, norms and biases (not the KV cache or activations).
  size_t device_bytes() const { return device_bytes_; }
  // Whether single-token steps replay a CUDA graph (false until the first
  // such step, and for good where the capture was refused).
  bool step_graph() const { return graph_ != nullptr; }

 private:
  struct Layer {
    DeviceMatrix q, k, v, o, gate, up, down;
    DeviceBuffer attn_norm, mlp_norm, bq, bk, bv, bo;  // biases: empty when the architecture has none
  };
  enum class Head { None, Last, All };  // which rows of the chunk get logits

  DeviceMatrix upload(const Matrix& m, const std::string& what);
  DeviceBuffer upload_vec(const std::vector<float>& v);
  // Enqueues one chunk of b tokens whose position and ids are already in
  // io_ (pos, then ids): every layer, then the head for `head` into logits_.
  void enqueue_chunk(int b, Head head);
  // A single-token step with logits of that token: from the graph, captured
  // on first use; eagerly where capture is refused.
  void step();
  bool capture_step();

  DecoderConfig cfg_;
  int q_dim_ = 0, kv_dim_ = 0;
  int n_past_ = 0;
  size_t device_bytes_ = 0;
  std::unique_ptr<CUstream_st, void (*)(cudaStream_t)> stream_;
  std::unique_ptr<CUgraphExec_st, void (*)(cudaGraphExec_t)> graph_;
  bool graph_refused_ = false;

  std::vector<Layer> layers_;
  DeviceBuffer final_norm_, inv_freq_;
  // The embedding matrix as stored: kept when it is the (tied) head or,
  // stored as f32, the lookup table itself.
  DeviceMatrix embed_;
  DeviceMatrix head_;        // an untied lm_head
  const DeviceMatrix* head_ptr_ = nullptr;
  DeviceBuffer embed_f32_;   // the widened table of a non-f32 embedding
  const float* embed_table_ = nullptr;

  DeviceBuffer k_cache_, v_cache_;  // [layer][max_ctx][kv_dim] float32
  // Activations of one chunk (kMaxBatch rows each), attention scores
  // [row][head][max_ctx], logits [row][vocab], and io_ = {first position,
  // token ids}: what a graph replay reads instead of baked-in arguments.
  DeviceBuffer x_, xn_, q_, k_, v_, att_, tmp_, gate_, up_, scores_, logits_, io_;
  std::vector<int32_t> io_host_;
};

}  // namespace ie::cuda
