// The decoder layer taken apart along the partitions of a Plan (planner/plan/plan.h "split"), for the
// plan-driven runtime (backend/train/plan_runtime.h). Built from the functions of backend/model/model.h, so the
// arithmetic is the model's; only where the work is cut differs:
//   - attention: projections, the softmax core per query-head group over complete sequences
//     (each group sees the shared K/V of its GQA group), the output projection; the core's backward
//     from kept O/LSE without recomputing the forward (attention_core_backward);
//   - Gated DeltaNet: projections, the recurrence over sequence chunks with the FP32 state handed
//     from chunk to chunk (and the causal-conv left context read from the previous chunk's
//     pre-conv channels), the gated norm and output projection;
//   - MoE: per token chunk, router + shared expert + dense MLP, and the routed experts (their
//     inputs and the combination from model.h: ffn_inputs, route_layer, ffn_output).
// Shapes: x [B, S, h]; q [B, H, S, d], k, v [B, Hkv, S, d]; GDN pre-conv channels [B, conv, S].
// Stateless; thread-compatible.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include "backend/model/model.h"

namespace oom::backend::plan_ops {

// --- attention ---
struct AttentionInputs {
  at::Tensor q, k, v;  // [B, H, S, d], [B, Hkv, S, d], [B, Hkv, S, d] after norms and rotary embedding
  at::Tensor gate;     // [B, S, H, d] output gate, undefined without one
};
// Latent attention (MLA) gives K and V per query head (Hkv = H, from latent_qkv: V's width is
// v_head_dim, Q and K's qk_nope + qk_rope), so every query-head group has its own K/V head.
// `positions`: the tokens' places in their sequence where not 0..S-1 (model.h apply_rope).
AttentionInputs attention_inputs(const at::Tensor& xn, const BlockWeights& w, const ModelSpec& spec, LayerKind kind,
                                 const at::Tensor& positions = {});
// Query heads per group → the groups (costmodel/memory.h attention_head_groups: g query heads of
// one KV group each, numbered KV group by KV group; group_heads 0 = one group). query_group gives
// group `index`'s queries [B, g, S, d] (heads index·g …) of q [B, H, S, d] (or of any tensor with
// heads on dim 1: O, LSE, dO), kv_group its K or V head [B, 1, S, d] of k [B, Hkv, S, d]; with one
// group both return their input.
int attention_groups(const AttentionSpec& a, int group_heads);
at::Tensor query_group(const at::Tensor& q, int groups, int index);
at::Tensor kv_group(const at::Tensor& k, int groups, int index);
// Puts group outputs [B, g, S, …] back in head order [B, H, S, …].
at::Tensor merge_groups(const std::vector<at::Tensor>& parts);
// o_proj(gate ⊙ O) for the core output O [B, H, S, d] (FP32) in x's dtype; → [B, S, h].
at::Tensor attention_output(const at::Tensor& out, const at::Tensor& gate, const BlockWeights& w, at::ScalarType dtype);

// Gradients of the causal (windowed) softmax attention core from its kept output O and log-sum-exp
// (the flash-attention backward: P = exp(q·kᵀ·scale − lse), D = Σ dO ⊙ O, dS = P ⊙ (dP − D)), in
// FP32, without recomputing the forward. q [B, H, S, d], k, v [B, Hkv, S, d]; returns dq, dk, dv
// with the shapes and dtypes of q, k, v (dk, dv summed over the query heads sharing a KV head).
// query0: the queries' first place in the sequence, k and v from its start (model.h attention_core).
struct AttentionGrads {
  at::Tensor dq, dk, dv;
};
AttentionGrads attention_core_backward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                       const at::Tensor& out, const at::Tensor& lse, const at::Tensor& dout,
                                       std::int64_t window, std::int64_t query_block, double scale = 0.0,
                                       std::int64_t query0 = 0);

// --- Gated DeltaNet ---
struct GdnInputs {
  at::Tensor qkv;   // [B, conv_dim, S] FP32 pre-conv q/k/v channels
  at::Tensor z;     // [B, S, Hv, dv] output gate
  at::Tensor beta;  // [B, Hv, S] FP32
  at::Tensor g;     // [B, Hv, S] FP32 log decays
};
GdnInputs gdn_inputs(const at::Tensor& xn, const BlockWeights& w, const ModelSpec& spec);
// The recurrence over tokens [s0, s0 + C) of every sequence, starting from `state` [B, Hv, dk, dv]
// (replaced by the end state): causal conv with the left context read from `in.qkv`, SiLU, L2 norms,
// the WY-form chunks of `kernel_chunk` tokens. Returns [B, Hv, C, dv] FP32. A defined
// `left_context` [B, conv_dim, K − 1] is the conv's left context instead (s0 = 0: the channels
// before `in`'s tokens live elsewhere, as a context-parallel piece's on the rank before it).
at::Tensor gdn_core(const GdnInputs& in, std::int64_t s0, std::int64_t C, const BlockWeights& w, const ModelSpec& spec,
                    std::int64_t kernel_chunk, at::Tensor& state, const at::Tensor& left_context = {});
// Gated RMSNorm and output projection of the recurrence outputs o [B, Hv, S, dv] → [B, S, h].
at::Tensor gdn_output(const at::Tensor& o, const at::Tensor& z, const BlockWeights& w, const ModelSpec& spec,
                      at::ScalarType dtype);

