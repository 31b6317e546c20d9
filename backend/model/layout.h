// ParamLayout: where each named weight of a model lives inside flat per-block FP32 buffers.
//
// The backend keeps every block's parameters in one contiguous buffer (host master, Adam moments,
// working copy, gradient slot all share the layout), so optimizer, transfers and checkpoints work
// on flat buffers while the model code sees named, shaped views. Blocks: 0 = "outer" (token
// embeddings, final norm, LM head unless tied), 1..L = decoder layers 0..L-1. Offsets and sizes
// are in elements (FP32 or BF16 depending on the buffer). Shapes follow the torch Linear
// convention [out × in]. Plain value type; pure (no LibTorch); thread-safe to read.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "costmodel/model_spec.h"

namespace oom::backend {

// How a tensor is initialized from the seed.
enum class InitKind {
  kNormal,   // N(0, std²)
  kOnes,     // RMSNorm weights
  kZeros,
  kALog,     // GDN A_log = log(U(1, 16))
  kDtBias,   // GDN dt_bias = log(expm1(U(1e-3, 1e-1))) (inverse softplus of a small step)
};

struct ParamEntry {
  std::string name;                 // e.g. "attn.q_proj", "experts.gate"
  std::vector<std::int64_t> shape;  // torch shape
  std::int64_t offset = 0;          // element offset in the block buffer
  InitKind init = InitKind::kNormal;
  double init_std = 0.02;

  std::int64_t numel() const;
};

struct BlockLayout {
  std::string name;  // "outer", "layer.3"
  std::vector<ParamEntry> entries;
  std::int64_t numel = 0;

  // The entry called `name`; aborts (OOM_ASSERT) when absent, since callers name fixed weights.
  const ParamEntry& at(const std::string& name) const;
  bool has(const std::string& name) const;
};

struct ModelLayout {
  std::vector<BlockLayout> blocks;  // [0] outer, [1 + l] decoder layer l
  std::int64_t total_numel() const;
};

// The layout of `spec`; its per-block totals equal costmodel::model_params (tested), plus, in a
// layer with sigmoid routing, the router's selection bias "router.bias" [E] (DeepSeek-V3's
// e_score_correction_bias: a checkpoint buffer, read without gradient, not counted as a parameter).
// Latent attention (MLA) layers hold transformers' DeepseekV3Attention modules under "attn."
// (q_a_proj, q_a_layernorm, q_b_proj or q_proj, kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj,
// o_proj); a dense first layer (first_k_dense_replace) holds "dense.*" and empty expert banks.
// Throws InputError naming the field when the decoder has a feature the LibTorch backend does not
// implement (group-limited or scaled softmax routing, a load-balancing loss over sigmoid routing);
// decoder_layout and so every backend path calls it.
void check_backend_model(const ModelSpec& spec);
ModelLayout model_layout(const ModelSpec& spec);
BlockLayout decoder_layout(const ModelSpec& spec, int layer);
BlockLayout outer_layout(const ModelSpec& spec);

}  // namespace oom::backend
