// The decoder's step on the device (cuda/decoder.h). The matrices are the
// GEMV's (cuda/gemv.h); the kernels here are the O(hidden + ctx) parts,
// each the CPU decoder's loop (decoder/decoder.cpp) with one block per
// chunk row (and head): f32 throughout, softmax with the maximum
// subtracted, so the logits stay within float rounding of the CPU's.
// Positions and token ids are read from device memory (io_), never passed
// as kernel arguments, so a captured single-token step stays valid for
// every position.
#include "cuda/decoder.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>

#include "common/errors.h"
#include "cuda/check.h"
#include "cuda/reduce.cuh"
#include "dedup/dedup.h"

namespace ie::cuda {
namespace {

constexpr int kThreads = 256;      // rows: norms, gathers, element-wise
constexpr int kAttnThreads = 128;  // one (row, head) of attention: four warps over the cache positions

// x[row] = table[ids[row]]; io = {position, ids...}.
__global__ void embed_kernel(const float* table, const int32_t* io, int hidden, float* x) {
  const float* src = table + static_cast<size_t>(io[1 + blockIdx.x]) * hidden;
  float* dst = x + static_cast<size_t>(blockIdx.x) * hidden;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) dst[i] = src[i];
}

// HF's LlamaRMSNorm, one block per row: out = w * (x * 1/sqrt(mean(x^2) + eps)).
__global__ void rmsnorm_kernel(const float* x, const float* w, int n, float eps, float* out) {
  __shared__ float red[32];
  x += static_cast<size_t>(blockIdx.x) * n;
  out += static_cast<size_t>(blockIdx.x) * n;
  float ss = 0.f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) ss = fmaf(x[i], x[i], ss);
  ss = block_sum(ss, red);
  const float inv = 1.f / sqrtf(ss / static_cast<float>(n) + eps);
  for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = w[i] * (x[i] * inv);
}

// RoPE (rotate_half: pairs (i, i + head_dim/2) turn by pos * inv_freq[i])
// of the row's q and k heads, then the row's k and v into the cache at its
// position: one block per chunk row.
__global__ void rope_store_kernel(float* q, float* k, const float* v, const float* inv_freq, float rope_scale,
                                  const int32_t* io, int n_heads, int n_kv_heads, int head_dim, float* k_cache,
                                  float* v_cache) {
  const int j = blockIdx.x, half = head_dim / 2;
  const int q_dim = n_heads * head_dim, kv_dim = n_kv_heads * head_dim;
  const int pos = io[0] + j;
  float* qj = q + static_cast<size_t>(j) * q_dim;
  float* kj = k + static_cast<size_t>(j) * kv_dim;
  const float* vj = v + static_cast<size_t>(j) * kv_dim;
  float* kc = k_cache + static_cast<size_t>(pos) * kv_dim;
  for (int e = threadIdx.x; e < (n_heads + n_kv_heads) * half; e += blockDim.x) {
    const int h = e / half, i = e % half;
    const float ang = static_cast<float>(pos) * inv_freq[i];
    const float c = cosf(ang) * rope_scale, s = sinf(ang) * rope_scale;
    float* p = h < n_heads ? qj + h * head_dim : kj + (h - n_heads) * head_dim;
    const float a = p[i], b = p[i + half];
    p[i] = a * c - b * s;
    p[i + half] = b * c + a * s;
    if (h >= n_heads) {  // a k head: its rotated pair is final
      kc[(h - n_heads) * head_dim + i] = p[i];
      kc[(h - n_heads) * head_dim + i + half] = p[i + half];
    }
  }
  float* vc = v_cache + static_cast<size_t>(pos) * kv_dim;
  for (int i = threadIdx.x; i < kv_dim; i += blockDim.x) vc[i] = vj[i];
}

