// ModelSpec: the dimensions of a Mixture-of-Experts decoder, read from a Hugging Face config.
//
// Covers the layer kinds of the models we train: full causal attention (GQA, optional output
// gate), sliding-window causal attention, and Gated DeltaNet linear attention ("linear_attention"),
// each followed by a MoE block of routed SwiGLU experts with an optional shared expert and an
// optional dense MLP beside the experts (Gemma 4). Gemma 4's global layers have their own KV head
// count and head dim and may reuse K as V. Plain value type; the loaders validate every field.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace oom {

enum class LayerKind { kFullAttention, kSlidingAttention, kLinearAttention };

// "full_attention", "sliding_attention", "linear_attention" (the Hugging Face layer_types names).
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
  GdnSpec gdn;                         // used by kLinearAttention layers
  MoeSpec moe;
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
// types other than default/proportional.
ModelSpec model_spec_from_hf_config(const nlohmann::json& config, const std::string& file,
                                    const std::string& name);

// Writes the spec back as a Hugging Face style config (round-trips through the reader).
nlohmann::json model_spec_to_hf_config(const ModelSpec& spec);

// Loads a model by project name (configs/models/NAME.json) or by path to a config.json.
// Throws InputError for an unknown name (listing the known ones) or a bad file.
ModelSpec load_model_spec(const std::string& name_or_path);

}  // namespace oom
