#include "costmodel/model_spec.h"

#include <algorithm>
#include <exception>
#include <filesystem>
#include <limits>
#include <string>

#include <fmt/format.h>

#include "costmodel/config_paths.h"
#include "costmodel/input_error.h"
#include "costmodel/json_input.h"

namespace oom {
namespace {

constexpr std::int64_t kMaxDim = 1 << 24;  // generous bound on any width, count or vocabulary

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

// Qwen3.5 / Qwen3.6 / Qwen3-Next gate the attention output and use GDN with an interval.
bool is_qwen_hybrid(const std::string& t) { return starts_with(t, "qwen3_5") || starts_with(t, "qwen3_next"); }
bool is_gemma(const std::string& t) { return starts_with(t, "gemma"); }
bool is_gemma4(const std::string& t) { return starts_with(t, "gemma4"); }
// DeepSeek-V2/V3 and Kimi-K2 (DeepseekV3ForCausalLM): latent attention, ungated shared experts.
bool is_deepseek(const std::string& t) { return starts_with(t, "deepseek") || starts_with(t, "kimi"); }

// The one of `keys` this config names a quantity by (families name some differently, e.g.
// num_experts_per_tok and Gemma 4's top_k_experts); when it has none, an error that names them
// all rather than whichever was tried last.
std::string key_of(const JsonReader& r, std::initializer_list<const char*> keys) {
  std::string names;
  for (const char* k : keys) {
    if (r.has(k)) return k;
    names += (names.empty() ? "" : " or ") + std::string(k);
  }
  r.fail(*keys.begin(), "required field is missing (" + names + ")");
}

int dim(const JsonReader& r, const std::string& key) { return static_cast<int>(r.integer(key, 1, kMaxDim)); }
int dim_or(const JsonReader& r, const std::string& key, int fallback) {
  return static_cast<int>(r.integer_or(key, fallback, 1, kMaxDim));
}

// A spec may have at most 2^50 parameters (~1.1e15; the largest model here has 1.2e11), so that
// parameter counts and the byte sizes of their state (16 B per parameter) stay far inside int64.
constexpr double kMaxParams = 1125899906842624.0;  // 2^50

// An upper bound of the parameter count in floating point (cannot overflow): every layer gets
// the larger of its attention kinds and GDN, plus the whole MoE block; untied embeddings.
double params_upper_bound(const ModelSpec& s) {
  const double h = s.hidden;
  double mixing = 0;
  for (const AttentionSpec* a : {&s.full_attention, &s.sliding_attention}) {
    const double q = static_cast<double>(a->heads) * a->head_dim, kv = static_cast<double>(a->kv_heads) * a->head_dim;
    mixing = std::max(mixing, h * (3 * q + 2 * kv) + 2.0 * a->head_dim);
  }
  const AttentionSpec& la = s.latent_attention;
  const double qw = static_cast<double>(la.heads) * la.head_dim, qr = std::max(1, la.q_lora_rank);
  mixing = std::max(mixing, (h + qw) * qr + qw * h + h * (la.kv_lora_rank + la.rope_head_dim) +
                                static_cast<double>(la.kv_lora_rank) * la.heads * (la.head_dim + la.value_dim()) +
                                static_cast<double>(la.heads) * la.value_dim() * h + la.kv_lora_rank + qr);
  const GdnSpec& g = s.gdn;
  const double kd = static_cast<double>(g.key_heads) * g.key_head_dim, vd = static_cast<double>(g.value_heads) * g.value_head_dim;
  mixing = std::max(mixing, h * (2 * kd + 3 * vd + 2.0 * g.value_heads) + (2 * kd + vd) * g.conv_kernel +
                                2.0 * g.value_heads + g.value_head_dim);
  const MoeSpec& m = s.moe;
  const double moe = h * m.experts * (1 + 3.0 * m.expert_intermediate) +
                     3 * h * (static_cast<double>(m.shared_expert_intermediate) + m.dense_intermediate +
                              s.dense_layer.dense_intermediate) + 3 * h;
  return static_cast<double>(s.layers) * (mixing + moe) + 2 * static_cast<double>(s.vocab) * h + h;
}

LayerKind parse_layer_kind(const JsonReader& r, const std::string& key, std::size_t i, const std::string& s) {
  if (s == "full_attention" || s == "attention" || s == "global_attention") return LayerKind::kFullAttention;
  if (s == "sliding_attention" || s == "sliding_window_attention" || s == "local_attention") {
    return LayerKind::kSlidingAttention;
  }
  if (s == "linear_attention") return LayerKind::kLinearAttention;
  if (s == "latent_attention") return LayerKind::kLatentAttention;
  r.fail_value(fmt::format("{}[{}]", r.field(key), i), s,
               "unknown layer type (expected full_attention, sliding_attention, linear_attention or latent_attention)");
}

std::vector<LayerKind> read_layer_kinds(const JsonReader& r, int layers, bool has_window, bool latent) {
  std::vector<LayerKind> kinds;
  if (r.has("layer_types")) {
    const auto names = r.string_list("layer_types");
    if (static_cast<int>(names.size()) != layers) {
      r.fail("layer_types", fmt::format("has {} entries, num_hidden_layers is {}", names.size(), layers));
    }
    for (std::size_t i = 0; i < names.size(); ++i) kinds.push_back(parse_layer_kind(r, "layer_types", i, names[i]));
    return kinds;
  }
  if (r.has("full_attention_interval")) {
    const auto interval = r.integer("full_attention_interval", 1, layers);
    for (int i = 0; i < layers; ++i) {
      kinds.push_back((i + 1) % interval == 0 ? LayerKind::kFullAttention : LayerKind::kLinearAttention);
    }
    return kinds;
  }
  if (r.has("sliding_window_pattern")) {  // every N-th layer is global, the rest slide
    const auto pattern = r.integer("sliding_window_pattern", 1, layers);
    for (int i = 0; i < layers; ++i) {
      kinds.push_back((i + 1) % pattern == 0 ? LayerKind::kFullAttention : LayerKind::kSlidingAttention);
    }
    return kinds;
  }
  kinds.assign(layers, latent       ? LayerKind::kLatentAttention
                       : has_window ? LayerKind::kSlidingAttention
                                    : LayerKind::kFullAttention);
  return kinds;
}

}  // namespace

std::string_view layer_kind_name(LayerKind kind) {
  switch (kind) {
    case LayerKind::kFullAttention: return "full_attention";
    case LayerKind::kSlidingAttention: return "sliding_attention";
    case LayerKind::kLinearAttention: return "linear_attention";
    case LayerKind::kLatentAttention: return "latent_attention";
  }
  return "unknown";
}

const AttentionSpec& ModelSpec::attention(LayerKind kind) const {
  OOM_ASSERT(kind != LayerKind::kLinearAttention, "linear attention layers have no softmax attention");
  if (kind == LayerKind::kLatentAttention) return latent_attention;
  return kind == LayerKind::kSlidingAttention ? sliding_attention : full_attention;
}

int ModelSpec::count(LayerKind kind) const {
  int n = 0;
  for (auto k : layer_kinds) n += k == kind ? 1 : 0;
  return n;
}

bool ModelSpec::zero_centered_norm() const { return is_qwen_hybrid(model_type); }

bool ModelSpec::gemma4() const { return is_gemma4(model_type); }

namespace {

// rope_parameters (transformers ≥ 5) or rope_scaling (older configs): the scaling of the
// frequencies. Per-layer-type parameters (Gemma 4) are not read here.
RopeScaling read_rope_scaling(const JsonReader& r, std::int64_t max_position) {
  RopeScaling s;
  const char* key = r.has("rope_parameters") && r.raw()["rope_parameters"].is_object() ? "rope_parameters"
                    : r.has("rope_scaling") && r.raw()["rope_scaling"].is_object()   ? "rope_scaling"
                                                                                       : nullptr;
  if (key == nullptr) return s;
  const JsonReader p = r.object(key);
  const char* type_key = p.has("rope_type") ? "rope_type" : p.has("type") ? "type" : nullptr;
  if (type_key == nullptr) return s;
  s.type = p.one_of(type_key, {"default", "yarn"});
  if (s.type == "default") return s;
  s.original_max_position = p.integer("original_max_position_embeddings", 1, std::int64_t{1} << 40);
  s.factor = p.has("factor") && !p.raw()["factor"].is_null()
                 ? p.number("factor", 1.0, 1e6)
                 : static_cast<double>(std::max<std::int64_t>(max_position, 1)) / static_cast<double>(s.original_max_position);
  s.beta_fast = p.number_or("beta_fast", 32.0, 1e-6, 1e6);
  s.beta_slow = p.number_or("beta_slow", 1.0, 1e-6, 1e6);
  s.attention_factor = p.number_or("attention_factor", 0.0, 0.0, 1e3);
  s.mscale = p.number_or("mscale", 0.0, 0.0, 1e3);
  s.mscale_all_dim = p.number_or("mscale_all_dim", 0.0, 0.0, 1e3);
  s.truncate = p.boolean_or("truncate", true);
  return s;
}

// Gemma 4's RoPE of one layer type (transformers' defaults: sliding "default" θ = 1e4, full
// "proportional" with factor 0.25 and θ = 1e6).
void read_gemma4_rope(const JsonReader& r, const char* layer_type, AttentionSpec& a) {
  const bool full = std::string(layer_type) == "full_attention";
  a.rope_theta = full ? 1e6 : 1e4;
  a.rope_proportional = full;
  a.rope_partial_factor = full ? 0.25 : 1.0;
  if (!r.has("rope_parameters") || !r.raw()["rope_parameters"].is_object()) return;
  const JsonReader all = r.object("rope_parameters");
  if (!all.has(layer_type)) return;
  const JsonReader p = all.object(layer_type);
  const std::string type = p.has("rope_type") ? p.one_of("rope_type", {"default", "proportional"}) : "default";
  a.rope_theta = p.number_or("rope_theta", 1e4, 1.0, 1e15);
  a.rope_proportional = type == "proportional";
  // transformers' default RoPE rotates the whole head whatever partial_rotary_factor says.
  a.rope_partial_factor = a.rope_proportional ? p.number_or("partial_rotary_factor", 1.0, 0.0, 1.0) : 1.0;
  if (a.rope_proportional && p.has("factor") && p.number("factor", 0.0, 1e6) != 1.0) {
    p.fail("factor", "proportional RoPE is read without frequency scaling (factor 1)");
  }
}

// The Gemma 4 fields of Gemma4TextConfig beyond the common ones: global layers' heads, per-layer-
// type RoPE, and the refusal of what the backend does not implement.
void read_gemma4(const JsonReader& r, ModelSpec& s, const AttentionSpec& attn) {
  if (const auto ple = r.integer_or("hidden_size_per_layer_input", 256, 0, kMaxDim); ple != 0) {
    r.fail_value(r.field("hidden_size_per_layer_input"), ple,
                 "per-layer inputs are not implemented (set 0; transformers' default is 256 when absent)");
  }
  if (const auto shared = r.integer_or("num_kv_shared_layers", 0, 0, kMaxDim); shared != 0) {
    r.fail_value(r.field("num_kv_shared_layers"), shared, "KV sharing across layers is not implemented (set 0)");
  }
  if (r.boolean_or("attention_bias", false)) r.fail("attention_bias", "projection biases are not implemented");
  if (r.has("use_bidirectional_attention") && r.raw()["use_bidirectional_attention"] == "all") {
    r.fail("use_bidirectional_attention", "only causal attention over text tokens is implemented");
  }
  if (!r.boolean_or("enable_moe_block", false)) {
    r.fail_value(r.field("enable_moe_block"), r.boolean_or("enable_moe_block", false),
                 "a Gemma 4 model without the MoE block has no experts (transformers' default is false)");
  }
  // Global layers: transformers' per_layer_config (what save_pretrained writes), else
  // global_head_dim (default 512) and, with attention_k_eq_v, num_global_key_value_heads.
  s.full_attention = attn;
  s.full_attention.k_eq_v = r.boolean_or("attention_k_eq_v", false);
  s.full_attention.head_dim = dim_or(r, "global_head_dim", 512);
  std::string kv_heads_field = r.field("num_global_key_value_heads");  // where full_attention.kv_heads came from
  if (s.full_attention.k_eq_v && r.has("num_global_key_value_heads")) {
    s.full_attention.kv_heads = dim(r, "num_global_key_value_heads");
  }
  if (r.has("per_layer_config")) {
    const JsonReader per = r.object("per_layer_config");
    bool seen = false;
    for (const auto& [key, value] : per.raw().items()) {
      std::size_t used = 0;
      int layer = -1;
      try {
        layer = std::stoi(key, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != key.size() || layer < 0 || layer >= s.layers ||
          s.layer_kinds[static_cast<std::size_t>(layer)] != LayerKind::kFullAttention) {
        per.fail(key, "overrides are read for full_attention layers only");
      }
      const JsonReader o = per.object(key);
      AttentionSpec a = attn;
      a.k_eq_v = s.full_attention.k_eq_v;
      a.head_dim = dim_or(o, "head_dim", attn.head_dim);
      a.kv_heads = dim_or(o, "num_key_value_heads", attn.kv_heads);
      if (o.has("num_key_value_heads")) kv_heads_field = o.field("num_key_value_heads");
      if (seen && (a.head_dim != s.full_attention.head_dim || a.kv_heads != s.full_attention.kv_heads)) {
        per.fail(key, "every full_attention layer must have the same head_dim and num_key_value_heads");
      }
      s.full_attention.head_dim = a.head_dim;
      s.full_attention.kv_heads = a.kv_heads;
      seen = true;
    }
  }
  if (s.full_attention.heads % s.full_attention.kv_heads != 0) {
    r.fail_value(kv_heads_field, s.full_attention.kv_heads, fmt::format("must divide num_attention_heads = {}", attn.heads));
  }
  read_gemma4_rope(r, "sliding_attention", s.sliding_attention);
  read_gemma4_rope(r, "full_attention", s.full_attention);
  s.router_aux_loss_coef = 0.0;  // Gemma4ForCausalLM adds no load-balancing loss
}

// Multi-head Latent Attention (DeepSeek-V2/V3, Kimi-K2): the latent ranks and per-head widths.
AttentionSpec read_latent_attention(const JsonReader& r, int heads) {
  AttentionSpec a;
  a.heads = heads;
  a.kv_heads = heads;
  a.q_lora_rank = r.has("q_lora_rank") && r.raw()["q_lora_rank"].is_null() ? 0
                                                                             : static_cast<int>(r.integer_or("q_lora_rank", 0, 0, kMaxDim));
  a.kv_lora_rank = dim(r, "kv_lora_rank");
  a.rope_head_dim = dim(r, "qk_rope_head_dim");
  a.head_dim = dim(r, "qk_nope_head_dim") + a.rope_head_dim;
  a.v_head_dim = dim(r, "v_head_dim");
  if (r.boolean_or("attention_bias", false)) r.fail("attention_bias", "projection biases are not implemented");
  return a;
}

// DeepSeek-V3 style experts: n_routed_experts, n_shared_experts of moe_intermediate_size each, no
// shared-expert gate, the first first_k_dense_replace layers dense, grouped (sigmoid) routing.
void read_deepseek_moe(const JsonReader& r, ModelSpec& s) {
  MoeSpec& m = s.moe;
  if (const auto freq = r.integer_or("moe_layer_freq", 1, 1, kMaxDim); freq != 1) {
    r.fail_value(r.field("moe_layer_freq"), freq, "only every layer after first_k_dense_replace being MoE (1) is implemented");
  }
  if (r.has("n_shared_experts") && !r.raw()["n_shared_experts"].is_null()) {
    m.shared_expert_intermediate = static_cast<int>(r.integer("n_shared_experts", 0, 64) * m.expert_intermediate);
  }
  s.first_dense_layers = static_cast<int>(r.integer_or("first_k_dense_replace", 0, 0, s.layers - 1));
  if (s.first_dense_layers > 0) s.dense_layer.dense_intermediate = dim(r, "intermediate_size");
  // transformers' DeepseekV3Config has no scoring_func (its router is always sigmoid, noaux_tc), so
  // a config it writes for deepseek_v3 or kimi_k2 leaves it out; DeepSeek-V2's default is softmax.
  const bool v3 = s.model_type == "deepseek_v3" || starts_with(s.model_type, "kimi") || r.string_or("topk_method", "") == "noaux_tc";
  m.scoring = r.has("scoring_func") ? r.one_of("scoring_func", {"softmax", "sigmoid"}) : (v3 ? "sigmoid" : "softmax");
  m.groups = dim_or(r, "n_group", 1);
  m.topk_groups = static_cast<int>(r.integer_or("topk_group", 1, 1, m.groups));
  if (m.experts % m.groups != 0) r.fail_value(r.field("n_group"), m.groups, fmt::format("must divide the {} routed experts", m.experts));
  if (m.top_k > m.topk_groups * (m.experts / m.groups)) {
    r.fail_value(r.field("topk_group"), m.topk_groups,
                 fmt::format("{} groups of {} experts hold fewer than the {} experts per token", m.topk_groups, m.experts / m.groups, m.top_k));
  }
  m.routed_scaling = r.number_or("routed_scaling_factor", 1.0, 1e-6, 1e6);
}

}  // namespace

ModelSpec model_spec_from_hf_config(const nlohmann::json& config, const std::string& file, const std::string& name) {
  const JsonReader outer(config, file);
  const JsonReader r = outer.has("text_config") ? outer.object("text_config") : outer;

  ModelSpec s;
  s.name = name;
  s.model_type = r.string_or("model_type", outer.string_or("model_type", "unknown"));
  const std::string& type = s.model_type;
  s.layers = dim(r, "num_hidden_layers");
  s.hidden = dim(r, "hidden_size");
  s.vocab = dim(r, "vocab_size");
  s.tied_embeddings = r.boolean_or("tie_word_embeddings", is_gemma(type));
  s.max_position = r.integer_or("max_position_embeddings", 0, 0, std::int64_t{1} << 40);
  double theta = s.rope_theta;
  if (r.has("rope_parameters") && r.raw()["rope_parameters"].is_object()) {
    theta = r.object("rope_parameters").number_or("rope_theta", theta, 1.0, 1e15);
  }
  s.rope_theta = r.number_or("rope_theta", theta, 1.0, 1e15);
  double partial = 1.0;
  if (r.has("rope_parameters") && r.raw()["rope_parameters"].is_object()) {
    partial = r.object("rope_parameters").number_or("partial_rotary_factor", partial, 0.0, 1.0);
  }
  s.partial_rotary_factor = r.number_or("partial_rotary_factor", partial, 0.0, 1.0);
  s.rope_scaling = read_rope_scaling(r, s.max_position);
  s.norm_eps = r.number_or("rms_norm_eps", 1e-6, 1e-12, 1.0);
  // transformers adds the load-balancing loss only when the config outputs the router logits.
  const double aux = r.number_or("router_aux_loss_coef", 0.0, 0.0, 1e3);
  s.router_aux_loss_coef = r.boolean_or("output_router_logits", false) ? aux : 0.0;
  s.final_logit_softcap = r.number_or("final_logit_softcapping", 0.0, 0.0, 1e6);
  s.activation = r.string_or("hidden_activation", r.string_or("hidden_act", is_gemma4(type) ? "gelu_pytorch_tanh" : "silu"));

  // Softmax attention. Gemma 4 global layers have their own KV heads and head dim.
  AttentionSpec attn;
  attn.heads = dim(r, "num_attention_heads");
  attn.kv_heads = dim_or(r, "num_key_value_heads", attn.heads);
  attn.head_dim = dim_or(r, "head_dim", std::max(1, s.hidden / attn.heads));
  attn.output_gate = r.boolean_or("attn_output_gate", is_qwen_hybrid(type));
  attn.qk_norm = r.boolean_or("qk_norm", starts_with(type, "qwen3") || is_gemma(type));
  if (attn.heads % attn.kv_heads != 0) {
    r.fail("num_key_value_heads", fmt::format("must divide num_attention_heads = {}", attn.heads));
  }
  const auto window = r.integer_or("sliding_window", is_gemma4(type) ? 512 : 0, 0, std::int64_t{1} << 40);
  s.sliding_attention = attn;
  s.sliding_attention.window_tokens = window;
  s.full_attention = attn;
  if (r.has("global_head_dim")) s.full_attention.head_dim = dim(r, "global_head_dim");
  if (r.has("num_global_key_value_heads")) s.full_attention.kv_heads = dim(r, "num_global_key_value_heads");
  s.full_attention.k_eq_v = r.boolean_or("attention_k_eq_v", false);
  if (s.full_attention.heads % s.full_attention.kv_heads != 0) {
    r.fail("num_global_key_value_heads", fmt::format("must divide num_attention_heads = {}", attn.heads));
  }

  // Mixtral keeps one window for every layer; models with layer types name which slide.
  const bool explicit_kinds = r.has("layer_types") || r.has("full_attention_interval") || r.has("sliding_window_pattern");
  const bool latent = r.has("kv_lora_rank");
  s.layer_kinds = read_layer_kinds(r, s.layers, window > 0 && !explicit_kinds, latent);
  if (latent || s.count(LayerKind::kLatentAttention) > 0) s.latent_attention = read_latent_attention(r, attn.heads);
  if (s.count(LayerKind::kSlidingAttention) > 0 && window == 0) {
    r.fail("sliding_window", "sliding_attention layers need a window");
  }
  if (is_gemma4(type)) read_gemma4(r, s, attn);

  if (s.count(LayerKind::kLinearAttention) > 0) {
    s.gdn.key_heads = dim(r, "linear_num_key_heads");
    s.gdn.value_heads = dim(r, "linear_num_value_heads");
    s.gdn.key_head_dim = dim(r, "linear_key_head_dim");
    s.gdn.value_head_dim = dim(r, "linear_value_head_dim");
    s.gdn.conv_kernel = dim_or(r, "linear_conv_kernel_dim", 4);
    if (s.gdn.value_heads % s.gdn.key_heads != 0) {
      r.fail("linear_num_value_heads", fmt::format("must be a multiple of linear_num_key_heads = {}", s.gdn.key_heads));
    }
  }

  // Experts. Mixtral names them num_local_experts and sizes them with intermediate_size; Gemma 4
  // uses intermediate_size for the dense MLP beside the experts; Qwen's intermediate_size is for
  // dense-only layers, which the models here do not have.
  MoeSpec& m = s.moe;
  m.experts = dim(r, key_of(r, {"num_experts", "n_routed_experts", "num_local_experts"}));
  m.top_k = static_cast<int>(r.integer(key_of(r, {"num_experts_per_tok", "top_k_experts"}), 1, m.experts));
  if (r.has("moe_intermediate_size")) {
    m.expert_intermediate = dim(r, "moe_intermediate_size");
    if (r.has("dense_mlp_intermediate_size")) {
      m.dense_intermediate = dim(r, "dense_mlp_intermediate_size");
    } else if (is_gemma(type) && r.has("intermediate_size")) {
      m.dense_intermediate = dim(r, "intermediate_size");
    }
  } else {
    m.expert_intermediate = dim(r, key_of(r, {"moe_intermediate_size", "intermediate_size"}));
  }
  m.shared_expert_intermediate = static_cast<int>(r.integer_or("shared_expert_intermediate_size", 0, 0, kMaxDim));
  m.norm_topk_prob = r.boolean_or("norm_topk_prob", true);
  m.shared_expert_gate = r.boolean_or("shared_expert_gate", !is_deepseek(type));
  if (is_deepseek(type) || r.has("first_k_dense_replace") || r.has("n_shared_experts")) read_deepseek_moe(r, s);
  if (const double params = params_upper_bound(s); params > kMaxParams) {
    r.fail("hidden_size", fmt::format("with these dimensions the model has up to {:.3g} parameters, more than the "
                                      "{:.3g} supported", params, kMaxParams));
  }
  return s;
}

nlohmann::json model_spec_to_hf_config(const ModelSpec& s) {
  nlohmann::json j;
  j["model_type"] = s.model_type;
  j["num_hidden_layers"] = s.layers;
  j["hidden_size"] = s.hidden;
  j["vocab_size"] = s.vocab;
  j["tie_word_embeddings"] = s.tied_embeddings;
  j["max_position_embeddings"] = s.max_position;
  j["rope_theta"] = s.rope_theta;
  j["partial_rotary_factor"] = s.partial_rotary_factor;
  j["final_logit_softcapping"] = s.final_logit_softcap;
  j["hidden_act"] = s.activation;
  j["rms_norm_eps"] = s.norm_eps;
  j["router_aux_loss_coef"] = s.router_aux_loss_coef;
  j["output_router_logits"] = s.router_aux_loss_coef > 0;
  if (s.rope_scaling.type != "default") {
    const RopeScaling& y = s.rope_scaling;
    j["rope_scaling"] = {{"rope_type", y.type}, {"factor", y.factor}, {"original_max_position_embeddings", y.original_max_position},
                         {"beta_fast", y.beta_fast}, {"beta_slow", y.beta_slow}, {"attention_factor", y.attention_factor},
                         {"mscale", y.mscale}, {"mscale_all_dim", y.mscale_all_dim}, {"truncate", y.truncate}};
  }
  const AttentionSpec& a = s.sliding_attention;
  j["num_attention_heads"] = a.heads;
  j["num_key_value_heads"] = a.kv_heads;
  j["head_dim"] = a.head_dim;
  j["attn_output_gate"] = a.output_gate;
  j["qk_norm"] = a.qk_norm;
  j["sliding_window"] = a.window_tokens;
  j["global_head_dim"] = s.full_attention.head_dim;
  j["num_global_key_value_heads"] = s.full_attention.kv_heads;
  j["attention_k_eq_v"] = s.full_attention.k_eq_v;
  if (s.gemma4()) {
    j["hidden_size_per_layer_input"] = 0;
    j["num_kv_shared_layers"] = 0;
    j["enable_moe_block"] = true;
    j["hidden_activation"] = s.activation;
    auto rope = [](const AttentionSpec& a) {
      nlohmann::json p = {{"rope_type", a.rope_proportional ? "proportional" : "default"}, {"rope_theta", a.rope_theta}};
      if (a.rope_proportional) p["partial_rotary_factor"] = a.rope_partial_factor;
      return p;
    };
    j["rope_parameters"] = {{"sliding_attention", rope(s.sliding_attention)}, {"full_attention", rope(s.full_attention)}};
  }
  auto& types = j["layer_types"] = nlohmann::json::array();
  for (auto k : s.layer_kinds) types.push_back(std::string(layer_kind_name(k)));
  if (s.count(LayerKind::kLinearAttention) > 0) {
    j["linear_num_key_heads"] = s.gdn.key_heads;
    j["linear_num_value_heads"] = s.gdn.value_heads;
    j["linear_key_head_dim"] = s.gdn.key_head_dim;
    j["linear_value_head_dim"] = s.gdn.value_head_dim;
    j["linear_conv_kernel_dim"] = s.gdn.conv_kernel;
  }
  if (s.count(LayerKind::kLatentAttention) > 0) {
    const AttentionSpec& la = s.latent_attention;
    j["q_lora_rank"] = la.q_lora_rank;
    j["kv_lora_rank"] = la.kv_lora_rank;
    j["qk_rope_head_dim"] = la.rope_head_dim;
    j["qk_nope_head_dim"] = la.head_dim - la.rope_head_dim;
    j["v_head_dim"] = la.value_dim();
  }
  j["num_experts"] = s.moe.experts;
  j["num_experts_per_tok"] = s.moe.top_k;
  j["moe_intermediate_size"] = s.moe.expert_intermediate;
  j["shared_expert_intermediate_size"] = s.moe.shared_expert_intermediate;
  if (s.moe.dense_intermediate > 0) j["dense_mlp_intermediate_size"] = s.moe.dense_intermediate;
  j["norm_topk_prob"] = s.moe.norm_topk_prob;
  j["shared_expert_gate"] = s.moe.shared_expert_gate;
  j["first_k_dense_replace"] = s.first_dense_layers;
  if (s.first_dense_layers > 0) j["intermediate_size"] = s.dense_layer.dense_intermediate;
  j["scoring_func"] = s.moe.scoring;
  j["n_group"] = s.moe.groups;
  j["topk_group"] = s.moe.topk_groups;
  j["routed_scaling_factor"] = s.moe.routed_scaling;
  return j;
}

ModelSpec load_model_spec(const std::string& name_or_path) {
  const auto path = resolve_config("models", name_or_path);
  if (!path) {
    throw InputError("", "model", "\"" + name_or_path + "\"",
                     "unknown model (known: " + known_config_names("models") + ")");
  }
  return model_spec_from_hf_config(read_json_file(*path), *path, std::filesystem::path(*path).stem().string());
}

}  // namespace oom
