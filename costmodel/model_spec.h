// ModelSpec: the dimensions of a Mixture-of-Experts decoder, read from a Hugging Face config.
//
// Covers the layer kinds of the models we train: full causal attention (GQA, optional output
// gate), sliding-window causal attention, Gated DeltaNet linear attention ("linear_attention") and
// Multi-head Latent Attention ("latent_attention", DeepSeek-V3 / Kimi-K2: queries and keys/values
// through low-rank latents, a decoupled RoPE key shared by all heads), each followed by a MoE block
// of routed SwiGLU experts with an optional shared expert and an optional dense MLP beside the
// experts (Gemma 4) -- or, in the first `first_dense_layers` layers (DeepSeek's
// first_k_dense_replace), by a dense SwiGLU MLP alone. Gemma 4's global layers have their own KV head
// count and head dim and may reuse K as V. Plain value type; the loaders validate every field.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace oom {

enum class LayerKind { kFullAttention, kSlidingAttention, kLinearAttention, kLatentAttention };

// "full_attention", "sliding_attention", "linear_attention" (the Hugging Face layer_types names),
// "latent_attention".
std::string_view layer_kind_name(LayerKind kind);

// Softmax attention of one layer kind.
struct AttentionSpec {
  int heads = 0;             // query heads
  int kv_heads = 0;          // key/value heads (GQA groups)
  int head_dim = 0;          // per-head dimension of Q, K and V
  bool output_gate = false;  // Q projection also produces a sigmoid gate on the output (doubles Q)
  bool k_eq_v = false;       // V reuses K: no V projection (Gemma 4 global layers)
  bool qk_norm = false;      // per-head RMSNorm of Q and K
  std::int64_t window_tokens = 0;  // sliding window; 0 = unlimited (full causal)
  // RoPE of this layer kind where the config gives one per layer type (Gemma 4's rope_parameters
  // keyed by "sliding_attention" / "full_attention"); rope_theta 0 = the model's RoPE.
  double rope_theta = 0.0;
  bool rope_proportional = false;     // "proportional": head_dim/2 frequencies θ^(−2i/head_dim), the
                                      // first ⌊factor·head_dim/2⌋ rotating, the rest 0 (unrotated)
  double rope_partial_factor = 1.0;   // the rotated fraction of a proportional RoPE
  // Multi-head Latent Attention (kv_lora_rank > 0): head_dim is the query/key width per head
  // (qk_nope_head_dim + qk_rope_head_dim), kv_heads = heads (the latent expands to per-head K, V).
  // Q = q_b(norm(q_a(x))) when q_lora_rank > 0, else q_proj(x); [c_kv, k_rope] = kv_a(x);
  // [k_nope, v] = kv_b(norm(c_kv)); k_rope (rope_head_dim wide) is shared by every head.
  int v_head_dim = 0;       // per-head value width; 0 = head_dim
  int q_lora_rank = 0;      // 0 = queries straight from the hidden state
  int kv_lora_rank = 0;     // > 0: latent attention
  int rope_head_dim = 0;    // rotated part of head_dim (qk_rope_head_dim)

  bool latent() const { return kv_lora_rank > 0; }
  int value_dim() const { return v_head_dim > 0 ? v_head_dim : head_dim; }

  bool operator==(const AttentionSpec&) const = default;
};

// Gated DeltaNet (chunked linear attention with a recurrent FP32 state per value head).
struct GdnSpec {
  int key_heads = 0;
  int value_heads = 0;
  int key_head_dim = 0;
  int value_head_dim = 0;
  int conv_kernel = 0;  // causal depthwise conv over q, k, v

  std::int64_t key_dim() const { return std::int64_t{key_heads} * key_head_dim; }
  std::int64_t value_dim() const { return std::int64_t{value_heads} * value_head_dim; }
  bool operator==(const GdnSpec&) const = default;
};

struct MoeSpec {
  int experts = 0;                     // routed experts E
  int top_k = 0;                       // experts per token k
  int expert_intermediate = 0;         // I of each routed SwiGLU expert
  int shared_expert_intermediate = 0;  // 0 = no shared expert
  int dense_intermediate = 0;          // 0 = no dense MLP beside the experts
  bool norm_topk_prob = true;          // renormalize the top-k routing weights
  bool shared_expert_gate = true;      // a sigmoid gate [h → 1] scales the shared expert (Qwen); DeepSeek has none
  // Routing: "softmax" over the experts' logits, or "sigmoid" scores (DeepSeek-V3's noaux_tc,
  // whose selection bias is a buffer, not a parameter); top-k within the best `topk_groups` of
  // `groups` expert groups; the weights scaled by routed_scaling.
  std::string scoring = "softmax";
  int groups = 1;
  int topk_groups = 1;
  double routed_scaling = 1.0;

  bool operator==(const MoeSpec&) const = default;
};

