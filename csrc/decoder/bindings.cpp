// Python bindings of the decoder (`_native.DecoderConfig`, `_native.Decoder`,
// in CUDA builds `_native.CudaDecoder`, `touch_bytes`).
// runtime/decoder_weights.py is the only caller: it resolves HF names to
// the keys used here and hands over (WeightSpec, byte view) pairs of the
// mapped model.ie.bin, which the CPU decoder keeps referenced for its
// lifetime (the CUDA one copies them to the device and reads them no more).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <initializer_list>
#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

#include "decoder.h"
#include "common/py_args.h"

#if IE_HAVE_CUDA
#include "cuda/decoder.h"
#endif

namespace py = pybind11;

namespace {

using F32Array = py::array_t<float, py::array::c_style | py::array::forcecast>;

// The weight keys the decoder binds, each the field it fills: the one C++
// definition of them (formats/model_spec.py layer_parts names the same keys
// on the Python side; runtime/decoder_weights.py builds the dict). A key not
// listed here is refused, a missing one is left empty for check_decoder to
// name; tests/test_decoder.py holds the two lists to each other.
template <class S>
using Field = std::pair<const char*, S>;
const Field<ie::Matrix ie::LayerWeights::*> kLayerMatrices[] = {
    {"q", &ie::LayerWeights::q},       {"k", &ie::LayerWeights::k},   {"v", &ie::LayerWeights::v},
    {"o", &ie::LayerWeights::o},       {"gate", &ie::LayerWeights::gate}, {"up", &ie::LayerWeights::up},
    {"down", &ie::LayerWeights::down}, {"router", &ie::LayerWeights::router},
    {"shared_gate", &ie::LayerWeights::shared_gate}, {"q_a", &ie::LayerWeights::q_a},
    {"kv_a", &ie::LayerWeights::kv_a}, {"kv_b", &ie::LayerWeights::kv_b},
    {"lin_qkv", &ie::LayerWeights::lin_qkv}, {"lin_z", &ie::LayerWeights::lin_z},
    {"lin_b", &ie::LayerWeights::lin_b}, {"lin_a", &ie::LayerWeights::lin_a},
    {"conv_in", &ie::LayerWeights::conv_in}, {"ssm_in", &ie::LayerWeights::ssm_in},
    {"ssm_out", &ie::LayerWeights::ssm_out}, {"ssm_x", &ie::LayerWeights::ssm_x},
    {"ssm_dt_w", &ie::LayerWeights::ssm_dt_w},
    {"q_gate", &ie::LayerWeights::q_gate}};
const Field<std::vector<float> ie::LayerWeights::*> kLayerVectors[] = {
    {"attn_norm", &ie::LayerWeights::attn_norm}, {"mlp_norm", &ie::LayerWeights::mlp_norm},
    {"attn_norm_b", &ie::LayerWeights::attn_norm_b}, {"mlp_norm_b", &ie::LayerWeights::mlp_norm_b},
    {"attn_post_norm", &ie::LayerWeights::attn_post_norm}, {"mlp_post_norm", &ie::LayerWeights::mlp_post_norm},
    {"bq", &ie::LayerWeights::bq},               {"bk", &ie::LayerWeights::bk},
    {"bv", &ie::LayerWeights::bv},               {"bo", &ie::LayerWeights::bo},
    {"bup", &ie::LayerWeights::bup},             {"bdown", &ie::LayerWeights::bdown},
    {"q_norm", &ie::LayerWeights::q_norm},       {"k_norm", &ie::LayerWeights::k_norm},
    {"sinks", &ie::LayerWeights::sinks},         {"router_bias", &ie::LayerWeights::router_bias},
    {"expert_bias", &ie::LayerWeights::expert_bias}, {"q_a_norm", &ie::LayerWeights::q_a_norm},
    {"kv_a_norm", &ie::LayerWeights::kv_a_norm}, {"lin_conv", &ie::LayerWeights::lin_conv},
    {"lin_dt", &ie::LayerWeights::lin_dt}, {"lin_decay", &ie::LayerWeights::lin_decay},
    {"lin_norm", &ie::LayerWeights::lin_norm}, {"conv_w", &ie::LayerWeights::conv_w},
    {"ssm_conv_w", &ie::LayerWeights::ssm_conv_w}, {"ssm_conv_b", &ie::LayerWeights::ssm_conv_b},
    {"ssm_dt", &ie::LayerWeights::ssm_dt}, {"ssm_a", &ie::LayerWeights::ssm_a}, {"ssm_d", &ie::LayerWeights::ssm_d},
    {"ssm_norm", &ie::LayerWeights::ssm_norm},
    {"xielu_alpha_p", &ie::LayerWeights::xielu_alpha_p}, {"xielu_alpha_n", &ie::LayerWeights::xielu_alpha_n},
    {"xielu_beta", &ie::LayerWeights::xielu_beta}, {"xielu_eps", &ie::LayerWeights::xielu_eps}};
const Field<ie::Matrix ie::Expert::*> kExpertMatrices[] = {
    {"gate", &ie::Expert::gate}, {"up", &ie::Expert::up}, {"down", &ie::Expert::down}};
const Field<std::vector<float> ie::Expert::*> kExpertVectors[] = {{"bgate", &ie::Expert::bgate},
                                                                  {"bdown", &ie::Expert::bdown}};
// The two lists (formats/model_spec.py LAYERS_KEY, EXPERTS_KEY): the model's
// layers, and a layer's per-expert dicts.
constexpr const char* kLayersKey = "layers";
constexpr const char* kExpertsKey = "experts";

// A matrix value is (WeightSpec, buffer): the spec was validated when it was
// made; here the buffer must hold exactly its bytes. (WeightSpec, buffer):
// bytes read in place; (WeightSpec, DedupStore, name): a dedup member,
// multiplied through the fused GEMV or the store's cache (`plan_dedup`: the
// CPU decoder's), or rebuilt whole by the store (CUDA).
ie::Matrix matrix(const py::handle& value, const std::string& where, py::list& keep, bool plan_dedup) {
  if (!py::isinstance<py::tuple>(value) || (py::len(value) != 2 && py::len(value) != 3))
    throw std::invalid_argument("decoder weights: " + where + " must be (WeightSpec, buffer) or (WeightSpec, DedupStore, name)");
  py::tuple t = value.cast<py::tuple>();
  ie::Matrix m;
  m.spec = t[0].cast<ie::WeightSpec>();
  if (t.size() == 3) {
    m.store = t[1].cast<ie::dedup::DedupStore*>();
    if (m.store == nullptr) throw std::invalid_argument("decoder weights: " + where + ": no DedupStore");
    m.name = t[2].cast<std::string>();
    if (!m.store->contains(m.name))
      throw std::invalid_argument("decoder weights: " + where + ": '" + m.name + "' is not a member of the dedup store");
    if (plan_dedup)
      m.dedup = std::make_shared<const ie::DedupMatrix>(ie::make_dedup_matrix(m.spec, m.store->view(m.name)));
    keep.append(t[1]);  // the store outlives the decoder
    return m;
  }
  py::object buf = t[1];
  m.data = static_cast<const uint8_t*>(ie::weight_buffer(py::reinterpret_borrow<py::buffer>(buf), m.spec, where).ptr);
  keep.append(buf);  // the buffer's owner, kept referenced for the decoder's lifetime
  return m;
}

std::vector<float> vec(const py::handle& value) {
  F32Array a = value.cast<F32Array>();
  return std::vector<float>(a.data(), a.data() + a.size());
}

// Fills `out` from the dict `d` by the field tables; `extra` takes a key
// the tables do not have (true: taken), else the key is refused.
template <class T, size_t NM, size_t NV, class Extra>
void fill(T& out, const py::dict& d, const std::string& where, const Field<ie::Matrix T::*> (&mats)[NM],
          const Field<std::vector<float> T::*> (&vecs)[NV], py::list& keep, bool plan_dedup, Extra extra) {
  for (auto item : d) {
    const std::string key = py::str(item.first);
    const std::string at = where + key;
    auto m = std::find_if(std::begin(mats), std::end(mats), [&](const auto& f) { return key == f.first; });
    auto v = std::find_if(std::begin(vecs), std::end(vecs), [&](const auto& f) { return key == f.first; });
    if (m != std::end(mats))
      out.*(m->second) = matrix(item.second, at, keep, plan_dedup);
    else if (v != std::end(vecs))
      out.*(v->second) = vec(item.second);
    else if (!extra(key, item.second, at))
      throw std::invalid_argument("decoder weights: " + at + ": not a weight the decoder binds");
  }
}

// Owns the decoder and the Python objects whose memory it reads.
struct PyDecoder {
  std::unique_ptr<ie::Decoder> dec;
  py::list keep;
};

// The weights of the dict runtime/decoder_weights.py builds ({"embed",
// "lm_head", "norm", "norm_b", "lm_head_b", "layers": [{key: value, "experts": [{...}]}]});
// `keep` collects the Python objects whose memory the matrices point into.
ie::DecoderWeights decoder_weights(const py::dict& weights, py::list& keep, bool plan_dedup) {
  ie::DecoderWeights w;  // what is missing stays empty: ie::check_decoder names it
  for (auto item : weights) {
    const std::string key = py::str(item.first);
    if (key == "embed") {
      w.embed = matrix(item.second, key, keep, plan_dedup);
    } else if (key == "lm_head") {
      w.lm_head = matrix(item.second, key, keep, plan_dedup);
    } else if (key == "norm") {
      w.final_norm = vec(item.second);
    } else if (key == "norm_b") {
      w.final_norm_b = vec(item.second);
    } else if (key == "lm_head_b") {
      w.lm_head_b = vec(item.second);
    } else if (key == kLayersKey) {
      for (py::handle layer : item.second.cast<py::list>()) {
        const std::string where = "layers[" + std::to_string(w.layers.size()) + "].";
        ie::LayerWeights L;
        fill(L, layer.cast<py::dict>(), where, kLayerMatrices, kLayerVectors, keep, plan_dedup,
             [&](const std::string& k, py::handle experts, const std::string& at) {
               if (k != kExpertsKey) return false;
               for (py::handle e : experts.cast<py::list>()) {
                 ie::Expert ex;
                 fill(ex, e.cast<py::dict>(), at + "[" + std::to_string(L.experts.size()) + "].", kExpertMatrices,
                      kExpertVectors, keep, plan_dedup, [](const std::string&, py::handle, const std::string&) { return false; });
                 L.experts.push_back(std::move(ex));
               }
               return true;
             });
        w.layers.push_back(std::move(L));
      }
    } else {
      throw std::invalid_argument("decoder weights: " + key + ": not a weight the decoder binds");
    }
  }
  return w;
}

// The keys above, for the test that holds them to formats/model_spec.py.
py::dict weight_keys() {
  auto names = [](const auto& table) {
    py::list out;
    for (const auto& f : table) out.append(f.first);
    return out;
  };
  py::dict d;
  d["model"] = py::make_tuple("embed", "lm_head", "norm", "norm_b", "lm_head_b", kLayersKey);
  d["layer_matrices"] = names(kLayerMatrices);
  d["layer_vectors"] = names(kLayerVectors);
  d["layer_lists"] = py::make_tuple(kExpertsKey);
  d["expert_matrices"] = names(kExpertMatrices);
  d["expert_vectors"] = names(kExpertVectors);
  return d;
}

std::unique_ptr<PyDecoder> make_decoder(const ie::DecoderConfig& c, const py::dict& weights,
                                        const std::string& act, int threads, const std::string& isa,
                                        const std::string& affinity, bool copy_experts, bool grow_copies) {
  auto out = std::make_unique<PyDecoder>();
  ie::DecoderWeights w = decoder_weights(weights, out->keep, /*plan_dedup=*/true);
  out->dec = std::make_unique<ie::Decoder>(c, std::move(w), ie::parse_act(act), threads, ie::resolve_isa(isa),
                                           affinity, copy_experts, grow_copies);
  return out;
}

// Decoder::forward or CudaDecoder::forward (the same contract) into a new
// array or the caller's `out`.
template <class Dec>
py::array_t<float> forward(Dec& dec, py::array_t<int32_t, py::array::c_style | py::array::forcecast> tokens,
                           bool all_logits, std::optional<py::array> out_arg) {
  const int n = static_cast<int>(tokens.size());
  const int vocab = dec.config().vocab;
  const std::vector<py::ssize_t> shape = all_logits ? std::vector<py::ssize_t>{n, vocab} : std::vector<py::ssize_t>{vocab};
  py::array_t<float> logits;
  if (out_arg) {
    // A caller's buffer, reused across calls (ierun eval: no fresh 50 MB
    // array to page-fault in per chunk); it must be exactly what we'd allocate.
    const bool f32 = out_arg->dtype().is(py::dtype::of<float>());
    if (f32) logits = py::reinterpret_borrow<py::array_t<float>>(*out_arg);
    const bool same = f32 && logits.ndim() == static_cast<py::ssize_t>(shape.size()) &&
                      std::equal(shape.begin(), shape.end(), logits.shape());
    if (!same || !(logits.flags() & py::array::c_style) || !logits.writeable())
      throw std::invalid_argument("forward: out must be a writeable C-contiguous float32 array of shape " +
                                  std::string(all_logits ? "[n, vocab]" : "[vocab]"));
  } else {
    logits = py::array_t<float>(shape);
  }
  float* out = logits.mutable_data();
  const int32_t* t = tokens.data();
  {
    py::gil_scoped_release nogil;
    dec.forward(t, n, out, all_logits);
  }
  return logits;
}

// Captured rows (n floats each) as a float32 array [rows, n].
py::array_t<float> rows_array(const std::vector<float>& v, int n) {
  py::array_t<float> a({static_cast<py::ssize_t>(v.size() / static_cast<size_t>(n)), static_cast<py::ssize_t>(n)});
  std::copy(v.begin(), v.end(), a.mutable_data());
  return a;
}

#if IE_HAVE_CUDA
// The device decoder reads the host weights only while it is built: nothing
// Python owns is kept.
std::unique_ptr<ie::cuda::CudaDecoder> make_cuda_decoder(const ie::DecoderConfig& c, const py::dict& weights) {
  py::list keep;
  const ie::DecoderWeights w = decoder_weights(weights, keep, /*plan_dedup=*/false);
  return std::make_unique<ie::cuda::CudaDecoder>(c, w);
}
#endif

// The names of DecoderConfig's enums, as Python sets them.
template <class E>
using Choices = std::initializer_list<std::pair<const char*, E>>;
const Choices<ie::Glu> kGlus = {{"silu", ie::Glu::Silu}, {"gpt_oss", ie::Glu::GptOss}, {"halves", ie::Glu::Halves},
                              {"relu2", ie::Glu::Relu2}};
const Choices<ie::MlpAct> kMlpActs = {{"silu", ie::MlpAct::Silu}, {"gelu_tanh", ie::MlpAct::GeluTanh},
                                    {"relu2", ie::MlpAct::Relu2}, {"xielu", ie::MlpAct::Xielu}};

// DecoderConfig's enum field `field` as a Python property `name` of its names in `choices` (an unknown one:
// std::invalid_argument listing them).
template <class E>
void def_choice(py::class_<ie::DecoderConfig>& cls, const char* name, E ie::DecoderConfig::*field, Choices<E> choices) {
  cls.def_property(
      name,
      [field, choices](const ie::DecoderConfig& c) {
        for (const auto& [n, e] : choices)
          if (e == c.*field) return std::string(n);
        return std::string();
      },
      [name, field, choices](ie::DecoderConfig& c, const std::string& value) {
        std::string names;
        for (const auto& [n, e] : choices) {
          if (value == n) {
            c.*field = e;
            return;
          }
          names += (names.empty() ? "" : ", ") + std::string(n);
        }
        throw std::invalid_argument(std::string(name) + " must be one of " + names + ", got '" + value + "'");
      });
}

}  // namespace

