// A minimal Llama-family decoder (Llama, Mistral, Qwen2, Qwen3, Gemma 1, 2 and 3,
// Phi-2, Phi-3, SmolLM3, Arcee, StableLM, StarCoder2, Nemotron, Granite (and Granite SWA), OLMo 1, 2 and 3,
// Ministral 3, EXAONE 4, Seed-OSS, GLM-4, Cohere and Cohere 2, ERNIE 4.5, and the mixture-of-experts models
// gpt-oss, Qwen3-MoE, Qwen2-MoE, GLM-4.5, MiniMax-M2, OLMoE, Mixtral,
// DeepSeek-V2 and V3, GLM-4.7-Flash, Llama 4, ERNIE 4.5 MoE; Qwen3.5, whose layers mix tokens through gated
// DeltaNet, linear attention, three in four; LFM2, most of whose layers mix them through a short gated
// convolution; Granite 4 and Nemotron-H, most of whose layers mix them through Mamba2's state space, Nemotron-H's
// blocks each a mixer or a ReLU-squared MLP alone, and Mamba-2, every layer of which does; Falcon-H1, whose every layer
// runs Mamba2 beside attention, under muP multipliers; Mamba and Falcon Mamba, every layer of which runs Mamba 1's
// selective scan): RMSNorm, RoPE
// (rotate-half or interleaved pairs; YaRN's and LongRoPE's attention factor included; partial RoPE; a
// second table for sliding layers; layers without RoPE), grouped-query
// attention (or DeepSeek's multi-head latent attention, absorbed into multi-query attention over its latent)
// over a float32 or float16 KV cache with optional per-head or whole
// q/k norms, attention sinks and per-layer sliding windows, a SwiGLU or
// GELU-gated MLP or a routed set of experts (beside a shared one), optional norms of the attention
// and MLP outputs (Gemma's sandwich; OLMo's without the norms before them),
// soft-capped scores and logits (Gemma 2), Granite's residual and logit
// multipliers, Ministral 3's and Llama 4's attention temperature, Cohere's
// LayerNorm and parallel blocks (StableLM's LayerNorm with its biases), Llama 4's chunked attention, weightless q/k
// norms and experts fed their router weight, OLMo's clamp of q, k and v, tied or untied output head.
// Every matrix is read in place, in its stored format,
// through the fused GEMV kernels (gemv.h) -- or, for a prefill chunk of
// more than kMaxBatch tokens with float activations, the GEMM kernels
// (gemm.h), which convert weight tiles to float32 once for the whole
// chunk and run near the FMA peak; the decoder owns only the KV
// cache, activations and the small norm/bias vectors (widened to f32).
//
// The Python side (runtime/decoder.py, runtime/decoder_weights.py) maps HF
// tensor names and the config captured in model.ie.json onto these structs and keeps the mapped
// model.ie.bin alive for the decoder's lifetime.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/aligned.h"
#include "common/isa.h"
#include "common/thread_pool.h"
#include "common/zero_pages.h"
#include "gemm/gemm.h"
#include "dedup/fused_product.h"
#include "gemv/gemv.h"

