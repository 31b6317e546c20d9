#include "costmodel/params.h"

#include "costmodel/input_error.h"

namespace oom {

ParamCount swiglu_params(std::int64_t hidden, std::int64_t intermediate) {
  return 3 * hidden * intermediate;  // gate [h × I] + up [h × I] + down [I × h]
}

namespace {

ParamCount latent_attention_params(const AttentionSpec& a, std::int64_t h) {
  const std::int64_t q_width = std::int64_t{a.heads} * a.head_dim;
  const std::int64_t nope = a.head_dim - a.rope_head_dim;
  ParamCount p = 0;
  if (a.q_lora_rank > 0) {
    p += h * a.q_lora_rank + a.q_lora_rank;  // q_a_proj [h × r_q], q_a_layernorm [r_q]
    p += std::int64_t{a.q_lora_rank} * q_width;  // q_b_proj [r_q × heads·d_qk]
  } else {
    p += h * q_width;  // q_proj [h × heads·d_qk]
  }
  p += h * (a.kv_lora_rank + a.rope_head_dim) + a.kv_lora_rank;               // kv_a_proj_with_mqa, kv_a_layernorm
  p += std::int64_t{a.kv_lora_rank} * a.heads * (nope + a.value_dim());      // kv_b_proj
  p += std::int64_t{a.heads} * a.value_dim() * h;                            // o_proj [heads·d_v × h]
  return p;
}

}  // namespace

ParamCount attention_params(const AttentionSpec& a, std::int64_t h) {
  if (a.latent()) return latent_attention_params(a, h);
  const std::int64_t q_width = std::int64_t{a.heads} * a.head_dim;
  const std::int64_t kv_width = std::int64_t{a.kv_heads} * a.head_dim;
  ParamCount p = 0;
  p += h * q_width * (a.output_gate ? 2 : 1);  // q_proj [h × heads·d (·2 with gate)]
  p += h * kv_width;                           // k_proj [h × kv·d]
  p += a.k_eq_v ? 0 : h * kv_width;            // v_proj [h × kv·d]
  p += q_width * h;                            // o_proj [heads·d × h]
  p += a.qk_norm ? 2 * a.head_dim : 0;         // q_norm, k_norm [d]
  return p;
}

ParamCount gdn_params(const GdnSpec& g, std::int64_t h) {
  const std::int64_t kd = g.key_dim(), vd = g.value_dim();
  ParamCount p = 0;
  p += h * (2 * kd + 2 * vd);                // in_proj_qkvz [h × (q k v z)]
  p += h * 2 * g.value_heads;                // in_proj_ba [h × (beta, alpha) per value head]
  p += (2 * kd + vd) * g.conv_kernel;        // depthwise causal conv over q, k, v
  p += 2 * g.value_heads;                    // dt_bias, A_log [value_heads]
  p += g.value_head_dim;                     // gated RMSNorm [value_head_dim]
  p += vd * h;                               // out_proj [value_dim × h]
  return p;
}

ParamCount expert_params(const ModelSpec& m) { return swiglu_params(m.hidden, m.moe.expert_intermediate); }

LayerParams layer_params(const ModelSpec& m, int layer) {
  OOM_ASSERT(layer >= 0 && layer < m.layers, "layer index out of range");
  const std::int64_t h = m.hidden;
  const LayerKind kind = m.layer_kinds[static_cast<std::size_t>(layer)];
  LayerParams p;
  p.mixing = kind == LayerKind::kLinearAttention ? gdn_params(m.gdn, h) : attention_params(m.attention(kind), h);
  p.norms = 2 * h;                                           // input + post-attention RMSNorm
  const MoeSpec& moe = m.layer_moe(layer);
  p.router = h * moe.experts;                                // [h × E]
  if (m.gemma4()) {
    // Input, post-attention, pre/post dense MLP, pre/post experts and post-FFN RMSNorms [h], and
    // the layer scalar [1]; the router's input scale [h] and per-expert scales [E].
    p.norms = 7 * h + 1;
    p.router = h * moe.experts + h + moe.experts;
  }
  p.routed_experts = std::int64_t{moe.experts} * swiglu_params(h, moe.expert_intermediate);
  if (moe.shared_expert_intermediate > 0) {
    p.shared_expert = swiglu_params(h, moe.shared_expert_intermediate) + (moe.shared_expert_gate ? h : 0);  // + gate [h × 1]
  }
  if (moe.dense_intermediate > 0) p.dense_mlp = swiglu_params(h, moe.dense_intermediate);
  return p;
}

ModelParams model_params(const ModelSpec& m) {
  ModelParams mp;
  mp.embedding = std::int64_t{m.vocab} * m.hidden;
  mp.lm_head = m.tied_embeddings ? 0 : std::int64_t{m.vocab} * m.hidden;
  mp.final_norm = m.hidden;
  for (int l = 0; l < m.layers; ++l) mp.layers.push_back(layer_params(m, l));
  mp.active_per_token_experts = std::int64_t{m.moe_layers()} * m.moe.top_k * expert_params(m);
  return mp;
}

LayerParams ModelParams::layer_sum() const {
  LayerParams s;
  for (const auto& l : layers) {
    s.mixing += l.mixing;
    s.norms += l.norms;
    s.router += l.router;
    s.routed_experts += l.routed_experts;
    s.shared_expert += l.shared_expert;
    s.dense_mlp += l.dense_mlp;
  }
  return s;
}

ParamCount ModelParams::total() const { return embedding + lm_head + final_norm + layer_sum().total(); }

ParamCount ModelParams::active() const {
  return embedding + lm_head + final_norm + layer_sum().common() + active_per_token_experts;
}

}  // namespace oom