void ie_register_decoder(py::module_& m) {
  // Every field by its name, its default the struct's (runtime/decoder.py native_config sets them by keyword: an
  // unknown name is an AttributeError); the enums by their names (choose).
  py::class_<ie::DecoderConfig> config(m, "DecoderConfig",
                                       "The decoder's dimensions (csrc/decoder/decoder.h); checked by Decoder().");
  config.def(py::init<>());
  config.def_readwrite("n_layers", &ie::DecoderConfig::n_layers);
  config.def_readwrite("hidden", &ie::DecoderConfig::hidden);
  config.def_readwrite("n_heads", &ie::DecoderConfig::n_heads);
  config.def_readwrite("n_kv_heads", &ie::DecoderConfig::n_kv_heads);
  config.def_readwrite("head_dim", &ie::DecoderConfig::head_dim);
  config.def_readwrite("inter", &ie::DecoderConfig::inter);
  config.def_readwrite("vocab", &ie::DecoderConfig::vocab);
  config.def_readwrite("max_ctx", &ie::DecoderConfig::max_ctx);
  config.def_readwrite("n_experts", &ie::DecoderConfig::n_experts);
  config.def_readwrite("top_k", &ie::DecoderConfig::top_k);
  config.def_readwrite("expert_inter", &ie::DecoderConfig::expert_inter);
  config.def_readwrite("attn_temp_floor", &ie::DecoderConfig::attn_temp_floor);
  config.def_readwrite("shared_inter", &ie::DecoderConfig::shared_inter);
  config.def_readwrite("n_group", &ie::DecoderConfig::n_group);
  config.def_readwrite("topk_group", &ie::DecoderConfig::topk_group);
  config.def_readwrite("q_lora", &ie::DecoderConfig::q_lora);
  config.def_readwrite("kv_lora", &ie::DecoderConfig::kv_lora);
  config.def_readwrite("v_head_dim", &ie::DecoderConfig::v_head_dim);
  config.def_readwrite("eps", &ie::DecoderConfig::eps);
  config.def_readwrite("rope_scale", &ie::DecoderConfig::rope_scale);
  config.def_readwrite("swiglu_alpha", &ie::DecoderConfig::swiglu_alpha);
  config.def_readwrite("swiglu_limit", &ie::DecoderConfig::swiglu_limit);
  config.def_readwrite("attn_scale", &ie::DecoderConfig::attn_scale);
  config.def_readwrite("embed_scale", &ie::DecoderConfig::embed_scale);
  config.def_readwrite("attn_softcap", &ie::DecoderConfig::attn_softcap);
  config.def_readwrite("logit_softcap", &ie::DecoderConfig::logit_softcap);
  config.def_readwrite("residual_scale", &ie::DecoderConfig::residual_scale);
  config.def_readwrite("logits_scaling", &ie::DecoderConfig::logits_scaling);
  config.def_readwrite("attn_temp_scale", &ie::DecoderConfig::attn_temp_scale);
  config.def_readwrite("attn_temp_offset", &ie::DecoderConfig::attn_temp_offset);
  config.def_readwrite("routed_scale", &ie::DecoderConfig::routed_scale);
  config.def_readwrite("norm_topk", &ie::DecoderConfig::norm_topk);
  config.def_readwrite("pre_norms", &ie::DecoderConfig::pre_norms);
  config.def_readwrite("qk_norm_full", &ie::DecoderConfig::qk_norm_full);
  config.def_readwrite("rope_interleaved", &ie::DecoderConfig::rope_interleaved);
  config.def_readwrite("layer_norm", &ie::DecoderConfig::layer_norm);
  config.def_readwrite("mlp_gated", &ie::DecoderConfig::mlp_gated);
  config.def_readwrite("parallel_block", &ie::DecoderConfig::parallel_block);
  config.def_readwrite("sigmoid_gating", &ie::DecoderConfig::sigmoid_gating);
  config.def_readwrite("attn_temp_nope", &ie::DecoderConfig::attn_temp_nope);
  config.def_readwrite("qk_l2_norm", &ie::DecoderConfig::qk_l2_norm);
  config.def_readwrite("qk_norm_after_rope", &ie::DecoderConfig::qk_norm_after_rope);
  config.def_readwrite("clip_qkv", &ie::DecoderConfig::clip_qkv);
  config.def_readwrite("weight_before", &ie::DecoderConfig::weight_before);
  config.def_readwrite("windows", &ie::DecoderConfig::windows);
  config.def_readwrite("inv_freq", &ie::DecoderConfig::inv_freq);
  config.def_readwrite("inv_freq_swa", &ie::DecoderConfig::inv_freq_swa);
  config.def_readwrite("nope", &ie::DecoderConfig::nope);
  config.def_readwrite("chunks", &ie::DecoderConfig::chunks);
  config.def_readwrite("attn_gate", &ie::DecoderConfig::attn_gate);
  config.def_readwrite("linear", &ie::DecoderConfig::linear);
  config.def_readwrite("lin_k_heads", &ie::DecoderConfig::lin_k_heads);
  config.def_readwrite("lin_v_heads", &ie::DecoderConfig::lin_v_heads);
  config.def_readwrite("lin_k_dim", &ie::DecoderConfig::lin_k_dim);
  config.def_readwrite("lin_v_dim", &ie::DecoderConfig::lin_v_dim);
  config.def_readwrite("lin_conv", &ie::DecoderConfig::lin_conv);
  config.def_readwrite("lin_v_tiled", &ie::DecoderConfig::lin_v_tiled);
  config.def_readwrite("short_conv", &ie::DecoderConfig::short_conv);
  config.def_readwrite("conv_taps", &ie::DecoderConfig::conv_taps);
  config.def_readwrite("ssm", &ie::DecoderConfig::ssm);
  config.def_readwrite("ssm_heads", &ie::DecoderConfig::ssm_heads);
  config.def_readwrite("ssm_head_dim", &ie::DecoderConfig::ssm_head_dim);
  config.def_readwrite("ssm_state", &ie::DecoderConfig::ssm_state);
  config.def_readwrite("ssm_groups", &ie::DecoderConfig::ssm_groups);
  config.def_readwrite("ssm_conv", &ie::DecoderConfig::ssm_conv);
  config.def_readwrite("mlp_only", &ie::DecoderConfig::mlp_only);
  config.def_readwrite("mixer_only", &ie::DecoderConfig::mixer_only);
  config.def_readwrite("ssm1", &ie::DecoderConfig::ssm1);
  config.def_readwrite("ssm1_inner", &ie::DecoderConfig::ssm1_inner);
  config.def_readwrite("ssm1_rank", &ie::DecoderConfig::ssm1_rank);
  config.def_readwrite("ssm1_norms", &ie::DecoderConfig::ssm1_norms);
  config.def_readwrite("ssm1_eps", &ie::DecoderConfig::ssm1_eps);
  config.def_readwrite("ssm_attends", &ie::DecoderConfig::ssm_attends);
  config.def_readwrite("q_mult", &ie::DecoderConfig::q_mult);
  config.def_readwrite("k_mult", &ie::DecoderConfig::k_mult);
  config.def_readwrite("v_mult", &ie::DecoderConfig::v_mult);
  config.def_readwrite("o_mult", &ie::DecoderConfig::o_mult);
  config.def_readwrite("ssm_out_mult", &ie::DecoderConfig::ssm_out_mult);
  config.def_readwrite("gate_mult", &ie::DecoderConfig::gate_mult);
  config.def_readwrite("down_mult", &ie::DecoderConfig::down_mult);
  config.def_readwrite("ssm_in_mults", &ie::DecoderConfig::ssm_in_mults);
  def_choice(config, "glu", &ie::DecoderConfig::glu, kGlus);
  def_choice(config, "mlp_act", &ie::DecoderConfig::mlp_act, kMlpActs);
  for (const auto& kv :
       {std::pair{"k_cache", &ie::DecoderConfig::k_cache}, std::pair{"v_cache", &ie::DecoderConfig::v_cache}}) {
    ie::WType ie::DecoderConfig::*field = kv.second;  // (a lambda cannot capture a structured binding in C++17)
    config.def_property(
        kv.first, [field](const ie::DecoderConfig& c) { return std::string(ie::wtype_info(c.*field).name); },
        [field](ie::DecoderConfig& c, const std::string& v) {
          const ie::WTypeInfo* t = ie::find_wtype(v);  // which of them a cache may hold: check_decoder
          if (t == nullptr) throw std::invalid_argument("a KV cache holds f32 or f16, got '" + v + "'");
          c.*field = t->type;
        });
  }
  py::class_<PyDecoder>(m, "Decoder", "Llama-family decoder over weights read in place (csrc/decoder/decoder.h).")
      .def(py::init(&make_decoder), py::arg("config"), py::arg("weights"),
           py::arg("act") = "f32", py::arg("threads") = 1, py::arg("isa") = "", py::arg("affinity") = "",
           py::arg("copy_experts") = false, py::arg("grow_copies") = true)
      .def_property_readonly("solo_jobs", [](const PyDecoder& s) { return s.dec->solo_jobs(); },
                             "Parallel jobs run on the calling thread alone because the machine was busy.")
      .def_property_readonly("pinned", [](const PyDecoder& s) { return s.dec->pinned(); },
                             "Each thread's CPU (-1: not pinned); empty without an affinity.")
      .def("forward",
           [](PyDecoder& s, py::array_t<int32_t, py::array::c_style | py::array::forcecast> tokens, bool all_logits,
              std::optional<py::array> out) { return forward(*s.dec, tokens, all_logits, out); },
           py::arg("tokens"), py::arg("all_logits") = false, py::arg("out") = py::none(),
           "Run tokens at the next positions; float32 logits [n, vocab] (all_logits) or [vocab] (last), "
           "written into `out` when given (that shape, C-contiguous).")
      .def("run_layers",
           [](PyDecoder& s, py::array_t<int32_t, py::array::c_style | py::array::forcecast> tokens, int layers,
              int first, std::optional<F32Array> stream) {
             const int64_t hidden = s.dec->config().hidden;
             const int64_t n = tokens.size();
             if (n < 1 || n > std::numeric_limits<int>::max())
               throw py::value_error("run_layers: " + std::to_string(n) + " tokens, outside 1.." +
                                     std::to_string(std::numeric_limits<int>::max()));
             if (stream && (stream->ndim() != 2 || stream->shape(0) != n || stream->shape(1) != hidden))
               throw py::value_error("run_layers: the residual stream must be [" + std::to_string(n) + ", " +
                                     std::to_string(hidden) + "] float32, one row per token");
             py::array_t<float> out({static_cast<py::ssize_t>(n), static_cast<py::ssize_t>(hidden)});
             const int32_t* t = tokens.data();
             const float* in = stream ? stream->data() : nullptr;
             float* o = out.mutable_data();
             {
               py::gil_scoped_release nogil;
               s.dec->run_layers(t, static_cast<int>(n), layers, first, in, o);
             }
             return out;
           },
           py::arg("tokens"), py::arg("layers"), py::arg("first") = 0, py::arg("stream") = py::none(),
           "Run tokens at the next positions through layers first..layers-1 only, no head (a calibration pass: "
           "collect_stats of those layers' inputs), from their embedding or from `stream` [n, hidden], the "
           "residual stream entering layer `first`; returns the stream leaving layer layers-1. forward refuses "
           "to continue until the positions are truncated.")
      .def("truncate", [](PyDecoder& s, int n) { s.dec->truncate(n); }, py::arg("n"),
           "Forget cached positions >= n.")
      .def_property_readonly("n_past", [](const PyDecoder& s) { return s.dec->n_past(); })
      .def_property_readonly("rewinds", [](const PyDecoder& s) { return s.dec->rewinds(); },
                             "Whether truncate may keep a prefix (false: linear attention's states, 0 or all)")
      .def("step_times", [](const PyDecoder& s) {
             const ie::Decoder::StepTimes& t = s.dec->step_times();
             py::dict d;
             d["steps"] = t.steps;
             d["total_s"] = t.total_s;
             d["matmul_s"] = t.matmul_s;
             d["attention_s"] = t.attention_s;
             return d;
           },
           "Single-token forward calls since reset_step_times, and their wall seconds: in all, inside weight "
           "matmuls, inside attention.")
      .def("reset_step_times", [](PyDecoder& s) { s.dec->reset_step_times(); })
      .def("collect_stats", [](PyDecoder& s, bool on, const std::vector<int>& capture, const std::vector<int>& capture_experts) {
             s.dec->collect_stats(on, capture, capture_experts);
           },
           py::arg("on"), py::arg("capture") = std::vector<int>{}, py::arg("capture_experts") = std::vector<int>{},
           "Start (clearing them) or stop the per-column sums of x^2 of every matrix input; the inputs of "
           "the `capture` slots are also kept row by row for take_captured, and each expert's routed rows of "
           "the `capture_experts` layers for take_expert_captured.")
      .def("take_expert_captured", [](PyDecoder& s, int layer) {
             const int H = s.dec->config().hidden, I = s.dec->config().expert_inter;
             py::list out;
             for (const ie::Decoder::ExpertRows& r : s.dec->take_expert_captured(layer))
               out.append(py::make_tuple(rows_array(r.in, H), rows_array(r.mid, I)));
             return out;
           }, py::arg("layer"),
           "Per expert of a captured layer, its routed rows since the last call: (input float32 [rows, hidden], "
           "down input float32 [rows, expert_inter]).")
      .def("take_captured", [](PyDecoder& s, int slot) {
             int n = 0;
             const std::vector<float> rows = s.dec->take_captured(slot, &n);
             return rows_array(rows, n);
           }, py::arg("slot"), "The rows of slot's input captured since the last call, float32 [tokens, n].")
      .def("stats", [](const PyDecoder& s) {
             py::list out;
             for (const std::vector<double>& v : s.dec->stats()) {
               py::array_t<double> a(static_cast<py::ssize_t>(v.size()));
               std::copy(v.begin(), v.end(), a.mutable_data());
               out.append(a);
             }
             return py::make_tuple(out, s.dec->stats_tokens());
           },
           "([4 per layer: attn norm out, attention out, mlp norm out, SwiGLU out; then final norm out], tokens).")
      .def("expert_stats", [](const PyDecoder& s) {
             py::list out;
             for (const ie::Decoder::ExpertStats& es : s.dec->expert_stats()) {
               if (es.rows.empty()) {
                 out.append(py::none());
                 continue;
               }
               const auto E = static_cast<py::ssize_t>(es.rows.size());
               auto arr = [E](const std::vector<double>& v) {
                 py::array_t<double> a({E, static_cast<py::ssize_t>(v.size()) / E});
                 std::copy(v.begin(), v.end(), a.mutable_data());
                 return a;
               };
               py::array_t<double> rows(E);
               std::copy(es.rows.begin(), es.rows.end(), rows.mutable_data());
               out.append(py::make_tuple(arr(es.in), arr(es.mid), rows));
             }
             return out;
           },
           "Per layer: None (no experts), or (sum x^2 of each expert's input rows [E, hidden], of its down "
           "inputs [E, expert_inter], rows routed to it [E]).")
      .def_property_readonly("experts_copied", [](const PyDecoder& s) { return s.dec->experts_copied(); },
                             "Whether a mixture's experts got rows8 copies at load (copy_experts, where the ISA and "
                             "act have the kernels).")
      .def_property_readonly("rows8_bytes", [](const PyDecoder& s) { return s.dec->rows8_bytes(); },
                             "Bytes of the row-interleaved copies decode steps read (0: none).");
#if IE_HAVE_CUDA
  using ie::cuda::CudaDecoder;
  py::class_<CudaDecoder>(m, "CudaDecoder",
                          "The decoder on the current CUDA device: weights uploaded once, KV cache on the device "
                          "(csrc/cuda/decoder.h).")
      .def(py::init(&make_cuda_decoder), py::arg("config"), py::arg("weights"))
      .def("forward", &forward<CudaDecoder>, py::arg("tokens"), py::arg("all_logits") = false,
           py::arg("out") = py::none(),
           "Run tokens at the next positions; float32 logits [n, vocab] (all_logits) or [vocab] (last), "
           "written into `out` when given (that shape, C-contiguous).")
      .def("truncate", &CudaDecoder::truncate, py::arg("n"), "Forget cached positions >= n.")
      .def_property_readonly("n_past", &CudaDecoder::n_past)
      .def_property_readonly("device_bytes", &CudaDecoder::device_bytes,
                             "Device bytes of the weights (matrices, f32 embedding table, norms, biases).")
      .def_property_readonly("step_graph", &CudaDecoder::step_graph,
                             "Whether single-token steps replay a CUDA graph.")
      .def_property_readonly("rows8_bytes", [](const CudaDecoder&) { return size_t{0}; },
                             "0: the device decoder keeps no row-interleaved copies (as Decoder.rows8_bytes).");
#endif
  m.def("decoder_weight_keys", &weight_keys,
        "The keys Decoder's weights dict may hold, by where they go (csrc/decoder/bindings.cpp).");
  m.def(
      "touch_bytes",
      [](py::buffer buf, size_t start, size_t nbytes, size_t stride) {
        py::buffer_info info = buf.request();
        // The loop reads [ptr, ptr + size): only a contiguous buffer is that range
        // (a reversed or strided view is not).
        if (info.ndim != 1 || (info.size > 1 && info.strides[0] != info.itemsize))
          throw std::invalid_argument("touch_bytes: buf must be a contiguous 1-D buffer");
        if (stride < 1) throw std::invalid_argument("touch_bytes: stride must be >= 1");
        const auto* p = static_cast<const uint8_t*>(info.ptr);
        const size_t size = static_cast<size_t>(info.size) * static_cast<size_t>(info.itemsize);
        py::gil_scoped_release nogil;
        return ie::touch_bytes(p, size, start, nbytes, stride);
      },
      py::arg("buf"), py::arg("start"), py::arg("nbytes"), py::arg("stride"),
      "Read one byte every `stride` bytes, `nbytes` in all, from `start`, wrapping; returns their sum.");
}