namespace ie {

// An expert's gated unit. Silu: SiLU(gate) * up, gate and up separate
// matrices [expert_inter, hidden]. GptOss: one matrix [2 expert_inter,
// hidden] whose rows alternate gate, up; gate clamped above at
// swiglu_limit, up to [-limit, limit], out = (up + 1) * gate *
// sigmoid(swiglu_alpha * gate) (transformers' GptOssExperts). Halves:
// SiLU(gate) * up from one matrix [2 expert_inter, hidden], gate's rows
// first, then up's (Llama 4's gate_up_proj, chunk(2)). Relu2: no gate, relu(up)^2
// from up [expert_inter, hidden] alone (Nemotron-H's experts; `gate` empty).
enum class Glu { Silu, GptOss, Halves, Relu2 };
// The dense MLP's (and a shared expert's) unit: act(gate) * up, act SiLU
// (Llama, Qwen, ...) or GELU with the tanh approximation (Gemma 3's
// gelu_pytorch_tanh); without a gate (DecoderConfig::mlp_gated false),
// act(up) alone: Relu2, relu(up)^2 (Nemotron-H's, Arcee's), which has no gate,
// or GELU (StarCoder2's), or Xielu (Apertus's xIELU, act/act.h, with each
// layer's own four parameters, LayerWeights' xielu_*), which has no gate either.
enum class MlpAct { Silu, GeluTanh, Relu2, Xielu };

struct DecoderConfig {
  int n_layers = 0;
  int hidden = 0;
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int inter = 0;
  int vocab = 0;
  int max_ctx = 0;
  float eps = 1e-5f;
  // Per layer: a query attends to the last windows[l] positions, itself
  // included (sliding-window attention: Mistral, gpt-oss's sliding layers);
  // 0 attends to the whole cache.
  std::vector<int> windows;
  // Per layer: a query attends only to the positions of its own chunk of
  // chunks[l] (Llama 4's chunked attention: positions p - p % chunk .. p);
  // 0, or empty for every layer: no chunks.
  std::vector<int> chunks;
  // RoPE inverse frequencies [rotary_dim / 2], scaling (e.g. Llama-3's,
  // YaRN's, LongRoPE's) already applied; rotation pairs are (i, i +
  // rotary_dim / 2) as in HF. rotary_dim is head_dim but for partial RoPE
  // (Phi-4-mini's first 3/4 of each head); the dims after it pass through.
  std::vector<float> inv_freq;
  // The pairs RoPE turns: (i, i + rotary_dim / 2), rotate_half's (Llama and
  // most), or (2i, 2i + 1) with rope_interleaved (GLM-4's).
  bool rope_interleaved = false;
  // YaRN's attention factor: cos and sin are multiplied by it, as
  // transformers does (1 for every other RoPE).
  float rope_scale = 1.f;
  // The sliding layers' RoPE inverse frequencies [rotary_dim / 2] (Gemma 3:
  // its local base, unscaled, cos/sin not multiplied), or empty: every
  // layer rotates by inv_freq.
  std::vector<float> inv_freq_swa;
  // Per layer: nonzero where q and k are not rotated at all (NoPE: SmolLM3's
  // every 4th layer), or empty: every layer rotates.
  std::vector<uint8_t> nope;
  // Scores are q.k times attn_scale (0: 1/sqrt(head_dim); Gemma 3:
  // query_pre_attn_scalar^-1/2); embeddings are multiplied by embed_scale
  // (Gemma: sqrt(hidden); the head reads the unscaled rows).
  float attn_scale = 0.f, embed_scale = 1.f;
  MlpAct mlp_act = MlpAct::Silu;
  // false: the dense MLP (and a shared expert) is up, mlp_act, down, with no
  // gate matrix (Nemotron-H, Arcee, StarCoder2); Relu2 requires it.
  bool mlp_gated = true;
  // Soft-capping (Gemma 2): scores become c tanh(s / c) before the softmax
  // (attn_softcap), logits the same (logit_softcap); 0: none.
  float attn_softcap = 0.f, logit_softcap = 0.f;
  // Granite: the attention's and the MLP's outputs (the experts' and the
  // shared MLP's, Granite 4's) join the residual times residual_scale (its
  // residual_multiplier), and the logits are divided by
  // logits_scaling; 1: Llama's.
  float residual_scale = 1.f, logits_scaling = 1.f;
  // Ministral 3's attention temperature (transformers' get_llama_4_attn_scale,
  // llama.cpp's attention.temperature_scale): after RoPE, the query of
  // position p is multiplied by 1 + attn_temp_scale * ln(1 + floor(p /
  // attn_temp_floor)), so positions past the original context score
  // sharper. 0: none (attn_temp_floor unused).
  // Llama 4's: 1 + attn_temp_scale ln(1 + floor((p + attn_temp_offset) /
  // attn_temp_floor)), on the layers without RoPE alone (attn_temp_nope).
  float attn_temp_scale = 0.f;
  int attn_temp_floor = 0;
  float attn_temp_offset = 0.f;
  bool attn_temp_nope = false;
  // Llama 4's q/k norm: after RoPE, each head of q and k divided by its RMS
  // (no weight), in the layers RoPE turns (Llama4TextL2Norm).
  bool qk_l2_norm = false;
  // HunYuan's per-head q/k RMSNorm (q_norm, k_norm) after RoPE, not before it
  // (HunYuanDenseV1Attention: query_layernorm on the rotated query).
  bool qk_norm_after_rope = false;
  // OLMo's clip_qkv: each element of q, k and v clamped to [-clip_qkv, clip_qkv] after their projections (and
  // biases), before any norm or RoPE (OlmoAttention); 0: none.
  float clip_qkv = 0.f;
  // Cohere's layer (Command R7B, Command A): LayerNorm (the mean taken out;
  // plus a bias where LayerWeights' attn_norm_b, mlp_norm_b and
  // DecoderWeights' final_norm_b have one: StableLM's) where RMSNorm
  // normalizes the layer's and the model's inputs (layer_norm), and the MLP
  // reading the attention's normed input, both blocks' outputs added to the
  // residual together (parallel_block: one norm per layer, mlp_norm empty).
  bool layer_norm = false, parallel_block = false;
  // OLMo 2: no RMSNorm before the attention or the MLP (pre_norms false:
  // each reads the residual itself; their outputs are normed instead,
  // LayerWeights' attn_post_norm / mlp_post_norm), and q_norm / k_norm over
  // the whole q and k projections rather than per head (qk_norm_full).
  bool pre_norms = true, qk_norm_full = false;
  // Mixture of experts (n_experts > 0): a layer with experts sends each
  // token to the top_k experts its router scores highest, each an MLP of
  // expert_inter channels, and adds their outputs weighted by the router.
  int n_experts = 0, top_k = 0, expert_inter = 0;
  // The weights: softmax over the selected logits (gpt-oss, Mixtral, and
  // Qwen3-MoE's norm_topk_prob), else the softmax over all experts'.
  // With sigmoid_gating (GLM-4.5, DeepSeek-V3's router): each expert's score
  // is the sigmoid of its logit; experts are chosen by score plus
  // LayerWeights::expert_bias (which weights nothing), within the topk_group
  // of n_group groups whose two best such sums are highest (n_group 1: one
  // group); the weights are the chosen scores, divided by their sum
  // (norm_topk). Without sigmoid_gating an expert_bias (ERNIE 4.5's) chooses
  // by softmax probability plus bias, the weights as without one. Either way
  // the weights are then times routed_scale. With weight_before (Llama 4),
  // an expert reads its input times its weight and its output joins
  // unweighted (SiLU is not linear: not the same).
  bool norm_topk = true;
  bool weight_before = false;
  bool sigmoid_gating = false;
  int n_group = 1, topk_group = 1;
  float routed_scale = 1.f;
  // The shared expert's channels (0: none): in a layer with experts every
  // token also runs a SwiGLU MLP of this width, held in the layer's dense
  // gate/up/down, its output added beside the routed ones, times the sigmoid
  // of LayerWeights::shared_gate's logit where that has data (Qwen2-MoE's
  // shared_expert and shared_expert_gate; llama.cpp's ffn_*_shexp).
  int shared_inter = 0;
  Glu glu = Glu::Silu;
  float swiglu_alpha = 1.702f, swiglu_limit = 7.f;  // Glu::GptOss only
  // Multi-head latent attention (DeepSeek-V2 and V3, Kimi K2; kv_lora > 0),
  // as transformers' DeepseekV3Attention computes it: q is q_b(RMSNorm(q_a
  // x)) (q_lora > 0) or q x; kv_a x is a latent [kv_lora] and one rotated key
  // part [rotary_dim] every head shares; kv_b(RMSNorm(latent)) gives each
  // head its unrotated key part [head_dim - rotary_dim] and its value
  // [v_head_dim]. It runs absorbed, as llama.cpp's deepseek2 does: each
  // head's query is [q_pe | W_k^T q_nope] (W_k its key rows of kv_b), the one
  // cached key per position [k_pe | latent] and its value the latent (the
  // same cached floats): multi-query attention over kv_lora + rotary_dim
  // dims whose outputs each head's value rows of kv_b lift to v_head_dim.
  // The same scores and outputs as transformers' decompressed heads (rotated
  // part first: the same dot product as its [nope | pe]); RoPE turns the
  // first rotary_dim dims as partial RoPE does; the KV cache holds
  // kv_lora + rotary_dim elements per position and layer, not n_heads
  // (head_dim + v_head_dim) (DeepSeek-V3: 576 against 40960). n_kv_heads
  // is n_heads (transformers' view).
  int q_lora = 0, kv_lora = 0;
  // The value heads' dims (MLA's v_head_dim); 0: head_dim.
  int v_head_dim = 0;
  // The KV cache's element types, WType::F32 or F16 (llama.cpp's default:
  // half the memory, and half the bytes each decode step reads from a long
  // context; the attention still multiplies floats, the f16 values widened
  // exactly). The CUDA decoder keeps f32 only.
  WType k_cache = WType::F32, v_cache = WType::F32;
  // Qwen3.5's gated attention (Qwen3-Next's too): q_proj's rows hold, head
  // by head, the query's head_dim rows and then as many gate rows
  // ([n_heads][2][head_dim]); each head's attention output is times the
  // sigmoid of its gate before o_proj.
  bool attn_gate = false;
  // Gated DeltaNet (Qwen3.5's and Qwen3-Next's linear attention), per layer:
  // nonzero where the layer mixes tokens through it instead of attention
  // (empty: no layer does). Such a layer (transformers' Qwen3_5GatedDeltaNet)
  // projects its normed input to q, k [lin_k_heads][lin_k_dim] and v
  // [lin_v_heads][lin_v_dim] (lin_qkv), runs them through a causal
  // depthwise convolution of lin_conv taps and SiLU, divides each q and k
  // head by its L2 norm (q also by sqrt(lin_k_dim)), and keeps per value
  // head a state S [lin_k_dim][lin_v_dim] that each token decays by
  // exp(g) and corrects towards its value (the delta rule, rate beta):
  //   S = exp(g) S;  S += k (beta (v - S^T k))^T;  out = S^T q
  // with beta = sigmoid(lin_b x), g = lin_decay * softplus(lin_a x +
  // lin_dt). Each head's output is RMS-normed (lin_norm, plain weights)
  // times SiLU(lin_z x), and o_proj [hidden, lin_v_heads lin_v_dim] maps
  // the heads back. A value head h reads key head h / (lin_v_heads /
  // lin_k_heads) (Hugging Face's grouped order) or, with lin_v_tiled, h %
  // lin_k_heads (llama.cpp's order, which its converter writes). The
  // states (and the convolution's last lin_conv - 1 inputs) replace the KV
  // cache for such a layer: they cannot be rewound (Decoder::truncate).
  std::vector<uint8_t> linear;
  int lin_k_heads = 0, lin_v_heads = 0, lin_k_dim = 0, lin_v_dim = 0, lin_conv = 0;
  bool lin_v_tiled = false;
  // LFM2's short gated convolution, per layer: nonzero where the layer mixes
  // tokens through it instead of attention (empty: no layer does). Such a
  // layer (transformers' Lfm2ShortConv) projects its normed input to B, C and
  // x [hidden] each (conv_in's rows, in that order), runs B * x through a
  // causal depthwise convolution of conv_taps taps (no bias, no activation),
  // multiplies the result by C, and o (its out_proj) maps it back. The last
  // conv_taps - 1 inputs B * x replace the KV cache for such a layer: they
  // cannot be rewound (Decoder::truncate).
  std::vector<uint8_t> short_conv;
  int conv_taps = 0;
  // Mamba2's selective state space (Granite 4's hybrid layers, Nemotron-H's), per layer:
  // nonzero where the layer mixes tokens through it instead of attention
  // (empty: no layer does). Such a layer (transformers'
  // GraniteMoeHybridMambaLayer) projects its normed input to z [inner], x
  // [inner], B and C [ssm_groups][ssm_state] each and dt [ssm_heads]
  // (ssm_in's rows, in that order; inner = ssm_heads ssm_head_dim), runs x,
  // B, C through a causal depthwise convolution of ssm_conv taps plus bias
  // and SiLU, and keeps per head h a state S [ssm_head_dim][ssm_state]:
  //   dt = softplus(dt + dt_bias);  S = exp(dt A) S + dt x B^T;  y = S C + D x
  // with head h reading group h / (ssm_heads / ssm_groups)'s B and C. The
  // heads' outputs times SiLU(z) are RMS-normed group by group (inner /
  // ssm_groups channels each) times ssm_norm, and o (its out_proj) maps them
  // back. The states and the convolution's last ssm_conv - 1 inputs replace
  // the KV cache for such a layer: they cannot be rewound (Decoder::truncate).
  std::vector<uint8_t> ssm;
  int ssm_heads = 0, ssm_head_dim = 0, ssm_state = 0, ssm_groups = 0, ssm_conv = 0;
  // Nemotron-H's blocks, each one norm and one of a mixer or an MLP, per
  // layer: nonzero in mlp_only where the layer is its MLP or experts alone
  // (normed by mlp_norm; no attention, states or KV cache), in mixer_only
  // where it is its attention or Mamba2 alone (normed by attn_norm; no MLP);
  // empty: every layer both.
  std::vector<uint8_t> mlp_only, mixer_only;
  // Mamba 1's selective state space (MambaForCausalLM, FalconMambaForCausalLM), per layer: nonzero where the layer
  // mixes tokens through it (empty: no layer does). Such a layer projects its normed input to x and z [ssm1_inner]
  // each (ssm_in's rows), runs x through a causal depthwise convolution of ssm_conv taps plus bias and SiLU, projects
  // x to dt's low rank [ssm1_rank], B and C [ssm_state] (ssm_x's rows; with ssm1_norms each RMS-normed without
  // weights, eps ssm1_eps: Falcon Mamba's), dt = softplus(ssm_dt_w dt_low + ssm_dt), and keeps per channel ch a state
  // h [ssm_state]:  h = exp(dt A[ch]) h + dt x B;  y = h . C + D x; y times SiLU(z), and o (its out_proj) maps it
  // back. The states and the convolution's last ssm_conv - 1 inputs replace the KV cache (Decoder::truncate).
  std::vector<uint8_t> ssm1;
  int ssm1_inner = 0, ssm1_rank = 0;
  bool ssm1_norms = false;
  float ssm1_eps = 0.f;
  // Falcon-H1's hybrid layers: true where every ssm layer also attends, Mamba2 and attention reading the one normed
  // input side by side and their outputs (ssm_out's, o's) joining the residual together, then the layer's MLP. Its
  // Mamba2 may run without the grouped RMSNorm (ssm_norm empty: y times SiLU(z) alone, mamba_rms_norm false).
  bool ssm_attends = false;
  // Falcon-H1's muP multipliers, each a factor on one projection's output (1: none; transformers multiplies the
  // input, the same where there is no bias): q, k and v (attention_in_multiplier, k also key_multiplier), o
  // (attention_out_multiplier), Mamba2's in_proj by its row groups z, x, B, C, dt (ssm_in_multiplier times
  // ssm_multipliers; empty: none), its out_proj (ssm_out_multiplier), the MLP's gate and down (mlp_multipliers).
  float q_mult = 1.f, k_mult = 1.f, v_mult = 1.f, o_mult = 1.f, ssm_out_mult = 1.f, gate_mult = 1.f, down_mult = 1.f;
  std::vector<float> ssm_in_mults;