// Causal attention of one (head, chunk row) per block over the cache
// positions it sees: the row at position io[0] + j sees every earlier one
// and itself, or the last `window` of them. Scores go to global memory (a
// long context does not fit in shared memory): warps take positions in
// turn, the lanes of a warp split head_dim; then softmax with the maximum
// subtracted and the weighted sum of V, one output element per thread.
__global__ void attention_kernel(const float* q, const float* k_cache, const float* v_cache, const int32_t* io,
                                 int window, int n_heads, int group, int head_dim, int max_ctx, float scale,
                                 float* scores, float* out) {
  extern __shared__ float qs[];  // head_dim
  __shared__ float red[32];
  const int h = blockIdx.x, j = blockIdx.y;
  const int q_dim = n_heads * head_dim, kv_dim = q_dim / group;
  const int n_ctx = io[0] + j + 1;
  const int t0 = window > 0 ? max(0, n_ctx - window) : 0, n = n_ctx - t0;
  const float* qh = q + static_cast<size_t>(j) * q_dim + h * head_dim;
  for (int d = threadIdx.x; d < head_dim; d += blockDim.x) qs[d] = qh[d];
  __syncthreads();
  const size_t kvo = static_cast<size_t>(t0) * kv_dim + (h / group) * head_dim;
  float* sc = scores + (static_cast<size_t>(j) * n_heads + h) * max_ctx;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  float mx = -INFINITY;
  for (int t = warp; t < n; t += warps) {
    const float* kt = k_cache + kvo + static_cast<size_t>(t) * kv_dim;
    float s = 0.f;
    for (int d = lane; d < head_dim; d += 32) s = fmaf(qs[d], kt[d], s);
    s = warp_sum(s) * scale;
    if (lane == 0) sc[t] = s;
    mx = fmaxf(mx, s);
  }
  mx = block_max(mx, red);  // its barrier also publishes sc[] to the block
  float sum = 0.f;
  for (int t = threadIdx.x; t < n; t += blockDim.x) {
    const float e = expf(sc[t] - mx);
    sc[t] = e;
    sum += e;
  }
  const float inv = 1.f / block_sum(sum, red);
  float* o = out + static_cast<size_t>(j) * q_dim + h * head_dim;
  for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
    const float* vt = v_cache + kvo + d;
    float acc = 0.f;
    for (int t = 0; t < n; ++t) acc = fmaf(sc[t], vt[static_cast<size_t>(t) * kv_dim], acc);
    o[d] = acc * inv;
  }
}

// gate = SiLU(gate) * up, element-wise over the chunk.
__global__ void swiglu_kernel(float* gate, const float* up, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const float g = gate[i];
    gate[i] = g / (1.f + expf(-g)) * up[i];
  }
}

// The residual: x += y.
__global__ void add_kernel(float* x, const float* y, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    x[i] += y[i];
}

int blocks_for(size_t n) { return static_cast<int>(std::min<size_t>((n + kThreads - 1) / kThreads, 1024)); }

// Two Matrix structs for the same stored bytes: a tied head, uploaded once.
bool same_bytes(const Matrix& a, const Matrix& b) {
  const bool same_spec = a.spec.type == b.spec.type && a.spec.rows == b.spec.rows && a.spec.cols == b.spec.cols;
  if (a.data != nullptr) return same_spec && a.data == b.data;
  return same_spec && a.store != nullptr && a.store == b.store && a.name == b.name;
}

void destroy_stream(cudaStream_t s) { cudaStreamDestroy(s); }
void destroy_graph(cudaGraphExec_t g) { cudaGraphExecDestroy(g); }

cudaStream_t new_stream() {
  cudaStream_t s = nullptr;
  // Not ordered with the legacy default stream: nothing else in the process
  // waits on the decoder's steps, nor they on it (the uploads, which run
  // there, are waited for once in the constructor).
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  return s;
}

}  // namespace

