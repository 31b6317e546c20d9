// FLOP counts per operator and decoder layer (reference Eq. 1: F(B,S) ≈ a·B·S + b·B·S²).
//
// All counts are forward FLOPs (2 per multiply-accumulate) for B sequences of S tokens unless a
// name says backward. Token-linear work (projections, experts, GDN recurrence, sliding-window
// attention past its window) goes into `linear`; full causal attention's score and value products
// go into `quadratic`, so that at equal tokens T = B·S the attention term still depends on S.
// Causal attention over S tokens touches S·(S+1)/2 query–key pairs; a window w caps each query at
// w keys. GDN uses the chunked delta rule with chunk C = kGdnKernelChunk.
#pragma once

#include <cstdint>

#include "costmodel/model_spec.h"
#include "costmodel/units.h"

namespace oom {

inline constexpr std::int64_t kGdnKernelChunk = 64;  // chunk length of the chunked GDN kernel

// Backward/forward FLOP ratios: a matmul's backward computes the input and the weight gradient
// (2×); flash attention's backward runs five matmuls against the forward's two (2.5×).
inline constexpr double kMatmulBackwardRatio = 2.0;
inline constexpr double kAttentionBackwardRatio = 2.5;
inline constexpr double kGdnBackwardRatio = 2.0;

struct Eq1Flops {
  Flops linear = 0;     // a·B·S part
  Flops quadratic = 0;  // b·B·S² part
  Flops total() const { return linear + quadratic; }
  Eq1Flops& operator+=(const Eq1Flops& o) {
    linear += o.linear;
    quadratic += o.quadratic;
    return *this;
  }
};

// Query–key pairs of causal attention over one sequence of S tokens with window w (0 = none).
double causal_pairs(std::int64_t seq_len, std::int64_t window_tokens);

// Q/K/V/gate/O projections of one attention layer for `tokens` tokens.
Flops attention_projection_flops(const AttentionSpec& a, std::int64_t hidden, std::int64_t tokens);
// Scores QKᵀ and values PV: 2·heads·(d + d_v) per pair; the S²/2 part is quadratic, the rest linear.
Eq1Flops attention_core_flops(const AttentionSpec& a, std::int64_t batch, std::int64_t seq_len);
// Latent attention (MLA) under context parallelism: a GPU receives the other pieces' compressed
// latents and expands them (kv_b) to per-head K and V for its core, 2·tokens·kv_lora_rank·heads·
// (d − d_rope + d_v) FLOPs for `tokens` received tokens; 0 without latents.
Flops latent_expansion_flops(const AttentionSpec& a, std::int64_t tokens);
// The attention core of decoder `layer` on one of the C GPUs that split `seqs` sequences of
// `seq_len` tokens (context parallelism, ring attention's zig-zag pieces balancing the causal
// mask): 1/C of the whole sequences' core, plus under MLA the expansion of the other C − 1 pieces'
// latents. C = 1: the whole core.
Flops context_parallel_core_flops(const ModelSpec& m, int layer, std::int64_t seqs, std::int64_t seq_len, int C);
// in/out projections and the conv of one GDN layer for `tokens` tokens.
Flops gdn_projection_flops(const GdnSpec& g, std::int64_t hidden, std::int64_t tokens);
// The chunked delta-rule recurrence: per token and value head 6·d_k·d_v (state read, delta,
// state update) + 2·C·(2·d_k + 2·d_v) (intra-chunk scores and values).
Flops gdn_core_flops(const GdnSpec& g, std::int64_t tokens);
// Context parallelism of GDN: a piece of `tokens` tokens corrected with the state it received
// (q·S over its tokens), 2·tokens·H_v·d_k·d_v FLOPs forward (its backward twice that).
Flops gdn_state_correction_flops(const GdnSpec& g, std::int64_t tokens);

// The MoE block: router h·E, top-k experts 3·h·I each, shared expert, dense MLP.
struct MoeFlops {
  Flops router = 0;
  Flops routed_experts = 0;
  Flops shared_expert = 0;
  Flops dense_mlp = 0;
  Flops total() const { return router + routed_experts + shared_expert + dense_mlp; }
};
// Of decoder `layer` (a dense first layer has its MLP as dense_mlp and nothing else).
MoeFlops moe_flops(const ModelSpec& m, int layer, std::int64_t tokens);

// Forward FLOPs of decoder `layer` by sublayer.
struct LayerFlops {
  Flops mixing_projection = 0;  // attention or GDN projections, the output projection included
  Flops mixing_output = 0;      // of which the output projection (o_proj / out_proj), after the core
  Eq1Flops mixing_core;         // attention scores/values, or the GDN recurrence (linear)
  MoeFlops moe;
  bool core_is_recurrent = false;  // GDN layer
  Flops forward() const { return mixing_projection + mixing_core.total() + moe.total(); }
  Flops backward() const;  // matmuls ×2, attention core ×2.5, GDN core ×2
};
LayerFlops layer_flops(const ModelSpec& m, int layer, std::int64_t batch, std::int64_t seq_len);

// LM head (vocab projection) for `tokens` tokens.
Flops lm_head_flops(const ModelSpec& m, std::int64_t tokens);

// Eq. 1 for the whole model's forward pass (decoders + LM head).
Eq1Flops model_forward_flops(const ModelSpec& m, std::int64_t batch, std::int64_t seq_len);

}  // namespace oom
