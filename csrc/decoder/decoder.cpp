// The decoder's per-token step (decoder.h). Plain C++: the heavy lifting is
// the GEMV kernels, dispatched per ISA; the rest (norms, RoPE, attention
// over a short cache, SwiGLU) is O(hidden + ctx) per token and written as
// straightforward loops the compiler vectorises.
#include "decoder.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <tuple>
#include <utility>
#include <vector>

#include "act/act.h"
#include "attention/attention.h"
#include "common/errors.h"
#include "common/half.h"
#include "ssm/ssm.h"

#if defined(__linux__)
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>
#endif

namespace ie {
namespace {

// ln(1 + e^a), as torch's softplus (a itself above its threshold of 20): the time step of gated DeltaNet, Mamba2
// and Mamba 1.
float softplus(float a) { return a > 20.f ? a : std::log1p(std::exp(a)); }

// Adds the wall time of its scope to *acc; does nothing when acc is null.
class Stopwatch {
 public:
  explicit Stopwatch(double* acc) : acc_(acc), t0_(acc ? Clock::now() : Clock::time_point()) {}
  ~Stopwatch() {
    if (acc_) *acc_ += std::chrono::duration<double>(Clock::now() - t0_).count();
  }
  Stopwatch(const Stopwatch&) = delete;
  Stopwatch& operator=(const Stopwatch&) = delete;

 private:
  using Clock = std::chrono::steady_clock;
  double* acc_;
  Clock::time_point t0_;
};

// A matrix has bytes in memory or is a member of a dedup store; with
// `plans` (the CPU decoder) a member must come with its fused-GEMV plan.
void check_matrix(const std::string& what, const Matrix& m, int64_t rows, int64_t cols, bool plans) {
  if (m.data == nullptr && (plans ? !m.dedup : m.store == nullptr)) fail(what + ": no data");
  if (m.dedup && (m.store == nullptr || m.dedup->spec.rows != m.spec.rows || m.dedup->spec.cols != m.spec.cols))
    fail(what + ": dedup member planned for another matrix");
  if (m.spec.rows != rows || m.spec.cols != cols)
    fail(what + ": shape [" + std::to_string(m.spec.rows) + ", " + std::to_string(m.spec.cols) + "], expected [" +
         std::to_string(rows) + ", " + std::to_string(cols) + "]");
}

void check_vec(const std::string& what, const std::vector<float>& v, size_t n, bool optional = false) {
  if (optional && v.empty()) return;
  if (v.size() != n) fail(what + ": " + std::to_string(v.size()) + " elements, expected " + std::to_string(n));
}

// Hints the kernel that [p, p + n) will not be read soon: its whole pages
// leave the resident set (file pages are re-read, anonymous ones swapped in,
// if ever touched again). A hint only: failure changes nothing.
void page_out(const uint8_t* p, size_t n) {
#if defined(__linux__) && defined(MADV_PAGEOUT)
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t a = (reinterpret_cast<uintptr_t>(p) + page - 1) / page * page;
  const uintptr_t b = (reinterpret_cast<uintptr_t>(p) + n) / page * page;
  if (b > a) madvise(reinterpret_cast<void*>(a), b - a, MADV_PAGEOUT);
#else
  (void)p;
  (void)n;
#endif
}

// HF's LlamaRMSNorm in float32: x * rsqrt(mean(x^2) + eps) * weight. The
// squares are summed in eight partial sums (lane u: the elements i < n - n % 8
// with i % 8 == u, added pairwise, then the tail in order), which the
// compiler keeps in vector registers: one running sum was a chain of n
// dependent adds, 2,300 cycles a row for SmolLM2's 576 (3% of a prefill).
float rms_inverse(const float* x, int n, float eps) {
  float p[8] = {};
  int i = 0;
  for (; i + 8 <= n; i += 8)
    for (int u = 0; u < 8; ++u) p[u] += x[i + u] * x[i + u];
  float ss = ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]));
  for (; i < n; ++i) ss += x[i] * x[i];
  return 1.f / std::sqrt(ss / static_cast<float>(n) + eps);
}

void rmsnorm(const float* x, const float* w, int n, float eps, float* out) {
  const float inv = rms_inverse(x, n, eps);
  for (int i = 0; i < n; ++i) out[i] = w[i] * (x[i] * inv);
}

// x over its RMS, in place, no weight (Llama4TextL2Norm: x rsqrt(mean(x^2) + eps)).
void rms_unit(float* x, int n, float eps) {
  const float inv = rms_inverse(x, n, eps);
  for (int i = 0; i < n; ++i) x[i] *= inv;
}

// rotate_half convention over a head's first 2 * half dims: pairs
// (i, i + half) rotate by the angle pos * inv_freq[i], whose cos and sin are
// cs[i] and cs[half + i]; the dims after them pass through (partial RoPE,
// Phi-4-mini's; half = head_dim / 2 everywhere else).
void rope(float* v, int n_heads, int head_dim, int half, const float* cs) {
  // Heads outer: the inner loop runs over consecutive floats and vectorizes
  // (heads inner, a stride of head_dim apart, it ran one float at a time:
  // 1.7% of a SmolLM2 prefill with the cache copy).
  for (int h = 0; h < n_heads; ++h) {
    float* lo = v + h * head_dim;
    float* hi = lo + half;
    for (int i = 0; i < half; ++i) {
      const float a = lo[i], b = hi[i], c = cs[i], s = cs[half + i];
      lo[i] = a * c - b * s;
      hi[i] = b * c + a * s;
    }
  }
}

// The interleaved convention (GLM-4's, transformers' repeat_interleave of cos
// and sin; llama.cpp's ROPE_TYPE_NORM): pairs (2i, 2i + 1) over a head's
// first 2 * half dims rotate by cs[i], cs[half + i]; the dims after them pass
// through.
void rope_interleaved(float* v, int n_heads, int head_dim, int half, const float* cs) {
  for (int h = 0; h < n_heads; ++h) {
    float* x = v + h * head_dim;
    for (int i = 0; i < half; ++i) {
      const float a = x[2 * i], b = x[2 * i + 1], c = cs[i], s = cs[half + i];
      x[2 * i] = a * c - b * s;
      x[2 * i + 1] = b * c + a * s;
    }
  }
}

// Cohere's LayerNorm in float32, without a bias: (x - mean) * rsqrt(var +
// eps) * weight, var the mean of the squared deviations.
void layernorm(const float* x, const float* w, int n, float eps, float* out) {
  double sum = 0.0;  // (a float sum of ~10^4 values loses the mean's low bits that the deviations keep)
  for (int i = 0; i < n; ++i) sum += x[i];
  const float mean = static_cast<float>(sum / n);
  double ss = 0.0;
  for (int i = 0; i < n; ++i) ss += static_cast<double>(x[i] - mean) * (x[i] - mean);
  const float inv = 1.f / std::sqrt(static_cast<float>(ss / n) + eps);
  for (int i = 0; i < n; ++i) out[i] = w[i] * ((x[i] - mean) * inv);
}

// A vector's data for a kernel that takes null for none (an optional bias, sinks).
const float* or_null(const std::vector<float>& v) { return v.empty() ? nullptr : v.data(); }

// The layer's and the model's input norms: RMSNorm, or with layer_norm
// LayerNorm (Cohere's, StableLM's) plus its bias where the model has one.
void input_norm(const DecoderConfig& c, const float* x, const std::vector<float>& w, const std::vector<float>& bias,
                float* out) {
  (c.layer_norm ? layernorm : rmsnorm)(x, w.data(), c.hidden, c.eps, out);
  for (size_t i = 0; i < bias.size(); ++i) out[i] += bias[i];
}

// Gemma 2's soft-cap: x = cap tanh(x / cap), in place, as transformers
// divides, takes the tanh and multiplies.
void softcap(float* x, size_t n, float cap) {
  for (size_t i = 0; i < n; ++i) x[i] = std::tanh(x[i] / cap) * cap;
}

// No bytes at all: gpt-oss's `up` (its rows live interleaved in `gate`).
bool absent(const Matrix& m) { return m.data == nullptr && !m.dedup && m.store == nullptr; }

void check_experts(const DecoderConfig& c, const LayerWeights& L, const std::string& n, bool p) {
  if (c.n_experts == 0) fail(n + "has experts but the config has n_experts 0");
  if (L.experts.size() != static_cast<size_t>(c.n_experts))
    fail(n + "experts: " + std::to_string(L.experts.size()) + ", the config has " + std::to_string(c.n_experts));
  check_matrix(n + "router", L.router, c.n_experts, c.hidden, p);
  check_vec(n + "router.bias", L.router_bias, static_cast<size_t>(c.n_experts), true);
  check_vec(n + "e_score_correction_bias", L.expert_bias, static_cast<size_t>(c.n_experts), true);
  const bool fused = c.glu == Glu::GptOss || c.glu == Glu::Halves, relu2 = c.glu == Glu::Relu2;
  const int64_t gate_rows = fused ? 2 * static_cast<int64_t>(c.expert_inter) : c.expert_inter;
  for (size_t e = 0; e < L.experts.size(); ++e) {
    const Expert& x = L.experts[e];
    const std::string en = n + "expert " + std::to_string(e) + " ";
    if (relu2) {
      if (!absent(x.gate) || !x.bgate.empty()) fail(en + "gate_proj: a ReLU-squared expert (Nemotron-H's) has no gate");
    } else {
      check_matrix(en + (fused ? "gate_up_proj" : "gate_proj"), x.gate, gate_rows, c.hidden, p);
    }
    if (fused) {
      if (!absent(x.up)) fail(en + "up_proj: the up rows are in gate_up_proj (gpt-oss, Llama 4); pass no up matrix");
    } else {
      check_matrix(en + "up_proj", x.up, c.expert_inter, c.hidden, p);
    }
    check_matrix(en + "down_proj", x.down, c.hidden, c.expert_inter, p);
    check_vec(en + "gate bias", x.bgate, static_cast<size_t>(gate_rows), true);
    check_vec(en + "down bias", x.bdown, static_cast<size_t>(c.hidden), true);
  }
}

}  // namespace

