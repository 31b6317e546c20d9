// The MoE decoder as pure functions of named weights: embeddings, RMSNorm, partial rotary
// embeddings, softmax attention (full or sliding window, GQA, optional output gate, returns the
// softmax log-sum-exp), chunked Gated DeltaNet, top-k routed SwiGLU experts with the shared expert
// and the dense MLP beside them, the LM head and cross-entropy.
//
// Every function is differentiable with LibTorch autograd and takes its weights as a BlockWeights
// (named views into a flat block buffer, or separate leaf tensors for the plain trainer), so the
// streamed runtime and the plain in-memory trainer run the very same arithmetic. Activations are
// [batch B, sequence S, hidden h]; tokens are int64 [B, S]. Weights may be FP32 or BF16; the
// attention core, the GDN recurrence and the loss compute in FP32. Positions restart at 0 in each
// sequence. Stateless and thread-compatible: concurrent calls on different tensors are safe.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "backend/model/layout.h"
#include "backend/model/recompute.h"
#include "costmodel/model_spec.h"

namespace oom::backend {

// Named weights of one block, aligned with layout->entries.
struct BlockWeights {
  const BlockLayout* layout = nullptr;
  std::vector<at::Tensor> tensors;
  // Optional: an expert bank's experts as tensors of their own (leaves whose gradients accumulate
  // in place, where selecting expert e of the bank would materialize a bank-size gradient per expert).
  std::map<std::string, std::vector<at::Tensor>> experts;

  const at::Tensor& operator[](const std::string& name) const;
  // Expert e of bank `name` ("experts.gate"): its own tensor when `experts` has the bank, else (*this)[name][e].
  at::Tensor expert(const std::string& name, int e) const;
  bool has(const std::string& name) const { return layout->has(name); }
};

// Shaped views of the flat buffer `flat` (numel == layout.numel); gradients flow to `flat`.
BlockWeights block_views(const BlockLayout& layout, const at::Tensor& flat);

struct ModelOptions {
  std::int64_t gdn_chunk_tokens = 32;       // GDN sequence chunk (state hand-off between chunks)
  std::int64_t attention_query_block = 64;  // query rows per attention block (windows skip keys)
  std::int64_t loss_chunk_tokens = 1024;    // tokens per vocabulary-projection chunk of the loss
};

constexpr double kNormEps = 1e-6;

// x · (mean(x²) + eps)^-1/2 · weight over the last dimension, in FP32, in x's dtype; an undefined
// weight gives the weightless norm (Gemma 4's V and router norms). A lean kernel (recompute.h).
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps = kNormEps);
// The model's RMSNorm: spec.norm_eps, and a (1 + w) scale where spec.zero_centered_norm().
at::Tensor model_norm(const at::Tensor& x, const at::Tensor& weight, const ModelSpec& spec);
// model_norm's values, with a backward that keeps the norm's output (which the projections after it
// keep anyway) and the FP32 1/rms [.., 1] instead of the input: the normalized rows are the output
// over the scale (apex's memory-efficient RMSNorm does the same). The decoder input a backward's
// replay reads is a checkpoint boundary, so nothing of it is kept once read, as the memory model
// prices it (planner/lowering/lowering_layers.cc). Gradients are model_norm's to rounding: the output
// is rounded to x's dtype before it is divided by the scale.
at::Tensor model_norm_keeping_output(const at::Tensor& x, const at::Tensor& weight, const ModelSpec& spec);
// Rotates the first rotary_dims of the last dimension of x [B, S, heads, d] at positions 0..S-1.
at::Tensor apply_rope(const at::Tensor& x, std::int64_t rotary_dims, double theta);
// The model's RoPE for heads of head_dim: partial rotation, theta, and YaRN scaling of the
// frequencies (with its cos/sin attention factor) where spec.rope_scaling asks for it. `positions`
// [S] (int64) are the tokens' places in their sequence where they are not 0..S-1 (context
// parallelism: a rank's zig-zag pieces); the same below.
at::Tensor apply_rope(const at::Tensor& x, const ModelSpec& spec, std::int64_t head_dim, const at::Tensor& positions = {});
std::int64_t rotary_dims(const ModelSpec& spec, std::int64_t head_dim);
// Inverse frequencies [rotary_dims / 2] (FP32) and the cos/sin scale of the model's RoPE.
struct RopeFrequencies {
  at::Tensor inv_freq;
  double attention_factor = 1.0;
};
RopeFrequencies rope_frequencies(const ModelSpec& spec, std::int64_t head_dim, const at::TensorOptions& options);
// The RoPE of a layer of `kind` on x [B, S, heads, head_dim]: the model's (above), or the layer
// type's own where the spec has one (Gemma 4: "default" over the whole head, or "proportional").
at::Tensor attention_rope(const at::Tensor& x, const ModelSpec& spec, LayerKind kind, const at::Tensor& positions = {});
// The softmax scale of the attention scores: 1/√head_dim, or 1 for Gemma 4 (its Q/K norms set it);
// for latent attention 1/√(qk_nope + qk_rope) × mscale(factor, mscale_all_dim)² under YaRN
// (transformers' DeepseekV3Attention).
double attention_scale(const ModelSpec& spec, const AttentionSpec& a);