CudaDecoder::CudaDecoder(const DecoderConfig& cfg, const DecoderWeights& w)
    : cfg_(cfg), stream_(nullptr, destroy_stream), graph_(nullptr, destroy_graph) {
  const DecoderConfig& c = cfg_;
  check_decoder(c, w, /*dedup_plans=*/false);  // everything, before the first byte goes to the device
  if (c.k_cache != WType::F32 || c.v_cache != WType::F32)
    fail("the CUDA decoder keeps an f32 KV cache (--cache-type-k/--cache-type-v f32)");
  // What the device step does not implement is refused, never skipped.
  if (c.kv_lora > 0) fail("the CUDA decoder has no multi-head latent attention (DeepSeek); run it on the CPU");
  if (!w.lm_head_b.empty()) fail("the CUDA decoder has no output head bias (Phi-2); run it on the CPU");
  for (const LayerWeights& L : w.layers) {
    if (!L.experts.empty()) fail("the CUDA decoder runs dense MLP layers only; a mixture of experts runs on the CPU");
    if (!L.q_norm.empty()) fail("the CUDA decoder has no per-head q/k norm (Qwen3); run it on the CPU");
    if (!L.sinks.empty()) fail("the CUDA decoder has no attention sinks (gpt-oss); run it on the CPU");
    if (L.q_gate.data != nullptr || L.q_gate.dedup || L.q_gate.store != nullptr)
      fail("the CUDA decoder has no attention gate (AFMoE); run it on the CPU");
    if (!L.bup.empty() || !L.bdown.empty()) fail("the CUDA decoder has no MLP biases (StarCoder2); run it on the CPU");
    if (!L.attn_post_norm.empty() || !L.mlp_post_norm.empty())
      fail("the CUDA decoder has no norms of the attention and MLP outputs (Gemma 3); run it on the CPU");
  }
  if (c.mlp_act == MlpAct::GeluTanh || c.embed_scale != 1.f || c.attn_scale != 0.f || !c.inv_freq_swa.empty() ||
      c.attn_softcap != 0.f || c.logit_softcap != 0.f)
    fail("the CUDA decoder has no GELU MLP, embedding or attention scale, second RoPE table or soft-caps (Gemma); "
         "run it on the CPU");
  if (c.inv_freq.size() != static_cast<size_t>(c.head_dim / 2))
    fail("the CUDA decoder rotates whole heads; partial RoPE (Phi-4-mini) runs on the CPU");
  for (uint8_t n : c.nope)
    if (n) fail("the CUDA decoder rotates every layer; layers without RoPE (SmolLM3) run on the CPU");
  if (!c.pre_norms || c.qk_norm_full)
    fail("the CUDA decoder has no OLMo 2 layer (output norms alone, whole-projection q/k norms); run it on the CPU");
  if (c.residual_scale != 1.f || c.logits_scaling != 1.f)
    fail("the CUDA decoder has no residual or logit multipliers (Granite); run it on the CPU");
  if (c.layer_norm || c.parallel_block)
    fail("the CUDA decoder has no LayerNorm or parallel layer (Cohere, StableLM); run it on the CPU");
  if (c.rope_interleaved)
    fail("the CUDA decoder turns rotate-half pairs; interleaved RoPE (GLM-4) runs on the CPU");
  if (c.attn_temp_scale != 0.f)
    fail("the CUDA decoder has no attention temperature (Ministral 3, Llama 4); run it on the CPU");
  for (int chunk : c.chunks)
    if (chunk) fail("the CUDA decoder has no chunked attention (Llama 4); run it on the CPU");
  if (c.qk_l2_norm || c.qk_norm_after_rope)
    fail("the CUDA decoder has no q/k norm after RoPE (Llama 4, HunYuan); run it on the CPU");
  if (c.clip_qkv != 0.f) fail("the CUDA decoder does not clamp q, k and v (OLMo's clip_qkv); run it on the CPU");
  for (float m : {c.q_mult, c.k_mult, c.v_mult, c.o_mult, c.gate_mult, c.down_mult})
    if (m != 1.f) fail("the CUDA decoder has no muP multipliers (Falcon-H1); run it on the CPU");
  if (c.attn_gate || !c.linear.empty() || !c.short_conv.empty() || !c.ssm.empty() || !c.ssm1.empty())
    fail("the CUDA decoder has no gated attention, linear attention (Qwen3.5), short convolution (LFM2), Mamba2 "
         "(Granite 4) or Mamba 1; run it on the CPU");
  if (!c.mlp_only.empty() || !c.mixer_only.empty() || !c.mlp_gated)
    fail("the CUDA decoder has no blocks of a mixer or an MLP alone, nor MLPs without a gate (Nemotron-H, Arcee, StarCoder2, Apertus); "
         "run it on the CPU");
  q_dim_ = c.n_heads * c.head_dim;
  kv_dim_ = c.n_kv_heads * c.head_dim;
  const size_t B = kMaxBatch, F = sizeof(float);
  const size_t cache = checked_mul(checked_mul(checked_mul(static_cast<size_t>(c.n_layers), static_cast<size_t>(c.max_ctx),
                                                           "KV cache"), static_cast<size_t>(kv_dim_), "KV cache"),
                                   F, "KV cache");
  const size_t scores = checked_mul(checked_mul(B * c.n_heads, static_cast<size_t>(c.max_ctx), "attention scores"), F,
                                    "attention scores");

  stream_.reset(new_stream());
  for (const LayerWeights& L : w.layers) {
    const std::string p = "layer " + std::to_string(layers_.size()) + " ";
    Layer d;
    d.q = upload(L.q, p + "q_proj");
    d.k = upload(L.k, p + "k_proj");
    d.v = upload(L.v, p + "v_proj");
    d.o = upload(L.o, p + "o_proj");
    d.gate = upload(L.gate, p + "gate_proj");
    d.up = upload(L.up, p + "up_proj");
    d.down = upload(L.down, p + "down_proj");
    d.attn_norm = upload_vec(L.attn_norm);
    d.mlp_norm = upload_vec(L.mlp_norm);
    d.bq = upload_vec(L.bq);
    d.bk = upload_vec(L.bk);
    d.bv = upload_vec(L.bv);
    d.bo = upload_vec(L.bo);
    layers_.push_back(std::move(d));
  }
  final_norm_ = upload_vec(w.final_norm);
  inv_freq_ = upload_vec(c.inv_freq);

  // The embedding: rows are gathered one token at a time from an f32 table
  // -- the stored matrix itself when it is f32, else widened once here
  // (exactly, by the GEMV's own dequantizer).
  const bool tied = same_bytes(w.embed, w.lm_head);
  embed_ = upload(w.embed, "embed_tokens");
  if (!tied) head_ = upload(w.lm_head, "lm_head");
  head_ptr_ = tied ? &embed_ : &head_;
  // A synchronous copy from pageable memory may return before its DMA has
  // landed: wait for every upload before the stream reads any of them.
  check(cudaDeviceSynchronize(), "weight upload");
  if (embed_.spec.type != WType::F32) {
    embed_f32_ = DeviceBuffer(checked_mul(static_cast<size_t>(c.vocab) * c.hidden, F, "embed_tokens"));
    cuda::dequantize(embed_, embed_f32_.as<float>(), stream_.get());
    check(cudaStreamSynchronize(stream_.get()), "embed_tokens dequantize");
    device_bytes_ += embed_f32_.size();
    if (!tied) {  // the stored bytes have served their purpose
      device_bytes_ -= embed_.bytes.size();
      embed_ = DeviceMatrix{};
    }
  }
  embed_table_ = embed_f32_.size() ? embed_f32_.as<float>() : embed_.bytes.as<float>();

  k_cache_ = DeviceBuffer(cache);
  v_cache_ = DeviceBuffer(cache);
  const size_t H = c.hidden, I = c.inter;
  x_ = DeviceBuffer(B * H * F);
  xn_ = DeviceBuffer(B * H * F);
  q_ = DeviceBuffer(B * q_dim_ * F);
  k_ = DeviceBuffer(B * kv_dim_ * F);
  v_ = DeviceBuffer(B * kv_dim_ * F);
  att_ = DeviceBuffer(B * q_dim_ * F);
  tmp_ = DeviceBuffer(B * H * F);
  gate_ = DeviceBuffer(B * I * F);
  up_ = DeviceBuffer(B * I * F);
  scores_ = DeviceBuffer(scores);
  logits_ = DeviceBuffer(B * c.vocab * F);
  io_ = DeviceBuffer((1 + B) * sizeof(int32_t));
  io_host_.resize(1 + B);
}

