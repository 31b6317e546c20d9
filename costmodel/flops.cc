#include "costmodel/flops.h"

#include "costmodel/params.h"

namespace oom {

double causal_pairs(std::int64_t s, std::int64_t w) {
  const double S = static_cast<double>(s);
  if (w <= 0 || w >= s) return S * (S + 1.0) / 2.0;
  const double W = static_cast<double>(w);
  // The first w queries see 1..w keys; the remaining S − w see w each.
  return W * (W + 1.0) / 2.0 + (S - W) * W;
}

Flops attention_projection_flops(const AttentionSpec& a, std::int64_t h, std::int64_t tokens) {
  // Every parameter but the norms' is one multiply-accumulate per token (MLA's latents included).
  const std::int64_t norms = a.latent() ? a.q_lora_rank + a.kv_lora_rank : a.qk_norm ? 2 * a.head_dim : 0;
  const double proj_params = static_cast<double>(attention_params(a, h) - norms);
  return 2.0 * static_cast<double>(tokens) * proj_params;
}

Flops latent_expansion_flops(const AttentionSpec& a, std::int64_t tokens) {
  if (!a.latent()) return 0;
  return 2.0 * static_cast<double>(tokens) * a.kv_lora_rank * a.heads * (a.head_dim - a.rope_head_dim + a.value_dim());
}

Flops context_parallel_core_flops(const ModelSpec& m, int layer, std::int64_t seqs, std::int64_t seq_len, int C) {
  const Flops core = layer_flops(m, layer, seqs, seq_len).mixing_core.total();
  if (C <= 1) return core;
  const AttentionSpec& a = m.attention(m.layer_kinds[static_cast<std::size_t>(layer)]);
  return core / static_cast<double>(C) + latent_expansion_flops(a, (C - 1) * seqs * (seq_len / C));
}

Eq1Flops attention_core_flops(const AttentionSpec& a, std::int64_t batch, std::int64_t s) {
  const double per_pair = 2.0 * a.heads * (a.head_dim + a.value_dim());  // QKᵀ (2·d) + PV (2·d_v) per head
  const double B = static_cast<double>(batch), S = static_cast<double>(s);
  Eq1Flops f;
  if (a.window_tokens <= 0 || a.window_tokens >= s) {
    f.quadratic = B * per_pair * S * S / 2.0;  // b·B·S² with b = 2·heads·d
    f.linear = B * per_pair * S / 2.0;          // the diagonal's half
  } else {
    f.linear = B * per_pair * causal_pairs(s, a.window_tokens);
  }
  return f;
}

Flops gdn_projection_flops(const GdnSpec& g, std::int64_t h, std::int64_t tokens) {
  const double T = static_cast<double>(tokens);
  const double kd = static_cast<double>(g.key_dim()), vd = static_cast<double>(g.value_dim());
  const double hd = static_cast<double>(h);
  double f = 0;
  f += 2.0 * T * hd * (2 * kd + 2 * vd);           // in_proj_qkvz
  f += 2.0 * T * hd * 2 * g.value_heads;           // in_proj_ba
  f += 2.0 * T * (2 * kd + vd) * g.conv_kernel;    // depthwise conv
  f += 2.0 * T * vd * hd;                          // out_proj
  return f;
}

Flops gdn_state_correction_flops(const GdnSpec& g, std::int64_t tokens) {
  return 2.0 * static_cast<double>(tokens) * g.value_heads * g.key_head_dim * g.value_head_dim;
}

Flops gdn_core_flops(const GdnSpec& g, std::int64_t tokens) {
  const double dk = g.key_head_dim, dv = g.value_head_dim, C = static_cast<double>(kGdnKernelChunk);
  const double per_token_head = 6.0 * dk * dv + 2.0 * C * (2.0 * dk + 2.0 * dv);
  return static_cast<double>(tokens) * g.value_heads * per_token_head;
}

MoeFlops moe_flops(const ModelSpec& m, int layer, std::int64_t tokens) {
  const double T = static_cast<double>(tokens), h = m.hidden;
  const MoeSpec& moe = m.layer_moe(layer);
  MoeFlops f;
  f.router = 2.0 * T * h * moe.experts;
  f.routed_experts = 2.0 * T * moe.top_k * static_cast<double>(swiglu_params(m.hidden, moe.expert_intermediate));
  if (moe.shared_expert_intermediate > 0) {
    f.shared_expert = 2.0 * T * (static_cast<double>(swiglu_params(m.hidden, moe.shared_expert_intermediate)) +
                                 (moe.shared_expert_gate ? h : 0.0));
  }
  if (moe.dense_intermediate > 0) {
    f.dense_mlp = 2.0 * T * static_cast<double>(swiglu_params(m.hidden, moe.dense_intermediate));
  }
  return f;
}

Flops LayerFlops::backward() const {
  const double core_ratio = core_is_recurrent ? kGdnBackwardRatio : kAttentionBackwardRatio;
  return kMatmulBackwardRatio * (mixing_projection + moe.total()) + core_ratio * mixing_core.total();
}

LayerFlops layer_flops(const ModelSpec& m, int layer, std::int64_t batch, std::int64_t s) {
  const LayerKind kind = m.layer_kinds.at(static_cast<std::size_t>(layer));
  const std::int64_t tokens = batch * s;
  LayerFlops f;
  if (kind == LayerKind::kLinearAttention) {
    f.mixing_projection = gdn_projection_flops(m.gdn, m.hidden, tokens);
    f.mixing_output = 2.0 * static_cast<double>(tokens) * static_cast<double>(m.gdn.value_dim()) * static_cast<double>(m.hidden);
    f.mixing_core.linear = gdn_core_flops(m.gdn, tokens);
    f.core_is_recurrent = true;
  } else {
    const AttentionSpec& a = m.attention(kind);
    f.mixing_projection = attention_projection_flops(a, m.hidden, tokens);
    f.mixing_output = 2.0 * static_cast<double>(tokens) * a.heads * a.value_dim() * static_cast<double>(m.hidden);
    f.mixing_core = attention_core_flops(m.attention(kind), batch, s);
  }
  f.moe = moe_flops(m, layer, tokens);
  return f;
}

Flops lm_head_flops(const ModelSpec& m, std::int64_t tokens) {
  return 2.0 * static_cast<double>(tokens) * m.hidden * m.vocab;
}

Eq1Flops model_forward_flops(const ModelSpec& m, std::int64_t batch, std::int64_t s) {
  Eq1Flops total;
  for (int l = 0; l < m.layers; ++l) {
    const LayerFlops f = layer_flops(m, l, batch, s);
    total.linear += f.mixing_projection + f.mixing_core.linear + f.moe.total();
    total.quadratic += f.mixing_core.quadratic;
  }
  total.linear += lm_head_flops(m, batch * s);
  return total;
}

}  // namespace oom