// Multi-head Latent Attention (transformers' DeepseekV3Attention) on the normalized input x
// [B, S, h]: Q = q_b(norm(q_a(x))) (or q_proj(x)); [c_kv, k_rot] = kv_a(x); [K_nope, V] =
// kv_b(norm(c_kv)) per head; RoPE on the last qk_rope_head_dim of Q and on k_rot, whose pairs are
// interleaved (rope_interleave, transformers' default), one k_rot shared by every head.
// q, k [B, S, H, qk_nope + qk_rope], v [B, S, H, v_head_dim].
struct LatentQkv {
  at::Tensor q, k, v;
};
LatentQkv latent_qkv(const at::Tensor& x, const BlockWeights& w, const ModelSpec& spec, const at::Tensor& positions = {});
// The model's RoPE (YaRN included) on x [B, S, heads, d] whose rotated pairs are interleaved
// (x0, x1), (x2, x3), …; the output holds the pairs' first elements, then their second ones.
at::Tensor latent_rope(const at::Tensor& x, const ModelSpec& spec, const at::Tensor& positions = {});

struct AttentionOutput {
  at::Tensor out;  // [B, H, S, d] FP32
  at::Tensor lse;  // [B, H, S] FP32: log Σ_j exp(q·k_j·scale) over the keys each query sees
};
// Causal softmax attention of q [B, H, S, d] over k, v [B, Hkv, S, d] (H a multiple of Hkv);
// window_tokens > 0 restricts query i to keys j with i − j < window. Computed in query blocks
// that only visit the keys inside the window. Scores are q·k·scale; scale 0 means 1/√d. Under
// LeanKernels, autograd keeps only each block's q, k, v and recomputes its scores in the backward,
// as flash attention does; otherwise it keeps every block's FP32 scores and probabilities.
// query0 > 0: the queries are the sequence's tokens query0 … query0 + S − 1 and k, v hold its keys
// from token 0 on (at least query0 + S of them; context parallelism's pieces over the whole
// sequence's K/V).
AttentionOutput attention_core(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               std::int64_t window_tokens, std::int64_t query_block, double scale = 0.0,
                               std::int64_t query0 = 0);

// Recurrent state carried between GDN sequence chunks: FP32 S [B, Hv, dk, dv] and the last
// conv_kernel − 1 pre-conv q/k/v channels [B, conv_dim, K − 1] (the causal-conv left context).
struct GdnState {
  at::Tensor recurrent;
  at::Tensor conv_context;
};
// One chunk of the gated delta rule in its WY (UT-transform) form. q, k [B, H, C, dk] (already
// L2-normalized, q scaled), v [B, H, C, dv], g [B, H, C] log decays (≤ 0), beta [B, H, C];
// state [B, H, dk, dv]. Returns the outputs [B, H, C, dv] and replaces `state` by the chunk's end state.
at::Tensor gdn_chunk(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
                     const at::Tensor& beta, at::Tensor& state);