  // Whether layer l keeps recurrent states in place of a KV cache (gated DeltaNet, short convolution, Mamba2, Mamba 1).
  bool recurrent(int l) const {
    auto on = [l](const std::vector<uint8_t>& v) { return !v.empty() && v[static_cast<size_t>(l)] != 0; };
    return on(linear) || on(short_conv) || on(ssm) || on(ssm1);
  }
  // Whether layer l mixes tokens (attention or a recurrent mixer), and whether it has an MLP (Nemotron-H's blocks
  // have one or the other).
  bool has_mixer(int l) const { return mlp_only.empty() || mlp_only[static_cast<size_t>(l)] == 0; }
  bool has_mlp(int l) const { return mixer_only.empty() || mixer_only[static_cast<size_t>(l)] == 0; }
  // Whether layer l attends, keeping a KV cache (a Falcon-H1 layer beside its states).
  bool attends(int l) const { return has_mixer(l) && (!recurrent(l) || ssm_attends); }

  // The dims RoPE turns of a q/k head (head_dim but for partial RoPE and latent attention), and a value head's.
  int rotary_dim() const { return 2 * static_cast<int>(inv_freq.size()); }
  int value_dim() const { return v_head_dim > 0 ? v_head_dim : head_dim; }
};

// A matrix in its stored format; `data` points into the mapped file.
// `rows8` is the decoder's own row-interleaved copy for decode steps
// (gemv/rows8.h), packed at load where the act=int8 GEMV reads one.
// A dedup member has no `data`: `dedup` plans its fused GEMV over the
// store's blobs, and `store` (which outlives the decoder) serves it from its
// LRU cache where it fits there (dedup/dedup.h).
struct Matrix {
  WeightSpec spec;
  const uint8_t* data = nullptr;
  std::shared_ptr<const Rows8> rows8;
  std::shared_ptr<const DedupMatrix> dedup;
  dedup::DedupStore* store = nullptr;
  std::string name;  // the member's name in `store`
};

// One expert: gate and up (Glu::Silu), or the interleaved gate_up in
// `gate` (Glu::GptOss, `up` empty), or up alone (Glu::Relu2, `gate` empty);
// biases empty where the model has none.
// The matrices are slices of the stored [experts, rows, cols] stack (or an
// expert's own tensor), read in place: only the routed experts' pages are
// ever touched.
struct Expert {
  Matrix gate, up, down;
  std::vector<float> bgate, bdown;
};

struct LayerWeights {
  std::vector<float> attn_norm, mlp_norm;
  std::vector<float> attn_norm_b, mlp_norm_b;  // LayerNorm's biases (layer_norm; StableLM's), or empty: none
  // RMSNorm of the attention's and the MLP's outputs before they join the
  // residual (Gemma 3's post_attention / post_feedforward norms; in a layer
  // with experts, of the routed and shared outputs' sum: AFMoE's), or empty.
  std::vector<float> attn_post_norm, mlp_post_norm;
  // gate/up/down: the dense MLP, or in a layer with experts the shared expert (no data: none)
  Matrix q, k, v, o, gate, up, down;
  std::vector<float> bq, bk, bv, bo;  // empty when the architecture has none
  std::vector<float> bup, bdown;      // the dense MLP's biases (StarCoder2's c_fc, c_proj), or empty
  std::vector<float> q_norm, k_norm;  // per-head RMSNorm weights [head_dim] (Qwen3), or empty
  std::vector<float> sinks;           // attention sink logit per head (gpt-oss), or empty
  // [n_heads head_dim, hidden]: the attention output's gate as a matrix of its own (AFMoE's self_attn.gate_proj:
  // each head's output times the sigmoid of gate_proj x before o_proj, as attn_gate's rows in q_proj do), or no data
  Matrix q_gate;
  // xIELU's raw parameters, one value each (MlpAct::Xielu; the checkpoint's act_fn.alpha_p, alpha_n, beta,
  // eps, Xielu::from_raw's arguments), or empty
  std::vector<float> xielu_alpha_p, xielu_alpha_n, xielu_beta, xielu_eps;
  Matrix router;                      // [n_experts, hidden] in a layer with experts
  std::vector<float> router_bias;     // [n_experts] or empty
  std::vector<float> expert_bias;     // [n_experts]: the choice bias (e_score_correction_bias), or empty
  Matrix shared_gate;                 // [1, hidden]: the shared expert's sigmoid gate, or no data (weight 1)
  // Multi-head latent attention (DecoderConfig::kv_lora > 0): q holds q_b (or
  // q_proj without q_lora), k and v no data; q_a [q_lora, hidden] and its norm,
  // kv_a [kv_lora + rotary_dim, hidden], kv_b [n_heads (head_dim - rotary_dim
  // + v_head_dim), kv_lora] and kv_a_norm [kv_lora].
  Matrix q_a, kv_a, kv_b;
  std::vector<float> q_a_norm, kv_a_norm;
  // Gated DeltaNet (DecoderConfig::linear; q, k, v no data, o its out_proj):
  // lin_qkv [2 lin_k_heads lin_k_dim + lin_v_heads lin_v_dim, hidden], lin_z
  // [lin_v_heads lin_v_dim, hidden], lin_b and lin_a [lin_v_heads, hidden];
  // lin_conv the convolution's taps [channels][lin_conv] (channels: lin_qkv's
  // rows), lin_dt and lin_decay (-exp(A_log)) [lin_v_heads], lin_norm [lin_v_dim].
  Matrix lin_qkv, lin_z, lin_b, lin_a;
  std::vector<float> lin_conv, lin_dt, lin_decay, lin_norm;
  // LFM2's short convolution (DecoderConfig::short_conv; q, k, v no data, o
  // its out_proj): conv_in [3 hidden, hidden] (B's rows, C's, x's), conv_w
  // the taps [hidden][conv_taps].
  Matrix conv_in;
  std::vector<float> conv_w;
  // Mamba2 (DecoderConfig::ssm; q, k, v no data, o its out_proj): ssm_in
  // [2 inner + 2 ssm_groups ssm_state + ssm_heads, hidden]; ssm_conv_w the
  // taps [channels][ssm_conv] and ssm_conv_b their bias [channels] (channels:
  // inner + 2 ssm_groups ssm_state); ssm_dt (dt_bias), ssm_a (-exp(A_log))
  // and ssm_d [ssm_heads]; ssm_norm [inner] (or, with ssm_attends, empty:
  // none). With ssm_attends, q, k, v and o are the attention's and ssm_out
  // [hidden, inner] is Mamba2's out_proj.
  Matrix ssm_in, ssm_out;
  std::vector<float> ssm_conv_w, ssm_conv_b, ssm_dt, ssm_a, ssm_d, ssm_norm;
  // Mamba 1 (DecoderConfig::ssm1; q, k, v no data, o its out_proj): ssm_in [2 ssm1_inner, hidden] (x's rows, z's),
  // ssm_conv_w [ssm1_inner][ssm_conv], ssm_conv_b, ssm_x [ssm1_rank + 2 ssm_state, ssm1_inner] (x_proj), ssm_dt_w
  // [ssm1_inner, ssm1_rank] (dt_proj) and its bias ssm_dt, ssm_a (-exp(A_log)) [ssm1_inner][ssm_state], ssm_d
  // [ssm1_inner].
  Matrix ssm_x, ssm_dt_w;
  // The matrices outside the experts a decode step streams whole (kv_b, read per head, apart): the one list the
  // decoder's resident copies and int8 chunk size go by.
  std::array<Matrix*, 20> streamed() {
    return {&q, &k, &v, &o, &gate, &up, &down, &shared_gate, &q_a, &kv_a, &lin_qkv, &lin_z, &lin_b, &lin_a, &conv_in,
            &ssm_in, &ssm_out, &ssm_x, &ssm_dt_w, &q_gate};
  }
  std::vector<Expert> experts;        // empty: a dense MLP layer
};

struct DecoderWeights {
  // [vocab, hidden]; rows are read one token at a time, in place.
  Matrix embed;
  std::vector<LayerWeights> layers;
  std::vector<float> final_norm, final_norm_b;  // (final_norm_b: LayerNorm's bias, or empty)
  Matrix lm_head;  // may alias embed (tied)
  std::vector<float> lm_head_b;  // [vocab]: the head's bias (Phi-2's), or empty
};

// The checks every decoder (CPU, CUDA) makes of its configuration and
// weights before it uses any: dimensions, layer count, every matrix's and
// vector's shape. dedup_plans: a dedup member must carry its fused-GEMV
// plan (the CPU decoder; the CUDA one rebuilds members from the store).
// Throws std::invalid_argument naming the first inconsistent one.
void check_decoder(const DecoderConfig& c, const DecoderWeights& w, bool dedup_plans);

class Decoder {
 public:
  // Throws std::invalid_argument naming the first inconsistent dimension.
  // affinity: "" (threads not pinned), or pin_threads' mode, applied before
  // the weights are copied (so each copy is first touched where it is read).
  // copy_experts: experts get rows8 copies too (Decoder::Decoder says when that pays).
  // grow_copies: dense matrices get rows8 copies larger than their stored
  // bytes (the codebook types'); false: those keep their stored layout.
  Decoder(DecoderConfig cfg, DecoderWeights w, Act act, int threads, Isa isa, const std::string& affinity = "",
          bool copy_experts = false, bool grow_copies = true);