// Work of a step that threw may still be in flight, reading the buffers
// about to be freed.
CudaDecoder::~CudaDecoder() {
  if (stream_) cudaStreamSynchronize(stream_.get());
}

DeviceMatrix CudaDecoder::upload(const Matrix& m, const std::string& what) {
  const uint8_t* bytes = m.data;
  dedup::BufferPtr rebuilt;  // a dedup member's bytes, held until copied
  if (bytes == nullptr) {
    rebuilt = m.store->get(m.name);
    if (rebuilt->size != weight_nbytes(m.spec))
      fail(what + ": dedup member '" + m.name + "' holds " + std::to_string(rebuilt->size) + " bytes, expected " +
           std::to_string(weight_nbytes(m.spec)));
    bytes = rebuilt->data;
  }
  DeviceMatrix d = upload_matrix(m.spec, bytes);
  device_bytes_ += d.bytes.size();
  return d;
}

DeviceBuffer CudaDecoder::upload_vec(const std::vector<float>& v) {
  device_bytes_ += v.size() * sizeof(float);
  return to_device(v.data(), v.size() * sizeof(float));
}

void CudaDecoder::truncate(int n) {
  if (n < 0 || n > n_past_) fail("truncate: " + std::to_string(n) + " is outside 0.." + std::to_string(n_past_));
  n_past_ = n;
}