// The recurrence's inputs of one GDN sequence chunk from its FP32 pre-conv q/k/v channels with
// their left context, [B, conv_dim, K − 1 + C]: causal depthwise conv (conv_w [conv_dim, 1, K]
// FP32), SiLU, q and k repeated to the value heads, L2-normalized, q scaled by 1/√dk.
// q, k [B, Hv, C, dk], v [B, Hv, C, dv].
struct GdnChunkInputs {
  at::Tensor q, k, v;
};
GdnChunkInputs gdn_chunk_inputs(const at::Tensor& with_context, const at::Tensor& conv_w, const GdnSpec& g);

// Token mixing of one layer on the normalized input x [B, S, h] → [B, S, h] (without Gemma 4's
// norm of the output: see post_mixing).
at::Tensor attention_mixing(const at::Tensor& x, const BlockWeights& w, const ModelSpec& spec, LayerKind kind,
                            const ModelOptions& opt, at::Tensor* lse_out = nullptr);
at::Tensor gdn_mixing(const at::Tensor& x, const BlockWeights& w, const ModelSpec& spec, const ModelOptions& opt);

// Routing of x [T, h]: top-k expert ids [T, k] and weights [T, k] (softmax over all experts, then
// renormalized over the chosen k when norm_topk_prob). With moe.scoring "sigmoid", transformers'
// DeepseekV3TopkRouter: sigmoid scores in FP32; the k experts chosen on scores + `bias` (the
// selection bias, without gradient) among the experts of the best moe.topk_groups of moe.groups
// groups (a group's score: the sum of its two best); weights = the chosen scores, renormalized
// where norm_topk_prob, × moe.routed_scaling.
struct Routing {
  at::Tensor expert_ids;
  at::Tensor weights;
  at::Tensor probs;  // [T, E] FP32: the softmax over all experts (what the load-balancing loss reads); sigmoid: the scores
};
Routing route(const at::Tensor& x2d, const at::Tensor& router_weight, const MoeSpec& moe, const at::Tensor& bias = {});

// What the load-balancing loss needs from the routers of a forward pass: per expert, how many of
// the top-k slots it took (no gradient) and the sum of its softmax probability over the tokens.
struct RouterStats {
  at::Tensor slot_counts;  // [E] FP32, summed over layers
  at::Tensor prob_sums;    // [E] FP32, summed over layers (differentiable)
  std::int64_t rows = 0;   // tokens × layers
  // Adds one layer's routing of its tokens.
  void add(const Routing& routing, int experts);
  // Adds another set of statistics, its probability sums without their gradient.
  void add_detached(const RouterStats& other);
};
// The Switch-Transformer load-balancing loss of transformers' load_balancing_loss_func:
// E · Σ_e (slot_counts_e / rows) · (prob_sums_e / rows).
at::Tensor router_aux_loss(const RouterStats& stats, int experts);
// SwiGLU-style MLP: down(act(x·gateᵀ) ⊙ x·upᵀ); act is SiLU, or tanh-GELU for "gelu*" activations.
at::Tensor gated_mlp(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& up, const at::Tensor& down,
                     const std::string& activation);
// The gated activation act(g) ⊙ u of gated_mlp (SiLU, or tanh-GELU for "gelu*" activations).
at::Tensor gated_activation(const at::Tensor& g, const at::Tensor& u, const std::string& activation);
bool is_gelu(const std::string& activation);
// Routed experts of the tokens x2d [T, h] under routing r (dispatch, expert MLPs, weighted combine) → [T, h].
at::Tensor routed_experts(const at::Tensor& x2d, const Routing& r, const BlockWeights& w, const ModelSpec& spec);
// Routed experts + shared expert (gated where the layer has shared.expert_gate) + dense MLP, each
// where the layer's weights have it, on the normalized input x [B, S, h] → [B, S, h].
// With `stats`, the router's statistics are added to it. Not for Gemma 4, whose branches have
// their own inputs (ffn_half).
at::Tensor moe_ffn(const at::Tensor& x, const BlockWeights& w, const ModelSpec& spec, RouterStats* stats = nullptr);

