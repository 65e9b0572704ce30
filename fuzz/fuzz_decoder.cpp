// The decoder on fuzzed dimensions, weight types, weight bytes and tokens:
// a configuration it cannot run, matrices of the wrong shape or size and
// out-of-vocabulary tokens are refused with std::invalid_argument; anything
// accepted runs forward in bounds (every variant, both activation precisions).
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/weight_types.h"
#include "decoder/decoder.h"

namespace {

struct Pool {
  std::vector<std::vector<uint8_t>> bufs;
};

ie::Matrix matrix(FuzzedDataProvider& in, Pool& pool, int64_t rows, int64_t cols) {
  const ie::WTypeInfo& t = ie::kWeightTypes[in.ConsumeIntegral<uint8_t>() % ie::kNumWeightTypes];
  // Usually the shape the config implies, sometimes a lie.
  if (in.ConsumeIntegral<uint8_t>() < 16) rows += in.ConsumeIntegralInRange<int>(-1, 1);
  const int64_t group = t.type == ie::WType::Int4w ? (in.ConsumeBool() ? 32 : cols) : 0;
  ie::Matrix m;
  m.spec = ie::make_weight_spec(t.name, rows, cols, group, in.ConsumeBool(), in.ConsumeBool() ? "f32" : "f16");
  std::vector<uint8_t> bytes(ie::weight_nbytes(m.spec));
  const std::vector<uint8_t> seed = in.ConsumeBytes<uint8_t>(64);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = seed.empty() ? uint8_t(i) : seed[i % seed.size()];
  pool.bufs.push_back(std::move(bytes));
  m.data = pool.bufs.back().data();
  return m;
}

std::vector<float> vec(FuzzedDataProvider& in, int n) {
  std::vector<float> v(static_cast<size_t>(std::max(0, n)));
  for (float& x : v) x = in.ConsumeFloatingPointInRange<float>(-2.f, 2.f);
  if (in.ConsumeIntegral<uint8_t>() < 8 && !v.empty()) v.pop_back();  // a wrong length
  return v;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  ie::DecoderConfig c;
  c.n_layers = in.ConsumeIntegralInRange<int>(0, 2);
  c.n_kv_heads = in.ConsumeIntegralInRange<int>(0, 2);
  c.n_heads = c.n_kv_heads * in.ConsumeIntegralInRange<int>(0, 2) + in.ConsumeIntegralInRange<int>(0, 1);
  c.head_dim = 2 * in.ConsumeIntegralInRange<int>(0, 16) + in.ConsumeIntegralInRange<int>(0, 1);
  c.hidden = 32 * in.ConsumeIntegralInRange<int>(0, 3);
  c.inter = 32 * in.ConsumeIntegralInRange<int>(0, 3);
  c.vocab = in.ConsumeIntegralInRange<int>(0, 40);
  c.max_ctx = in.ConsumeIntegralInRange<int>(0, 24);
  for (int l = 0; l < c.n_layers + (in.ConsumeIntegral<uint8_t>() < 8); ++l)  // sometimes one too many
    c.windows.push_back(in.ConsumeIntegralInRange<int>(-1, 6));
  c.eps = in.ConsumeFloatingPointInRange<float>(0.f, 1e-3f);
  // Every rotated dim, or a head's first few (partial RoPE: Phi-4-mini); none at all is refused.
  c.inv_freq = vec(in, in.ConsumeBool() ? c.head_dim / 2 : in.ConsumeIntegralInRange<int>(0, c.head_dim / 2));
  c.rope_scale = in.ConsumeFloatingPointInRange<float>(-0.5f, 2.f);
  c.rope_interleaved = in.ConsumeBool();  // GLM-4's pairs
  if (in.ConsumeBool()) {  // Gemma 3's: a second RoPE table (sometimes of the wrong size), scales, GELU
    c.inv_freq_swa = vec(in, c.head_dim / 2 + (in.ConsumeIntegral<uint8_t>() < 8));
    c.attn_scale = in.ConsumeFloatingPointInRange<float>(-0.5f, 1.f);
    c.embed_scale = in.ConsumeFloatingPointInRange<float>(-0.5f, 8.f);
    c.mlp_act = ie::MlpAct::GeluTanh;
    if (in.ConsumeBool()) {  // Gemma 2's soft-caps (negative: refused)
      c.attn_softcap = in.ConsumeFloatingPointInRange<float>(-1.f, 60.f);
      c.logit_softcap = in.ConsumeFloatingPointInRange<float>(-1.f, 40.f);
    }
  }
  if (in.ConsumeBool()) {  // SmolLM3's layers without RoPE (sometimes one flag too many)
    for (int l = 0; l < c.n_layers + (in.ConsumeIntegral<uint8_t>() < 8); ++l) c.nope.push_back(in.ConsumeBool());
  }
  if (in.ConsumeBool()) {  // Granite's multipliers (not positive: refused; with experts: refused)
    c.residual_scale = in.ConsumeFloatingPointInRange<float>(-0.5f, 2.f);
    c.logits_scaling = in.ConsumeFloatingPointInRange<float>(-0.5f, 16.f);
  }
  if (in.ConsumeBool()) {  // Ministral 3's attention temperature (negative scale, floor below 1: refused)
    c.attn_temp_scale = in.ConsumeFloatingPointInRange<float>(-0.5f, 1.f);
    c.attn_temp_floor = in.ConsumeIntegralInRange<int>(-1, 8);
  }
  if (in.ConsumeBool()) {  // Llama 4's chunks (one too many, negative, beside a window: refused), q/k norm, temperature
    for (int l = 0; l < c.n_layers + (in.ConsumeIntegral<uint8_t>() < 8); ++l)
      c.chunks.push_back(in.ConsumeIntegralInRange<int>(-1, 6));
    c.qk_l2_norm = in.ConsumeBool();
    c.qk_norm_after_rope = in.ConsumeBool();  // (HunYuan's; beside Llama 4's norm: refused)
    c.attn_temp_offset = in.ConsumeFloatingPointInRange<float>(-0.5f, 2.f);
    c.attn_temp_nope = in.ConsumeBool();
  }
  c.layer_norm = in.ConsumeBool();      // Cohere's LayerNorm
  if (in.ConsumeBool()) {  // an MLP without a gate, any unit (Arcee, StarCoder2, Phi-2, Apertus's xIELU)
    c.mlp_gated = false;
    const int unit = in.ConsumeIntegralInRange<int>(0, 3);
    c.mlp_act = unit == 0 ? ie::MlpAct::Silu : unit == 1 ? ie::MlpAct::GeluTanh
              : unit == 2 ? ie::MlpAct::Relu2 : ie::MlpAct::Xielu;
  }
  c.parallel_block = in.ConsumeBool();  // and its parallel layer (with OLMo's or experts: refused)
  const bool olmo = in.ConsumeBool();  // OLMo 2's layer: output norms alone, whole-projection q/k norms
  c.pre_norms = !olmo;
  c.qk_norm_full = olmo && in.ConsumeBool();
  if (in.ConsumeBool()) {  // mixture of experts
    c.n_experts = in.ConsumeIntegralInRange<int>(-1, 4);
    c.top_k = in.ConsumeIntegralInRange<int>(0, 5);
    c.expert_inter = 32 * in.ConsumeIntegralInRange<int>(0, 2);
    c.norm_topk = in.ConsumeBool();
    const int glu = in.ConsumeIntegralInRange<int>(0, 2);  // Llama 4's halves, fed the weight (with gpt-oss's: refused)
    c.glu = glu == 0 ? ie::Glu::Silu : glu == 1 ? ie::Glu::GptOss : ie::Glu::Halves;
    c.weight_before = in.ConsumeBool();
    c.swiglu_limit = in.ConsumeFloatingPointInRange<float>(-1.f, 10.f);
  }
  if (in.ConsumeBool()) {  // Qwen3.5's gated DeltaNet layers (one flag too many, dims of 0, value heads not a
                           // multiple of key heads: refused) and gated attention
    for (int l = 0; l < c.n_layers + (in.ConsumeIntegral<uint8_t>() < 8); ++l) c.linear.push_back(in.ConsumeBool());
    c.lin_k_heads = in.ConsumeIntegralInRange<int>(0, 2);
    c.lin_v_heads = c.lin_k_heads * in.ConsumeIntegralInRange<int>(1, 2) + (in.ConsumeIntegral<uint8_t>() < 8);
    c.lin_k_dim = 8 * in.ConsumeIntegralInRange<int>(0, 2);
    c.lin_v_dim = 8 * in.ConsumeIntegralInRange<int>(0, 2);
    c.lin_conv = in.ConsumeIntegralInRange<int>(0, 4);
    c.lin_v_tiled = in.ConsumeBool();
    c.attn_gate = in.ConsumeBool();
  }
  if (in.ConsumeBool()) {  // LFM2's short convolutions (one flag too many, 0 taps or 65, beside DeltaNet: refused)
    for (int l = 0; l < c.n_layers + (in.ConsumeIntegral<uint8_t>() < 8); ++l) c.short_conv.push_back(in.ConsumeBool());
    c.conv_taps = in.ConsumeBool() ? in.ConsumeIntegralInRange<int>(0, 4) : 65;
  }
  if (in.ConsumeBool()) {  // Granite 4's Mamba2 (a flag too many, 0 heads, groups not dividing them, 65 taps: refused)
    for (int l = 0; l < c.n_layers + (in.ConsumeIntegral<uint8_t>() < 8); ++l) c.ssm.push_back(in.ConsumeBool());
    c.ssm_heads = in.ConsumeIntegralInRange<int>(0, 4);
    c.ssm_head_dim = in.ConsumeIntegralInRange<int>(1, 8);
    c.ssm_state = in.ConsumeIntegralInRange<int>(1, 8);
    c.ssm_groups = in.ConsumeIntegralInRange<int>(1, 3);
    c.ssm_conv = in.ConsumeBool() ? in.ConsumeIntegralInRange<int>(0, 4) : 65;
    c.ssm_attends = in.ConsumeBool();  // Falcon-H1's: attention beside (with Nemotron-H's blocks or experts: refused)
  }
  if (in.ConsumeBool()) {  // Falcon-H1's muP factors (0, negative; four in_proj factors, or without Mamba2: refused)
    for (float* m : {&c.q_mult, &c.k_mult, &c.v_mult, &c.o_mult, &c.ssm_out_mult, &c.gate_mult, &c.down_mult})
      *m = in.ConsumeFloatingPointInRange<float>(-0.5f, 2.f);
    c.ssm_in_mults = vec(in, in.ConsumeIntegral<uint8_t>() < 8 ? 4 : 5);
  }
  if (in.ConsumeBool()) {  // Mamba 1's scan (a flag too many, dims of 0, beside Mamba2: refused), Falcon Mamba's norms
    for (int l = 0; l < c.n_layers + (in.ConsumeIntegral<uint8_t>() < 8); ++l) c.ssm1.push_back(in.ConsumeBool());
    c.ssm1_inner = 8 * in.ConsumeIntegralInRange<int>(0, 2);
    c.ssm1_rank = in.ConsumeIntegralInRange<int>(0, 4);
    c.ssm_state = in.ConsumeIntegralInRange<int>(1, 17);
    c.ssm_conv = in.ConsumeBool() ? in.ConsumeIntegralInRange<int>(0, 4) : 65;
    c.ssm1_norms = in.ConsumeBool();
    c.ssm1_eps = in.ConsumeFloatingPointInRange<float>(-1e-5f, 1e-4f);
  }
  if (in.ConsumeBool()) {  // Nemotron-H's blocks of a mixer or an MLP alone, ReLU-squared MLPs and experts (a flag too
                           // many, a block of neither, an MLP block marked recurrent: refused)
    for (int l = 0; l < c.n_layers + (in.ConsumeIntegral<uint8_t>() < 8); ++l) c.mlp_only.push_back(in.ConsumeBool());
    for (int l = 0; l < c.n_layers; ++l) c.mixer_only.push_back(in.ConsumeBool());
    c.mlp_act = ie::MlpAct::Relu2;
    c.mlp_gated = in.ConsumeIntegral<uint8_t>() < 8;  // (a ReLU-squared MLP with a gate: refused)
    if (in.ConsumeBool()) c.glu = ie::Glu::Relu2;
  }
  const bool mla = in.ConsumeBool();  // DeepSeek's latent attention (a latent of -1, q_lora without it: refused)
  if (mla) {
    c.kv_lora = 16 * in.ConsumeIntegralInRange<int>(0, 2) + in.ConsumeIntegralInRange<int>(-1, 1);
    c.q_lora = in.ConsumeBool() ? 32 : 0;
    c.v_head_dim = in.ConsumeIntegralInRange<int>(0, c.head_dim);
  }
  const int q_dim = c.n_heads * c.head_dim, kv_dim = c.n_kv_heads * c.head_dim;
  const int rot = c.rotary_dim(), vd = c.value_dim();
  Pool pool;
  try {
    ie::DecoderWeights w;
    w.embed = matrix(in, pool, c.vocab, c.hidden);
    w.lm_head = in.ConsumeBool() ? w.embed : matrix(in, pool, c.vocab, c.hidden);
    w.final_norm = vec(in, c.hidden);
    // LayerNorm's bias, the head's (Phi-2's): with an RMSNorm, or one too long: refused
    if (in.ConsumeBool()) w.final_norm_b = vec(in, c.hidden + (in.ConsumeIntegral<uint8_t>() < 8));
    if (in.ConsumeBool()) w.lm_head_b = vec(in, c.vocab + (in.ConsumeIntegral<uint8_t>() < 8));
    for (int l = 0; l < c.n_layers; ++l) {
      ie::LayerWeights L;
      // (a block given weights it does not have: refused)
      const bool mlp_only = !c.has_mixer(l) && in.ConsumeIntegral<uint8_t>() >= 8;
      const bool mixer_only = !c.has_mlp(l) && in.ConsumeIntegral<uint8_t>() >= 8;
      if (!olmo || in.ConsumeIntegral<uint8_t>() < 8) {  // (OLMo 2 with pre-norms: refused)
        if (!mlp_only) L.attn_norm = vec(in, c.hidden);
        if (!mixer_only && (!c.parallel_block || in.ConsumeIntegral<uint8_t>() < 8))  // (a parallel layer with two norms: refused)
          L.mlp_norm = vec(in, c.hidden);
        if (in.ConsumeBool()) {  // LayerNorm's biases (beside an RMSNorm, or a norm the layer lacks: refused)
          L.attn_norm_b = vec(in, c.hidden);
          L.mlp_norm_b = vec(in, c.hidden);
        }
      }
      // (a DeltaNet layer given attention's weights instead, or beside them: refused)
      const bool lin = l < static_cast<int>(c.linear.size()) && c.linear[l] && in.ConsumeIntegral<uint8_t>() >= 8;
      // (a convolving layer given attention's weights instead: refused)
      const bool conv = l < static_cast<int>(c.short_conv.size()) && c.short_conv[l] &&
                        in.ConsumeIntegral<uint8_t>() >= 8;
      // (a Mamba2 layer given attention's weights instead: refused)
      const bool ssm = l < static_cast<int>(c.ssm.size()) && c.ssm[l] && in.ConsumeIntegral<uint8_t>() >= 8;
      // (a Mamba 1 layer given attention's weights instead: refused)
      const bool ssm1 = l < static_cast<int>(c.ssm1.size()) && c.ssm1[l] && in.ConsumeIntegral<uint8_t>() >= 8;
      if (ssm && c.ssm_attends) {  // (Falcon-H1's: attention's weights too, below; Mamba2's out_proj apart)
        const int64_t inner = static_cast<int64_t>(c.ssm_heads) * c.ssm_head_dim;
        const int64_t channels = inner + 2 * static_cast<int64_t>(c.ssm_groups) * c.ssm_state;
        L.ssm_in = matrix(in, pool, inner + channels + c.ssm_heads, c.hidden);
        L.ssm_conv_w = vec(in, static_cast<int>(channels * std::max(0, std::min(c.ssm_conv, 64))));
        L.ssm_conv_b = vec(in, static_cast<int>(channels));
        for (auto* v : {&L.ssm_dt, &L.ssm_a, &L.ssm_d}) *v = vec(in, c.ssm_heads);
        if (in.ConsumeBool()) L.ssm_norm = vec(in, static_cast<int>(inner));
        L.ssm_out = matrix(in, pool, c.hidden, inner);
      }
      if (mlp_only) {  // (no mixer's weights)
      } else if (ssm1) {  // in_proj (x, z), the taps and their bias, x_proj, dt_proj and its bias, A, D, out_proj
        const int64_t D = c.ssm1_inner;
        L.ssm_in = matrix(in, pool, 2 * D, c.hidden);
        L.ssm_conv_w = vec(in, static_cast<int>(D * std::max(0, std::min(c.ssm_conv, 64))));
        L.ssm_conv_b = vec(in, static_cast<int>(D));
        L.ssm_x = matrix(in, pool, c.ssm1_rank + 2 * static_cast<int64_t>(c.ssm_state), D);
        L.ssm_dt_w = matrix(in, pool, D, c.ssm1_rank);
        L.ssm_dt = vec(in, static_cast<int>(D));
        L.ssm_a = vec(in, static_cast<int>(D * c.ssm_state));
        L.ssm_d = vec(in, static_cast<int>(D));
        L.o = matrix(in, pool, c.hidden, D);
      } else if (ssm && !c.ssm_attends) {  // in_proj (z, x B C, dt), the taps and their bias, dt_bias, A, D, the gated
                                           // norm, out_proj
        const int64_t inner = static_cast<int64_t>(c.ssm_heads) * c.ssm_head_dim;
        const int64_t channels = inner + 2 * static_cast<int64_t>(c.ssm_groups) * c.ssm_state;
        L.ssm_in = matrix(in, pool, inner + channels + c.ssm_heads, c.hidden);
        L.ssm_conv_w = vec(in, static_cast<int>(channels * std::max(0, std::min(c.ssm_conv, 64))));
        L.ssm_conv_b = vec(in, static_cast<int>(channels));
        L.ssm_dt = vec(in, c.ssm_heads);
        L.ssm_a = vec(in, c.ssm_heads);
        L.ssm_d = vec(in, c.ssm_heads);
        L.ssm_norm = vec(in, static_cast<int>(inner));
        L.o = matrix(in, pool, c.hidden, inner);
      } else if (conv) {  // in_proj (B, C, x), the taps, out_proj
        L.conv_in = matrix(in, pool, 3 * static_cast<int64_t>(c.hidden), c.hidden);
        L.conv_w = vec(in, c.hidden * std::max(0, std::min(c.conv_taps, 64)));
        L.o = matrix(in, pool, c.hidden, c.hidden);
      } else if (lin) {  // its projections, convolution taps, step bias, decay, gated norm and out_proj
        const int64_t vdim = static_cast<int64_t>(c.lin_v_heads) * c.lin_v_dim;
        const int64_t channels = 2 * static_cast<int64_t>(c.lin_k_heads) * c.lin_k_dim + vdim;
        L.lin_qkv = matrix(in, pool, channels, c.hidden);
        L.lin_z = matrix(in, pool, vdim, c.hidden);
        L.lin_b = matrix(in, pool, c.lin_v_heads, c.hidden);
        L.lin_a = matrix(in, pool, c.lin_v_heads, c.hidden);
        L.lin_conv = vec(in, static_cast<int>(channels * c.lin_conv));
        L.lin_dt = vec(in, c.lin_v_heads);
        L.lin_decay = vec(in, c.lin_v_heads);
        L.lin_norm = vec(in, c.lin_v_dim);
        L.o = matrix(in, pool, c.hidden, vdim);
      } else if (mla) {  // q_a / q_b or q_proj; the latent with the shared rotary key part; each head's nope and value
        if (c.q_lora > 0) {
          L.q_a = matrix(in, pool, c.q_lora, c.hidden);
          L.q_a_norm = vec(in, c.q_lora);
        }
        L.q = matrix(in, pool, q_dim, c.q_lora > 0 ? c.q_lora : c.hidden);
        L.kv_a = matrix(in, pool, c.kv_lora + rot, c.hidden);
        L.kv_a_norm = vec(in, c.kv_lora);
        L.kv_b = matrix(in, pool, static_cast<int64_t>(c.n_heads) * (c.head_dim - rot + vd), c.kv_lora);
        L.o = matrix(in, pool, c.hidden, static_cast<int64_t>(c.n_heads) * vd);
      } else {
        L.q = matrix(in, pool, c.attn_gate ? 2 * q_dim : q_dim, c.hidden);  // (gated: each head's query and gate)
        L.k = matrix(in, pool, kv_dim, c.hidden);
        L.v = matrix(in, pool, kv_dim, c.hidden);
        L.o = matrix(in, pool, c.hidden, q_dim);
      }
      const bool relu2 = c.glu == ie::Glu::Relu2;
      if (mixer_only) {  // (no MLP's weights)
      } else if (c.n_experts > 0 && in.ConsumeBool()) {
        const bool fused = c.glu == ie::Glu::GptOss || c.glu == ie::Glu::Halves;
        L.router = matrix(in, pool, c.n_experts, c.hidden);
        if (in.ConsumeBool()) L.router_bias = vec(in, c.n_experts);
        for (int e = 0; e < c.n_experts + (in.ConsumeIntegral<uint8_t>() < 8); ++e) {
          ie::Expert x;
          if (!relu2 || in.ConsumeIntegral<uint8_t>() < 8)  // (a ReLU-squared expert's gate: refused)
            x.gate = matrix(in, pool, fused ? 2 * c.expert_inter : c.expert_inter, c.hidden);
          if (!fused || in.ConsumeIntegral<uint8_t>() < 8) x.up = matrix(in, pool, c.expert_inter, c.hidden);
          x.down = matrix(in, pool, c.hidden, c.expert_inter);
          if (in.ConsumeBool()) {
            x.bgate = vec(in, fused ? 2 * c.expert_inter : c.expert_inter);
            x.bdown = vec(in, c.hidden);
          }
          L.experts.push_back(std::move(x));
        }
      } else {
        if (c.mlp_gated || in.ConsumeIntegral<uint8_t>() < 8)  // (an ungated MLP's gate: refused)
          L.gate = matrix(in, pool, c.inter, c.hidden);
        L.up = matrix(in, pool, c.inter, c.hidden);
        L.down = matrix(in, pool, c.hidden, c.inter);
        // xIELU's four parameters (a wrong length, or any beside another unit: refused)
        if (c.mlp_act == ie::MlpAct::Xielu || in.ConsumeIntegral<uint8_t>() < 8)
          for (auto* v : {&L.xielu_alpha_p, &L.xielu_alpha_n, &L.xielu_beta, &L.xielu_eps}) *v = vec(in, 1);
      }
      if (in.ConsumeBool()) {  // the MLP's biases (StarCoder2's; with experts, one too long: refused)
        L.bup = vec(in, c.inter + (in.ConsumeIntegral<uint8_t>() < 8));
        L.bdown = vec(in, c.hidden);
      }
      if (in.ConsumeBool()) {
        L.bq = vec(in, q_dim);
        L.bk = vec(in, kv_dim);
        L.bv = vec(in, kv_dim);
        L.bo = vec(in, c.hidden);
      }
      if (in.ConsumeBool()) {  // per head, or over the whole projections (qk_norm_full)
        L.q_norm = vec(in, c.qk_norm_full ? q_dim : c.head_dim);
        L.k_norm = vec(in, c.qk_norm_full ? kv_dim : c.head_dim);
      }
      if (in.ConsumeBool()) L.sinks = vec(in, c.n_heads);
      // AFMoE's attention gate (beside Qwen3.5's, in a layer without attention or of latent attention: refused)
      if (in.ConsumeIntegral<uint8_t>() < 64) L.q_gate = matrix(in, pool, q_dim, c.hidden);
      if (olmo || in.ConsumeBool()) {  // Gemma's sandwich, OLMo 2's output norms (with experts: AFMoE's, their sum normed)
        L.attn_post_norm = vec(in, c.hidden);
        L.mlp_post_norm = vec(in, c.hidden + (in.ConsumeIntegral<uint8_t>() < 8));
      }
      w.layers.push_back(std::move(L));
    }
    const ie::Isa isa = ie::available_isas()[in.ConsumeIntegral<uint8_t>() % ie::available_isas().size()];
    ie::Decoder d(c, std::move(w), in.ConsumeBool() ? ie::Act::Int8 : ie::Act::F32, 1 + in.ConsumeBool(), isa);
    std::vector<float> logits(static_cast<size_t>(c.vocab) * 32);
    for (int step = 0; step < 3 && in.remaining_bytes() > 0; ++step) {
      std::vector<int32_t> tokens(in.ConsumeIntegralInRange<size_t>(1, 12));
      for (int32_t& t : tokens) t = in.ConsumeIntegralInRange<int32_t>(-1, c.vocab);
      if (tokens.size() * static_cast<size_t>(c.vocab) > logits.size()) logits.resize(tokens.size() * c.vocab);
      d.forward(tokens.data(), static_cast<int>(tokens.size()), logits.data(), in.ConsumeBool());
    }
  } catch (const std::invalid_argument&) {
  }
  return 0;
}