// RoPE frequency scaling (Hugging Face rope_parameters / rope_scaling): none, or YaRN.
struct RopeScaling {
  std::string type = "default";         // "default" or "yarn"
  double factor = 1.0;                   // context extension factor
  std::int64_t original_max_position = 0;  // positions the model was pre-trained on
  double beta_fast = 32.0;               // ramp bounds, in rotations over the original context
  double beta_slow = 1.0;
  double attention_factor = 0.0;         // cos/sin scale; 0 = derived from factor (and mscale)
  double mscale = 0.0;
  double mscale_all_dim = 0.0;
  bool truncate = true;                  // round the ramp bounds to whole dimensions

  bool operator==(const RopeScaling&) const = default;
};

struct ModelSpec {
  std::string name;        // project name (configs/models/<name>.json) or the file stem
  std::string model_type;  // Hugging Face model_type of the text backbone
  int layers = 0;
  int hidden = 0;
  int vocab = 0;
  bool tied_embeddings = false;
  std::vector<LayerKind> layer_kinds;  // one per decoder layer
  AttentionSpec full_attention;        // used by kFullAttention layers
  AttentionSpec sliding_attention;     // used by kSlidingAttention layers
  AttentionSpec latent_attention;      // used by kLatentAttention layers
  GdnSpec gdn;                         // used by kLinearAttention layers
  MoeSpec moe;                         // the MoE layers' block
  int first_dense_layers = 0;          // layers [0, n) have a dense MLP instead (first_k_dense_replace)
  MoeSpec dense_layer;                 // their block: no experts, dense_intermediate = intermediate_size
  std::int64_t max_position = 0;
  double rope_theta = 10000.0;
  double partial_rotary_factor = 1.0;
  double final_logit_softcap = 0.0;  // 0 = none
  std::string activation = "silu";
  RopeScaling rope_scaling;
  double norm_eps = 1e-6;               // rms_norm_eps of every RMSNorm
  double router_aux_loss_coef = 0.0;    // load-balancing loss weight; 0 = none (see router_aux_loss)

  // Whether the decoder is Gemma 4's (model_type gemma4*): RMSNorms before and after attention, the
  // dense MLP, the experts and their sum; the router on the un-normalized residual (weightless norm,
  // learned per-channel scale, h^-1/2, top-k renormalized, then per-expert scales); a weightless V
  // norm; attention scale 1 (Q/K norms instead of 1/√d); embeddings scaled by √h; each layer's
  // output multiplied by its layer_scalar (a checkpoint buffer, not trained in transformers).
  bool gemma4() const;

  // Whether the RMSNorms scale by (1 + w) with w initialised at 0 (Qwen3.5, Qwen3.6, Qwen3-Next);
  // otherwise by w, initialised at 1. Follows from model_type. The GDN output norm always uses w.
  bool zero_centered_norm() const;

  const AttentionSpec& attention(LayerKind kind) const;
  // Whether decoder `layer` has routed experts, and its FFN block (moe, or dense_layer).
  bool moe_layer(int layer) const { return layer >= first_dense_layers; }
  const MoeSpec& layer_moe(int layer) const { return moe_layer(layer) ? moe : dense_layer; }
  int moe_layers() const { return layers - first_dense_layers; }
  int count(LayerKind kind) const;
  bool operator==(const ModelSpec&) const = default;
};

// Reads a Hugging Face config.json object (or the "text_config" of a multimodal config).
// `file` names the origin for error messages; `name` becomes ModelSpec::name. Throws InputError
// naming the field for a missing, mistyped or out-of-range value. Gemma 4 fields are read with
// transformers' defaults (Gemma4TextConfig); its features that no MoE checkpoint here uses are
// refused with an InputError naming the field: per-layer inputs (hidden_size_per_layer_input ≠ 0,
// 256 when absent), KV sharing (num_kv_shared_layers ≠ 0), attention_bias, bidirectional
// attention over all tokens, a model without the MoE block (enable_moe_block false), and RoPE
// types other than default/proportional. DeepSeek-V3 style configs (kv_lora_rank, n_routed_experts,
// n_shared_experts, first_k_dense_replace, scoring_func, n_group, topk_group) give latent
// attention layers, shared experts without a gate and dense first layers; moe_layer_freq ≠ 1 and
// attention_bias are refused. Multi-token-prediction modules (num_nextn_predict_layers) are not
// part of the decoder transformers builds and are not counted.
ModelSpec model_spec_from_hf_config(const nlohmann::json& config, const std::string& file,
                                    const std::string& name);

// Writes the spec back as a Hugging Face style config (round-trips through the reader).
nlohmann::json model_spec_to_hf_config(const ModelSpec& spec);

// Loads a model by project name (configs/models/NAME.json) or by path to a config.json.
// Throws InputError for an unknown name (listing the known ones) or a bad file.
ModelSpec load_model_spec(const std::string& name_or_path);

}  // namespace oom