  // Runs `n` tokens at positions n_past() .. n_past()+n-1, appending their
  // K/V to the cache. Writes [n, vocab] logits when all_logits, else only
  // the last token's [vocab] (the head runs once). Tokens go through the
  // matrices kPrefillBatch at a time with float activations (GEMM), and
  // 64 (with experts kMaxRows8Batch) at a time with int8 ones (kMaxBatch
  // where a quantized matrix has no rows8 copy: the GEMV's int8 path is
  // the one being asked for); one weight read serves the whole chunk.
  void forward(const int32_t* tokens, int n, float* logits, bool all_logits);
  // As forward, through layers first .. layers-1 only and without the
  // output head: a calibration pass that collects statistics (collect_stats)
  // of some layers' inputs stops where they end. It starts from the tokens'
  // embedding (first 0, x_in null) or from x_in [n, hidden], the residual
  // stream entering layer `first`; x_out (if not null) gets the stream
  // leaving layer layers-1. So a pass can resume where the last one
  // stopped, and collecting every layer's covariances in windows costs one
  // run of the layers, not one per window. The other layers have no cache
  // for those positions, so forward refuses to run on from them until they
  // are truncated. Throws unless 0 <= first < layers <= n_layers, and x_in
  // is given where first > 0.
  void run_layers(const int32_t* tokens, int n, int layers, int first = 0, const float* x_in = nullptr,
                  float* x_out = nullptr);