void check_decoder(const DecoderConfig& c, const DecoderWeights& w, bool dedup_plans) {
  if (c.n_layers < 1 || c.hidden < 1 || c.n_heads < 1 || c.n_kv_heads < 1 || c.head_dim < 2 || c.inter < 1 ||
      c.vocab < 1 || c.max_ctx < 1)
    fail("decoder config: every dimension must be positive");
  if (c.windows.size() != static_cast<size_t>(c.n_layers)) fail("decoder config: windows must hold one value per layer");
  if (!c.nope.empty() && c.nope.size() != static_cast<size_t>(c.n_layers))
    fail("decoder config: nope must be empty or hold one value per layer");
  for (int win : c.windows)
    if (win < 0) fail("decoder config: a sliding window must be >= 0, got " + std::to_string(win));
  if (!c.chunks.empty() && c.chunks.size() != static_cast<size_t>(c.n_layers))
    fail("decoder config: chunks must be empty or hold one value per layer");
  for (size_t l = 0; l < c.chunks.size(); ++l)
    if (c.chunks[l] < 0 || (c.chunks[l] > 0 && c.windows[l] > 0))
      fail("decoder config: an attention chunk must be >= 0, and a layer has a chunk or a sliding window, not both");
  if (!(c.rope_scale > 0.f) || !std::isfinite(c.rope_scale)) fail("decoder config: rope_scale must be a positive number");
  if (!(c.attn_scale >= 0.f) || !std::isfinite(c.attn_scale)) fail("decoder config: attn_scale must be >= 0 and finite");
  if (!(c.embed_scale > 0.f) || !std::isfinite(c.embed_scale)) fail("decoder config: embed_scale must be a positive number");
  for (float cap : {c.attn_softcap, c.logit_softcap})
    if (!(cap >= 0.f) || !std::isfinite(cap)) fail("decoder config: a soft-cap must be >= 0 and finite");
  for (float s : {c.residual_scale, c.logits_scaling})
    if (!(s > 0.f) || !std::isfinite(s)) fail("decoder config: residual_scale and logits_scaling must be positive numbers");
  if (!(c.attn_temp_scale >= 0.f) || !std::isfinite(c.attn_temp_scale))
    fail("decoder config: attn_temp_scale must be >= 0 and finite");
  if (c.attn_temp_scale != 0.f && c.attn_temp_floor < 1)
    fail("decoder config: attn_temp_floor must be positive where attn_temp_scale is set");
  if (!(c.attn_temp_offset >= 0.f) || !std::isfinite(c.attn_temp_offset))
    fail("decoder config: attn_temp_offset must be >= 0 and finite");
  if (c.qk_l2_norm && (c.kv_lora > 0 || c.qk_norm_full))
    fail("decoder config: qk_l2_norm is Llama 4's per-head norm; not with latent attention or whole-projection norms");
  if (c.qk_norm_after_rope && (c.kv_lora > 0 || c.qk_norm_full || c.qk_l2_norm))
    fail("decoder config: qk_norm_after_rope is HunYuan's per-head norm after RoPE; not with latent attention, "
         "whole-projection norms or Llama 4's norm");
  if (!(c.clip_qkv >= 0.f) || !std::isfinite(c.clip_qkv) || (c.clip_qkv > 0.f && c.kv_lora > 0))
    fail("decoder config: clip_qkv must be >= 0 and finite, and clamps q, k and v projections (not latent "
         "attention's)");
  if (c.parallel_block && (!c.pre_norms || c.n_experts > 0))
    fail("decoder config: parallel_block is Cohere's dense layer with its input norm; not without pre-norms or "
         "with experts");
  if (c.n_experts < 0) fail("decoder config: n_experts must be >= 0");
  if (c.n_experts > 0) {
    if (c.top_k < 1 || c.top_k > c.n_experts)
      fail("decoder config: top_k " + std::to_string(c.top_k) + " is outside 1..n_experts (" +
           std::to_string(c.n_experts) + ")");
    if (c.expert_inter < 1) fail("decoder config: expert_inter must be positive");
    if (c.weight_before && c.glu == Glu::GptOss)
      fail("decoder config: weight_before is Llama 4's SiLU experts'; gpt-oss weights their outputs");
    if (c.glu == Glu::GptOss && (!(c.swiglu_limit > 0.f) || !std::isfinite(c.swiglu_limit)))
      fail("decoder config: swiglu_limit must be a positive number, got " + std::to_string(c.swiglu_limit));
    if (!std::isfinite(c.swiglu_alpha)) fail("decoder config: swiglu_alpha must be finite");
  }
  if (c.shared_inter < 0 || (c.shared_inter > 0 && c.n_experts == 0))
    fail("decoder config: shared_inter must be 0, or positive in a model with experts");
  if (!(c.routed_scale > 0.f) || !std::isfinite(c.routed_scale)) fail("decoder config: routed_scale must be a positive number");
  if (c.n_group < 1 || c.topk_group < 1 || c.topk_group > c.n_group)
    fail("decoder config: topk_group must be within 1..n_group");
  if (c.n_group > 1 && (!c.sigmoid_gating || c.n_experts % c.n_group != 0 || c.n_experts / c.n_group < 2 ||
                        c.top_k > c.topk_group * (c.n_experts / c.n_group)))
    fail("decoder config: groups of experts (n_group > 1) are sigmoid gating's, of 2 or more experts each, and "
         "the kept groups hold at least top_k of them");
  if (c.head_dim % 2) fail("decoder config: head_dim must be even for RoPE, got " + std::to_string(c.head_dim));
  if (c.n_heads % c.n_kv_heads)
    fail("decoder config: num_attention_heads (" + std::to_string(c.n_heads) +
         ") is not a multiple of num_key_value_heads (" + std::to_string(c.n_kv_heads) + ")");
  if (c.inv_freq.empty() || c.inv_freq.size() > static_cast<size_t>(c.head_dim / 2))
    fail("decoder config: inv_freq must hold 1 to head_dim/2 values (the rotated dims' half)");
  if (!c.inv_freq_swa.empty() && c.inv_freq_swa.size() != c.inv_freq.size())
    fail("decoder config: inv_freq_swa must be empty or hold as many values as inv_freq");
  const bool mla = c.kv_lora > 0;
  const int rot = c.rotary_dim(), vd = c.value_dim();
  if (c.q_lora < 0 || c.kv_lora < 0 || c.v_head_dim < 0 || (c.q_lora > 0 && !mla))
    fail("decoder config: q_lora, kv_lora and v_head_dim must be >= 0, q_lora only with kv_lora");
  if (mla && (c.n_kv_heads != c.n_heads || rot >= c.head_dim || c.qk_norm_full))
    fail("decoder config: multi-head latent attention decompresses a key and a value per head (n_kv_heads = "
         "n_heads), each key with unrotated dims after its rotary ones, and has no q/k norms");
  if (!mla && vd != c.head_dim) fail("decoder config: v_head_dim differs from head_dim only with latent attention");
  if (mla && c.k_cache != c.v_cache)
    fail("decoder config: latent attention caches one latent for keys and values: the K and V cache types must match");
  for (WType t : {c.k_cache, c.v_cache})
    if (t != WType::F32 && t != WType::F16)
      fail(std::string("decoder config: a KV cache holds f32 or f16, not ") + wtype_info(t).name);
  const bool any_linear = std::any_of(c.linear.begin(), c.linear.end(), [](uint8_t f) { return f != 0; });
  if (!c.linear.empty() && c.linear.size() != static_cast<size_t>(c.n_layers))
    fail("decoder config: linear must be empty or hold one value per layer");
  if (any_linear) {
    if (c.lin_k_heads < 1 || c.lin_v_heads < 1 || c.lin_k_dim < 1 || c.lin_v_dim < 1 || c.lin_conv < 1 ||
        c.lin_v_heads % c.lin_k_heads)
      fail("decoder config: linear attention needs positive head counts and dims, a convolution of 1 or more "
           "taps, and value heads a multiple of key heads");
    if (2 * static_cast<int64_t>(c.lin_k_heads) * c.lin_k_dim + static_cast<int64_t>(c.lin_v_heads) * c.lin_v_dim >
        INT32_MAX)
      fail("decoder config: linear attention's q, k and v are more than 2^31 - 1 channels");
    if (mla || !c.pre_norms || c.parallel_block)
      fail("decoder config: linear-attention layers are Qwen3.5's: not with latent attention, OLMo 2's or Cohere's "
           "layers");
  }
  const bool any_conv = std::any_of(c.short_conv.begin(), c.short_conv.end(), [](uint8_t f) { return f != 0; });
  if (!c.short_conv.empty() && c.short_conv.size() != static_cast<size_t>(c.n_layers))
    fail("decoder config: short_conv must be empty or hold one value per layer");
  if (any_conv) {
    if (c.conv_taps < 1 || c.conv_taps > 64) fail("decoder config: a short convolution has 1 to 64 taps");
    if (any_linear || mla || !c.pre_norms || c.parallel_block)
      fail("decoder config: short-convolution layers are LFM2's: not beside linear attention, nor with latent "
           "attention, OLMo 2's or Cohere's layers");
    if (3 * static_cast<int64_t>(c.hidden) > INT32_MAX) fail("decoder config: hidden is too wide for conv_in");
  }
  const bool any_ssm = std::any_of(c.ssm.begin(), c.ssm.end(), [](uint8_t f) { return f != 0; });
  if (!c.ssm.empty() && c.ssm.size() != static_cast<size_t>(c.n_layers))
    fail("decoder config: ssm must be empty or hold one value per layer");
  if (any_ssm) {
    if (c.ssm_heads < 1 || c.ssm_head_dim < 1 || c.ssm_state < 1 || c.ssm_groups < 1 || c.ssm_heads % c.ssm_groups ||
        c.ssm_conv < 1 || c.ssm_conv > 64)
      fail("decoder config: a Mamba2 layer needs positive heads, head and state dims, heads a multiple of its "
           "groups, and a convolution of 1 to 64 taps");
    if (2 * static_cast<int64_t>(c.ssm_heads) * c.ssm_head_dim + 2 * static_cast<int64_t>(c.ssm_groups) * c.ssm_state +
            c.ssm_heads > INT32_MAX)
      fail("decoder config: a Mamba2 layer's in_proj has more than 2^31 - 1 rows");
    if (any_linear || any_conv || mla || !c.pre_norms || c.parallel_block)
      fail("decoder config: Mamba2 layers are Granite 4's and Nemotron-H's: not beside linear attention or short convolutions, nor "
           "with latent attention, OLMo 2's or Cohere's layers");
  }
  if (c.attn_gate && mla) fail("decoder config: attn_gate is Qwen3.5's gated attention; not with latent attention");
  const bool any_ssm1 = std::any_of(c.ssm1.begin(), c.ssm1.end(), [](uint8_t f) { return f != 0; });
  if (!c.ssm1.empty() && c.ssm1.size() != static_cast<size_t>(c.n_layers))
    fail("decoder config: ssm1 must be empty or hold one value per layer");
  if (any_ssm1) {
    if (c.ssm1_inner < 1 || c.ssm1_rank < 1 || c.ssm_state < 1 || c.ssm_conv < 1 || c.ssm_conv > 64 ||
        (c.ssm1_norms && (!(c.ssm1_eps > 0.f) || !std::isfinite(c.ssm1_eps))))
      fail("decoder config: a Mamba 1 layer needs positive channels, time-step rank and state dims, a convolution of "
           "1 to 64 taps, and a positive eps where it norms dt, B and C");
    if (2 * static_cast<int64_t>(c.ssm1_inner) > INT32_MAX ||
        static_cast<int64_t>(c.ssm1_rank) + 2 * static_cast<int64_t>(c.ssm_state) > INT32_MAX)
      fail("decoder config: a Mamba 1 layer's in_proj or x_proj has more than 2^31 - 1 rows");
    if (any_linear || any_conv || any_ssm || mla || !c.pre_norms || c.parallel_block || c.ssm_attends)
      fail("decoder config: Mamba 1 layers are Mamba's and Falcon Mamba's: not beside linear attention, short "
           "convolutions or Mamba2, nor with latent attention, OLMo 2's or Cohere's layers");
  }
  if (c.ssm_attends && (!any_ssm || !c.mlp_only.empty() || !c.mixer_only.empty() || c.n_experts > 0 || c.attn_gate))
    fail("decoder config: ssm_attends is Falcon-H1's layer (Mamba2 beside attention, then a dense MLP): it needs "
         "ssm layers, and not Nemotron-H's blocks, experts or gated attention");
  const auto factor = [](float m) { return std::isfinite(m) && m != 0.f; };
  for (float m : {c.q_mult, c.k_mult, c.v_mult, c.o_mult, c.ssm_out_mult, c.gate_mult, c.down_mult})
    if (!factor(m)) fail("decoder config: the muP multipliers must be finite and nonzero");
  if (!c.ssm_in_mults.empty() &&
      (c.ssm_in_mults.size() != 5 || !any_ssm || !std::all_of(c.ssm_in_mults.begin(), c.ssm_in_mults.end(), factor)))
    fail("decoder config: ssm_in_mults must be empty or five finite nonzero factors (z, x, B, C, dt) of a model with "
         "Mamba2 layers");
  if ((c.gate_mult != 1.f && !c.mlp_gated) || (c.ssm_out_mult != 1.f && !c.ssm_attends))
    fail("decoder config: gate_mult needs a gated MLP, ssm_out_mult Falcon-H1's layer (ssm_attends)");
  for (const std::vector<uint8_t>* v : {&c.mlp_only, &c.mixer_only})
    if (!v->empty() && v->size() != static_cast<size_t>(c.n_layers))
      fail("decoder config: mlp_only and mixer_only must be empty or hold one value per layer");
  for (int l = 0; l < c.n_layers; ++l)
    if (!c.has_mixer(l) && (!c.has_mlp(l) || c.recurrent(l)))
      fail("decoder config: layer " + std::to_string(l) + " is its MLP alone (mlp_only) but also has no MLP "
           "(mixer_only) or a recurrent mixer");
  if ((!c.mlp_only.empty() || !c.mixer_only.empty()) && (mla || !c.pre_norms || c.parallel_block))
    fail("decoder config: blocks of a mixer or an MLP alone are Nemotron-H's: not with latent attention, OLMo 2's or "
         "Cohere's layers");
  if (c.mlp_act == MlpAct::Relu2 && c.mlp_gated) fail("decoder config: a ReLU-squared MLP has no gate (mlp_gated false)");
  if (c.mlp_act == MlpAct::Xielu && (c.mlp_gated || c.n_experts > 0))
    fail("decoder config: xIELU is a dense MLP's unit without a gate (mlp_gated false, no experts)");
  if (w.layers.size() != static_cast<size_t>(c.n_layers)) fail("decoder weights: layer count differs from the config");
  const int64_t q_dim = static_cast<int64_t>(c.n_heads) * c.head_dim, kv_dim = static_cast<int64_t>(c.n_kv_heads) * c.head_dim;
  const int64_t o_dim = static_cast<int64_t>(c.n_heads) * vd;
  const bool p = dedup_plans;
  check_matrix("embed_tokens", w.embed, c.vocab, c.hidden, p);
  check_matrix("lm_head", w.lm_head, c.vocab, c.hidden, p);
  check_vec("norm", w.final_norm, c.hidden);
  check_vec("norm bias", w.final_norm_b, c.hidden, true);
  check_vec("lm_head bias", w.lm_head_b, c.vocab, true);
  if (!c.layer_norm && !w.final_norm_b.empty()) fail("norm bias: an RMSNorm has no bias (LayerNorm's: layer_norm)");
  for (int l = 0; l < c.n_layers; ++l) {
    const LayerWeights& L = w.layers[l];
    const std::string n = "layer " + std::to_string(l) + " ";
    const bool mixes = c.has_mixer(l), has_mlp = c.has_mlp(l);
    if (c.pre_norms) {
      check_vec(n + "input_layernorm", L.attn_norm, c.hidden, !mixes);
      if (!mixes && !L.attn_norm.empty()) fail(n + "input_layernorm: the layer is its MLP alone (mlp_only)");
      if (!has_mlp && !L.mlp_norm.empty()) fail(n + "post_attention_layernorm: the layer has no MLP (mixer_only)");
      if (c.parallel_block && !L.mlp_norm.empty())
        fail(n + "post_attention_layernorm: a parallel layer (Cohere) norms its input once, for both blocks");
      if (!c.parallel_block && has_mlp) check_vec(n + "post_attention_layernorm", L.mlp_norm, c.hidden);
    } else if (!L.attn_norm.empty() || !L.mlp_norm.empty() || L.attn_post_norm.empty() || L.mlp_post_norm.empty()) {
      fail(n + "norms: a layer without pre-norms (OLMo 2) has the attention's and the MLP's output norms alone");
    }
    check_vec(n + "input_layernorm bias", L.attn_norm_b, c.hidden, true);
    check_vec(n + "post_attention_layernorm bias", L.mlp_norm_b, c.hidden, true);
    if ((!L.attn_norm_b.empty() && L.attn_norm.empty()) || (!L.mlp_norm_b.empty() && L.mlp_norm.empty()) ||
        (!c.layer_norm && (!L.attn_norm_b.empty() || !L.mlp_norm_b.empty())))
      fail(n + "norm biases: a bias belongs to a LayerNorm (layer_norm) the layer has");
    check_vec(n + "attention output norm", L.attn_post_norm, c.hidden, true);
    check_vec(n + "MLP output norm", L.mlp_post_norm, c.hidden, true);
    const bool conv = !c.short_conv.empty() && c.short_conv[l];
    if (!conv && (!absent(L.conv_in) || !L.conv_w.empty()))
      fail(n + "conv: the layer has attention (the config's short_conv is 0 for it)");
    const bool ssm = !c.ssm.empty() && c.ssm[l], ssm1 = !c.ssm1.empty() && c.ssm1[l];
    if (!ssm && !ssm1 && (!absent(L.ssm_in) || !L.ssm_conv_w.empty() || !L.ssm_conv_b.empty() || !L.ssm_dt.empty() ||
                          !L.ssm_a.empty() || !L.ssm_d.empty() || !L.ssm_norm.empty()))
      fail(n + "mamba: the layer has attention (the config's ssm is 0 for it)");
    if (!ssm1 && (!absent(L.ssm_x) || !absent(L.ssm_dt_w)))
      fail(n + "mixer.x_proj, mixer.dt_proj: Mamba 1's (the config's ssm1 is 0 for the layer)");
    const bool lin = !c.linear.empty() && c.linear[l];
    if (!absent(L.q_gate) && (ssm || conv || lin || !mixes || mla))
      fail(n + "self_attn.gate_proj: AFMoE's attention gate is an attention layer's (not latent attention's)");
    if (!lin && (!absent(L.lin_qkv) || !absent(L.lin_z) || !absent(L.lin_b) || !absent(L.lin_a) ||
                 !L.lin_conv.empty() || !L.lin_dt.empty() || !L.lin_decay.empty() || !L.lin_norm.empty()))
      fail(n + "linear_attn: the layer has attention (the config's linear is 0 for it)");
    if ((!ssm || !c.ssm_attends) && !absent(L.ssm_out))
      fail(n + "mamba.out_proj: a Mamba2 layer's out_proj is o here (Falcon-H1's alone has both: ssm_attends)");
    if (ssm) {
      const int64_t inner = static_cast<int64_t>(c.ssm_heads) * c.ssm_head_dim;
      const int64_t ch = inner + 2 * static_cast<int64_t>(c.ssm_groups) * c.ssm_state;
      check_matrix(n + "mamba.in_proj", L.ssm_in, inner + ch + c.ssm_heads, c.hidden, p);
      check_vec(n + "mamba.conv1d.weight", L.ssm_conv_w, checked_mul(static_cast<size_t>(ch),
                                                                     static_cast<size_t>(c.ssm_conv), "conv1d"));
      check_vec(n + "mamba.conv1d.bias", L.ssm_conv_b, static_cast<size_t>(ch));
      check_vec(n + "mamba.dt_bias", L.ssm_dt, static_cast<size_t>(c.ssm_heads));
      check_vec(n + "mamba.A_log", L.ssm_a, static_cast<size_t>(c.ssm_heads));
      check_vec(n + "mamba.D", L.ssm_d, static_cast<size_t>(c.ssm_heads));
      if (!c.ssm_attends || !L.ssm_norm.empty()) check_vec(n + "mamba.norm", L.ssm_norm, static_cast<size_t>(inner));
      check_matrix(n + "mamba.out_proj", c.ssm_attends ? L.ssm_out : L.o, c.hidden, inner, p);
    }
    if (ssm1) {
      const int64_t D = c.ssm1_inner, N = c.ssm_state;
      check_matrix(n + "mixer.in_proj", L.ssm_in, 2 * D, c.hidden, p);
      check_vec(n + "mixer.conv1d.weight", L.ssm_conv_w, checked_mul(static_cast<size_t>(D),
                                                                     static_cast<size_t>(c.ssm_conv), "conv1d"));
      check_vec(n + "mixer.conv1d.bias", L.ssm_conv_b, static_cast<size_t>(D));
      check_matrix(n + "mixer.x_proj", L.ssm_x, c.ssm1_rank + 2 * N, D, p);
      check_matrix(n + "mixer.dt_proj", L.ssm_dt_w, D, c.ssm1_rank, p);
      check_vec(n + "mixer.dt_proj.bias", L.ssm_dt, static_cast<size_t>(D));
      check_vec(n + "mixer.A_log", L.ssm_a, checked_mul(static_cast<size_t>(D), static_cast<size_t>(N), "A_log"));
      check_vec(n + "mixer.D", L.ssm_d, static_cast<size_t>(D));
      check_matrix(n + "mixer.out_proj", L.o, c.hidden, D, p);
      if (!absent(L.q) || !absent(L.k) || !absent(L.v) || !L.bq.empty() || !L.bk.empty() || !L.bv.empty() ||
          !L.bo.empty() || !L.q_norm.empty() || !L.k_norm.empty() || !L.sinks.empty() || !L.ssm_norm.empty())
        fail(n + "self_attn: a Mamba 1 layer has no attention projections, biases, norms or sinks, nor a gated norm");
    } else if (ssm && !c.ssm_attends) {
      if (!absent(L.q) || !absent(L.k) || !absent(L.v) || !L.bq.empty() || !L.bk.empty() || !L.bv.empty() ||
          !L.bo.empty() || !L.q_norm.empty() || !L.k_norm.empty() || !L.sinks.empty())
        fail(n + "self_attn: a Mamba2 layer has no attention projections, biases, norms or sinks");
    } else if (conv) {
      check_matrix(n + "conv.in_proj", L.conv_in, 3 * static_cast<int64_t>(c.hidden), c.hidden, p);
      check_vec(n + "conv.conv", L.conv_w, checked_mul(static_cast<size_t>(c.hidden), static_cast<size_t>(c.conv_taps),
                                                       "conv"));
      check_matrix(n + "conv.out_proj", L.o, c.hidden, c.hidden, p);
      if (!absent(L.q) || !absent(L.k) || !absent(L.v) || !L.bq.empty() || !L.bk.empty() || !L.bv.empty() ||
          !L.bo.empty() || !L.q_norm.empty() || !L.k_norm.empty() || !L.sinks.empty())
        fail(n + "self_attn: a short-convolution layer has no attention projections, biases, norms or sinks");
    } else if (lin) {
      const int64_t kd = static_cast<int64_t>(c.lin_k_heads) * c.lin_k_dim;
      const int64_t vdim = static_cast<int64_t>(c.lin_v_heads) * c.lin_v_dim;
      check_matrix(n + "linear_attn.in_proj_qkv", L.lin_qkv, 2 * kd + vdim, c.hidden, p);
      check_matrix(n + "linear_attn.in_proj_z", L.lin_z, vdim, c.hidden, p);
      check_matrix(n + "linear_attn.in_proj_b", L.lin_b, c.lin_v_heads, c.hidden, p);
      check_matrix(n + "linear_attn.in_proj_a", L.lin_a, c.lin_v_heads, c.hidden, p);
      check_vec(n + "linear_attn.conv1d", L.lin_conv, checked_mul(static_cast<size_t>(2 * kd + vdim),
                                                                  static_cast<size_t>(c.lin_conv), "conv1d"));
      check_vec(n + "linear_attn.dt_bias", L.lin_dt, static_cast<size_t>(c.lin_v_heads));
      check_vec(n + "linear_attn.A_log", L.lin_decay, static_cast<size_t>(c.lin_v_heads));
      check_vec(n + "linear_attn.norm", L.lin_norm, static_cast<size_t>(c.lin_v_dim));
      check_matrix(n + "linear_attn.out_proj", L.o, c.hidden, vdim, p);
      if (!absent(L.q) || !absent(L.k) || !absent(L.v) || !L.bq.empty() || !L.bk.empty() || !L.bv.empty() ||
          !L.bo.empty() || !L.q_norm.empty() || !L.k_norm.empty() || !L.sinks.empty())
        fail(n + "self_attn: a linear-attention layer has no attention projections, biases, norms or sinks");
    } else if (!mixes) {
      if (!absent(L.q) || !absent(L.k) || !absent(L.v) || !absent(L.o) || !L.bq.empty() || !L.bk.empty() ||
          !L.bv.empty() || !L.bo.empty() || !L.q_norm.empty() || !L.k_norm.empty() || !L.sinks.empty() ||
          !absent(L.q_a) || !absent(L.kv_a) || !absent(L.kv_b))
        fail(n + "self_attn: the layer is its MLP alone (mlp_only): no attention weights");
    } else if (mla) {
      check_matrix(n + (c.q_lora > 0 ? "q_b_proj" : "q_proj"), L.q, q_dim, c.q_lora > 0 ? c.q_lora : c.hidden, p);
      if (c.q_lora > 0) check_matrix(n + "q_a_proj", L.q_a, c.q_lora, c.hidden, p);
      check_vec(n + "q_a_layernorm", L.q_a_norm, static_cast<size_t>(c.q_lora), c.q_lora == 0);
      check_matrix(n + "kv_a_proj_with_mqa", L.kv_a, static_cast<int64_t>(c.kv_lora) + rot, c.hidden, p);
      check_vec(n + "kv_a_layernorm", L.kv_a_norm, static_cast<size_t>(c.kv_lora));
      check_matrix(n + "kv_b_proj", L.kv_b, static_cast<int64_t>(c.n_heads) * (c.head_dim - rot + vd), c.kv_lora, p);
      if (L.kv_b.data == nullptr) fail(n + "kv_b_proj: latent attention reads it per head; pass its bytes, not a dedup member");
      if (!absent(L.k) || !absent(L.v) || (c.q_lora == 0 && !absent(L.q_a)))
        fail(n + "k_proj, v_proj: latent attention computes k and v from kv_a_proj_with_mqa and kv_b_proj");
      if (!L.bq.empty() || !L.bk.empty() || !L.bv.empty() || !L.q_norm.empty() || !L.sinks.empty())
        fail(n + "latent attention has no q/k/v biases, q/k norms or sinks");
    } else {
      check_matrix(n + "q_proj", L.q, c.attn_gate ? 2 * q_dim : q_dim, c.hidden, p);
      if (!absent(L.q_gate)) {
        if (c.attn_gate) fail(n + "self_attn.gate_proj: the gates are q_proj's rows here (attn_gate)");
        check_matrix(n + "self_attn.gate_proj", L.q_gate, q_dim, c.hidden, p);
      }
      check_matrix(n + "k_proj", L.k, kv_dim, c.hidden, p);
      check_matrix(n + "v_proj", L.v, kv_dim, c.hidden, p);
      if (!absent(L.q_a) || !absent(L.kv_a) || !absent(L.kv_b) || !L.q_a_norm.empty() || !L.kv_a_norm.empty())
        fail(n + "q_a_proj, kv_a_proj_with_mqa, kv_b_proj: latent attention's (the config has kv_lora 0)");
    }
    if (!lin && !conv && !ssm1 && (!ssm || c.ssm_attends) && mixes) check_matrix(n + "o_proj", L.o, c.hidden, o_dim, p);
    const bool gated = c.mlp_gated;
    if (!has_mlp) {
      if (!absent(L.gate) || !absent(L.up) || !absent(L.down) || !absent(L.shared_gate) || !L.experts.empty() ||
          !absent(L.router) || !L.mlp_post_norm.empty())
        fail(n + "mlp: the layer has no MLP (mixer_only)");
    } else if (L.experts.empty()) {
      if (gated)
        check_matrix(n + "gate_proj", L.gate, c.inter, c.hidden, p);
      else if (!absent(L.gate))
        fail(n + "gate_proj: the config's MLP has no gate (mlp_gated false)");
      check_matrix(n + "up_proj", L.up, c.inter, c.hidden, p);
      check_matrix(n + "down_proj", L.down, c.hidden, c.inter, p);
      if (!absent(L.shared_gate)) fail(n + "shared_expert_gate: a dense layer has no shared expert");
    } else {
      check_experts(c, L, n, p);
      if (c.shared_inter > 0) {
        if (gated)
          check_matrix(n + "shared_expert.gate_proj", L.gate, c.shared_inter, c.hidden, p);
        else if (!absent(L.gate))
          fail(n + "shared_expert.gate_proj: the config's MLP has no gate (mlp_gated false)");
        check_matrix(n + "shared_expert.up_proj", L.up, c.shared_inter, c.hidden, p);
        check_matrix(n + "shared_expert.down_proj", L.down, c.hidden, c.shared_inter, p);
        if (!absent(L.shared_gate)) check_matrix(n + "shared_expert_gate", L.shared_gate, 1, c.hidden, p);
      } else if (!absent(L.gate) || !absent(L.up) || !absent(L.down) || !absent(L.shared_gate)) {
        fail(n + "shared expert: the config has none (shared_inter 0)");
      }
    }
    check_vec(n + "q_proj.bias", L.bq, q_dim, true);
    if (c.attn_gate && !L.bq.empty()) fail(n + "q_proj.bias: gated attention's q_proj has none here");
    check_vec(n + "k_proj.bias", L.bk, kv_dim, true);
    check_vec(n + "v_proj.bias", L.bv, kv_dim, true);
    check_vec(n + "o_proj.bias", L.bo, c.hidden, true);
    check_vec(n + "up_proj.bias", L.bup, static_cast<size_t>(c.inter), true);
    check_vec(n + "down_proj.bias", L.bdown, c.hidden, true);
    if ((!L.bup.empty() || !L.bdown.empty()) && (!L.experts.empty() || !has_mlp))
      fail(n + "MLP biases: a dense MLP's alone (the layer has experts or no MLP)");
    check_vec(n + "q_norm", L.q_norm, c.qk_norm_full ? q_dim : c.head_dim, true);
    check_vec(n + "k_norm", L.k_norm, c.qk_norm_full ? kv_dim : c.head_dim, true);
    if (L.q_norm.empty() != L.k_norm.empty()) fail(n + "q_norm and k_norm: one without the other");
    check_vec(n + "sinks", L.sinks, c.n_heads, true);
    const bool xielu = c.mlp_act == MlpAct::Xielu && has_mlp;
    for (const auto& [what, v] : {std::pair{"alpha_p", &L.xielu_alpha_p}, std::pair{"alpha_n", &L.xielu_alpha_n},
                                  std::pair{"beta", &L.xielu_beta}, std::pair{"eps", &L.xielu_eps}}) {
      const std::string name = n + "mlp.act_fn." + what;
      check_vec(name, *v, 1, !xielu);
      if (!xielu && !v->empty()) fail(name + ": the layer's MLP is not xIELU (mlp_act)");
      if (!v->empty() && !std::isfinite((*v)[0])) fail(name + ": not finite");
    }
  }
}

