// HBM traffic of the memory-bound kernels around the matmuls of a decoder layer.
//
// A training step's GPU time is not only matmuls and attention: every RMSNorm, residual add, RoPE,
// activation, gate, token permutation and loss softmax reads and writes whole activation tensors
// and runs at the HBM's bandwidth, not at the tensor cores' rate. Their share grows as the
// matmuls per token shrink: a model of many small experts (top-8 of 256 with I = 512) moves about
// as many bytes per token through permutation and activation as it does arithmetic on them, while
// a model of a few large experts (Mixtral: top-2 of 8 with I = 14336) hides them. Counting these
// bytes is what lets one set of efficiencies price both kinds of model.
//
// Counts are forward bytes for `tokens` tokens of BF16 activations, each kernel counted as the
// tensors it reads plus the tensors it writes (no fusion across kernels; a kernel is one pass):
//   RMSNorm: read x, write x̂                                     2·h per token
//   residual add: read two, write one                            3·h
//   RoPE and q/k RMSNorm: read and write q and k                 2·(H + Hkv)·d each
//   Gemma 4's further norms (transformers' Gemma4TextDecoderLayer): v and post-attention norms,
//        the experts' and the dense MLP's own input norms, the router's input norm and scale, the
//        post-norms of the dense and routed outputs and of their sum (an add), the layer scalar
//                                                                2·Hkv·d + 2·h; 9·h in place of 2·h; 11·h
//   output gate: read the gate and O, write                      3·H·d
//   GDN: causal conv over q, k, v (read, write), L2 norm of q, k, gated output norm (read o and z,
//        write)                                                  2·(2·dk + dv) + 2·2·dk + 3·dv
//   router: FP32 logits written by the GEMM read by softmax/top-k, probabilities written
//                                                                2·E (FP32, so 4 B each)
//   token permutation: gather k copies of each token, scatter back with the routing weights
//                                                                2·k·h (dispatch) + k·h + h (combine)
//   SwiGLU of the routed experts: read gate and up, write        3·k·I (and 3·I_shared, 3·I_dense)
// The backward of a memory-bound kernel reads the output gradient and the saved inputs and writes
// the input gradients: kMemoryBackwardRatio × the forward bytes.
// Attention's core reads its operands inside one fused kernel: its efficiency covers that, so it is
// not counted here. GDN's chunked core is not one kernel but a chain of them that hand their
// intermediates through HBM: gdn_core_hbm_bytes(). Pure functions.
#pragma once

#include <cstdint>

#include "costmodel/model_spec.h"
#include "costmodel/units.h"

namespace oom {

inline constexpr Bytes kMemoryBackwardRatio = 2;

// Forward HBM bytes of the mixing sublayer of decoder `layer` (input norm, RoPE/q-k norms or the
// GDN's conv, norms and gates, output gate, residual add) for `tokens` tokens.
Bytes mixing_hbm_bytes(const ModelSpec& m, int layer, std::int64_t tokens);

// Forward HBM bytes of the MoE sublayer for `tokens` tokens on the GPU that routes them.
struct MoeTraffic {
  Bytes pre = 0;      // post-attention norm, router softmax/top-k, dispatch permutation, shared/dense activations
  Bytes experts = 0;  // SwiGLU activation of the routed experts' k·tokens rows
  Bytes combine = 0;  // weighted un-permutation and the residual add
  Bytes total() const { return pre + experts + combine; }
};
MoeTraffic moe_hbm_bytes(const ModelSpec& m, int layer, std::int64_t tokens);

// HBM bytes of the chunked Gated DeltaNet core (the chunk_gated_delta_rule kernels of
// flash-linear-attention, which transformers' Qwen3-Next/Qwen3.5 layers call, with q and k repeated
// to the value heads) over `seqs` sequences of `seq_tokens` tokens, forward or backward. Each
// kernel reads its inputs and writes its outputs, per token and value head (d_k, d_v the head dims,
// C = kGdnKernelChunk, BF16 tensors unless named):
//   forward:
//     scaled K·Kᵀ within each chunk: read k, write A (FP32, C wide)
//     triangular solve: read A, write A⁻¹ (C wide)
//     WY representation: read k, v, A⁻¹, write w, u
//     chunk states: read k, w, u, write the state h entering each chunk (d_k·d_v per C tokens)
//        and the corrected values v_new
//     output: read q, k, v_new, h, write o
//   backward (the forward saves q, k, v, the gate and A; w, u, h are recomputed):
//     WY recomputed: read k, v, A⁻¹, write w, u
//     chunk states recomputed: read k, w, u, write h, v_new
//     local dv: read q, k, do, write dv
//     state gradients: read q, k, w, do, dv, write dh (per chunk, as h) and the corrected dv
//     dq, dk, dw: read q, k, w, v_new, do, dv, h, dh, write dq, dk, dw
//     WY backward: read k, v, A (FP32), dw, dv, write dk, dv
// That is 14·d_k + 12·d_v + 12·C bytes plus h written and read (4·d_k·d_v/C) forward, and
// 36·d_k + 30·d_v + 6·C plus h and dh (8·d_k·d_v/C) backward. The gate, β and their gradients
// (a few scalars per token and head) are left out.
Bytes gdn_core_hbm_bytes(const GdnSpec& g, std::int64_t seqs, std::int64_t seq_tokens, bool backward);
// The same for the mixing core of decoder `layer`, whatever its kind: gdn_core_hbm_bytes() for a
// GDN layer, 0 for attention (one fused kernel).
Bytes mixing_core_hbm_bytes(const ModelSpec& m, int layer, std::int64_t seqs, std::int64_t seq_tokens, bool backward);

// HBM bytes of the LM head's cross-entropy for `tokens` tokens: FP32 logits written and read back
// by the log-sum-exp in the forward; read again and a BF16 gradient written in the backward. A
// final-logit softcap (Gemma 4: cap·tanh(z/cap)) adds three read-write passes forward and seven
// FP32 accesses per logit backward.
Bytes loss_forward_hbm_bytes(const ModelSpec& m, std::int64_t tokens);
Bytes loss_backward_hbm_bytes(const ModelSpec& m, std::int64_t tokens);

}  // namespace oom
