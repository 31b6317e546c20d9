// Parameter counts of a ModelSpec, by component, per layer, total and active per token.
//
// Counts follow the Hugging Face implementations of the backbones (no biases): attention
// Q [h × heads·d (×2 with output gate)], K [h × kv·d], V [h × kv·d] (none when V reuses K),
// O [heads·d × h], Q/K norms [d] each; Gated DeltaNet in_proj_qkvz [h × (2·key_dim + 2·value_dim)],
// in_proj_ba [h × 2·value_heads], depthwise conv [(2·key_dim + value_dim) × kernel], dt_bias and
// A_log [value_heads], gated norm [value_head_dim], out_proj [value_dim × h]; router [h × E];
// each SwiGLU expert 3·h·I; shared expert 3·h·I_s + its gate [h × 1] (none in DeepSeek-V3);
// dense MLP 3·h·I_d (beside the experts, or alone in DeepSeek's first dense layers); latent
// attention (MLA) q_a [h × r_q], its norm [r_q], q_b [r_q × heads·d_qk] (or q_proj [h × heads·d_qk]
// without r_q), kv_a [h × (r_kv + d_rope)], its norm [r_kv], kv_b [r_kv × heads·(d_nope + d_v)],
// O [heads·d_v × h];
// two RMSNorms [h] per layer, a final norm [h], embeddings [vocab × h] and an LM head unless tied.
// "Active" counts what one token touches: everything but the routed experts, plus top_k of them.
#pragma once

#include <cstdint>
#include <vector>

#include "costmodel/model_spec.h"

namespace oom {

using ParamCount = std::int64_t;

// Parameters of one decoder layer by component.
struct LayerParams {
  ParamCount mixing = 0;          // attention or GDN projections, convs and per-head norms
  ParamCount norms = 0;           // the layer's RMSNorms
  ParamCount router = 0;          // h × E
  ParamCount routed_experts = 0;  // the whole bank: E · 3·h·I
  ParamCount shared_expert = 0;   // 3·h·I_s + gate
  ParamCount dense_mlp = 0;       // 3·h·I_d

  // Everything streamed on the common parameter stream (all but the routed expert bank).
  ParamCount common() const { return mixing + norms + router + shared_expert + dense_mlp; }
  ParamCount total() const { return common() + routed_experts; }
  bool operator==(const LayerParams&) const = default;
};

struct ModelParams {
  ParamCount embedding = 0;  // vocab × h
  ParamCount lm_head = 0;    // vocab × h, 0 when tied
  ParamCount final_norm = 0;
  std::vector<LayerParams> layers;

  ParamCount total() const;
  ParamCount active() const;  // per token
  // Sums over layers by component.
  LayerParams layer_sum() const;
  ParamCount active_per_token_experts = 0;  // top_k · 3·h·I summed over the MoE layers
};

ParamCount swiglu_params(std::int64_t hidden, std::int64_t intermediate);  // 3·h·I
ParamCount attention_params(const AttentionSpec& a, std::int64_t hidden);
ParamCount gdn_params(const GdnSpec& g, std::int64_t hidden);
ParamCount expert_params(const ModelSpec& m);  // one routed expert
LayerParams layer_params(const ModelSpec& m, int layer);
ModelParams model_params(const ModelSpec& m);

}  // namespace oom