  // Activation statistics for an importance matrix (llama-imatrix's): while
  // on, every token run adds x^2 of each matrix input, per column, in
  // float64. Turning it on clears them. Inputs per layer l, at 4 l + k:
  // k = 0 the attention norm's output (q/k/v), 1 the attention output (o),
  // 2 the MLP norm's output (gate/up, router), 3 SiLU(gate) * up (down;
  // empty in a layer with experts, whose down inputs are per expert); at
  // 4 n_layers the final norm's output (the head); with multi-head latent
  // attention, at 4 n_layers + 1 + 2 l + k: k = 0 q_a's normed output (q_b;
  // empty without q_lora), 1 the latent's (kv_b). The inputs of the slots
  // in `capture` are also kept row by row (float32 [tokens, n]) until
  // take_captured(slot) hands them over: the input covariances GPTQ-style
  // quantization needs (runtime/hessians.py), a chunk at a time.
  // A layer with experts also sums per expert (expert_stats): each expert
  // sees only the rows routed to it, and an importance matrix that pooled
  // them would weight every expert by the others' inputs. The layers in
  // `capture_experts` (each one with experts) keep each expert's routed
  // input rows and its down projection's input rows too, until
  // take_expert_captured(layer): each expert's own covariances.
  void collect_stats(bool on, const std::vector<int>& capture = {}, const std::vector<int>& capture_experts = {});
  const std::vector<std::vector<double>>& stats() const { return stats_; }
  // Per layer (all empty for a dense one): sum of x^2 of each expert's
  // input rows [n_experts][hidden] (gate/up) and of its down projection's
  // inputs [n_experts][expert_inter], and how many rows it was routed [n_experts].
  struct ExpertStats {
    std::vector<double> in, mid, rows;
  };
  const std::vector<ExpertStats>& expert_stats() const { return expert_stats_; }
  int64_t stats_tokens() const { return stats_tokens_; }
  // The rows captured for `slot` since the last call (moved out; n per row).
  std::vector<float> take_captured(int slot, int* n);
  // Per expert of a capture_experts layer, the rows routed to it since the
  // last call: its input (hidden wide) and its down projection's input
  // (expert_inter wide), moved out.
  struct ExpertRows {
    std::vector<float> in, mid;
  };
  std::vector<ExpertRows> take_expert_captured(int layer);

