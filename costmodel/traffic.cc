#include "costmodel/traffic.h"

#include "costmodel/flops.h"

namespace oom {
namespace {

// One RMSNorm over `width` elements per token: read x, write x̂.
std::int64_t norm(std::int64_t width) { return 2 * width; }

}  // namespace

Bytes mixing_hbm_bytes(const ModelSpec& m, int layer, std::int64_t tokens) {
  const std::int64_t h = m.hidden;
  std::int64_t per_token = norm(h) + 3 * h;  // input norm, residual add
  const LayerKind kind = m.layer_kinds.at(static_cast<std::size_t>(layer));
  if (kind == LayerKind::kLinearAttention) {
    const std::int64_t dk = m.gdn.key_dim(), dv = m.gdn.value_dim();
    per_token += 2 * (2 * dk + dv) + 2 * 2 * dk + 3 * dv;
  } else {
    const AttentionSpec& a = m.attention(kind);
    const std::int64_t q = std::int64_t{a.heads} * a.head_dim, kv = std::int64_t{a.kv_heads} * a.head_dim;
    if (a.latent()) {
      // The latents' RMSNorms; RoPE of the rotated query part and of the shared rotated key; the
      // rotated key broadcast beside each head's unrotated key (read both, write the K heads).
      const std::int64_t rope_q = std::int64_t{a.heads} * a.rope_head_dim;
      per_token += norm(a.q_lora_rank) + norm(a.kv_lora_rank) + 2 * (rope_q + a.rope_head_dim) + 2 * kv;
      return per_token * tokens * kBf16Bytes;
    }
    per_token += 2 * (q + kv);                                      // RoPE
    if (a.qk_norm) per_token += norm(q) + norm(kv);                 // q/k RMSNorm
    if (m.gemma4()) per_token += norm(kv) + norm(h);                // v RMSNorm, post-attention norm
    if (a.output_gate) per_token += 3 * q;
  }
  return per_token * tokens * kBf16Bytes;
}

Bytes gdn_core_hbm_bytes(const GdnSpec& g, std::int64_t seqs, std::int64_t seq_tokens, bool backward) {
  const std::int64_t C = kGdnKernelChunk, dk = g.key_head_dim, dv = g.value_head_dim;
  const std::int64_t chunks = seqs * ((seq_tokens + C - 1) / C);
  const std::int64_t vectors = backward ? 18 * dk + 15 * dv : 7 * dk + 6 * dv;  // BF16 q, k, v, w, u, … reads and writes
  const std::int64_t a_matrix = backward ? (C * kBf16Bytes + C * kFp32Bytes) : (2 * C * kFp32Bytes + 2 * C * kBf16Bytes);
  const std::int64_t states = (backward ? 4 : 2) * dk * dv * kBf16Bytes;  // h (and dh) per chunk, written and read
  return g.value_heads * (seqs * seq_tokens * (vectors * kBf16Bytes + a_matrix) + chunks * states);
}

Bytes mixing_core_hbm_bytes(const ModelSpec& m, int layer, std::int64_t seqs, std::int64_t seq_tokens, bool backward) {
  if (m.layer_kinds.at(static_cast<std::size_t>(layer)) != LayerKind::kLinearAttention) return 0;
  return gdn_core_hbm_bytes(m.gdn, seqs, seq_tokens, backward);
}

MoeTraffic moe_hbm_bytes(const ModelSpec& m, int layer, std::int64_t tokens) {
  const MoeSpec& moe = m.layer_moe(layer);
  const std::int64_t h = m.hidden, k = moe.top_k;
  // Gemma 4 normalizes the experts' and the dense MLP's inputs apart and the router's input once
  // more, then scales it (read two, write one).
  const std::int64_t input_norms = m.gemma4() ? 3 * norm(h) + 3 * h : norm(h);
  // Gemma 4 normalizes the dense and the routed outputs, adds them, normalizes the sum and scales
  // the layer's output (layer_scalar).
  const std::int64_t output_norms = m.gemma4() ? 3 * norm(h) + 3 * h + 2 * h : 0;
  MoeTraffic t;
  t.pre = tokens * ((input_norms + 2 * k * h + 3 * std::int64_t{moe.shared_expert_intermediate} +
                     3 * std::int64_t{moe.dense_intermediate}) * kBf16Bytes +
                    2 * std::int64_t{moe.experts} * kFp32Bytes);
  t.experts = tokens * 3 * k * std::int64_t{moe.expert_intermediate} * kBf16Bytes;
  t.combine = tokens * (k * h + h + 3 * h + output_norms) * kBf16Bytes;
  return t;
}

Bytes loss_forward_hbm_bytes(const ModelSpec& m, std::int64_t tokens) {
  // Logits written, read by the log-sum-exp; a softcap (divide, tanh, multiply) reads and writes
  // them three times more.
  const std::int64_t passes = 2 + (m.final_logit_softcap > 0 ? 3 * 2 : 0);
  return tokens * std::int64_t{m.vocab} * passes * kFp32Bytes;
}

Bytes loss_backward_hbm_bytes(const ModelSpec& m, std::int64_t tokens) {
  // The softcap's backward: tanh's derivative reads the gradient and tanh and writes; each scaling
  // reads and writes.
  const Bytes softcap = m.final_logit_softcap > 0 ? (3 + 2 + 2) * kFp32Bytes : 0;
  return tokens * std::int64_t{m.vocab} * (kFp32Bytes + kBf16Bytes + softcap);
}

}  // namespace oom