// A dense model's int8 prefill chunk: 64 tokens (gemv.h). 256 was 6-10%
// slower on the widened SmolLM2's Q4_K_M (pp512, 2 threads, taking turns).
// A model with experts takes kMaxRows8Batch (512), so that each expert
// gets more of a chunk's tokens (32 experts, top 4: about 64 instead of 8)
// and packs its tiles once for them: pp512 of 4 gpt-oss-20b layers, 2
// threads, taking turns: 64 -> 256 tokens 103 -> 212 and 125 -> 245 tok/s,
// 256 -> 512 176 -> 214 and 202 -> 279 (kPrefillBatch).
constexpr int kDenseRows8Chunk = 64;
static_assert(kMaxRows8Batch <= kPrefillBatch, "an int8 chunk fits the decoder's activation buffers");

Decoder::Decoder(DecoderConfig cfg, DecoderWeights w, Act act, int threads, Isa isa, const std::string& affinity,
                 bool copy_experts, bool grow_copies)
    : cfg_(std::move(cfg)), w_(std::move(w)), act_(act), isa_(isa) {
  const DecoderConfig& c = cfg_;
  check_decoder(c, w_, /*dedup_plans=*/true);
  pool_ = std::make_unique<ThreadPool>(threads);  // checks the count
  if (!affinity.empty()) pinned_ = pin_threads(*pool_, affinity);
  const bool mla = c.kv_lora > 0;
  const int rot = c.rotary_dim();
  hd_ = mla ? c.kv_lora + rot : c.head_dim;
  vd_ = mla ? c.kv_lora : c.value_dim();
  kv_heads_ = mla ? 1 : c.n_kv_heads;
  q_dim_ = c.n_heads * hd_;
  kv_dim_ = kv_heads_ * hd_;
  v_dim_ = mla ? 0 : kv_heads_ * vd_;  // (latent attention's values: its keys' latent part, cached once)
  o_dim_ = c.n_heads * vd_;
  o_in_ = c.n_heads * c.value_dim();
  if (mla) {  // kv_b_proj per head, as float32: its key rows as they are, its value rows transposed
    const int nope = c.head_dim - rot, vh = c.value_dim();
    const size_t nh = static_cast<size_t>(c.n_heads), kvl = static_cast<size_t>(c.kv_lora);
    std::vector<float> row(kvl);
    for (const LayerWeights& L : w_.layers) {
      AlignedArray<float>& kb = mla_kb_.emplace_back(checked_mul(nh * kvl, static_cast<size_t>(nope), "kv_b_proj"), false);
      AlignedArray<float>& vbt = mla_vbt_.emplace_back(checked_mul(nh * kvl, static_cast<size_t>(vh), "kv_b_proj"), false);
      for (size_t h = 0; h < nh; ++h)
        for (int r = 0; r < nope + vh; ++r) {
          dequantize_row(L.kv_b.spec, L.kv_b.data, static_cast<int64_t>(h * (nope + vh) + r), row.data());
          if (r < nope)
            std::copy(row.begin(), row.end(), kb.data() + (h * nope + r) * kvl);
          else
            for (size_t i = 0; i < kvl; ++i) vbt.data()[(h * kvl + i) * vh + (r - nope)] = row[i];
        }
      page_out(L.kv_b.data, weight_nbytes(L.kv_b.spec));
    }
  }
  if (w_.embed.dedup) fail("embed_tokens: pass the rebuilt bytes (rows are read one token at a time)");
  // Every dense matrix is read from a copy made here, in memory that takes
  // transparent huge pages (aligned.h: streaming through 4 KiB pages costs
  // a page walk every 64 lines): the row-interleaved rows8 copy where the
  // int8 GEMV has that kernel, else the stored bytes as they are (float
  // types, act=f32, an ISA without the kernel). A tied head's copy serves
  // the embedding's rows too (an embedding is otherwise read in place, a
  // row per token). Experts get rows8 copies only with copy_experts: each
  // token reads only top_k of them, so in place the mapped file pages in the
  // experts a prompt uses and no more, and a model larger than memory still
  // runs; copied, the whole model is resident, and a Qwen3-MoE-shaped
  // Q4_K_M decodes 1.74x faster on AVX2 (its stored-layout expert kernels
  // took 1.6-2.0x the tiles' time per byte, docs/benchmarks.md). Python's
  // Decoder copies them where the machine has the memory. (Experts without
  // the rows8 kernel stay in place: a copy of the stored bytes would not be
  // read faster.) The stored bytes are then not read again: their pages,
  // touched once by the copying, are handed back (MADV_PAGEOUT: dropped
  // from this process's resident set, contents kept), so a copy does not
  // double the RSS. The codebook types' rows8 copies are larger than their
  // stored bytes (4.25 bits a weight: iq2_xxs's twice its 2.06); without
  // grow_copies (Python's Decoder: where they would not fit in memory) those
  // matrices keep their stored layout, read by its slower kernels.
  auto make_resident = [&](Matrix& m) {
    if (m.data == nullptr || m.dedup) return;
    const uint8_t* stored = m.data;
    const size_t n = weight_nbytes(m.spec);
    if (gemv_uses_rows8(m.spec, act_, isa_) && (grow_copies || rows8_nbytes(m.spec) <= n)) {
      m.rows8 = std::make_shared<const Rows8>(pack_rows8(m.spec, stored, *pool_));
      rows8_bytes_ += m.rows8->bytes.size();
    } else {
      AlignedArray<uint8_t> copy(n, /*zero=*/false);
      std::memcpy(copy.data(), stored, n);
      if (w_.embed.data == stored) w_.embed.data = copy.data();
      m.data = copy.data();
      copies_.push_back(std::move(copy));
    }
    page_out(stored, n);
  };
  for (LayerWeights& L : w_.layers)
    for (Matrix* m : L.streamed()) make_resident(*m);
  if (copy_experts)  // only into rows8: a copy of an expert's stored bytes would not be read faster
    for (LayerWeights& L : w_.layers)
      for (Expert& x : L.experts)
        for (Matrix* m : {&x.gate, &x.up, &x.down})
          if (gemv_uses_rows8(m->spec, act_, isa_)) {
            make_resident(*m);
            experts_copied_ = experts_copied_ || m->rows8 != nullptr;
          }
  make_resident(w_.lm_head);
  // int8 prefill chunks of kDenseRows8Chunk tokens where every quantized
  // matrix is read through its rows8 copy; kMaxRows8Batch where some are
  // read in place (experts, and dense matrices whose larger copies did not
  // fit) and packed into rows8 tiles as they are multiplied (packs), so
  // that each packing serves more tokens (iq2_xs's 2048-wide Llama without
  // its copies, 2 threads, pp128: 64 -> 128 tokens 54 -> 69 tok/s); else
  // kMaxBatch, what the stored-layout GEMV takes (a dedup member, an ISA
  // without the rows8 kernel), so that no chunk falls back to the float GEMM.
  if (act_ == Act::Int8) {
    auto packable_or_float = [&](const Matrix& m) {
      return !m.dedup && (gemv_uses_rows8(m.spec, act_, isa_) || !wtype_info(m.spec.type).int8_act);
    };
    auto packed = [&](const Matrix& m) { return packs(m, kMaxRows8Batch); };  // in a full chunk
    bool all = packable_or_float(w_.lm_head), packing = packed(w_.lm_head);
    for (LayerWeights& L : w_.layers) {
      for (const Matrix* m : L.streamed()) all = all && packable_or_float(*m), packing = packing || packed(*m);
      for (const Expert& x : L.experts)
        for (const Matrix* m : {&x.gate, &x.up, &x.down}) all = all && packable_or_float(*m);
      packing = packing || !L.experts.empty();
    }
    if (all) int8_chunk_ = packing ? kMaxRows8Batch : kDenseRows8Chunk;
  }
  // (the layers with attention alone: a linear-attention layer keeps its states instead)
  std::vector<int> slot(static_cast<size_t>(c.n_layers), -1);
  int cached = 0;
  for (int l = 0; l < c.n_layers; ++l)
    if (c.attends(l)) slot[l] = cached++;
  const size_t positions = checked_mul(static_cast<size_t>(cached), static_cast<size_t>(c.max_ctx), "KV cache");
  // (latent attention's values are its keys' latent part: no V cache of their own)
  for (auto [half, type, dim] : {std::tuple{&k_cache_, c.k_cache, hd_}, std::tuple{&v_cache_, c.v_cache, v_dim_ / kv_heads_}}) {
    half->slot = slot;
    half->type = type;
    half->heads = kv_heads_;
    half->dim = dim;
    const size_t n = checked_mul(positions, static_cast<size_t>(kv_heads_) * static_cast<size_t>(dim), "KV cache");
    half->bytes = ZeroPages<uint8_t>(checked_mul(n, half->elem(), "KV cache"));
  }
  const size_t B = kPrefillBatch;
  x_.resize(B * c.hidden);
  const size_t mlp = static_cast<size_t>(std::max(c.inter, c.shared_inter));  // a dense MLP's or the shared expert's
  xn_.resize(B * std::max(static_cast<size_t>(c.hidden), mlp));
  if (c.parallel_block || c.ssm_attends) par_.resize(B * c.hidden);
  q_.resize(B * q_dim_);
  k_.resize(B * kv_dim_);
  v_.resize(B * v_dim_);
  if (!c.linear.empty()) {
    lin_channels_ = 2 * c.lin_k_heads * c.lin_k_dim + c.lin_v_heads * c.lin_v_dim;
    lin_out_ = c.lin_v_heads * c.lin_v_dim;
    lin_qkv_.resize(B * static_cast<size_t>(lin_channels_));
    lin_z_.resize(B * static_cast<size_t>(lin_out_));
    lin_beta_.resize(B * static_cast<size_t>(c.lin_v_heads));
    lin_g_.resize(B * static_cast<size_t>(c.lin_v_heads));
    recurrent_states(c.linear, static_cast<size_t>(c.lin_conv - 1) * lin_channels_,
                     checked_mul(static_cast<size_t>(lin_out_), static_cast<size_t>(c.lin_k_dim), "state"),
                     static_cast<size_t>(std::max(c.lin_conv, c.lin_v_dim)));
  }
  if (!c.short_conv.empty()) {
    conv_bcx_.resize(B * 3 * static_cast<size_t>(c.hidden));
    recurrent_states(c.short_conv, static_cast<size_t>(c.conv_taps - 1) * c.hidden, 0, 0);
  }
  if (!c.ssm.empty()) {
    ssm_inner_ = c.ssm_heads * c.ssm_head_dim;
    const int channels = ssm_inner_ + 2 * c.ssm_groups * c.ssm_state;
    ssm_rows_ = ssm_inner_ + channels + c.ssm_heads;
    ssm_zxbcdt_.resize(B * static_cast<size_t>(ssm_rows_));
    // (a thread's scratch: a channel's last inputs, or a head's dt x)
    recurrent_states(c.ssm, static_cast<size_t>(c.ssm_conv - 1) * channels,
                     checked_mul(static_cast<size_t>(ssm_inner_), static_cast<size_t>(c.ssm_state), "state"),
                     static_cast<size_t>(std::max(c.ssm_conv, c.ssm_head_dim)));
  }
  if (!c.ssm1.empty()) {
    const int D = c.ssm1_inner;
    ssm_inner_ = D;
    ssm_zxbcdt_.resize(B * 2 * static_cast<size_t>(D));
    ssm1_dbc_.resize(B * static_cast<size_t>(c.ssm1_rank + 2 * c.ssm_state));
    ssm1_low_.resize(B * static_cast<size_t>(c.ssm1_rank));
    ssm1_dt_.resize(B * static_cast<size_t>(D));
    // (a thread's scratch: a channel's last inputs, or its run's dt and y)
    recurrent_states(c.ssm1, static_cast<size_t>(c.ssm_conv - 1) * D,
                     checked_mul(static_cast<size_t>(D), static_cast<size_t>(c.ssm_state), "state"),
                     std::max(static_cast<size_t>(c.ssm_conv), 2 * static_cast<size_t>(D)));
  }
  if (c.attn_gate) qg_.resize(B * 2 * static_cast<size_t>(q_dim_));
  bool gated_q = false, pooled = false;
  for (const LayerWeights& L : w_.layers) {
    gated_q = gated_q || !absent(L.q_gate);
    pooled = pooled || (!L.experts.empty() && !L.mlp_post_norm.empty());
  }
  if (gated_q) gate_q_.resize(B * static_cast<size_t>(q_dim_));
  if (pooled) moe_out_.resize(B * static_cast<size_t>(c.hidden));
  att_.resize(B * std::max({o_dim_, c.hidden, lin_out_, ssm_inner_}));
  if (mla) {
    mla_lat_.resize(B * static_cast<size_t>(std::max(c.q_lora, c.kv_lora)));
    mla_kva_.resize(B * static_cast<size_t>(c.kv_lora + rot));
    mla_heads_.resize(B * c.n_heads * static_cast<size_t>(c.head_dim));
    mla_out_.resize(B * static_cast<size_t>(o_in_));
  }
  gate_.resize(B * mlp);
  up_.resize(B * mlp);
  if (c.shared_inter > 0) shared_gate_.resize(B);
  if (c.n_experts > 0) {
    const size_t gate_rows = static_cast<size_t>(c.expert_inter) * (c.glu == Glu::Silu ? 1 : 2);
    router_logits_.resize(B * c.n_experts);
    score_.resize(static_cast<size_t>(c.n_experts));
    choice_.resize(static_cast<size_t>(c.n_experts));
    group_score_.resize(static_cast<size_t>(c.n_group));
    group_kept_.resize(static_cast<size_t>(c.n_group));
    top_.resize(static_cast<size_t>(c.top_k));
    routed_.resize(static_cast<size_t>(c.n_experts));
    ex_x_.resize(B * c.hidden);
    ex_g_.resize(B * gate_rows);
    if (c.glu == Glu::Silu) ex_u_.resize(B * c.expert_inter);
    ex_y_.resize(B * c.hidden);
  }
  rope_cs_.resize(B * c.head_dim);
  if (!c.inv_freq_swa.empty()) rope_cs_swa_.resize(B * c.head_dim);
}