  // Bytes of the rows8 copies packed at load (0 where the int8 GEMV has no
  // rows8 kernel: act=f32, or the scalar ISA; the stored bytes are then
  // copied as they are).
  size_t rows8_bytes() const { return rows8_bytes_; }
  // Whether any expert got a rows8 copy (copy_experts, on an ISA and act with the kernels).
  bool experts_copied() const { return experts_copied_; }
  // Each thread's CPU (-1: not pinned); empty without an affinity.
  const std::vector<int>& pinned() const { return pinned_; }
  // Parallel jobs run on the calling thread alone because the machine was busy (thread_pool.h).
  uint64_t solo_jobs() const { return pool_->solo_jobs(); }

  // Where the time of single-token forward calls (decode steps) went since
  // the last reset: wall seconds inside weight matmuls (their threads'
  // start and join included), inside attention, and in all (the rest:
  // norms, RoPE, activation quantization, residual adds, the embedding
  // row). ierun bench reports them per step: a step that is nearly all
  // matmul is limited by how fast the kernels stream the weights, one that
  // is not by the work between them.
  struct StepTimes {
    int64_t steps = 0;
    double total_s = 0, matmul_s = 0, attention_s = 0;
  };
  const StepTimes& step_times() const { return step_times_; }
  void reset_step_times() { step_times_ = StepTimes(); }

  // Drops cached positions >= n (prefix reuse between prompts). A model
  // with linear-attention layers keeps recurrent states, which cannot be
  // rewound: it truncates to 0 (all) or n_past() (nothing) only.
  void truncate(int n);
  bool rewinds() const {
    return cfg_.linear.empty() && cfg_.short_conv.empty() && cfg_.ssm.empty() && cfg_.ssm1.empty();
  }
  int n_past() const { return n_past_; }
  const DecoderConfig& config() const { return cfg_; }

 private:
  void embed_row(int32_t token, float* out) const;
  // forward and run_layers: `layers` layers, then the head where all are run.
  // run_layers: x_in the stream entering layer `first` (null: the tokens' embedding), x_out the one leaving.
  struct Stream {
    int first = 0;
    const float* in = nullptr;
    float* out = nullptr;
  };
  void run(const int32_t* tokens, int n, float* logits, bool all_logits, int layers, Stream stream);
  void run_chunk(const int32_t* tokens, int b, float* logits, bool all_logits, int layers, Stream stream);
  // The rest of layer l after its token mixing: o_proj of o_in [b, width], the residual add, then mlp (unless the
  // layer has none).
  void mix_out(int l, int b, const float* o_in, int width);
  // Row j's per-head RMSNorm of q and k by the layer's q_norm / k_norm.
  void head_norms(const LayerWeights& L, int j);
  // Layer l's MLP block: its norm of the residual x_, the dense MLP or the experts (beside a shared one), the
  // residual add.
  void mlp(int l, int b);
  // After a chunk's layers: positions counted, the stream handed out, the head's logits where every layer ran.
  void finish(int b, float* logits, bool all_logits, int layers, Stream stream);
  void attention(int layer, int b);
  // Gated DeltaNet's token mixing (DecoderConfig::linear) of xn_ [b, hidden]
  // (prepared in xn_prep_): its heads' gated, normed outputs into att_ [b,
  // lin_v_heads lin_v_dim], the layer's states advanced by b tokens.
  void delta_net(int layer, int b);
  // LFM2's short convolution (DecoderConfig::short_conv) of xn_ [b, hidden]
  // into att_ [b, hidden], for o (its out_proj) to map.
  void short_conv(int layer, int b);
  // Mamba2's selective state space (DecoderConfig::ssm) of xn_ [b, hidden]
  // into att_ [b, inner], the layer's states advanced by the b tokens.
  void mamba(int layer, int b);
  // Mamba 1's selective scan (DecoderConfig::ssm1) of xn_ [b, hidden] into att_ [b, ssm1_inner]
  void mamba1(int layer, int b);
  // At load, for a recurrent layer kind (`on`: per layer): each such layer's convolution inputs (conv floats) and
  // state (state floats), zeroed, and each thread's scratch (lin_scratch_) at least `scratch` floats.
  void recurrent_states(const std::vector<uint8_t>& on, size_t conv, size_t state, size_t scratch);
  // The causal depthwise convolution (taps K, plus bias where given) and SiLU
  // of `channels` channels of b rows `stride` apart, in place; `state` keeps
  // each channel's last K - 1 inputs [K - 1][channels] (gated DeltaNet's, Mamba2's).
  void conv_silu(float* state, float* data, size_t stride, int channels, int K, const float* w, const float* bias,
                 int b);
  // The routed experts of layer `layer` over xn_ [b, hidden]; adds their
  // weighted outputs to x_ (the residual).
  // Adds each token's routed experts' outputs, weighted and times `scale`, into out's row of the token.
  void experts(int layer, int b, float* out, float scale);
  // Sigmoid gating's scores (score_) and choice (returned) of one row's router logits `lg`.
  const float* sigmoid_choice(const LayerWeights& L, const float* lg);
  // Softmax gating's choice with LayerWeights::expert_bias (returned) of one row's router logits `lg`.
  const float* softmax_choice(const LayerWeights& L, const float* lg);
  // SiLU(gate) * up (or gpt-oss's clamped unit) of n rows of `width`
  // channels: g holds gate (Glu::GptOss: interleaved gate/up, 2 width per
  // row), u up; the result lands in g's first n * width floats.
  void glu(Glu kind, float* g, const float* u, int n, int width) const;
  using ActFn = void (*)(float*, const float*, const float*, size_t);
  void act_rows(ActFn op, float* g, const float* u, int n, int width) const;
  void mlp_unit(const LayerWeights& L, float* g, const float* u, int n, int width) const;
  void relu2(float* g, int n, int width) const;
  // fn(j) for each of a chunk's n token rows, shared by the pool's threads
  // (a single row runs on this thread, waking none).
  template <class F>
  void rows(int n, F&& fn) const {
    parallel_for(*pool_, n, 1, [&](int64_t j0, int64_t j1, int) {
      for (int64_t j = j0; j < j1; ++j) fn(static_cast<int>(j));
    });
  }
  // x [b, cols]: through the GEMV (prepared once in `prep` for every matrix
  // that reads it) when b <= kMaxBatch (kMaxRows8Batch for a matrix with a
  // rows8 copy and int8 activations), else through the GEMM.
  void prepare(PreparedAct& prep, const float* x, int b, int cols);
  // One weight matrix times x (counted in step_times_.matmul_s while a
  // step is timed): packing rows8 tiles as it goes (packs), else
  // mm_plain, or mm_dedup for a dedup member.
  void mm(const Matrix& m, PreparedAct& prep, const float* x, int b, const float* bias, float* y);
  void mm_plain(const Matrix& m, PreparedAct& prep, const float* x, int b, const float* bias, float* y);
  void mm_dedup(const Matrix& m, PreparedAct& prep, const float* x, int b, const float* bias, float* y);
  // Whether a product over b rows of a matrix read in place (an expert, or
  // a dense matrix whose larger rows8 copy did not fit) packs rows8 tiles.
  bool packs(const Matrix& m, int b) const;
  // SiLU(gate) * up of a Silu expert's b rows into y in one product: over
  // both matrices' copies (swiglu_rows8), else where both pack
  // (gemv_packing_swiglu); false, having done nothing, where neither.
  bool mm_expert_swiglu(const Expert& e, PreparedAct& prep, int b, float* y);
  // SiLU(gate x) * (up x) (gelu: GELU's) into y in one fused pass over
  // gate's and up's rows8 copies (a dense MLP's, copied experts'); false,
  // having done nothing, where either has no copy or b is past a rows8 batch.
  bool swiglu_rows8(const Matrix& gate, const Matrix& up, PreparedAct& prep, int b, float* y, bool gelu = false);
  // gemv_rows8 (gemv.h) on this decoder's threads and ISA, timed as mm is.
  bool rows8(const Rows8Job* jobs, int n, PreparedAct& x);
  // The rows8 copy a product of b tokens reads: m's, but none for one token of a type
  // whose stored bytes decode faster (rows8_decodes).
  static const Rows8* copy_for(const Matrix& m, int b);
  // Where a timed step adds (null: this call is not a single-token step).
  double* timer(double StepTimes::*field) { return timing_ ? &(step_times_.*field) : nullptr; }