void CudaDecoder::enqueue_chunk(int b, Head head) {
  const DecoderConfig& c = cfg_;
  const int H = c.hidden;
  cudaStream_t s = stream_.get();
  const int32_t* io = io_.as<int32_t>();
  float *x = x_.as<float>(), *xn = xn_.as<float>(), *q = q_.as<float>(), *k = k_.as<float>(), *v = v_.as<float>();
  float *att = att_.as<float>(), *tmp = tmp_.as<float>(), *gate = gate_.as<float>(), *up = up_.as<float>();
  const size_t layer_cache = static_cast<size_t>(c.max_ctx) * kv_dim_;
  const float scale = 1.f / std::sqrt(static_cast<float>(c.head_dim));

  embed_kernel<<<b, kThreads, 0, s>>>(embed_table_, io, H, x);
  check_launch("embed_kernel");
  for (int l = 0; l < c.n_layers; ++l) {
    const Layer& L = layers_[l];
    rmsnorm_kernel<<<b, kThreads, 0, s>>>(x, L.attn_norm.as<float>(), H, c.eps, xn);
    check_launch("rmsnorm_kernel");
    cuda::gemv(L.q, xn, b, L.bq.as<float>(), q, s);
    cuda::gemv(L.k, xn, b, L.bk.as<float>(), k, s);
    cuda::gemv(L.v, xn, b, L.bv.as<float>(), v, s);
    float* kc = k_cache_.as<float>() + l * layer_cache;
    float* vc = v_cache_.as<float>() + l * layer_cache;
    rope_store_kernel<<<b, kThreads, 0, s>>>(q, k, v, inv_freq_.as<float>(), c.rope_scale, io, c.n_heads, c.n_kv_heads, c.head_dim,
                                             kc, vc);
    check_launch("rope_store_kernel");
    attention_kernel<<<dim3(c.n_heads, b), kAttnThreads, c.head_dim * sizeof(float), s>>>(
        q, kc, vc, io, c.windows[static_cast<size_t>(l)], c.n_heads, c.n_heads / c.n_kv_heads, c.head_dim, c.max_ctx, scale,
        scores_.as<float>(), att);
    check_launch("attention_kernel");
    cuda::gemv(L.o, att, b, L.bo.as<float>(), tmp, s);
    add_kernel<<<blocks_for(static_cast<size_t>(b) * H), kThreads, 0, s>>>(x, tmp, static_cast<size_t>(b) * H);
    check_launch("add_kernel");
    rmsnorm_kernel<<<b, kThreads, 0, s>>>(x, L.mlp_norm.as<float>(), H, c.eps, xn);
    check_launch("rmsnorm_kernel");
    cuda::gemv(L.gate, xn, b, nullptr, gate, s);
    cuda::gemv(L.up, xn, b, nullptr, up, s);
    const size_t gi = static_cast<size_t>(b) * c.inter;
    swiglu_kernel<<<blocks_for(gi), kThreads, 0, s>>>(gate, up, gi);
    check_launch("swiglu_kernel");
    cuda::gemv(L.down, gate, b, nullptr, tmp, s);
    add_kernel<<<blocks_for(static_cast<size_t>(b) * H), kThreads, 0, s>>>(x, tmp, static_cast<size_t>(b) * H);
    check_launch("add_kernel");
  }
  if (head == Head::None) return;
  // The head over every row, or only over the last (its normed row first in xn).
  const int rows = head == Head::All ? b : 1;
  rmsnorm_kernel<<<rows, kThreads, 0, s>>>(x + static_cast<size_t>(b - rows) * H, final_norm_.as<float>(), H, c.eps, xn);
  check_launch("rmsnorm_kernel");
  cuda::gemv(*head_ptr_, xn, rows, nullptr, logits_.as<float>(), s);
}