void Decoder::recurrent_states(const std::vector<uint8_t>& on, size_t conv, size_t state, size_t scratch) {
  const size_t layers = static_cast<size_t>(cfg_.n_layers);
  conv_state_.resize(layers);
  lin_state_.resize(layers);
  for (size_t l = 0; l < layers; ++l)
    if (on[l]) {
      conv_state_[l].assign(conv, 0.f);
      lin_state_[l].assign(state, 0.f);
    }
  lin_scratch_stride_ = std::max(lin_scratch_stride_, scratch);
  lin_scratch_.resize(lin_scratch_stride_ * static_cast<size_t>(pool_->size()));
}

void Decoder::collect_stats(bool on, const std::vector<int>& capture, const std::vector<int>& capture_experts) {
  const DecoderConfig& c = cfg_;
  const int slots = 4 * c.n_layers + 1 + (c.kv_lora > 0 || c.ssm_attends || !c.ssm1.empty() ? 2 * c.n_layers : 0);
  for (int slot : capture)
    if (slot < 0 || slot >= slots) fail("collect_stats: capture slot " + std::to_string(slot) + " is outside 0.." + std::to_string(slots - 1));
  for (int l : capture_experts)
    if (l < 0 || l >= c.n_layers || w_.layers[static_cast<size_t>(l)].experts.empty())
      fail("collect_stats: capture_experts layer " + std::to_string(l) + " is not a layer with experts");
  if (!on && !(capture.empty() && capture_experts.empty())) fail("collect_stats: capture needs on");
  expert_captured_.assign(on ? static_cast<size_t>(c.n_layers) : 0, {});
  for (int l : capture_experts) expert_captured_[static_cast<size_t>(l)].assign(static_cast<size_t>(c.n_experts), {});
  stats_on_ = on;
  stats_tokens_ = 0;
  stats_.clear();
  expert_stats_.assign(on ? static_cast<size_t>(c.n_layers) : 0, {});
  captured_.assign(on ? static_cast<size_t>(slots) : 0, {});
  capture_on_.assign(on ? static_cast<size_t>(slots) : 0, 0);
  if (!on) return;
  for (int slot : capture) {
    if (slot % 4 == 3 && slot / 4 < c.n_layers && !w_.layers[static_cast<size_t>(slot / 4)].experts.empty() &&
        c.shared_inter == 0)
      fail("collect_stats: slot " + std::to_string(slot) + " (layer " + std::to_string(slot / 4) +
           "'s down inputs) is empty in a layer with experts and no shared expert: each expert has its own "
           "(expert_stats)");
    capture_on_[static_cast<size_t>(slot)] = 1;
  }
  for (int l = 0; l < c.n_layers; ++l) {
    const bool moe = !w_.layers[static_cast<size_t>(l)].experts.empty();
    // (slot 3 of a layer with experts: the shared expert's down inputs, if it has one)
    // (o_proj: gated DeltaNet's, the short convolution's or Mamba2's out_proj)
    const bool lin = !c.linear.empty() && c.linear[static_cast<size_t>(l)];
    const bool conv = !c.short_conv.empty() && c.short_conv[static_cast<size_t>(l)];
    const bool ssm = (!c.ssm.empty() && c.ssm[static_cast<size_t>(l)] && !c.ssm_attends) ||  // (Falcon-H1's: o's)
                     (!c.ssm1.empty() && c.ssm1[static_cast<size_t>(l)]);
    for (int n : {c.hidden, lin ? lin_out_ : conv ? c.hidden : ssm ? ssm_inner_ : o_in_, c.hidden,
                  moe ? c.shared_inter : c.inter})
      stats_.emplace_back(static_cast<size_t>(n), 0.0);
    if (moe) {
      ExpertStats& es = expert_stats_[static_cast<size_t>(l)];
      const size_t E = static_cast<size_t>(c.n_experts);
      es.in.assign(E * static_cast<size_t>(c.hidden), 0.0);
      es.mid.assign(E * static_cast<size_t>(c.expert_inter), 0.0);
      es.rows.assign(E, 0.0);
    }
  }
  stats_.emplace_back(static_cast<size_t>(c.hidden), 0.0);
  if (c.kv_lora > 0)
    for (int l = 0; l < c.n_layers; ++l) {
      stats_.emplace_back(static_cast<size_t>(c.q_lora), 0.0);
      stats_.emplace_back(static_cast<size_t>(c.kv_lora), 0.0);
    }
  if (!c.ssm1.empty())  // (Mamba 1: each layer's x_proj and dt_proj inputs)
    for (int l = 0; l < c.n_layers; ++l) {
      const bool on = c.ssm1[static_cast<size_t>(l)] != 0;
      stats_.emplace_back(static_cast<size_t>(on ? c.ssm1_inner : 0), 0.0);
      stats_.emplace_back(static_cast<size_t>(on ? c.ssm1_rank : 0), 0.0);
    }
  if (c.ssm_attends)  // (Falcon-H1: each layer's Mamba2 out_proj input, and a slot nothing fills)
    for (int l = 0; l < c.n_layers; ++l) {
      stats_.emplace_back(static_cast<size_t>(c.ssm.empty() || !c.ssm[static_cast<size_t>(l)] ? 0 : ssm_inner_), 0.0);
      stats_.emplace_back(0, 0.0);
    }
}

std::vector<float> Decoder::take_captured(int slot, int* n) {
  if (slot < 0 || static_cast<size_t>(slot) >= captured_.size() || !capture_on_[static_cast<size_t>(slot)])
    fail("take_captured: slot " + std::to_string(slot) + " is not being captured");
  *n = static_cast<int>(stats_[static_cast<size_t>(slot)].size());
  return std::exchange(captured_[static_cast<size_t>(slot)], {});
}

std::vector<Decoder::ExpertRows> Decoder::take_expert_captured(int layer) {
  if (layer < 0 || static_cast<size_t>(layer) >= expert_captured_.size() || expert_captured_[static_cast<size_t>(layer)].empty())
    fail("take_expert_captured: layer " + std::to_string(layer) + "'s experts are not being captured");
  std::vector<ExpertRows>& per = expert_captured_[static_cast<size_t>(layer)];
  std::vector<ExpertRows> out(per.size());
  for (size_t e = 0; e < per.size(); ++e) out[e] = std::exchange(per[e], {});
  return out;
}

// s[i] += x[j][i]^2 over the b rows of x (n wide), in float64.
static void add_squares(double* s, const float* x, int b, int n) {
  for (int j = 0; j < b; ++j)
    for (int i = 0; i < n; ++i) {
      const double v = x[static_cast<size_t>(j) * n + i];
      s[i] += v * v;
    }
}

void Decoder::add_stats(int slot, const float* x, int b, int n) {
  add_squares(stats_[static_cast<size_t>(slot)].data(), x, b, n);
  if (capture_on_[static_cast<size_t>(slot)]) {
    std::vector<float>& rows = captured_[static_cast<size_t>(slot)];
    rows.insert(rows.end(), x, x + static_cast<size_t>(b) * static_cast<size_t>(n));
  }
}

void Decoder::truncate(int n) {
  if (n < 0 || n > n_past_) fail("truncate: " + std::to_string(n) + " is outside 0.." + std::to_string(n_past_));
  if (!rewinds() && n != 0 && n != n_past_)
    fail("truncate: " + std::to_string(n) + " of " + std::to_string(n_past_) + " positions; linear attention's "
         "recurrent states cannot be rewound (truncate to 0 or keep all)");
  if (n == 0) {
    for (std::vector<float>& st : conv_state_) std::fill(st.begin(), st.end(), 0.f);
    for (std::vector<float>& st : lin_state_) std::fill(st.begin(), st.end(), 0.f);
  }
  n_past_ = n;
  full_past_ = std::min(full_past_, n);
}

void Decoder::prepare(PreparedAct& prep, const float* x, int b, int cols) {
  if (b <= kMaxRows8Batch) prep.set(x, b, cols);
}

void Decoder::mm(const Matrix& m, PreparedAct& prep, const float* x, int b, const float* bias, float* y) {
  Stopwatch sw(timer(&StepTimes::matmul_s));
  if (packs(m, b))
    gemv_packing(m.spec, m.data, prep, bias, y, *pool_, isa_, scratch_);
  else if (m.dedup)
    mm_dedup(m, prep, x, b, bias, y);
  else
    mm_plain(m, prep, x, b, bias, y);
}

const Rows8* Decoder::copy_for(const Matrix& m, int b) {
  return b == 1 && !rows8_decodes(m.spec.type) ? nullptr : m.rows8.get();
}

bool Decoder::rows8(const Rows8Job* jobs, int n, PreparedAct& x) {
  Stopwatch sw(timer(&StepTimes::matmul_s));
  return gemv_rows8(jobs, n, x, *pool_, isa_);
}

void Decoder::mm_plain(const Matrix& m, PreparedAct& prep, const float* x, int b, const float* bias, float* y) {
  if (b > (m.rows8 && act_ == Act::Int8 ? kMaxRows8Batch : kMaxBatch))
    gemm(m.spec, m.data, x, b, bias, y, *pool_, isa_, gemm_scratch_);
  else
    gemv(m.spec, m.data, prep, bias, y, wtype_info(m.spec.type).int8_act ? act_ : Act::F32, *pool_, isa_, scratch_,
         copy_for(m, b));
}

// Tokens a product read in place needs in a chunk before it packs rows8
// tiles (gemv_packing) instead of reading the stored layout: packing is a
// pass over the matrix's bytes (~7 GB/s on 2 threads for the 4-bit types),
// which a few tokens do not repay. mxfp4 5760 x 2880, 2 threads: stored 3.1
// ms for 8 tokens, packing 2.1 ms for 8, 2.6 ms for 16.
constexpr int kPackingMinTokens = 8;

// A product read in place: an expert's (no rows8 copy), or a dense
// matrix's whose larger copy did not fit (grow_copies: the codebook types'
// stored layouts prefill at a fifth of their tiles' speed, iq2_xs on a
// 2048-wide Llama 20 against 111 tokens/s) packs rows8 tiles as it goes
// where it has enough tokens (int8, a type and ISA with the kernels).
bool Decoder::packs(const Matrix& m, int b) const {
  return b >= kPackingMinTokens && !m.rows8 && !m.dedup && gemv_uses_rows8(m.spec, act_, isa_);
}

