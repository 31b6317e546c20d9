#include "costmodel/memory.h"

#include <algorithm>
#include <cmath>

namespace oom {

Bytes canonical_state_bytes(ParamCount p) { return kCanonicalBytesPerParam * p; }
Bytes working_weight_bytes(ParamCount p) { return kWorkingBytesPerParam * p; }
Bytes gradient_bytes(ParamCount p) { return kGradientBytesPerParam * p; }

Bytes boundary_bytes(std::int64_t L, std::int64_t B, std::int64_t S, std::int64_t h) {
  return kBf16Bytes * L * B * S * h;  // L × [B, S, h] BF16
}

Bytes attention_result_bytes(const AttentionSpec& a, std::int64_t B, std::int64_t S) {
  const std::int64_t tokens = B * S;
  return tokens * a.heads * a.value_dim() * kBf16Bytes  // O   [B·S, heads·d_v] BF16
         + tokens * a.heads * kFp32Bytes;            // LSE [B·S, heads]   FP32
}

Bytes resident_shard_state_bytes(ParamCount shard_params, ParamCount slice_params, int replicas) {
  if (replicas <= 1) return canonical_state_bytes(shard_params);
  return canonical_state_bytes(slice_params) + working_weight_bytes(shard_params);
}

Bytes ring_kv_bytes(const AttentionSpec& a, std::int64_t tokens) {
  const std::int64_t width = a.latent() ? std::int64_t{a.kv_lora_rank} + a.rope_head_dim
                                        : std::int64_t{a.kv_heads} * (a.head_dim + (a.k_eq_v ? 0 : a.value_dim()));
  return tokens * width * kBf16Bytes;
}

Bytes ring_attention_buffer_bytes(const AttentionSpec& a, std::int64_t tokens, bool backward) {
  Bytes bytes = 2 * ring_kv_bytes(a, tokens);
  if (a.latent()) bytes += tokens * a.heads * (std::int64_t{a.head_dim} + a.value_dim()) * kBf16Bytes;
  return backward ? 2 * bytes : bytes;
}

GdnCallShape gdn_call_shape(std::int64_t seqs, std::int64_t S, std::int64_t C) {
  GdnCallShape c;
  c.seq_tokens = S;
  c.call_seqs = seqs;
  if (C > 0 && C < S) {
    c.pieces = static_cast<int>((S + C - 1) / C);
    c.seq_tokens = C;
  } else if (C > 0) {
    c.call_seqs = std::min(seqs, std::max<std::int64_t>(1, C / S));
    if (c.call_seqs > 0) c.calls = (seqs + c.call_seqs - 1) / c.call_seqs;
  }
  return c;
}

Bytes gdn_chunk_state_bytes(const GdnSpec& g, std::int64_t B, std::int64_t S, std::int64_t C) {
  return (gdn_call_shape(B, S, C).pieces - 1) * gdn_state_bytes(g, B);  // (⌈S/C⌉−1) states
}

Bytes gdn_state_bytes(const GdnSpec& g, std::int64_t seqs) {
  return kFp32Bytes * seqs * g.value_heads * g.key_head_dim * g.value_head_dim;
}

Bytes ep_a2a_bytes(int k, std::int64_t N, std::int64_t h, Bytes b, int P) {
  // dispatch and return: 2 × [k·N, h] of which (P−1)/P leaves the GPU
  return 2 * k * N * h * b * (P - 1) / P;
}

int attention_head_groups(const AttentionSpec& a, int group_heads) {
  if (group_heads <= 0) return 1;
  const int per_kv = a.heads / std::max(1, a.kv_heads);
  return std::max(1, a.heads / std::max(1, std::min(group_heads, per_kv)));
}

Bytes attention_activation_bytes(const AttentionSpec& a, std::int64_t h, std::int64_t seqs, std::int64_t S,
                                 int head_group) {
  const std::int64_t T = seqs * S;
  const std::int64_t d = a.head_dim;
  const std::int64_t live_q = head_group > 0 ? std::min<std::int64_t>(head_group, a.heads) : a.heads;
  Bytes bytes = 0;
  bytes += T * h * kBf16Bytes;                                   // normed input [T, h]
  if (a.latent()) {
    // The latents before and after their norms: c_q [T, r_q] ×2, kv_a's output [T, r_kv + d_rope]
    // and the normed c_kv [T, r_kv]; per-head K [T, heads·d] and V [T, heads·d_v] from kv_b.
    bytes += T * (2 * std::int64_t{a.q_lora_rank} + 2 * a.kv_lora_rank + a.rope_head_dim) * kBf16Bytes;
    bytes += T * a.heads * (d + a.value_dim()) * kBf16Bytes;
    bytes += T * live_q * d * kBf16Bytes;                        // Q of the live head group [T, g·d]
    bytes += T * live_q * kFp32Bytes;                            // LSE of the live group [T, g] FP32
    bytes += T * a.heads * a.value_dim() * kBf16Bytes;           // O, all heads [T, heads·d_v]
    return bytes;
  }
  bytes += T * a.kv_heads * d * kBf16Bytes * (a.k_eq_v ? 1 : 2);  // K, V [T, kv·d] (shared by all groups)
  bytes += T * live_q * d * kBf16Bytes;                          // Q of the live head group [T, g·d]
  bytes += a.output_gate ? T * live_q * d * kBf16Bytes : 0;      // output gate [T, g·d]
  bytes += T * live_q * kFp32Bytes;                              // LSE of the live group [T, g] FP32
  bytes += T * a.heads * d * kBf16Bytes;                         // O, all heads [T, heads·d]
  return bytes;
}

AttentionBackwardBytes attention_backward_bytes(const AttentionSpec& a, std::int64_t h, std::int64_t seqs, std::int64_t S,
                                               int head_group) {
  const std::int64_t T = seqs * S;
  const std::int64_t d = a.head_dim, dv = a.value_dim(), H = a.heads;
  // Query heads per call, and the KV heads they attend to in that call.
  const std::int64_t g = H / attention_head_groups(a, head_group);
  const std::int64_t kv = a.latent() ? H : a.kv_heads;
  const std::int64_t kv_in_call = g < H ? std::max<std::int64_t>(1, g * kv / H) : kv;
  AttentionBackwardBytes b;
  if (g < H && !a.latent()) {
    // Query-head groups: the sublayer's backward group by group, only the sums held across groups.
    b.held += T * h * kBf16Bytes;                                // d(normalized input) [T, h]
    b.held += T * d * kBf16Bytes;                                // dK of the current KV head [T, d]
    b.held += a.k_eq_v ? 0 : T * dv * kBf16Bytes;                // dV of the current KV head [T, d_v]
    b.per_call += T * g * dv * kBf16Bytes;                       // the group's dO [T, g·d_v]
    b.per_call += a.output_gate ? T * g * d * kBf16Bytes : 0;    // the group's gate gradient [T, g·d]
    b.per_call += T * g * d * kBf16Bytes;                        // the group's dQ [T, g·d]
  } else {
    b.held += T * H * dv * kBf16Bytes;                           // dO [T, heads·d_v]
    b.held += a.output_gate ? T * H * d * kBf16Bytes : 0;        // the output gate's gradient [T, heads·d]
    b.held += T * H * d * kBf16Bytes;                            // dQ [T, heads·d]
    b.held += T * kv * d * kBf16Bytes;                           // dK [T, kv·d]
    b.held += a.k_eq_v ? 0 : T * kv * dv * kBf16Bytes;           // dV [T, kv·d_v]
  }
  b.per_call += T * g * d * kFp32Bytes;                          // FP32 dQ accumulator [T, g·d]
  b.per_call += T * g * kFp32Bytes;                              // softmax_d [T, g] FP32
  if (g > kv_in_call) b.per_call += T * g * (d + dv) * kBf16Bytes;  // dK, dV expanded to the g query heads
  return b;
}

Bytes gdn_backward_bytes(const GdnSpec& g, std::int64_t seqs, std::int64_t S, std::int64_t C) {
  // One call: a C-token piece of every sequence, C/S whole sequences, or everything.
  const GdnCallShape call = gdn_call_shape(seqs, S, C);
  constexpr std::int64_t kChunk = 64;  // the kernels' chunk (BT)
  const std::int64_t T = call.call_tokens(), chunks = call.call_seqs * ((call.seq_tokens + kChunk - 1) / kChunk);
  const std::int64_t Hv = g.value_heads, dk = g.key_head_dim, dv = g.value_head_dim;
  Bytes bytes = 0;
  bytes += 5 * T * Hv * dk * kBf16Bytes;          // w, dq, dk, dw, the WY backward's dk
  bytes += 4 * T * Hv * dv * kBf16Bytes;          // u, v_new, dv (local, then state-corrected), the WY backward's dv
  bytes += 2 * chunks * Hv * dk * dv * kBf16Bytes;  // h, dh
  bytes += T * Hv * (2 * kFp32Bytes + kBf16Bytes);  // the gate's gradients (two FP32), beta's
  // Saved by the call's forward: normalized q and k, their reciprocal norms, the cumulative gate, A.
  bytes += 2 * T * Hv * dk * kBf16Bytes + 3 * T * Hv * kFp32Bytes + T * Hv * kChunk * kBf16Bytes;
  return bytes;
}

Bytes mixing_backward_total_bytes(const ModelSpec& m, int layer, std::int64_t seqs, std::int64_t S) {
  const LayerKind kind = m.layer_kinds[static_cast<std::size_t>(layer)];
  if (kind == LayerKind::kLinearAttention) return gdn_backward_bytes(m.gdn, seqs, S, 0);
  const AttentionBackwardBytes b = attention_backward_bytes(m.attention(kind), m.hidden, seqs, S, 0);
  return b.held + b.per_call;
}

Bytes gdn_activation_bytes(const GdnSpec& g, std::int64_t h, std::int64_t seqs, std::int64_t S, std::int64_t C) {
  const std::int64_t T = gdn_call_shape(seqs, S, C).call_tokens();
  const std::int64_t kd = g.key_dim(), vd = g.value_dim();
  Bytes bytes = 0;
  bytes += T * h * kBf16Bytes;                         // normed input [T, h]
  bytes += T * (2 * kd + 2 * vd) * kBf16Bytes;          // q, k, v, z projections [T, 2kd + 2vd]
  bytes += T * (2 * kd + vd) * kBf16Bytes;              // conv outputs [T, 2kd + vd]
  bytes += T * 2 * g.value_heads * kFp32Bytes;          // beta, decay [T, 2·H_v] FP32
  bytes += T * vd * kBf16Bytes * 2;                     // core output and gated-norm output [T, vd] ×2
  bytes += gdn_chunk_state_bytes(g, seqs, S, C);        // Eq. 4 states
  return bytes;
}

Bytes mixing_activation_bytes(const ModelSpec& m, int layer, std::int64_t seqs, std::int64_t S, int head_group, std::int64_t gdn_chunk_tokens) {
  const LayerKind kind = m.layer_kinds[static_cast<std::size_t>(layer)];
  if (kind == LayerKind::kLinearAttention) return gdn_activation_bytes(m.gdn, m.hidden, seqs, S, gdn_chunk_tokens);
  return attention_activation_bytes(m.attention(kind), m.hidden, seqs, S, head_group);
}

Bytes moe_activation_bytes(const ModelSpec& m, int layer, std::int64_t T) {
  const MoeSpec& moe = m.layer_moe(layer);
  const std::int64_t h = m.hidden, k = moe.top_k;
  Bytes bytes = 0;
  bytes += T * h * kBf16Bytes;                         // normed input [T, h]
  bytes += T * moe.experts * kFp32Bytes;               // router logits [T, E] FP32
  bytes += T * k * (kFp32Bytes + 8);                   // top-k weights FP32 + indices int64 [T, k]
  bytes += moe_assignment_bytes(m, layer, T * k);      // dispatched copies, expert intermediates
  bytes += T * 3 * moe.shared_expert_intermediate * kBf16Bytes;  // shared expert [T, I_s] ×3
  bytes += T * 3 * moe.dense_intermediate * kBf16Bytes;          // dense MLP [T, I_d] ×3
  return bytes;
}

Bytes moe_input_grad_bytes(const ModelSpec& m, std::int64_t T) { return T * m.hidden * kBf16Bytes; }

Bytes expert_grad_workspace_bytes(const ModelSpec& m, int layer, std::int64_t T, int ranks, double largest_share) {
  const MoeSpec& moe = m.layer_moe(layer);
  const auto rows = static_cast<std::int64_t>(std::ceil(static_cast<double>(T * moe.top_k * ranks) * largest_share));
  return rows * 3 * std::int64_t{moe.expert_intermediate} * kBf16Bytes;  // d gate, d up, d activation [rows, I] ×3
}

Bytes moe_assignment_bytes(const ModelSpec& m, int layer, std::int64_t A) {
  const std::int64_t h = m.hidden, I = m.layer_moe(layer).expert_intermediate;
  return A * h * kBf16Bytes       // dispatched tokens [A, h]
         + A * 3 * I * kBf16Bytes  // gate, up, activation [A, I] ×3
         + A * h * kBf16Bytes;     // expert outputs [A, h]
}

Bytes moe_activation_bytes_at_load(const ModelSpec& m, int layer, std::int64_t T, double load) {
  const Bytes assigned = moe_assignment_bytes(m, layer, T * m.layer_moe(layer).top_k);
  return moe_activation_bytes(m, layer, T) + static_cast<Bytes>((load - 1.0) * static_cast<double>(assigned));
}

Bytes a2a_buffer_bytes_at_load(const ModelSpec& m, int layer, std::int64_t c, double load) {
  const Bytes each = a2a_buffer_bytes(m, layer, c) / 2;
  return each + static_cast<Bytes>(static_cast<double>(each) * load);
}

Bytes a2a_buffer_bytes(const ModelSpec& m, int layer, std::int64_t c) {
  return 2 * std::int64_t{m.layer_moe(layer).top_k} * c * m.hidden * kBf16Bytes;  // send + receive [k·c, h]
}

Bytes logits_workspace_bytes(const ModelSpec& m, std::int64_t T) {
  return T * m.vocab * (kBf16Bytes + kFp32Bytes);  // logits [T, V] BF16 + softmax grad [T, V] FP32
}

Bytes head_accumulator_bytes(std::int64_t params) { return params * kFp32Bytes; }

Bytes sharded_logits_workspace_bytes(const ModelSpec& m, std::int64_t T, int shards) {
  return T * (m.vocab / std::max(1, shards)) * (kBf16Bytes + kFp32Bytes);
}

RingDtpHops ring_dtp_hops(const ModelSpec& m, std::int64_t tokens, int ranks) {
  const std::int64_t rows = m.vocab / std::max(1, ranks), h = m.hidden;
  RingDtpHops r;
  r.weights_move = rows < tokens;  // (V/P)·h against N·h, both BF16
  if (r.weights_move) {
    r.forward = rows * h * kBf16Bytes;
    r.backward = rows * h * (kBf16Bytes + kFp32Bytes);
  } else {
    r.forward = tokens * (h * kBf16Bytes + 8 + 3 * kFp32Bytes);
    r.backward = tokens * (h * kBf16Bytes + 8 + kFp32Bytes + h * kFp32Bytes);
  }
  return r;
}

Bytes pinned_host_block_bytes(Bytes requested) {
  if (requested <= 0) return 0;
  Bytes block = 1;
  while (block < requested) block *= 2;
  return block;
}

GpuPeakTerms eq2_gpu_peak(Bytes fixed, Bytes state, Bytes keep, Bytes work, double headroom_fraction) {
  GpuPeakTerms t{fixed, state, keep, work, 0};
  t.headroom = static_cast<Bytes>(headroom_fraction * static_cast<double>(fixed + state + keep + work));
  return t;
}

}  // namespace oom