void CudaDecoder::step() {
  cudaStream_t s = stream_.get();
  if (!graph_ && !graph_refused_) graph_refused_ = !capture_step();
  if (graph_)
    check(cudaGraphLaunch(graph_.get(), s), "cudaGraphLaunch");
  else
    enqueue_chunk(1, Head::Last);
}

// Captures the single-token step once. A capture the runtime refuses (a
// call inside that may not be captured) leaves the steps eager rather than
// failing them: the eager step says what is wrong, if anything is.
bool CudaDecoder::capture_step() {
  cudaStream_t s = stream_.get();
  if (cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  bool ok = true;
  try {
    enqueue_chunk(1, Head::Last);
  } catch (const std::exception&) {
    ok = false;
  }
  cudaGraph_t g = nullptr;
  ok = cudaStreamEndCapture(s, &g) == cudaSuccess && ok;  // always ends it: the stream must leave capture mode
  cudaGraphExec_t exec = nullptr;
  ok = ok && cudaGraphInstantiate(&exec, g, 0) == cudaSuccess;
  if (g != nullptr) cudaGraphDestroy(g);
  cudaGetLastError();  // a refused capture's error is not the step's
  if (ok) graph_.reset(exec);
  return ok;
}

void CudaDecoder::forward(const int32_t* tokens, int n, float* logits, bool all_logits) {
  if (n < 1) fail("forward: no tokens");
  if (logits == nullptr) fail("forward: no logits buffer");
  if (n > cfg_.max_ctx - n_past_)
    fail("context full: " + std::to_string(n_past_) + " cached + " + std::to_string(n) + " new tokens > ctx " +
         std::to_string(cfg_.max_ctx));
  for (int i = 0; i < n; ++i)
    if (tokens[i] < 0 || tokens[i] >= cfg_.vocab)
      fail("token id " + std::to_string(tokens[i]) + " is outside the vocabulary (0.." + std::to_string(cfg_.vocab - 1) +
           ")");
  cudaStream_t s = stream_.get();
  const size_t vocab = static_cast<size_t>(cfg_.vocab);
  for (int done = 0; done < n;) {
    const int b = std::min(kMaxBatch, n - done);
    const Head head = all_logits ? Head::All : (done + b == n ? Head::Last : Head::None);
    // Pageable source: the call returns once it is staged, so io_host_ is
    // free for the next chunk.
    io_host_[0] = n_past_;
    std::copy_n(tokens + done, b, io_host_.begin() + 1);
    check(cudaMemcpyAsync(io_.get(), io_host_.data(), (1 + b) * sizeof(int32_t), cudaMemcpyHostToDevice, s),
          "cudaMemcpyAsync ids to device");
    if (b == 1 && head == Head::Last)
      step();
    else
      enqueue_chunk(b, head);
    if (head != Head::None) {
      float* dst = all_logits ? logits + static_cast<size_t>(done) * vocab : logits;
      const size_t rows = head == Head::All ? b : 1;
      check(cudaMemcpyAsync(dst, logits_.get(), rows * vocab * sizeof(float), cudaMemcpyDeviceToHost, s),
            "cudaMemcpyAsync logits to host");
    }
    n_past_ += b;
    done += b;
  }
  check(cudaStreamSynchronize(s), "decoder step");
}

}  // namespace ie::cuda