// What the token mixing adds to the residual: `mixed` itself, or its RMSNorm for Gemma 4
// (post_attention_layernorm).
at::Tensor post_mixing(const at::Tensor& mixed, const BlockWeights& w, const ModelSpec& spec);

// The inputs of the feed-forward half for the tokens a2d [T, h] (the residual after the mixing):
// router, routed experts and dense MLP / shared expert. All three are norm(a) (post_norm) except
// for Gemma 4: the router reads a itself, the experts and the dense MLP their own pre-norms.
struct FfnInputs {
  at::Tensor router, experts, dense;
};
FfnInputs ffn_inputs(const at::Tensor& a2d, const BlockWeights& w, const ModelSpec& spec);
// The layer's routing of its router input: route() on the router weight (and the selection bias
// "router.bias" where the layer has one), no expert at all in a layer without a router (a dense
// layer: expert_ids [T, 0]), or Gemma 4's router
// (weightless RMSNorm · router.scale · h^-1/2, softmax, top-k renormalized, × router.expert_scale).
Routing route_layer(const at::Tensor& router_in, const BlockWeights& w, const ModelSpec& spec);
// The feed-forward half's output from its parts (undefined parts absent): a + ((routed + shared) +
// dense); Gemma 4: (a + norm_ffn(norm_dense(dense) + norm_moe(routed))) · layer_scalar, the layer
// scalar without gradient (a buffer in transformers).
at::Tensor ffn_output(const at::Tensor& a, const at::Tensor& routed, const at::Tensor& shared, const at::Tensor& dense,
                      const BlockWeights& w, const ModelSpec& spec);
// The feed-forward half of a decoder layer on the residual a [B, S, h] after the mixing.
at::Tensor ffn_half(const at::Tensor& a, const BlockWeights& w, const ModelSpec& spec, RouterStats* stats = nullptr);

// One decoder layer: a = x + post_mixing(mix(norm(x))), then ffn_half(a).
at::Tensor decoder_layer(const at::Tensor& x, const BlockWeights& w, const ModelSpec& spec, int layer,
                         const ModelOptions& opt, RouterStats* stats = nullptr);

// Token embeddings [B, S, h] (× √h in the weights' dtype for Gemma 4).
at::Tensor embed(const at::Tensor& tokens, const BlockWeights& outer, const ModelSpec& spec);
// Mean cross-entropy of next-token targets [B, S] given the last hidden state x [B, S, h]. The
// vocabulary projection runs in chunks of `chunk_tokens` tokens: the forward keeps one log-sum-exp
// per token, the backward recomputes each chunk's logits, so no [B·S, V] logits tensor exists.
at::Tensor head_loss(const at::Tensor& x, const at::Tensor& targets, const BlockWeights& outer, const ModelSpec& spec,
                     std::int64_t chunk_tokens = 1024);
// The same loss over normalized hidden states xn [N, h], head [V, h] and targets [N], in chunks.
at::Tensor chunked_cross_entropy(const at::Tensor& xn, const at::Tensor& head, const at::Tensor& targets,
                                 double softcap, std::int64_t chunk_tokens);

// Logits [B, S, V] FP32 (softcapped where the model caps them) of the last hidden state.
at::Tensor head_logits(const at::Tensor& x, const BlockWeights& outer, const ModelSpec& spec);
// The whole model to the logits (for evaluation and parity checks).
at::Tensor model_logits(const at::Tensor& tokens, const std::vector<BlockWeights>& weights, const ModelSpec& spec,
                        const ModelOptions& opt);

// The whole model: embeddings, every decoder layer, head and loss (weights[0] outer, [1+l] layer l),
// plus spec.router_aux_loss_coef × the load-balancing loss where that is > 0.
at::Tensor model_loss(const at::Tensor& tokens, const at::Tensor& targets, const std::vector<BlockWeights>& weights,
                      const ModelSpec& spec, const ModelOptions& opt);

}  // namespace oom::backend