// --- MoE (x2d [T, h], one token chunk's input of the shared expert and dense MLP: FfnInputs::dense;
// routing, routed experts and the combination: model.h) ---
// Shared expert (gated where the layer has shared.expert_gate) and dense MLP terms (DeepSeek's
// dense first layers: the MLP alone); undefined where the layer has none.
struct DenseTerms {
  at::Tensor shared, dense;
};
DenseTerms dense_terms(const at::Tensor& x2d, const BlockWeights& w, const ModelSpec& spec);

// --- the experts' rows without autograd (the EP owner's expert kernel) ---
// Rows are in the experts' order (each expert's rows one block); each expert's block is computed
// into views of buffers of all the rows.
// An expert's (gate, up, down) weights, or their gradients.
using ExpertWeights = std::array<at::Tensor, 3>;
// x·gateᵀ, x·upᵀ and act(x·gateᵀ) ⊙ x·upᵀ, [n, I] each: the activations the backward reads, and
// (in the backward) the gradients of the same three.
struct ExpertActivations {
  at::Tensor g, u, gated;
};
// Three [rows, I] buffers; rows [start, start + n) of each.
ExpertActivations expert_activations(std::int64_t rows, std::int64_t intermediate, const at::TensorOptions& options);
ExpertActivations expert_rows(const ExpertActivations& a, std::int64_t start, std::int64_t n);
// gated_mlp of an expert's rows x [n, h] into y [n, h], its activations into `a`.
void expert_forward(const at::Tensor& x, const ExpertWeights& w, const std::string& activation, ExpertActivations a, at::Tensor y);
// Its backward for the output gradient dy [n, h]: dL/dx into dx [n, h], the weights' gradients
// added into dw, `work` (three [n, I]) holding the activations' gradients. gated_mlp's operators
// as autograd runs them (linear's: dx = dy·W, dW = dyᵀ·x), except that the gate and up
// projections' input gradients are summed in the second GEMM (one rounding, as a fused kernel).
void expert_backward(const at::Tensor& dy, const at::Tensor& x, const ExpertActivations& a, const ExpertWeights& w,
                     const ExpertWeights& dw, const std::string& activation, ExpertActivations work, at::Tensor dx);

// --- expert parallelism: one dispatch round ---
// A chunk's (token, slot) pairs sorted by expert (stable): each pair's token and routing weight,
// and the pairs per expert (on the host).
struct SortedSlots {
  at::Tensor tokens, weights;
  std::vector<std::int64_t> counts;
};
SortedSlots sort_slots_by_expert(const Routing& r, const MoeSpec& moe);
// From every rank's pairs per expert (all_counts [P, E], row q: rank q's), with experts owned in
// blocks of experts_local: the rows this rank sends to and receives from each rank, and for each
// owned expert its rows among the received ones (they arrive by source rank, then by expert).
struct DispatchSplits {
  std::vector<std::int64_t> send, recv;
  std::vector<std::vector<std::int64_t>> owned_rows;
  // PipelinedLLEP (balanced_dispatch_splits): the rows of each fetched expert computed here, and
  // the order of this rank's expert-sorted rows in its send buffer (empty: the expert order).
  std::map<int, std::vector<std::int64_t>> fetched_rows;
  std::vector<std::int64_t> send_order;
};
DispatchSplits dispatch_splits(const at::Tensor& all_counts, int rank, int experts_local);
// PipelinedLLEP's dispatch round: `copies` are the (expert, helper) pairs of this layer (the
// lowering's placement; an expert's helpers in the order listed). Every expert's rows go to its owner, except
// that an owner above the round's mean load (rounded up) hands rows of its fetched experts to
// their helpers below it, hottest expert first and the least-loaded helper first, until it is at
// the mean or no helper has room. Of expert e's rows, taken in source-rank order, the helpers take
// their quotas first (in the order listed) and the owner the rest. A source's send buffer runs by
// destination rank, then expert; send_order maps it to the expert-sorted rows. Without copies it
// is dispatch_splits(). Every rank computes the same splits from the same counts.
DispatchSplits balanced_dispatch_splits(const at::Tensor& all_counts, int rank, int experts_local,
                                        const std::vector<std::pair<int, int>>& copies);

// --- Ring-DTP (FLAT): the vocabulary projection against one shard of the head at a time ---
// A block of normalized hidden states xn [n, h] meets the head's rows [v0, v0 + V/P) (shard
// [V/P, h]) on each rank of the ring; its cross-entropy state travels with it.
struct RingLse {
  at::Tensor max, sum, target;  // [n] FP32: running max of the logits, Σ exp(logit − max), the target's logit
};
RingLse ring_lse_start(std::int64_t n, const at::TensorOptions& options);
// Folds the block's logits against `shard` into its state, `chunk` tokens at a time (softcapped
// where the model caps them); targets [n] int64 in the whole vocabulary.
void ring_fold(RingLse& s, const at::Tensor& xn, const at::Tensor& shard, std::int64_t v0, const at::Tensor& targets,
               double softcap, std::int64_t chunk);
// log Σ exp over the whole vocabulary, once every shard was folded in.
at::Tensor ring_lse(const RingLse& s);
// The block's gradient against `shard` for the loss scale·Σ(lse − target logit): adds d·shard into
// dxn [n, h] FP32 and dᵀ·xn into dshard [V/P, h] FP32, `chunk` tokens at a time.
void ring_backward(const at::Tensor& xn, const at::Tensor& shard, std::int64_t v0, const at::Tensor& targets,
                   const at::Tensor& lse, double scale, double softcap, std::int64_t chunk, at::Tensor& dxn,
                   at::Tensor& dshard);

}  // namespace oom::backend::plan_ops