bool Decoder::swiglu_rows8(const Matrix& gate, const Matrix& up, PreparedAct& prep, int b, float* y, bool gelu) {
  Rows8Job job = {copy_for(gate, b), copy_for(up, b), nullptr, y};
  job.gelu = gelu;
  return b <= kMaxRows8Batch && job.w && job.up && rows8(&job, 1, prep);
}

// A Silu expert's gate and up in one pass: over their copies, or packing
// their stored bytes into tiles as it goes.
bool Decoder::mm_expert_swiglu(const Expert& e, PreparedAct& prep, int b, float* y) {
  if (cfg_.glu != Glu::Silu || !e.bgate.empty()) return false;
  if (swiglu_rows8(e.gate, e.up, prep, b, y)) return true;
  if (!packs(e.gate, b) || !packs(e.up, b)) return false;
  Stopwatch sw(timer(&StepTimes::matmul_s));
  return gemv_packing_swiglu(e.gate.spec, e.gate.data, e.up.spec, e.up.data, prep, y, *pool_, isa_, scratch_);
}

// A dedup member: from the store's LRU cache where it fits there (rebuilt on
// a miss), else multiplied where it is read, a few rows at a time (the fused
// GEMV, or a prefill chunk's GEMM over the same steps): never held whole.
void Decoder::mm_dedup(const Matrix& m, PreparedAct& prep, const float* x, int b, const float* bias, float* y) {
  if (m.store->cacheable(m.name)) {
    const dedup::BufferPtr buf = m.store->get(m.name);
    Matrix plain;
    plain.spec = m.spec;
    plain.data = buf->data;
    return mm_plain(plain, prep, x, b, bias, y);
  }
  if (b > kMaxBatch)
    gemm_dedup(*m.dedup, x, b, bias, y, *pool_, isa_, dedup_scratch_, gemm_scratch_);
  else
    gemv_dedup(*m.dedup, prep, bias, y, wtype_info(m.spec.type).int8_act ? act_ : Act::F32, *pool_, isa_,
               dedup_scratch_);
  m.store->count_fused(m.dedup->src.read_bytes());
}

void Decoder::embed_row(int32_t token, float* out) const {
  // One row widened per token, by the GEMV's own dequantizer: a table
  // widened once would hold vocab x hidden floats (113 MB for SmolLM2, 2 GB
  // for a 128k-vocabulary 8B model) to save microseconds a prompt.
  dequantize_row(w_.embed.spec, w_.embed.data, token, out);
}

// Cached positions from which a single token's attention runs on all threads.
constexpr int kParallelAttnCtx = 32;
// Positions per span of a decode step's attention (Decoder::attention).
constexpr int kAttnSpan = 512;

AttnSplit attn_split(int b, int n_kv, int group, int threads) {
  if (b < 1 || n_kv < 1 || group < 1 || threads < 1) fail("attn_split: every argument must be >= 1");
  const int want = b == 1 ? threads : 2 * threads;
  auto ceil_div = [](int a, int d) { return (a + d - 1) / d; };
  AttnSplit s;
  s.tj = ceil_div(b, std::min(b, ceil_div(want, n_kv)));
  const int jparts = ceil_div(b, s.tj);
  s.th = ceil_div(group, std::min(group, ceil_div(want, n_kv * jparts)));
  s.th = std::min(s.th, kAttnItemQueries);
  s.tj = std::min(s.tj, kAttnItemQueries / s.th);  // a long f32 prefill chunk: cap the item, more items
  // Parts from the sizes, so that no range is empty.
  s.jparts = ceil_div(b, s.tj);
  s.hparts = ceil_div(group, s.th);
  return s;
}

// Each item's queries run over the cache a block of keys at a time (16 KiB
// of one head's keys or values, which stays in L1 while every query of the
// item reads it): the KV cache comes from L2 once per item instead of once
// per query. Per block, the queries that see any of its positions form one
// tile for the kernels (attention.h), which reuse each key and value they
// load for several queries. A tile spans the whole block for each of its
// queries, so a query's row of scores has room for a block before its first
// position and runs on past its last: what lands there (the causal
// diagonal, a window's edge) is set to zero after the softmax, and the value
// sum adds it as nothing. Scores per key, the softmax per query and each
// query's value sum in order of position do not depend on the tile, so the
// result does not depend on the blocking or the split over threads. (A
// decode step past kAttnSpan positions runs its softmax per span of
// positions and merges the spans: that depends on the position alone.)
void Decoder::attention(int layer, int b) {
  const int hd = hd_, vd = vd_, nh = cfg_.n_heads, n_kv = kv_heads_, group = nh / n_kv;
  const bool mla = cfg_.kv_lora > 0;  // values: the latent part of each cached key
  const int window = cfg_.windows[static_cast<size_t>(layer)];
  const int chunk = cfg_.chunks.empty() ? 0 : cfg_.chunks[static_cast<size_t>(layer)];
  // gpt-oss's sinks: one more logit per head in the softmax's denominator,
  // with no value behind it (transformers appends it to the scores and
  // drops its probability).
  const std::vector<float>& sink = w_.layers[static_cast<size_t>(layer)].sinks;
  const float* sinks = or_null(sink);
  const float scale = cfg_.attn_scale > 0.f ? cfg_.attn_scale : 1.f / std::sqrt(static_cast<float>(cfg_.head_dim));
  const float cap = cfg_.attn_softcap;
  const AttnOps& ops = kAttnTable.ops(isa_);
  const int threads = pool_->size();
  const AttnSplit sp = attn_split(b, n_kv, group, threads);
  const int block = std::max(8, 4096 / hd / 8 * 8);  // keys per block
  const size_t row = static_cast<size_t>(cfg_.max_ctx) + static_cast<size_t>(block);  // a block's room before position 0
  const size_t per_thread = checked_mul(static_cast<size_t>(sp.tj * sp.th), row, "attention scores");
  const size_t all = checked_mul(per_thread, static_cast<size_t>(threads), "attention scores");
  if (scores_.size() < all) scores_.resize(all);
  // A decode step past kAttnSpan positions: its positions split into spans
  // of kAttnSpan (by position alone, so the floats depend on the context,
  // never on the threads); an item is one span of one KV head's queries,
  // its partial softmax kept in part_ and merged below. Whole KV heads
  // alone left SmolLM2's 3 over 2 threads 2:1, and 8 over 16 threads half
  // the threads idle, while the step waited on the cache's reads.
  const int n_spans = b == 1 && n_past_ + 1 > kAttnSpan ? (n_past_ + kAttnSpan) / kAttnSpan : 0;
  const int jparts = n_spans ? n_spans : sp.jparts;
  const size_t part_row = static_cast<size_t>(vd) + 2;  // sum of p v [vd], max, sum of p
  if (n_spans)
    part_.resize(checked_mul(checked_mul(static_cast<size_t>(nh), static_cast<size_t>(n_spans), "attention spans"),
                             part_row, "attention spans"));
  const int items = n_kv * jparts * sp.hparts;
  // A short single-token attention runs on this thread alone (one piece).
  const int64_t grain = b > 1 || n_past_ >= kParallelAttnCtx ? 1 : items;
  parallel_for(*pool_, items, grain, [&](int64_t i0, int64_t i1, int slot) {
    for (int i = static_cast<int>(i0); i < i1; ++i) {
      // The last tokens first: they see the most positions, and the threads
      // that finish a prefill chunk's smaller items end the job together.
      const int it = items - 1 - i;
      // KV head fastest: items that run at the same time read different heads' caches.
      const int g = it % n_kv, jp = it / n_kv / sp.hparts, hp = it / n_kv % sp.hparts;
      const int j0 = n_spans ? 0 : jp * sp.tj, j1 = n_spans ? 1 : std::min(b, j0 + sp.tj);
      const int h0 = g * group + hp * sp.th, h1 = std::min((g + 1) * group, h0 + sp.th);
      // Query r = (j, h) in order: its q row, output row, head, positions [t0[r], n_ctx[r]),
      // and its scores' row (p[r][t - t0[r]] for position t).
      const float* qr[kAttnItemQueries];
      float *out[kAttnItemQueries], *p[kAttnItemQueries];
      int head[kAttnItemQueries], t0[kAttnItemQueries], n_ctx[kAttnItemQueries];
      int nq = 0, lo = cfg_.max_ctx, hi = 0;
      for (int j = j0; j < j1; ++j)
        for (int h = h0; h < h1; ++h, ++nq) {
          qr[nq] = q_.data() + static_cast<size_t>(j) * q_dim_ + h * hd;
          out[nq] = n_spans ? part_.data() + (static_cast<size_t>(h) * n_spans + jp) * part_row
                            : att_.data() + static_cast<size_t>(j) * o_dim_ + h * vd;
          p[nq] = scores_.data() + static_cast<size_t>(slot) * per_thread + nq * row + block;
          head[nq] = h;
          n_ctx[nq] = n_past_ + j + 1;  // causal: this token and every earlier one
          t0[nq] = window > 0 ? std::max(0, n_ctx[nq] - window) : chunk > 0 ? (n_ctx[nq] - 1) / chunk * chunk : 0;
          if (n_spans) {
            t0[nq] = std::max(t0[nq], jp * kAttnSpan);
            n_ctx[nq] = std::min(n_ctx[nq], (jp + 1) * kAttnSpan);
          }
          lo = std::min(lo, t0[nq]);
          hi = std::max(hi, n_ctx[nq]);
        }
      if (lo >= hi) {  // a span wholly before a sliding window or chunk (one token: every query alike)
        for (int r = 0; r < nq; ++r) {
          out[r][vd] = -INFINITY;
          out[r][vd + 1] = 0.f;
        }
        continue;
      }
      // Calls fn(tb, te, m, sel, at) for each block [tb, te) of positions, with
      // the m queries sel[] that see any of it and at[i]: where position tb is
      // in query sel[i]'s row.
      auto blocks = [&](auto&& fn) {
        for (int tb = lo; tb < hi; tb += block) {
          const int te = std::min(tb + block, hi);
          int sel[kAttnItemQueries], m = 0;
          float* at[kAttnItemQueries];
          for (int r = 0; r < nq; ++r)
            if (std::max(tb, t0[r]) < std::min(te, n_ctx[r])) {
              sel[m] = r;
              at[m++] = p[r] + (tb - t0[r]);
            }
          fn(tb, te, m, sel, at);
        }
      };
      // one position to the next, in a head's run (latent attention's values: the keys' run, past the rotary part)
      const size_t stride = static_cast<size_t>(hd), vstride = mla ? stride : static_cast<size_t>(vd);
      KvCache& vc = mla ? k_cache_ : v_cache_;
      const size_t v_off = mla ? static_cast<size_t>(hd - vd) * vc.elem() : 0;
      blocks([&](int tb, int te, int m, const int* sel, float* const* at) {
        const float* qs[kAttnItemQueries];
        for (int i = 0; i < m; ++i) qs[i] = qr[sel[i]];
        const uint8_t* k = k_cache_.at(cfg_, layer, g, tb);
        if (k_cache_.type == WType::F16)
          ops.scores_f16(qs, m, reinterpret_cast<const uint16_t*>(k), stride, te - tb, hd, scale, at);
        else
          ops.scores(qs, m, reinterpret_cast<const float*>(k), stride, te - tb, hd, scale, at);
      });
      float inv[kAttnItemQueries];
      for (int r = 0; r < nq; ++r) {
        const int n = n_ctx[r] - t0[r], h = head[r];
        if (cap > 0.f) softcap(p[r], n, cap);
        if (n_spans) {  // a span's own shift and sum; the sink joins at the merge
          out[r][vd] = ops.max(p[r], n);
          out[r][vd + 1] = ops.softmax_exp(p[r], n, out[r][vd]);
        } else {
          const float mx = std::max(ops.max(p[r], n), sinks ? sinks[h] : -INFINITY);
          inv[r] = 1.f / (ops.softmax_exp(p[r], n, mx) + (sinks ? std::exp(sinks[h] - mx) : 0.f));
        }
        // Zeros where its tiles ran past its positions: before the first, in
        // the block that holds it, and after the last, up to the item's.
        const int first = lo + (t0[r] - lo) / block * block;
        std::fill(p[r] - (t0[r] - first), p[r], 0.f);
        std::fill(p[r] + n, p[r] + (hi - t0[r]), 0.f);
        std::fill_n(out[r], vd, 0.f);
      }
      blocks([&](int tb, int te, int m, const int* sel, float* const* at) {
        float* os[kAttnItemQueries];
        for (int i = 0; i < m; ++i) os[i] = out[sel[i]];
        const uint8_t* v = vc.at(cfg_, layer, g, tb) + v_off;
        if (vc.type == WType::F16)
          ops.mix_f16(at, m, reinterpret_cast<const uint16_t*>(v), vstride, te - tb, vd, os);
        else
          ops.mix(at, m, reinterpret_cast<const float*>(v), vstride, te - tb, vd, os);
      });
      if (!n_spans)
        for (int r = 0; r < nq; ++r)
          for (int i = 0; i < vd; ++i) out[r][i] *= inv[r];
    }
  });
  if (!n_spans) return;
  // The spans merged in order of position: each rescaled to the largest
  // shift (the sink's logit included), summed, divided once.
  for (int h = 0; h < nh; ++h) {
    const float* part = part_.data() + static_cast<size_t>(h) * n_spans * part_row;
    float mx = sinks ? sinks[h] : -INFINITY;
    for (int s = 0; s < n_spans; ++s)
      if (part[s * part_row + vd + 1] > 0.f) mx = std::max(mx, part[s * part_row + vd]);
    float den = sinks ? std::exp(sinks[h] - mx) : 0.f;
    float* o = att_.data() + static_cast<size_t>(h) * vd;
    std::fill_n(o, vd, 0.f);
    for (int s = 0; s < n_spans; ++s) {
      const float* ps = part + s * part_row;
      if (!(ps[vd + 1] > 0.f)) continue;  // empty: before the window or chunk
      const float w = std::exp(ps[vd] - mx);
      den += w * ps[vd + 1];
      for (int i = 0; i < vd; ++i) o[i] += w * ps[i];
    }
    const float inv = 1.f / den;
    for (int i = 0; i < vd; ++i) o[i] *= inv;
  }
}

void Decoder::short_conv(int layer, int b) {
  const DecoderConfig& c = cfg_;
  const LayerWeights& L = w_.layers[layer];
  const int K = c.conv_taps, H = c.hidden;
  const size_t H3 = 3 * static_cast<size_t>(H);
  mm(L.conv_in, xn_prep_, xn_.data(), b, nullptr, conv_bcx_.data());
  // Channel by channel over the chunk's tokens in order: B * x joins the
  // last K - 1 of them (the state's, then the chunk's), the taps weigh them,
  // and C gates the sum; the state keeps the last K - 1.
  float* st = conv_state_[layer].data();
  parallel_for(*pool_, H, 64, [&](int64_t c0, int64_t c1, int) {
    float hist[64];
    for (int64_t ch = c0; ch < c1; ++ch) {
      const float* w = &L.conv_w[static_cast<size_t>(ch) * K];
      for (int t = 0; t < K - 1; ++t) hist[t] = st[static_cast<size_t>(t) * H + ch];
      for (int j = 0; j < b; ++j) {
        const float* row = &conv_bcx_[static_cast<size_t>(j) * H3];
        hist[K - 1] = row[ch] * row[2 * static_cast<size_t>(H) + ch];
        float acc = 0.f;
        for (int t = 0; t < K; ++t) acc += w[t] * hist[t];
        att_[static_cast<size_t>(j) * H + ch] = acc * row[static_cast<size_t>(H) + ch];
        for (int t = 0; t + 1 < K; ++t) hist[t] = hist[t + 1];
      }
      for (int t = 0; t < K - 1; ++t) st[static_cast<size_t>(t) * H + ch] = hist[t];
    }
  });
}