  DecoderConfig cfg_;
  DecoderWeights w_;
  Act act_;
  std::unique_ptr<ThreadPool> pool_;  // a pointer, so const members can run work on it
  Isa isa_;
  int n_past_ = 0;
  int full_past_ = 0;  // positions cached in every layer (run_layers caches the first layers only)
  int q_dim_ = 0, kv_dim_ = 0;
  // The attention's key and value head dims and KV heads (latent attention: kv_lora + rotary_dim, kv_lora and
  // one), a token's values' width (latent attention: 0, its values are in its keys), its attention outputs'
  // (n_heads vd_), and o_proj's input width.
  int hd_ = 0, vd_ = 0, kv_heads_ = 0, v_dim_ = 0, o_dim_ = 0, o_in_ = 0;
  size_t rows8_bytes_ = 0;
  bool experts_copied_ = false;
  int int8_chunk_ = kMaxBatch;  // tokens per int8 prefill chunk (set at load: more where every matrix allows)
  std::vector<int> pinned_;
  StepTimes step_times_;
  bool timing_ = false;  // within a single-token forward
  std::vector<AlignedArray<uint8_t>> copies_;  // the matrices without rows8, copied at load as stored
  bool stats_on_ = false;
  std::vector<std::vector<double>> stats_;
  std::vector<ExpertStats> expert_stats_;
  std::vector<std::vector<float>> captured_;  // per slot, rows of its input (slots in capture only)
  std::vector<char> capture_on_;
  std::vector<std::vector<ExpertRows>> expert_captured_;  // per layer (capture_experts only), per expert
  int64_t stats_tokens_ = 0;
  void add_stats(int slot, const float* x, int b, int n);
  // Half of the KV cache: [layer][kv_head][max_ctx][head_dim] elements of
  // `type` (DecoderConfig::k_cache, v_cache); pages resident once written.
  // Head-major, so the block of positions an attention item reads is one
  // contiguous run, at stride head_dim for the tiles (rows of every head,
  // kv_dim apart, measured no slower or faster: docs/benchmarks.md).
  struct KvCache {
    WType type = WType::F32;
    int heads = 0, dim = 0;  // its heads, and a head's elements
    // Per layer, its place among the layers with attention (recurrent layers and MLP blocks have none: -1)
    std::vector<int> slot;
    ZeroPages<uint8_t> bytes;
    size_t elem() const { return static_cast<size_t>(wtype_info(type).block_bytes); }
    // Where head `head`'s element 0 at position `pos` of `layer` is.
    uint8_t* at(const DecoderConfig& c, int layer, int head, int pos) {
      const size_t run = static_cast<size_t>(slot[layer]) * static_cast<size_t>(heads) + static_cast<size_t>(head);
      return bytes.data() + ((run * c.max_ctx + static_cast<size_t>(pos)) * static_cast<size_t>(dim)) * elem();
    }
  };
  KvCache k_cache_, v_cache_;
  // Appends a position's heads (cache.dim floats each) at (layer, pos), converted to the cache's type.
  void cache_row(KvCache& cache, int layer, int pos, const float* src);
  std::vector<float> x_, xn_, q_, k_, v_, att_, gate_, up_, scores_;
  std::vector<float> qg_;  // attn_gate: q_proj's rows as stored [chunk, n_heads][query | gate]
  // Gated DeltaNet: lin_qkv's, lin_z's, lin_b's and lin_a's rows of a chunk; per layer (empty where it has
  // attention) the convolution's last lin_conv - 1 inputs [lin_conv - 1][channels] and the states
  // [lin_v_heads][lin_k_dim][lin_v_dim]. A short-convolution layer's conv_state_ holds its last conv_taps - 1
  // inputs B * x [conv_taps - 1][hidden], conv_bcx_ conv_in's rows of a chunk [b][3 hidden].
  // A Mamba2 layer's ssm_in rows of a chunk [b][ssm_rows_] (z, then x B C convolved in place, then dt); its states
  // in lin_state_ [ssm_heads][ssm_head_dim][ssm_state], its convolution's in conv_state_. A Mamba 1 layer's ssm_in
  // rows likewise [b][x | z], x_proj's [b][dt_low | B | C] in ssm1_dbc_, dt_low alone [b][ssm1_rank] (dt_proj's
  // input) in ssm1_low_, dt [b][ssm1_inner] in ssm1_dt_; its states lin_state_ [ssm1_inner][ssm_state].
  std::vector<float> lin_qkv_, lin_z_, lin_beta_, lin_g_, conv_bcx_, ssm_zxbcdt_, ssm1_dbc_, ssm1_low_, ssm1_dt_;
  int ssm_rows_ = 0, ssm_inner_ = 0;
  std::vector<std::vector<float>> conv_state_, lin_state_;
  int lin_channels_ = 0, lin_out_ = 0;  // lin_qkv's rows, and the heads' outputs' width
  std::vector<float> lin_scratch_;      // per thread: a channel's last inputs, or a head's S^T k
  size_t lin_scratch_stride_ = 0;
  // parallel_block: each row's normed input, which the MLP reads after the attention; ssm_attends: ssm_out's output
  std::vector<float> par_;
  std::vector<float> moe_out_;  // a layer with experts and mlp_post_norm: the routed outputs, normed with the shared one's
  std::vector<float> gate_q_;  // q_gate's rows [chunk, n_heads head_dim], where the attention output reads them
  std::vector<float> part_;  // a decode step's partial softmaxes, [head][span][v_head_dim + 2] (attention)
  // Multi-head latent attention's scratch: q_a's or the latent's normed rows
  // [chunk, max(q_lora, kv_lora)], kv_a's [chunk, kv_lora + rotary_dim], q as
  // stored per head [chunk, n_heads * head_dim], and the heads' values lifted
  // out of the latent [chunk, n_heads * v_head_dim].
  std::vector<float> mla_lat_, mla_kva_, mla_heads_, mla_out_;
  // Per layer, kv_b_proj's key rows per head [n_heads][nope][kv_lora] and its value rows transposed
  // [n_heads][kv_lora][v_head_dim], widened to float32 at load (the stored matrix is not read again).
  std::vector<AlignedArray<float>> mla_kb_, mla_vbt_;
  // y[j, h] (y_step floats apart per (token, head), from y_off) = sum over i < in of x[j, h][i] w_h[i] (x
  // likewise), w_h the h-th [in, out] block of w, for b tokens and every head h: latent attention's
  // per-head products, as attention's value sums (AttnOps::mix: each weight row loaded once for up to
  // kAttnItemQueries tokens).
  void per_head(const float* w, int in, int out, const float* x, int x_step, int x_off, int b, float* y,
                int y_step, int y_off);
  // Each head's value: its latent-space attention output in att_ times its value rows, into mla_out_.
  void mla_values(int layer, int b);
  PreparedAct mla_prep_;
  // Multi-head latent attention's q, k and v of a chunk's b rows into q_, k_, v_ (decoder.h DecoderConfig).
  void mla_qkv(const LayerWeights& L, int layer, int b);
  // Routing: logits [chunk, n_experts]; one token's top_k experts; per
  // expert the (token, weight) pairs routed to it; the rows gathered for
  // one expert and its gate/up/down outputs.
  std::vector<float> router_logits_, ex_x_, ex_g_, ex_u_, ex_y_;
  std::vector<float> shared_gate_;  // [chunk]: each row's shared-expert gate logit
  std::vector<float> score_, choice_;  // [n_experts]: one row's sigmoid scores, and what experts are chosen by
  std::vector<float> group_score_;     // [n_group]: each group's two best choices, summed
  std::vector<uint8_t> group_kept_;    // [n_group]: the topk_group groups chosen from
  std::vector<int> top_;
  std::vector<std::vector<std::pair<int, float>>> routed_;
  PreparedAct ex_prep_, ex_down_prep_;
  std::vector<float> rope_cs_;  // [chunk][cos(head_dim/2) | sin(head_dim/2)] of the chunk's positions
  std::vector<float> rope_cs_swa_;  // the same by inv_freq_swa (sliding layers), where the config has it
  // Each activation prepared once for every matrix that reads it (q/k/v, gate/up),
  // and the GEMV scratch: storage kept across tokens, so a step allocates nothing.
  PreparedAct xn_prep_, att_prep_, gate_prep_;
  GemvScratch scratch_;
  GemmScratch gemm_scratch_;
  DedupGemvScratch dedup_scratch_;
};

// Tokens per prefill chunk with float activations, and with int8 ones in a
// model with experts (kMaxRows8Batch): each GEMM converts its weight tiles
// to float32 once per chunk, so a chunk of 512 (`ierun eval`'s default
// window in one) keeps that a small share, and each expert gets more of a
// chunk's tokens to pack its tiles for. 256 -> 512, pp512 taking turns: 4
// gpt-oss-20b layers (int8) 176 / 202 -> 214 / 279 tok/s; the widened
// SmolLM2's f32 520 / 520 -> 518 / 575. The activations (512 x
// intermediate floats) still fit in L2/L3.
constexpr int kPrefillBatch = 512;

// Queries one work item of attention holds at most (its scores are kept
// whole for the softmax: this many rows of max_ctx floats, and a block of
// keys more, per thread).
constexpr int kAttnItemQueries = 32;

// How attention's queries are shared out: a work item is one KV head's
// queries of tokens [j0, j0 + tj) and of heads [h0, h0 + th) of its group,
// so every key and value it reads serves all of them; jparts token ranges
// times hparts head ranges per KV head. Items are split, tokens first, then
// heads, until there are enough of them where the queries allow: for a
// decode step (b = 1) one per thread (whole KV heads while there are as
// many as threads: a KV head split over two threads has its keys read
// twice, and a step at 2k positions of SmolLM2 took 19 ms so against 22
// ms), for a prefill chunk two per thread (later tokens see more of the
// cache: items are handed out one at a time); never more than
// kAttnItemQueries queries. Throws std::invalid_argument unless every
// argument is >= 1.
struct AttnSplit {
  int jparts, tj, hparts, th;
};
AttnSplit attn_split(int b, int n_kv, int group, int threads);

// Pins a pool's threads (Linux; a no-op elsewhere): "compact" (and
// "auto", which on one socket has nothing better to do) puts thread i on the
// i-th allowed CPU, "scatter" spreads threads evenly over the allowed CPUs. Returns the CPU of each thread, in thread order.
std::vector<int> pin_threads(ThreadPool& pool, const std::string& mode);

// The benchmark's work-touch loop: reads one byte every `stride` bytes of
// [base, base + size), `nbytes` in all, starting at `start` and wrapping.
uint64_t touch_bytes(const uint8_t* base, size_t size, size_t start, size_t nbytes, size_t stride);

}  // namespace ie
