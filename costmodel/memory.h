// Memory sizes (bytes) of state, activations, boundaries and transfers (reference §1, §3–§5).
//
// Pure functions, one line per tensor with its shape in a comment. Activations are BF16 (2 B)
// unless noted; routing logits, softmax statistics and recurrent states are FP32 (4 B).
// "Activation bytes" of a sublayer are the tensors its forward saves for its backward, i.e. what
// the recompute of a checkpointed decoder holds while that decoder's backward runs.
#pragma once

#include <cstdint>

#include "costmodel/model_spec.h"
#include "costmodel/params.h"
#include "costmodel/units.h"

namespace oom {

// Canonical state: FP32 master + two FP32 Adam moments (reference §1).
inline constexpr Bytes kCanonicalBytesPerParam = 3 * kFp32Bytes;  // 12
inline constexpr Bytes kWorkingBytesPerParam = kBf16Bytes;         // BF16 weights
inline constexpr Bytes kGradientBytesPerParam = kBf16Bytes;        // BF16 gradients

Bytes canonical_state_bytes(ParamCount params);  // 12·P
// GPU-resident expert shards of `shard_params` on each GPU: their FP32 master and moments; with
// `replicas` > 1 (EP groups) each replica keeps the state of its 1/replicas slice (`slice_params`,
// ZeRO-1 over the replicas) and the whole shard's BF16 weights, which the replicas' all-gather of
// the updated slices refreshes.
Bytes resident_shard_state_bytes(ParamCount shard_params, ParamCount slice_params, int replicas);
Bytes working_weight_bytes(ParamCount params);   // 2·P
Bytes gradient_bytes(ParamCount params);         // 2·P

// Decoder boundaries (inputs of checkpointed decoders): 2·L·B·S·h bytes for L BF16 boundaries.
Bytes boundary_bytes(std::int64_t boundaries, std::int64_t batch, std::int64_t seq_len, std::int64_t hidden);

// Attention output O [B·S × heads·d_v] BF16 and its log-sum-exp [B·S × heads] FP32 for one layer.
Bytes attention_result_bytes(const AttentionSpec& a, std::int64_t batch, std::int64_t seq_len);

// How a GDN sublayer over `seqs` sequences of S tokens runs in pieces of C tokens (Plan
// split.gdn_chunk_tokens; 0 = unsplit): C < S cuts every sequence into ⌈S/C⌉ pieces of C tokens
// (the last may take fewer), one call each over every sequence, the FP32 state handed from piece to
// piece; C ≥ S is one piece of whole sequences, C/S of them a call. The lowering, the memory model
// and the backend all read a piece's calls from here.
struct GdnCallShape {
  int pieces = 1;                // pieces along the sequence
  std::int64_t seq_tokens = 0;   // tokens of each sequence one call takes (C, or S)
  std::int64_t call_seqs = 0;    // sequences one call takes
  std::int64_t calls = 1;        // calls per piece: ⌈seqs / call_seqs⌉
  std::int64_t call_tokens() const { return call_seqs * seq_tokens; }
};
GdnCallShape gdn_call_shape(std::int64_t seqs, std::int64_t seq_len, std::int64_t chunk_tokens);

// Eq. 4: GDN chunk-boundary states 4·B·(⌈S/C⌉−1)·H_v·d_k·d_v bytes for sequence chunk C.
// Zero when C is 0 (unpartitioned) or C ≥ S.
Bytes gdn_chunk_state_bytes(const GdnSpec& g, std::int64_t batch, std::int64_t seq_len, std::int64_t chunk_tokens);
// One FP32 recurrent state [H_v, d_k, d_v] per sequence, for `seqs` sequences.
Bytes gdn_state_bytes(const GdnSpec& g, std::int64_t seqs);

// Eq. 6: EP all-to-all volume per GPU for dispatch + return in one MoE pass:
// 2·k·N·h·b·(P−1)/P bytes for N tokens per GPU, b bytes per element, P GPUs.
Bytes ep_a2a_bytes(int top_k, std::int64_t tokens_per_gpu, std::int64_t hidden, Bytes bytes_per_element, int gpus);

// The groups an attention core runs in under Plan split.attention_head_group = `group_heads`
// (reference §4, Table 1: query-head groups of size g within each GQA group, each with that GQA
// group's shared K/V): 1 when group_heads ≤ 0 (unpartitioned), else heads / g with g the group
// size capped at the query heads per KV group — so g = heads per KV group runs each GQA group
// apart. Groups are numbered KV group by KV group: group i holds query heads [i·g, (i+1)·g) and
// K/V head i·g / (heads / kv_heads). Plan validation keeps g a divisor of the heads per KV group.
int attention_head_groups(const AttentionSpec& a, int group_heads);

// Context parallelism (ring attention): the BF16 K/V one GPU's piece of `tokens` tokens sends
// around its group per pass, i.e. what the attention core needs of other pieces: the compressed
// latent and the shared RoPE key under MLA (each receiver expands it), else the KV heads' K and V.
Bytes ring_kv_bytes(const AttentionSpec& a, std::int64_t tokens);
// The buffers ring attention holds on one GPU during the core over pieces of `tokens` tokens: the
// piece in flight and the one in use (ring_kv_bytes each), plus under MLA the expanded per-head K
// and V of the piece in use; in backward twice that (the pieces' gradients travel too).
Bytes ring_attention_buffer_bytes(const AttentionSpec& a, std::int64_t tokens, bool backward);

// Activations saved by an attention sublayer over `seqs` sequences of S tokens, with query heads
// processed `head_group` at a time within one KV group (0 = all heads at once).
Bytes attention_activation_bytes(const AttentionSpec& a, std::int64_t hidden, std::int64_t seqs,
                                 std::int64_t seq_len, int head_group);
// The gradient buffers of an attention sublayer's backward on one GPU, over `seqs` sequences of
// S tokens (a GPU's piece under context parallelism), query heads processed `head_group` at a
// time within one KV group (0 = all heads in one call).
// All heads in one call (head_group 0, or a group of every head):
//   held: from the output projection's backward to the Q/K/V projections' backward: the core
//     output's gradient dO [T, heads·d_v] and, with an output gate, the gate's [T, heads·d]; dQ
//     [T, heads·d]; dK and dV [T, kv·d] (one under k_eq_v; per head under MLA, before kv_b's
//     backward);
//   per_call: inside the core backward call of g query heads: FlashAttention-2's FP32 dQ
//     accumulator [T, g·d] and softmax_d [T, g] (mha_bwd allocates both, loop = true, in PyTorch's
//     vendored flash_api.cpp) and, when the call's g query heads share fewer KV heads (GQA), dK
//     and dV expanded to the g heads [T, g·d] BF16 each before their sum over each KV group.
//     Head dims past 256 (the memory-efficient kernel, which takes K and V already expanded to
//     the query heads) are given the same buffers: its FP32 dQ accumulation and K/V gradients at
//     the query heads.
// In query-head groups (Split, reference §4 Table 1: groups of g query heads within one GQA group,
// each group's causal sequence complete, backward rematerialized group by group in reverse; the
// group's columns of the output projection and the group's rows of the Q and gate projections are
// independent, so the whole sublayer's backward runs per group and only sums cross groups):
//   held: the normalized input's gradient [T, h], summed over the groups' Q/K/V projection
//     backward, and the current KV head's dK and dV [T, d] (one under k_eq_v), summed over the
//     groups that share it before its K/V projection's backward (groups run KV group by KV group);
//   per_call: the group's dO [T, g·d_v], gate gradient [T, g·d] and dQ [T, g·d] BF16 beside the
//     core call's buffers above at g heads.
// Not under MLA (kv_b expands K and V per head from one latent): its held buffers stay whole.
struct AttentionBackwardBytes {
  Bytes held = 0;
  Bytes per_call = 0;
};
AttentionBackwardBytes attention_backward_bytes(const AttentionSpec& a, std::int64_t hidden, std::int64_t seqs, std::int64_t seq_len,
                                               int head_group);
// The buffers of one chunked Gated DeltaNet backward call (flash-linear-attention's
// chunk_gated_delta_rule_bwd, 64-token chunks) over a piece of the `seqs` sequences of S tokens
// taken `chunk_tokens` at a time (gdn_activation_bytes' pieces; 0 = everything in one call). The
// call keeps every buffer it makes until it returns (they are its locals): the recomputed WY
// factors w [T, H_v·d_k] and u [T, H_v·d_v], the chunk states h and their gradients dh
// [⌈S/64⌉ per sequence, H_v, d_k, d_v] (new_empty in the inputs' BF16), the transformed values
// v_new, the local and the state-corrected value gradients and the WY backward's value gradient
// [T, H_v·d_v] BF16 each; dq, dk, dw and the WY backward's dk [T, H_v·d_k] BF16 each (queries and
// keys repeated to the value heads before the call where H_v > H_k, as Qwen3-Next's Hugging Face
// layer does); the gate's gradients FP32 [T, H_v] ×2 and beta's BF16 [T, H_v]. Beside them, what
// the call's forward saved for it (ChunkGatedDeltaRuleFunction.forward's save_for_backward with
// use_qk_l2norm_in_kernel, as that layer calls it), alive from the core's recompute to the
// backward's return: the L2-normalized q and k [T, H_v·d_k] BF16 each and their FP32 reciprocal
// norms [T, H_v] each, the chunk-local cumulative gate [T, H_v] FP32 and the solved WY matrix A
// [T, H_v, 64] BF16 (v and beta are the call's inputs, counted with the sublayer's activations).
Bytes gdn_backward_bytes(const GdnSpec& g, std::int64_t seqs, std::int64_t seq_len, std::int64_t chunk_tokens);
// The mixing sublayer's backward buffers of decoder `layer` in one call: an attention core's two
// parts with all heads at once, or gdn_backward_bytes over all its sequences. The baselines hold
// them over the core's backward or, more coarsely, over the decoder's.
Bytes mixing_backward_total_bytes(const ModelSpec& m, int layer, std::int64_t seqs, std::int64_t seq_len);
// Activations saved by a GDN sublayer over `seqs` sequences processed `chunk_tokens` at a time:
// 0 = everything at once; C < S = the same C-token piece of every sequence (FP32 state hand-off
// between pieces, Eq. 4 states included); C ≥ S = C/S whole sequences at a time.
Bytes gdn_activation_bytes(const GdnSpec& g, std::int64_t hidden, std::int64_t seqs, std::int64_t seq_len,
                           std::int64_t chunk_tokens);
// Activations saved by decoder `layer`'s mixing sublayer over `seqs` sequences of S tokens:
// attention_activation_bytes with query heads `head_group` at a time, or gdn_activation_bytes in
// pieces of `gdn_chunk_tokens`, by the layer's kind (0, 0 = unsplit, as the baselines run it).
Bytes mixing_activation_bytes(const ModelSpec& m, int layer, std::int64_t seqs, std::int64_t seq_len, int head_group = 0,
                              std::int64_t gdn_chunk_tokens = 0);
// Activations saved by the MoE sublayer for `tokens` tokens (routing, dispatched copies, expert
// intermediates, shared expert and dense MLP) of decoder `layer` = the per-token part + the
// per-assignment part of its k·tokens token–expert assignments (none in a dense first layer).
Bytes moe_activation_bytes(const ModelSpec& m, int layer, std::int64_t tokens);
// The MoE backward's gradient buffers besides the all-to-all buffers: the normalized input's
// gradient [T, h] BF16, summed from the router's, the experts' and the dense branches' backward
// until the norm's; and, while one expert's backward runs, the gradients of its rows' gate, up and
// activation [rows, I] ×3 BF16, for the largest expert: `largest_share` of the k·tokens
// assignments of each of the `ranks` ranks whose tokens it receives (1 without EP).
Bytes moe_input_grad_bytes(const ModelSpec& m, std::int64_t tokens);
Bytes expert_grad_workspace_bytes(const ModelSpec& m, int layer, std::int64_t tokens, int ranks, double largest_share);
// The part that lives where the assignments are processed (the receiving rank under EP):
// dispatched copies, expert gate/up/activation and outputs, per assignment.
Bytes moe_assignment_bytes(const ModelSpec& m, int layer, std::int64_t assignments);
// moe_activation_bytes on a rank that processes `load` times the mean share of the assignments
// (skewed routing under expert parallelism; 1 = balanced).
Bytes moe_activation_bytes_at_load(const ModelSpec& m, int layer, std::int64_t tokens, double load);
// Send + receive buffers of one EP dispatch round of `chunk_tokens` tokens: 2·k·c·h BF16 (0 in a
// dense first layer, whose k is 0; so are the routed parts of the *_at_load sizes).
Bytes a2a_buffer_bytes(const ModelSpec& m, int layer, std::int64_t chunk_tokens);
// The same on a rank that receives `load` times the mean: its send half, and `load` receive halves.
Bytes a2a_buffer_bytes_at_load(const ModelSpec& m, int layer, std::int64_t chunk_tokens, double load);
// Logits workspace of the vocabulary projection for `tokens` tokens at once: BF16 logits and
// their FP32 softmax gradient.
Bytes logits_workspace_bytes(const ModelSpec& m, std::int64_t tokens);
// The FP32 sum of a head's gradient (`params` of them) over more than one logits block, beside its
// BF16 gradient while the loss's backward runs (one block writes the BF16 gradient directly).
Bytes head_accumulator_bytes(std::int64_t params);
// The same for one block of a vocabulary sharded over `shards` GPUs (Ring-DTP): [T, V/shards].
Bytes sharded_logits_workspace_bytes(const ModelSpec& m, std::int64_t tokens, int shards);

// Ring-DTP over `ranks` GPUs of `tokens` tokens each (reference §6 "Ring-DTP"): what one hop of the
// ring carries. The smaller of a rank's hidden-state block (N·h BF16) and a head shard ((V/P)·h
// BF16) circulates. A hidden block travels with its targets (int64) and running log-sum-exp state
// (max, sum, target logit: FP32) in the forward, and with its targets, log-sum-exp and FP32
// hidden-state gradient partial in the backward; a head shard travels alone in the forward and with
// its FP32 gradient partial in the backward. Each step holds the block it computes on and the one
// arriving (two of each).
struct RingDtpHops {
  bool weights_move = false;
  Bytes forward = 0;   // one hop's bytes in the forward
  Bytes backward = 0;  // one hop's bytes in the backward
};
RingDtpHops ring_dtp_hops(const ModelSpec& m, std::int64_t tokens, int ranks);

// A pinned host block as PyTorch's caching host allocator hands it out: every request rounded up
// to the next power of two ("Round up the allocation to the nearest power of two to improve
// reuse", ATen/core/CachingHostAllocator.h: c10::llvm::PowerOf2Ceil(size)), and a freed block
// kept cached for the next request, so the process holds the rounded size. 0 stays 0.
Bytes pinned_host_block_bytes(Bytes requested);

// Runtime constants that no equation gives (estimates until calibration replaces them).
struct MemoryConstants {
  Bytes gpu_fixed_bytes = 3 * kGiB / 2;    // M_0: CUDA context, cuBLAS/NCCL workspaces (estimate)
  double gpu_headroom_fraction = 0.02;     // ε: allocator fragmentation, as a fraction of the rest
  Bytes host_process_bytes = 4 * kGiB;     // per rank: the process's own resident memory (estimate)
  std::int64_t loss_chunk_tokens = 1024;   // tokens per vocabulary-projection chunk (estimate)
};

// Eq. 2: M_peak = M_0 + M_state + max_t {M_keep + M_work} + ε.
struct GpuPeakTerms {
  Bytes fixed = 0;       // M_0
  Bytes state = 0;       // M_state: resident state
  Bytes keep = 0;        // M_keep at the peak
  Bytes work = 0;        // M_work at the peak
  Bytes headroom = 0;    // ε
  Bytes total() const { return fixed + state + keep + work + headroom; }
};
// Fills `headroom` as `fraction` of the other terms and returns the completed terms.
GpuPeakTerms eq2_gpu_peak(Bytes fixed, Bytes state, Bytes keep, Bytes work, double headroom_fraction);

}  // namespace oom