void Decoder::conv_silu(float* state, float* data, size_t stride, int channels, int K, const float* w,
                        const float* bias, int b) {
  // Channel by channel over the chunk's tokens in order (each output reads
  // the K - 1 inputs before it: the state's, then the chunk's), then SiLU;
  // the state keeps the last K - 1 inputs.
  const ActOps& act = kActTable.ops(isa_);
  parallel_for(*pool_, channels, 64, [&](int64_t c0, int64_t c1, int slot) {
    float* hist = &lin_scratch_[static_cast<size_t>(slot) * lin_scratch_stride_];
    for (int64_t ch = c0; ch < c1; ++ch) {
      const float* wc = w + static_cast<size_t>(ch) * K;
      for (int t = 0; t < K - 1; ++t) hist[t] = state[static_cast<size_t>(t) * channels + ch];
      for (int j = 0; j < b; ++j) {
        float& x = data[static_cast<size_t>(j) * stride + ch];
        hist[K - 1] = x;
        float acc = bias ? bias[ch] : 0.f;
        for (int t = 0; t < K; ++t) acc += wc[t] * hist[t];
        x = acc;
        for (int t = 0; t + 1 < K; ++t) hist[t] = hist[t + 1];
      }
      for (int t = 0; t < K - 1; ++t) state[static_cast<size_t>(t) * channels + ch] = hist[t];
    }
    for (int j = 0; j < b; ++j) {  // (then SiLU over each token's run of these channels)
      float* x = data + static_cast<size_t>(j) * stride + c0;
      act.silu_mul(x, x, nullptr, static_cast<size_t>(c1 - c0));
    }
  });
}

void Decoder::mamba(int layer, int b) {
  const DecoderConfig& c = cfg_;
  const LayerWeights& L = w_.layers[layer];
  const int nh = c.ssm_heads, P = c.ssm_head_dim, N = c.ssm_state, G = c.ssm_groups, inner = ssm_inner_;
  const size_t R = static_cast<size_t>(ssm_rows_), GN = static_cast<size_t>(G) * N;
  mm(L.ssm_in, xn_prep_, xn_.data(), b, nullptr, ssm_zxbcdt_.data());
  if (!c.ssm_in_mults.empty())  // Falcon-H1's muP factors of in_proj's row groups z, x, B, C, dt
    rows(b, [&](int j) {
      float* r = &ssm_zxbcdt_[static_cast<size_t>(j) * R];
      const size_t ends[5] = {static_cast<size_t>(inner), 2 * static_cast<size_t>(inner),
                              2 * static_cast<size_t>(inner) + GN, 2 * static_cast<size_t>(inner) + 2 * GN, R};
      for (size_t g = 0, i = 0; g < 5; ++g)
        for (; i < ends[g]; ++i) r[i] *= c.ssm_in_mults[g];
    });
  conv_silu(conv_state_[layer].data(), ssm_zxbcdt_.data() + inner, R, inner + 2 * G * N, c.ssm_conv,
            L.ssm_conv_w.data(), L.ssm_conv_b.data(), b);
  // Head by head (each its own state [P][N]), token by token: the state
  // decays by exp(dt A) and takes dt x B^T, y = S C (ssm/ssm.h), plus D x.
  const int per_group = nh / G;
  const SsmOps& ops = kSsmTable.ops(isa_);
  parallel_for(*pool_, nh, 1, [&](int64_t h0, int64_t h1, int slot) {
    float* dx = &lin_scratch_[static_cast<size_t>(slot) * lin_scratch_stride_];
    for (int64_t h = h0; h < h1; ++h) {
      float* S = &lin_state_[layer][static_cast<size_t>(h) * P * N];
      const size_t g = static_cast<size_t>(h / per_group);
      for (int j = 0; j < b; ++j) {
        const float* row = &ssm_zxbcdt_[static_cast<size_t>(j) * R];
        const float* x = row + inner + static_cast<size_t>(h) * P;
        const float* B = row + 2 * static_cast<size_t>(inner) + g * N;
        const float* C = B + GN;
        const float a = row[2 * static_cast<size_t>(inner) + 2 * GN + h] + L.ssm_dt[h];
        const float dt = softplus(a);
        const float decay = std::exp(dt * L.ssm_a[h]);
        for (int p = 0; p < P; ++p) dx[p] = dt * x[p];
        float* y = &att_[static_cast<size_t>(j) * inner + static_cast<size_t>(h) * P];
        ops.step(S, P, N, decay, dx, B, C, y);
        for (int p = 0; p < P; ++p) y[p] += L.ssm_d[h] * x[p];
      }
    }
  });
  // Each token's y times SiLU(z), RMS-normed group by group times the norm's weights (where it has them).
  const int gs = inner / G;
  const ActOps& act = kActTable.ops(isa_);
  rows(b, [&](int j) {
    float* y = &att_[static_cast<size_t>(j) * inner];
    const float* z = &ssm_zxbcdt_[static_cast<size_t>(j) * R];
    act.silu_mul(y, z, y, static_cast<size_t>(inner));
    for (int g = 0; g < G && !L.ssm_norm.empty(); ++g)
      rmsnorm(y + static_cast<size_t>(g) * gs, L.ssm_norm.data() + static_cast<size_t>(g) * gs, gs, c.eps,
              y + static_cast<size_t>(g) * gs);
  });
}

void Decoder::mamba1(int layer, int b) {
  const DecoderConfig& c = cfg_;
  const LayerWeights& L = w_.layers[layer];
  const int D = c.ssm1_inner, N = c.ssm_state, R = c.ssm1_rank, own = 4 * c.n_layers + 1 + 2 * layer;
  const size_t XZ = 2 * static_cast<size_t>(D), DBC = static_cast<size_t>(R + 2 * N);
  mm(L.ssm_in, xn_prep_, xn_.data(), b, nullptr, ssm_zxbcdt_.data());
  conv_silu(conv_state_[layer].data(), ssm_zxbcdt_.data(), XZ, D, c.ssm_conv, L.ssm_conv_w.data(),
            L.ssm_conv_b.data(), b);
  rows(b, [&](int j) { std::copy_n(&ssm_zxbcdt_[j * XZ], D, &att_[static_cast<size_t>(j) * D]); });  // x
  if (stats_on_) add_stats(own, att_.data(), b, D);
  prepare(att_prep_, att_.data(), b, D);
  mm(L.ssm_x, att_prep_, att_.data(), b, nullptr, ssm1_dbc_.data());
  rows(b, [&](int j) {  // dt's low rank, B and C (Falcon Mamba: each RMS-normed), dt_low apart for dt_proj
    float* r = &ssm1_dbc_[j * DBC];
    if (c.ssm1_norms)
      for (auto [at, n] : {std::pair{r, R}, std::pair{r + R, N}, std::pair{r + R + N, N}}) rms_unit(at, n, c.ssm1_eps);
    std::copy_n(r, R, &ssm1_low_[static_cast<size_t>(j) * R]);
  });
  if (stats_on_) add_stats(own + 1, ssm1_low_.data(), b, R);
  prepare(gate_prep_, ssm1_low_.data(), b, R);
  mm(L.ssm_dt_w, gate_prep_, ssm1_low_.data(), b, L.ssm_dt.data(), ssm1_dt_.data());
  // A run of channels at a time (each its own state [N]), token by token: h = exp(dt A) h + dt x B, y = h . C
  // (ssm/ssm.h), plus D x, times SiLU(z), written over x in att_.
  const SsmOps& ops = kSsmTable.ops(isa_);
  const ActOps& act = kActTable.ops(isa_);
  parallel_for(*pool_, D, 16, [&](int64_t c0, int64_t c1, int slot) {
    const size_t n = static_cast<size_t>(c1 - c0);
    float* dt = &lin_scratch_[static_cast<size_t>(slot) * lin_scratch_stride_];
    float* y = dt + n;
    for (int j = 0; j < b; ++j) {
      const float* row = &ssm1_dbc_[j * DBC];
      const float* a = &ssm1_dt_[static_cast<size_t>(j) * D + c0];
      float* x = &att_[static_cast<size_t>(j) * D + c0];
      for (size_t i = 0; i < n; ++i) dt[i] = softplus(a[i]);
      ops.channels(&lin_state_[layer][static_cast<size_t>(c0) * N], static_cast<int>(n), N, dt, x,
                   &L.ssm_a[static_cast<size_t>(c0) * N], row + R, row + R + N, y);
      for (size_t i = 0; i < n; ++i) y[i] += L.ssm_d[c0 + i] * x[i];
      act.silu_mul(x, &ssm_zxbcdt_[j * XZ + D + c0], y, n);
    }
  });
}

void Decoder::delta_net(int layer, int b) {
  const DecoderConfig& c = cfg_;
  const LayerWeights& L = w_.layers[layer];
  const int K = c.lin_conv, C = lin_channels_, Hk = c.lin_k_heads, Hv = c.lin_v_heads;
  const int dk = c.lin_k_dim, dv = c.lin_v_dim, kd = Hk * dk;
  const ActOps& act = kActTable.ops(isa_);
  mm(L.lin_qkv, xn_prep_, xn_.data(), b, nullptr, lin_qkv_.data());
  mm(L.lin_z, xn_prep_, xn_.data(), b, nullptr, lin_z_.data());
  mm(L.lin_b, xn_prep_, xn_.data(), b, nullptr, lin_beta_.data());
  mm(L.lin_a, xn_prep_, xn_.data(), b, nullptr, lin_g_.data());
  conv_silu(conv_state_[layer].data(), lin_qkv_.data(), static_cast<size_t>(C), C, K, L.lin_conv.data(), nullptr, b);
  // Per token: q and k heads over their L2 norms (FLA's eps 1e-6), q over
  // sqrt(dk); each value head's rate beta and log-decay g.
  const float q_scale = 1.f / std::sqrt(static_cast<float>(dk));
  rows(b, [&](int j) {
    float* row = &lin_qkv_[static_cast<size_t>(j) * C];
    for (int h = 0; h < 2 * Hk; ++h) {
      float* v = row + static_cast<size_t>(h) * dk;
      float ss = 0.f;
      for (int i = 0; i < dk; ++i) ss += v[i] * v[i];
      const float s = 1.f / std::sqrt(ss + 1e-6f) * (h < Hk ? q_scale : 1.f);
      for (int i = 0; i < dk; ++i) v[i] *= s;
    }
    for (int h = 0; h < Hv; ++h) {
      float& beta = lin_beta_[static_cast<size_t>(j) * Hv + h];
      beta = 1.f / (1.f + std::exp(-beta));
      float& g = lin_g_[static_cast<size_t>(j) * Hv + h];
      const float a = g + L.lin_dt[h];
      g = L.lin_decay[h] * softplus(a);
    }
  });
  // The delta rule, value head by value head (each its own state), token
  // by token; then each head's output RMS-normed times SiLU(z).
  const int group = Hv / Hk;
  parallel_for(*pool_, Hv, 1, [&](int64_t h0, int64_t h1, int slot) {
    float* mem = &lin_scratch_[static_cast<size_t>(slot) * lin_scratch_stride_];
    for (int64_t h = h0; h < h1; ++h) {
      const int kh = c.lin_v_tiled ? static_cast<int>(h % Hk) : static_cast<int>(h / group);
      float* S = &lin_state_[layer][static_cast<size_t>(h) * dk * dv];
      for (int j = 0; j < b; ++j) {
        const float* row = &lin_qkv_[static_cast<size_t>(j) * C];
        const float* q = row + static_cast<size_t>(kh) * dk;
        const float* k = row + kd + static_cast<size_t>(kh) * dk;
        const float* v = row + 2 * kd + static_cast<size_t>(h) * dv;
        const float decay = std::exp(lin_g_[static_cast<size_t>(j) * Hv + h]);
        const float beta = lin_beta_[static_cast<size_t>(j) * Hv + h];
        std::fill(mem, mem + dv, 0.f);
        for (int i = 0; i < dk; ++i) {
          float* s = S + static_cast<size_t>(i) * dv;
          for (int e = 0; e < dv; ++e) {
            s[e] *= decay;
            mem[e] += s[e] * k[i];
          }
        }
        for (int e = 0; e < dv; ++e) mem[e] = (v[e] - mem[e]) * beta;  // the correction delta
        float* out = &att_[static_cast<size_t>(j) * lin_out_ + static_cast<size_t>(h) * dv];
        std::fill(out, out + dv, 0.f);
        for (int i = 0; i < dk; ++i) {
          float* s = S + static_cast<size_t>(i) * dv;
          for (int e = 0; e < dv; ++e) {
            s[e] += k[i] * mem[e];
            out[e] += s[e] * q[i];
          }
        }
        rmsnorm(out, L.lin_norm.data(), dv, c.eps, out);
        const float* z = &lin_z_[static_cast<size_t>(j) * lin_out_ + static_cast<size_t>(h) * dv];
        act.silu_mul(out, z, out, static_cast<size_t>(dv));
      }
    }
  });
}

void Decoder::cache_row(KvCache& cache, int layer, int pos, const float* src) {
  const int hd = cache.dim;
  for (int h = 0; h < cache.heads; ++h) {
    uint8_t* dst = cache.at(cfg_, layer, h, pos);
    if (cache.type == WType::F16)
      kAttnTable.ops(isa_).narrow(src + static_cast<size_t>(h) * hd, hd, reinterpret_cast<uint16_t*>(dst));
    else
      std::memcpy(dst, src + static_cast<size_t>(h) * hd, static_cast<size_t>(hd) * sizeof(float));
  }
}

void Decoder::glu(Glu kind, float* g, const float* u, int n, int width) const {
  const size_t all = static_cast<size_t>(n) * static_cast<size_t>(width);
  if (kind == Glu::Silu) return act_rows(kActTable.ops(isa_).silu_mul, g, u, n, width);
  if (kind == Glu::Halves) {  // row j: gate at [2 width j, ...), up width later; in place (inputs at >= i)
    for (int j = 0; j < n; ++j) {
      const float* gj = g + static_cast<size_t>(j) * 2 * width;
      float* oj = g + static_cast<size_t>(j) * width;
      for (int i = 0; i < width; ++i) oj[i] = gj[i] / (1.f + std::exp(-gj[i])) * gj[width + i];
    }
    return;
  }
  // In place: output i is written after inputs 2i and 2i + 1 (>= i) are read.
  const float lim = cfg_.swiglu_limit, alpha = cfg_.swiglu_alpha;
  for (size_t i = 0; i < all; ++i) {
    const float gate = std::min(g[2 * i], lim), up = std::clamp(g[2 * i + 1], -lim, lim);
    g[i] = (up + 1.f) * (gate / (1.f + std::exp(-alpha * gate)));
  }
}

// g = op(g) * u over n rows of width, rows in parallel (act/act.h's ops; u null: op(g) alone).
void Decoder::act_rows(ActFn op, float* g, const float* u, int n, int width) const {
  rows(n, [&](int j) {
    const size_t at = static_cast<size_t>(j) * static_cast<size_t>(width);
    op(g + at, g + at, u ? u + at : nullptr, static_cast<size_t>(width));
  });
}

// g = mlp_act(g) * u, rows in parallel: layer L's dense MLP's (and a shared expert's) unit; u null for an MLP
// without a gate (mlp_gated false: mlp_act(g) alone, the only way ReLU squared and xIELU run).
void Decoder::mlp_unit(const LayerWeights& L, float* g, const float* u, int n, int width) const {
  if (cfg_.mlp_act == MlpAct::Relu2) return relu2(g, n, width);
  const ActOps& act = kActTable.ops(isa_);
  if (cfg_.mlp_act == MlpAct::Xielu) {
    const Xielu p = Xielu::from_raw(L.xielu_alpha_p[0], L.xielu_alpha_n[0], L.xielu_beta[0], L.xielu_eps[0]);
    return rows(n, [&](int j) { act.xielu(g + static_cast<size_t>(j) * width, static_cast<size_t>(width), p); });
  }
  act_rows(cfg_.mlp_act == MlpAct::Silu ? act.silu_mul : act.gelu_tanh_mul, g, u, n, width);
}

// g = relu(g)^2, rows in parallel (Nemotron-H's relu2: its MLP's and experts' unit, no gate).
void Decoder::relu2(float* g, int n, int width) const {
  rows(n, [&](int j) {
    for (size_t i = static_cast<size_t>(j) * width; i < static_cast<size_t>(j + 1) * width; ++i) {
      const float x = std::max(g[i], 0.f);
      g[i] = x * x;
    }
  });
}

// Softmax gating's choice with a choice bias (ERNIE 4.5's moe_statics, llama.cpp's exp_probs_b): each expert's
// softmax probability plus its bias, into choice_. (Its weights are the chosen probabilities, as without a bias.)
const float* Decoder::softmax_choice(const LayerWeights& L, const float* lg) {
  const int E = cfg_.n_experts;
  const float mx = *std::max_element(lg, lg + E);
  float sum = 0.f;
  for (int e = 0; e < E; ++e) sum += choice_[static_cast<size_t>(e)] = std::exp(lg[e] - mx);
  for (int e = 0; e < E; ++e) {
    float& c = choice_[static_cast<size_t>(e)];
    c = c / sum + L.expert_bias[static_cast<size_t>(e)];
  }
  return choice_.data();
}

