#include "costmodel/traffic.h"

namespace oom {

Bytes mixing_hbm_bytes(const ModelSpec& m, int layer, std::int64_t tokens) {
  const std::int64_t h = m.hidden;
  std::int64_t per_token = 2 * h + 3 * h;  // input norm, residual add
  const LayerKind kind = m.layer_kinds.at(static_cast<std::size_t>(layer));
  if (kind == LayerKind::kLinearAttention) {
    const std::int64_t dk = m.gdn.key_dim(), dv = m.gdn.value_dim();
    per_token += 2 * (2 * dk + dv) + 2 * 2 * dk + 3 * dv;
  } else {
    const AttentionSpec& a = m.attention(kind);
    const std::int64_t qk = std::int64_t{a.heads + a.kv_heads} * a.head_dim;
    per_token += 2 * qk;                           // RoPE
    if (a.qk_norm) per_token += 2 * qk;            // q/k RMSNorm
    if (a.output_gate) per_token += 3 * std::int64_t{a.heads} * a.head_dim;
  }
  return per_token * tokens * kBf16Bytes;
}

MoeTraffic moe_hbm_bytes(const ModelSpec& m, std::int64_t tokens) {
  const std::int64_t h = m.hidden, k = m.moe.top_k;
  MoeTraffic t;
  t.pre = tokens * ((2 * h + 2 * k * h + 3 * std::int64_t{m.moe.shared_expert_intermediate} +
                     3 * std::int64_t{m.moe.dense_intermediate}) * kBf16Bytes +
                    2 * std::int64_t{m.moe.experts} * kFp32Bytes);
  t.experts = tokens * 3 * k * std::int64_t{m.moe.expert_intermediate} * kBf16Bytes;
  t.combine = tokens * (k * h + h + 3 * h) * kBf16Bytes;
  return t;
}

Bytes loss_forward_hbm_bytes(const ModelSpec& m, std::int64_t tokens) {
  return tokens * std::int64_t{m.vocab} * 2 * kFp32Bytes;
}

Bytes loss_backward_hbm_bytes(const ModelSpec& m, std::int64_t tokens) {
  return tokens * std::int64_t{m.vocab} * (kFp32Bytes + kBf16Bytes);
}

}  // namespace oom