// Sigmoid gating's choice for one row's logits: score_ the sigmoids,
// choice_ (returned) score plus expert_bias, -inf outside the topk_group
// groups whose two best choices sum highest (transformers' DeepSeek-V3 and
// GLM-4.5 routers; llama.cpp's exp_probs_b and expert groups).
const float* Decoder::sigmoid_choice(const LayerWeights& L, const float* lg) {
  const DecoderConfig& c = cfg_;
  const int E = c.n_experts;
  for (int e = 0; e < E; ++e) {
    score_[static_cast<size_t>(e)] = 1.f / (1.f + std::exp(-lg[e]));
    choice_[static_cast<size_t>(e)] = score_[static_cast<size_t>(e)] + (L.expert_bias.empty() ? 0.f : L.expert_bias[static_cast<size_t>(e)]);
  }
  if (c.topk_group == c.n_group) return choice_.data();
  const int per = E / c.n_group;
  std::vector<float>& group = group_score_;
  for (int g = 0; g < c.n_group; ++g) {
    const float* x = &choice_[static_cast<size_t>(g) * per];
    float a = -INFINITY, s = -INFINITY;  // the best two
    for (int i = 0; i < per; ++i) {
      if (x[i] > a) {
        s = a;
        a = x[i];
      } else if (x[i] > s) {
        s = x[i];
      }
    }
    group[static_cast<size_t>(g)] = a + s;
  }
  std::vector<uint8_t>& keep = group_kept_;
  std::fill(keep.begin(), keep.end(), uint8_t{0});
  for (int k = 0; k < c.topk_group; ++k) {  // by rank, a tie to the lower group
    int best = -1;
    for (int g = 0; g < c.n_group; ++g)
      if (!keep[static_cast<size_t>(g)] && (best < 0 || group[static_cast<size_t>(g)] > group[static_cast<size_t>(best)])) best = g;
    keep[static_cast<size_t>(best)] = 1;
  }
  for (int g = 0; g < c.n_group; ++g)
    if (!keep[static_cast<size_t>(g)]) std::fill_n(&choice_[static_cast<size_t>(g) * per], per, -INFINITY);
  return choice_.data();
}

// Routing as transformers does it: the top_k logits (softmax is monotonic,
// so these are the top_k probabilities too), weighted by the softmax over
// them (norm_topk) or over every expert's logit. Then each expert with rows
// runs once over all of them (mm), and its outputs are added to the
// residual, weighted. An expert that every
// row of the chunk goes to (each of a decode step's top_k) reads xn_ and
// its prepared activation as they are: nothing gathered or quantized again.
void Decoder::experts(int layer, int b, float* out, float scale) {
  const DecoderConfig& c = cfg_;
  const LayerWeights& L = w_.layers[static_cast<size_t>(layer)];
  const int H = c.hidden, E = c.n_experts, K = c.top_k, I = c.expert_inter;
  mm(L.router, xn_prep_, xn_.data(), b, or_null(L.router_bias), router_logits_.data());
  for (auto& r : routed_) r.clear();
  int* sel = top_.data();
  for (int j = 0; j < b; ++j) {
    const float* lg = &router_logits_[static_cast<size_t>(j) * E];
    const float* pick = c.sigmoid_gating ? sigmoid_choice(L, lg) : L.expert_bias.empty() ? lg : softmax_choice(L, lg);
    for (int k = 0; k < K; ++k) {  // selection by rank; a tie goes to the lower expert index (NaN: never picked over a number)
      int best = -1;
      for (int e = 0; e < E; ++e)
        if (std::find(sel, sel + k, e) == sel + k && (best < 0 || pick[e] > pick[best])) best = e;
      sel[k] = best;
    }
    if (c.sigmoid_gating) {  // the chosen scores, as transformers sums them (+ 1e-20)
      float sum = 0.f;
      for (int k = 0; k < K; ++k) sum += score_[static_cast<size_t>(sel[k])];
      const float div = c.norm_topk ? sum + 1e-20f : 1.f;
      for (int k = 0; k < K; ++k)
        routed_[static_cast<size_t>(sel[k])].emplace_back(j, score_[static_cast<size_t>(sel[k])] / div * c.routed_scale);
      continue;
    }
    const float mx = lg[sel[0]];
    float sum = 0.f;
    if (c.norm_topk)
      for (int k = 0; k < K; ++k) sum += std::exp(lg[sel[k]] - mx);
    else
      for (int e = 0; e < E; ++e) sum += std::exp(lg[e] - mx);
    for (int k = 0; k < K; ++k)
      routed_[static_cast<size_t>(sel[k])].emplace_back(j, std::exp(lg[sel[k]] - mx) / sum * c.routed_scale);
  }
  for (int e = 0; e < E; ++e) {
    const std::vector<std::pair<int, float>>& rows = routed_[static_cast<size_t>(e)];
    if (rows.empty()) continue;
    const Expert& x = L.experts[static_cast<size_t>(e)];
    const int n = static_cast<int>(rows.size());
    // Rows are routed in token order, each token at most once per expert: n == b is every row, in place
    // (unless each row is first scaled by its weight: weight_before).
    const bool all = n == b && !c.weight_before;
    if (!all) {
      for (int r = 0; r < n; ++r) {
        const float* src = &xn_[static_cast<size_t>(rows[static_cast<size_t>(r)].first) * H];
        float* dst = &ex_x_[static_cast<size_t>(r) * H];
        const float wr = c.weight_before ? rows[static_cast<size_t>(r)].second : 1.f;
        for (int i = 0; i < H; ++i) dst[i] = wr * src[i];
      }
      prepare(ex_prep_, ex_x_.data(), n, H);
    }
    PreparedAct& prep = all ? xn_prep_ : ex_prep_;
    const float* in = all ? xn_.data() : ex_x_.data();
    if (c.glu == Glu::Relu2) {
      mm(x.up, prep, in, n, nullptr, ex_g_.data());
      relu2(ex_g_.data(), n, I);
    } else if (!mm_expert_swiglu(x, prep, n, ex_g_.data())) {
      mm(x.gate, prep, in, n, or_null(x.bgate), ex_g_.data());
      if (c.glu == Glu::Silu) mm(x.up, prep, in, n, nullptr, ex_u_.data());
      glu(c.glu, ex_g_.data(), ex_u_.data(), n, I);
    }
    if (stats_on_) {
      ExpertStats& es = expert_stats_[static_cast<size_t>(layer)];
      add_squares(&es.in[static_cast<size_t>(e) * H], in, n, H);
      add_squares(&es.mid[static_cast<size_t>(e) * I], ex_g_.data(), n, I);
      es.rows[static_cast<size_t>(e)] += n;
      if (!expert_captured_[static_cast<size_t>(layer)].empty()) {
        ExpertRows& kept = expert_captured_[static_cast<size_t>(layer)][static_cast<size_t>(e)];
        kept.in.insert(kept.in.end(), in, in + static_cast<size_t>(n) * H);
        kept.mid.insert(kept.mid.end(), ex_g_.data(), ex_g_.data() + static_cast<size_t>(n) * I);
      }
    }
    prepare(ex_down_prep_, ex_g_.data(), n, I);
    mm(x.down, ex_down_prep_, ex_g_.data(), n, or_null(x.bdown), ex_y_.data());
    for (int r = 0; r < n; ++r) {
      float* xj = out + static_cast<size_t>(rows[static_cast<size_t>(r)].first) * H;
      const float* y = &ex_y_[static_cast<size_t>(r) * H];
      const float wr = (c.weight_before ? 1.f : rows[static_cast<size_t>(r)].second) * scale;
      for (int i = 0; i < H; ++i) xj[i] += wr * y[i];
    }
  }
}

void Decoder::mla_qkv(const LayerWeights& L, int layer, int b) {
  const DecoderConfig& c = cfg_;
  const int hd = c.head_dim, rot = c.rotary_dim(), nope = hd - rot;
  const int nh = c.n_heads, kvl = c.kv_lora, kva = kvl + rot, slot = 4 * c.n_layers + 1 + 2 * layer;
  // q, as stored per head [nope | rotary], into mla_heads_
  if (c.q_lora > 0) {
    const int ql = c.q_lora;
    mm(L.q_a, xn_prep_, xn_.data(), b, nullptr, mla_lat_.data());
    rows(b, [&](int j) {
      float* r = &mla_lat_[static_cast<size_t>(j) * ql];
      rmsnorm(r, L.q_a_norm.data(), ql, c.eps, r);
    });
    if (stats_on_) add_stats(slot, mla_lat_.data(), b, ql);
    prepare(mla_prep_, mla_lat_.data(), b, ql);
    mm(L.q, mla_prep_, mla_lat_.data(), b, nullptr, mla_heads_.data());
  } else {
    mm(L.q, xn_prep_, xn_.data(), b, nullptr, mla_heads_.data());
  }
  // each head's query [q_pe | W_k^T q_nope]: its unrotated part taken into the latent's space
  rows(b, [&](int j) {
    for (int h = 0; h < nh; ++h)
      std::copy_n(&mla_heads_[(static_cast<size_t>(j) * nh + h) * hd + nope], rot, &q_[static_cast<size_t>(j) * q_dim_ + h * hd_]);
  });
  per_head(mla_kb_[static_cast<size_t>(layer)].data(), nope, kvl, mla_heads_.data(), hd, 0, b, q_.data(), hd_, rot);
  // the one cached key [k_pe | RMSNorm(latent)], whose latent part is also every head's value
  mm(L.kv_a, xn_prep_, xn_.data(), b, nullptr, mla_kva_.data());
  rows(b, [&](int j) {
    const float* a = &mla_kva_[static_cast<size_t>(j) * kva];
    float* k = &k_[static_cast<size_t>(j) * kv_dim_];
    std::copy_n(a + kvl, rot, k);
    rmsnorm(a, L.kv_a_norm.data(), kvl, c.eps, k + rot);
  });
  if (stats_on_)  // (kv_b's input: the normed latent)
    for (int j = 0; j < b; ++j) add_stats(slot + 1, &k_[static_cast<size_t>(j) * kv_dim_ + rot], 1, kvl);
}

void Decoder::mla_values(int layer, int b) {
  const int vh = cfg_.value_dim();
  per_head(mla_vbt_[static_cast<size_t>(layer)].data(), vd_, vh, att_.data(), vd_, 0, b, mla_out_.data(), vh, 0);
}

void Decoder::per_head(const float* w, int in, int out, const float* x, int x_step, int x_off, int b, float* y,
                       int y_step, int y_off) {
  const int nh = cfg_.n_heads, tiles = (b + kAttnItemQueries - 1) / kAttnItemQueries;
  const AttnOps& ops = kAttnTable.ops(isa_);
  const size_t per = static_cast<size_t>(in) * static_cast<size_t>(out);
  const int64_t items = static_cast<int64_t>(nh) * tiles;
  parallel_for(*pool_, items, 1, [&](int64_t i0, int64_t i1, int) {
    for (int64_t i = i0; i < i1; ++i) {
      const int h = static_cast<int>(i % nh), j0 = static_cast<int>(i / nh) * kAttnItemQueries;
      const int m = std::min(kAttnItemQueries, b - j0);
      const float* xs[kAttnItemQueries];
      float* ys[kAttnItemQueries];
      for (int r = 0; r < m; ++r) {
        const size_t row = static_cast<size_t>(j0 + r) * nh + static_cast<size_t>(h);
        xs[r] = x + row * static_cast<size_t>(x_step) + x_off;
        ys[r] = y + row * static_cast<size_t>(y_step) + y_off;
        std::fill_n(ys[r], out, 0.f);
      }
      ops.mix(xs, m, w + static_cast<size_t>(h) * per, static_cast<size_t>(out), in, out, ys);
    }
  });
}

void Decoder::run_chunk(const int32_t* tokens, int b, float* logits, bool all_logits, int layers, Stream stream) {
  const DecoderConfig& c = cfg_;
  const int H = c.hidden;
  const int half = static_cast<int>(c.inv_freq.size());  // the rotated dims' half (head_dim / 2 but for partial RoPE)
  for (int j = 0; j < b; ++j) {
    if (stream.in != nullptr)
      std::copy_n(stream.in + static_cast<size_t>(j) * H, H, x_.data() + static_cast<size_t>(j) * H);
    else {
      float* xj = x_.data() + static_cast<size_t>(j) * H;
      embed_row(tokens[j], xj);
      if (c.embed_scale != 1.f)
        for (int i = 0; i < H; ++i) xj[i] *= c.embed_scale;
    }
    // The rotation of position n_past_ + j, the same for q and k and in
    // every layer (every sliding one, where they have their own table).
    float* cs = rope_cs_.data() + static_cast<size_t>(j) * c.head_dim;
    float* cs_swa = rope_cs_swa_.empty() ? nullptr : rope_cs_swa_.data() + static_cast<size_t>(j) * c.head_dim;
    for (int i = 0; i < half; ++i) {
      const float ang = static_cast<float>(n_past_ + j) * c.inv_freq[i];
      cs[i] = std::cos(ang) * c.rope_scale;
      cs[half + i] = std::sin(ang) * c.rope_scale;
      if (cs_swa == nullptr) continue;
      const float a = static_cast<float>(n_past_ + j) * c.inv_freq_swa[i];
      cs_swa[i] = std::cos(a);
      cs_swa[half + i] = std::sin(a);
    }
  }
  for (int l = stream.first; l < layers; ++l) {
    const LayerWeights& L = w_.layers[l];
    if (!c.has_mixer(l)) {  // (Nemotron-H's MLP blocks)
      mlp(l, b);
      continue;
    }
    const std::vector<float>& rope_l = !rope_cs_swa_.empty() && c.windows[l] > 0 ? rope_cs_swa_ : rope_cs_;
    rows(b, [&](int j) {
      if (c.pre_norms)
        input_norm(c, &x_[j * H], L.attn_norm, L.attn_norm_b, &xn_[j * H]);
      else
        std::copy_n(&x_[j * H], H, &xn_[j * H]);
      if (c.parallel_block) std::copy_n(&xn_[j * H], H, &par_[j * H]);
    });
    if (stats_on_) add_stats(4 * l, xn_.data(), b, H);
    prepare(xn_prep_, xn_.data(), b, H);
    if (!c.linear.empty() && c.linear[l]) {
      delta_net(l, b);
      mix_out(l, b, att_.data(), lin_out_);
      continue;
    }
    if (!c.short_conv.empty() && c.short_conv[l]) {
      short_conv(l, b);
      mix_out(l, b, att_.data(), H);
      continue;
    }
    if (!c.ssm1.empty() && c.ssm1[l]) {
      mamba1(l, b);
      mix_out(l, b, att_.data(), c.ssm1_inner);
      continue;
    }
    if (!c.ssm.empty() && c.ssm[l] && !c.ssm_attends) {
      mamba(l, b);
      mix_out(l, b, att_.data(), ssm_inner_);
      continue;
    }
    if (!c.ssm.empty() && c.ssm[l]) {  // Falcon-H1: Mamba2 joins the residual, then the attention reads xn_ too
      mamba(l, b);
      if (stats_on_) add_stats(4 * c.n_layers + 1 + 2 * l, att_.data(), b, ssm_inner_);
      prepare(att_prep_, att_.data(), b, ssm_inner_);
      mm(L.ssm_out, att_prep_, att_.data(), b, nullptr, par_.data());
      rows(b, [&](int j) {
        for (int i = 0; i < H; ++i) x_[j * H + i] += par_[j * H + i] * c.ssm_out_mult;
      });
    }
    const float* bq = or_null(L.bq);
    const float* bk = or_null(L.bk);
    const float* bv = or_null(L.bv);
    const Rows8Job qkv[3] = {{copy_for(L.q, b), nullptr, bq, q_.data()},
                             {copy_for(L.k, b), nullptr, bk, k_.data()},
                             {copy_for(L.v, b), nullptr, bv, v_.data()}};
    if (c.kv_lora > 0) {
      mla_qkv(L, l, b);
    } else if (c.attn_gate) {  // q_proj's rows: each head's query, then its gate
      mm(L.q, xn_prep_, xn_.data(), b, nullptr, qg_.data());
      mm(L.k, xn_prep_, xn_.data(), b, bk, k_.data());
      mm(L.v, xn_prep_, xn_.data(), b, bv, v_.data());
      rows(b, [&](int j) {  // (the gates stay in qg_, where the output reads them)
        const size_t hd = static_cast<size_t>(c.head_dim);
        for (int h = 0; h < c.n_heads; ++h)
          std::copy_n(&qg_[(static_cast<size_t>(j) * c.n_heads + h) * 2 * hd], hd,
                      &q_[static_cast<size_t>(j) * q_dim_ + h * hd]);
      });
    } else if (!(b <= kMaxRows8Batch && qkv[0].w && qkv[1].w && qkv[2].w && rows8(qkv, 3, xn_prep_))) {
      mm(L.q, xn_prep_, xn_.data(), b, bq, q_.data());
      mm(L.k, xn_prep_, xn_.data(), b, bk, k_.data());
      mm(L.v, xn_prep_, xn_.data(), b, bv, v_.data());
    }
    if (!absent(L.q_gate)) mm(L.q_gate, xn_prep_, xn_.data(), b, nullptr, gate_q_.data());  // (AFMoE's gate_proj)
    rows(b, [&](int j) {
      const int pos = n_past_ + j;
      const float* cs = rope_l.data() + static_cast<size_t>(j) * c.head_dim;
      if (c.q_mult != 1.f || c.k_mult != 1.f || c.v_mult != 1.f)  // (Falcon-H1's muP factors)
        for (auto [v, n, m] : {std::tuple{&q_[j * q_dim_], q_dim_, c.q_mult},
                               std::tuple{&k_[j * kv_dim_], kv_dim_, c.k_mult},
                               std::tuple{&v_[j * v_dim_], v_dim_, c.v_mult}})
          for (int i = 0; i < n; ++i) v[i] *= m;
      if (c.clip_qkv > 0.f)  // OLMo: q, k and v clamped as projected
        for (auto [v, n] : {std::pair{&q_[j * q_dim_], q_dim_}, std::pair{&k_[j * kv_dim_], kv_dim_},
                            std::pair{&v_[j * v_dim_], v_dim_}})
          for (int i = 0; i < n; ++i) v[i] = std::clamp(v[i], -c.clip_qkv, c.clip_qkv);
      if (!L.q_norm.empty() && c.qk_norm_full) {  // OLMo 2: the whole projections RMS-normed
        rmsnorm(&q_[j * q_dim_], L.q_norm.data(), q_dim_, c.eps, &q_[j * q_dim_]);
        rmsnorm(&k_[j * kv_dim_], L.k_norm.data(), kv_dim_, c.eps, &k_[j * kv_dim_]);
      } else if (!L.q_norm.empty() && !c.qk_norm_after_rope) {  // Qwen3, Gemma 3: each head's q and k before the rotation
        head_norms(L, j);
      }
      const bool turns = c.nope.empty() || !c.nope[l];
      if (turns) {
        const auto turn = c.rope_interleaved ? rope_interleaved : rope;
        turn(&q_[j * q_dim_], c.n_heads, hd_, half, cs);
        turn(&k_[j * kv_dim_], kv_heads_, hd_, half, cs);
        if (c.qk_l2_norm) {  // Llama 4: each head over its RMS, after the rotation
          for (int h = 0; h < c.n_heads; ++h) rms_unit(&q_[j * q_dim_ + h * hd_], hd_, c.eps);
          for (int h = 0; h < kv_heads_; ++h) rms_unit(&k_[j * kv_dim_ + h * hd_], hd_, c.eps);
        }
      }
      if (!L.q_norm.empty() && c.qk_norm_after_rope) head_norms(L, j);  // HunYuan: after it
      if (c.attn_temp_scale != 0.f && !(c.attn_temp_nope && turns)) {
        // (llama.cpp's floor and log of floats, as transformers' float32 ones)
        const float t = 1.f + c.attn_temp_scale * std::log(std::floor((static_cast<float>(pos) + c.attn_temp_offset) /
                                                                      static_cast<float>(c.attn_temp_floor)) + 1.f);
        for (int i = 0; i < q_dim_; ++i) q_[j * q_dim_ + i] *= t;
      }
      cache_row(k_cache_, l, pos, &k_[j * kv_dim_]);
      if (v_cache_.dim > 0) cache_row(v_cache_, l, pos, &v_[j * v_dim_]);
    });
    {
      Stopwatch sw(timer(&StepTimes::attention_s));
      attention(l, b);
    }
    float* o_in = att_.data();
    if (c.kv_lora > 0) {
      mla_values(l, b);
      o_in = mla_out_.data();
    }
    if (c.attn_gate || !absent(L.q_gate))  // each head's output times the sigmoid of its gate: q_proj's rows
      rows(b, [&](int j) {                   // after its query's (Qwen3.5), or q_gate's (AFMoE)
        const size_t hd = static_cast<size_t>(c.head_dim);
        for (int h = 0; h < c.n_heads; ++h) {
          float* a = o_in + static_cast<size_t>(j) * o_in_ + h * hd;
          const float* g = c.attn_gate ? &qg_[(static_cast<size_t>(j) * c.n_heads + h) * 2 * hd + hd]
                                       : &gate_q_[static_cast<size_t>(j) * q_dim_ + h * hd];
          for (size_t i = 0; i < hd; ++i) a[i] /= 1.f + std::exp(-g[i]);
        }
      });
    mix_out(l, b, o_in, o_in_);
  }
  finish(b, logits, all_logits, layers, stream);
}

void Decoder::head_norms(const LayerWeights& L, int j) {
  const DecoderConfig& c = cfg_;
  for (int h = 0; h < c.n_heads; ++h)
    rmsnorm(&q_[j * q_dim_ + h * c.head_dim], L.q_norm.data(), c.head_dim, c.eps, &q_[j * q_dim_ + h * c.head_dim]);
  for (int h = 0; h < c.n_kv_heads; ++h)
    rmsnorm(&k_[j * kv_dim_ + h * c.head_dim], L.k_norm.data(), c.head_dim, c.eps, &k_[j * kv_dim_ + h * c.head_dim]);
}

void Decoder::mix_out(int l, int b, const float* o_in, int width) {
  const DecoderConfig& c = cfg_;
  const LayerWeights& L = w_.layers[l];
  const int H = c.hidden;
  if (stats_on_) add_stats(4 * l + 1, o_in, b, width);
  prepare(att_prep_, o_in, b, width);
  mm(L.o, att_prep_, o_in, b, or_null(L.bo), xn_.data());
  rows(b, [&](int j) {
    float* xj = &x_[j * H];
    if (!L.attn_post_norm.empty()) rmsnorm(&xn_[j * H], L.attn_post_norm.data(), H, c.eps, &xn_[j * H]);
    const float m = c.residual_scale * (c.attends(l) ? c.o_mult : 1.f);  // (o_mult: an attention's o alone)
    for (int i = 0; i < H; ++i) xj[i] += xn_[j * H + i] * m;
  });
  if (c.has_mlp(l)) mlp(l, b);
}

void Decoder::mlp(int l, int b) {
  const DecoderConfig& c = cfg_;
  const LayerWeights& L = w_.layers[l];
  const int H = c.hidden;
  rows(b, [&](int j) {
    const float* xj = &x_[j * H];
    if (c.parallel_block)
      std::copy_n(&par_[j * H], H, &xn_[j * H]);
    else if (c.pre_norms)
      input_norm(c, xj, L.mlp_norm, L.mlp_norm_b, &xn_[j * H]);
    else
      std::copy_n(xj, H, &xn_[j * H]);
  });
  if (stats_on_) add_stats(4 * l + 2, xn_.data(), b, H);
  prepare(xn_prep_, xn_.data(), b, H);
  const bool moe = !L.experts.empty(), routed_only = moe && c.shared_inter == 0;
  // AFMoE: the routed and the shared outputs summed, then normed (mlp_post_norm), then added to the residual
  const bool pooled = moe && !L.mlp_post_norm.empty();
  if (moe) {
    if (pooled) std::fill_n(moe_out_.data(), static_cast<size_t>(b) * H, 0.f);
    experts(l, b, pooled ? moe_out_.data() : x_.data(), pooled ? 1.f : c.residual_scale);
    if (routed_only && !pooled) return;
    if (!absent(L.shared_gate)) mm(L.shared_gate, xn_prep_, xn_.data(), b, nullptr, shared_gate_.data());
  }
  // The dense MLP, or the shared expert beside the routed ones (experts() read xn_ and xn_prep_ as they are).
  const int I = moe ? c.shared_inter : c.inter;
  if (routed_only) {  // (pooled: the routed outputs alone are normed)
    std::fill_n(att_.data(), static_cast<size_t>(b) * H, 0.f);
  } else if (!c.mlp_gated) {
    mm(L.up, xn_prep_, xn_.data(), b, or_null(L.bup), gate_.data());
    mlp_unit(L, gate_.data(), nullptr, b, I);
  } else if (c.gate_mult != 1.f ||
             !swiglu_rows8(L.gate, L.up, xn_prep_, b, gate_.data(), c.mlp_act == MlpAct::GeluTanh)) {
    mm(L.gate, xn_prep_, xn_.data(), b, nullptr, gate_.data());
    mm(L.up, xn_prep_, xn_.data(), b, nullptr, up_.data());
    if (c.gate_mult != 1.f)  // (Falcon-H1: the gate's projection times its muP factor, before the unit)
      for (size_t i = 0; i < static_cast<size_t>(b) * I; ++i) gate_[i] *= c.gate_mult;
    mlp_unit(L, gate_.data(), up_.data(), b, I);
  }
  if (!routed_only) {
    if (stats_on_) add_stats(4 * l + 3, gate_.data(), b, I);
    prepare(gate_prep_, gate_.data(), b, I);
    mm(L.down, gate_prep_, gate_.data(), b, or_null(L.bdown), att_.data());
  }
  rows(b, [&](int j) {
    float gate = moe && !absent(L.shared_gate) ? 1.f / (1.f + std::exp(-shared_gate_[static_cast<size_t>(j)])) : 1.f;
    float* a = &att_[static_cast<size_t>(j) * H];
    if (pooled) {
      const float* r = &moe_out_[static_cast<size_t>(j) * H];
      for (int i = 0; i < H; ++i) a[i] = a[i] * gate + r[i];
      gate = 1.f;
    }
    if (!L.mlp_post_norm.empty()) rmsnorm(a, L.mlp_post_norm.data(), H, c.eps, a);
    const float s = c.residual_scale * gate * c.down_mult;
    for (int i = 0; i < H; ++i) x_[static_cast<size_t>(j) * H + i] += a[i] * s;
  });
}

void Decoder::finish(int b, float* logits, bool all_logits, int layers, Stream stream) {
  const DecoderConfig& c = cfg_;
  const int H = c.hidden;
  n_past_ += b;
  if (stats_on_) stats_tokens_ += b;
  if (stream.out != nullptr) std::copy_n(x_.data(), static_cast<size_t>(b) * H, stream.out);
  if (layers < c.n_layers) return;
  if (stats_on_) {
    for (int j = 0; j < b; ++j) input_norm(c, &x_[j * H], w_.final_norm, w_.final_norm_b, &xn_[j * H]);
    add_stats(4 * c.n_layers, xn_.data(), b, H);
  }
  if (all_logits) {
    rows(b, [&](int j) { input_norm(c, &x_[j * H], w_.final_norm, w_.final_norm_b, &xn_[j * H]); });
    prepare(xn_prep_, xn_.data(), b, H);
    mm(w_.lm_head, xn_prep_, xn_.data(), b, or_null(w_.lm_head_b), logits);
  } else if (logits != nullptr) {
    input_norm(c, &x_[(b - 1) * H], w_.final_norm, w_.final_norm_b, xn_.data());
    prepare(xn_prep_, xn_.data(), 1, H);
    mm(w_.lm_head, xn_prep_, xn_.data(), 1, or_null(w_.lm_head_b), logits);
  }
  if (logits != nullptr && c.logit_softcap > 0.f)
    rows(all_logits ? b : 1, [&](int j) { softcap(logits + static_cast<size_t>(j) * c.vocab, c.vocab, c.logit_softcap); });
  if (logits != nullptr && c.logits_scaling != 1.f)  // Granite: divided, as transformers does
    rows(all_logits ? b : 1, [&](int j) {
      float* lg = logits + static_cast<size_t>(j) * c.vocab;
      for (int i = 0; i < c.vocab; ++i) lg[i] /= c.logits_scaling;
    });
}

void Decoder::forward(const int32_t* tokens, int n, float* logits, bool all_logits) {
  run(tokens, n, logits, all_logits, cfg_.n_layers, Stream{});
}

void Decoder::run_layers(const int32_t* tokens, int n, int layers, int first, const float* x_in, float* x_out) {
  if (first < 0 || first >= layers || layers > cfg_.n_layers)
    fail("run_layers: layers " + std::to_string(first) + ".." + std::to_string(layers - 1) + " are not within 0.." +
         std::to_string(cfg_.n_layers - 1));
  if (first > 0 && x_in == nullptr) fail("run_layers: starting at layer " + std::to_string(first) + " needs its input");
  run(tokens, n, nullptr, false, layers, Stream{first, x_in, x_out});
}

void Decoder::run(const int32_t* tokens, int n, float* logits, bool all_logits, int layers, Stream stream) {
  if (n < 1) fail("forward: no tokens");
  if (layers == cfg_.n_layers && stream.first == 0 && full_past_ != n_past_)
    fail("forward: positions " + std::to_string(full_past_) + ".." + std::to_string(n_past_ - 1) +
         " were run through the first layers only (run_layers): truncate them first");
  if (n > cfg_.max_ctx - n_past_)
    fail("context full: " + std::to_string(n_past_) + " cached + " + std::to_string(n) + " new tokens > ctx " +
         std::to_string(cfg_.max_ctx));
  for (int i = 0; i < n; ++i)
    if (tokens[i] < 0 || tokens[i] >= cfg_.vocab)
      fail("token id " + std::to_string(tokens[i]) + " is outside the vocabulary (0.." +
           std::to_string(cfg_.vocab - 1) + ")");
  // A single-token call is a decode step: its time is split in step_times_.
  timing_ = n == 1 && layers == cfg_.n_layers && stream.first == 0 && stream.out == nullptr;
  struct TimingOff {
    bool& on;
    ~TimingOff() { on = false; }
  } timing_off{timing_};
  Stopwatch whole(timer(&StepTimes::total_s));
  if (timing_) ++step_times_.steps;
  const int chunk = act_ == Act::Int8 ? int8_chunk_ : kPrefillBatch;
  for (int done = 0; done < n;) {
    const int b = std::min(chunk, n - done);
    const bool last = done + b == n;
    float* out = all_logits ? logits + static_cast<size_t>(done) * cfg_.vocab : (last ? logits : nullptr);
    const size_t at = static_cast<size_t>(done) * cfg_.hidden;
    run_chunk(tokens + done, b, out, all_logits, layers,
              Stream{stream.first, stream.in != nullptr ? stream.in + at : nullptr,
                     stream.out != nullptr ? stream.out + at : nullptr});
    done += b;
  }
  if (layers == cfg_.n_layers && stream.first == 0) full_past_ = n_past_;
}

std::vector<int> pin_threads(ThreadPool& pool, const std::string& mode) {
  const int threads = pool.size();
  if (mode != "compact" && mode != "scatter" && mode != "auto")
    fail("affinity must be compact, scatter or auto, got '" + mode + "'");
  std::vector<int> where(static_cast<size_t>(threads), -1);
#if defined(__linux__)
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) return where;
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &allowed)) cpus.push_back(c);
  if (cpus.empty()) return where;
  const int n = static_cast<int>(cpus.size());
  const bool scatter = mode == "scatter";
  pool.each([&](int t) {
    const int cpu = cpus[static_cast<size_t>(scatter ? (static_cast<long>(t) * n / threads) % n : t % n)];
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    if (sched_setaffinity(0, sizeof(one), &one) == 0) where[static_cast<size_t>(t)] = cpu;
  });
#endif
  return where;
}

uint64_t touch_bytes(const uint8_t* base, size_t size, size_t start, size_t nbytes, size_t stride) {
  if (size == 0 || stride == 0) return 0;
  // One read per started stride of nbytes; positions advance by stride
  // modulo size (so neither the position nor the count can wrap).
  const size_t reads = nbytes / stride + (nbytes % stride != 0), step = stride % size;
  uint64_t sum = 0;
  size_t pos = start % size;
  for (size_t k = 0; k < reads; ++k) {
    sum += base[pos];
    pos += step;
    if (pos >= size) pos -= size;
  }
  return sum;
}

}  // namespace ie
