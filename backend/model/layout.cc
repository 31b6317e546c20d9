#include "backend/model/layout.h"

#include <fmt/format.h>

#include "costmodel/input_error.h"

namespace oom::backend {
namespace {

class Builder {
 public:
  explicit Builder(std::string name) { block_.name = std::move(name); }
  void add(const std::string& name, std::vector<std::int64_t> shape, InitKind init = InitKind::kNormal,
           double std = 0.02) {
    ParamEntry e{name, std::move(shape), block_.numel, init, std};
    block_.numel += e.numel();
    block_.entries.push_back(std::move(e));
  }
  BlockLayout take() { return std::move(block_); }

 private:
  BlockLayout block_;
};

void add_swiglu(Builder& b, const std::string& prefix, std::int64_t h, std::int64_t inter) {
  b.add(prefix + ".gate", {inter, h});
  b.add(prefix + ".up", {inter, h});
  b.add(prefix + ".down", {h, inter});
}

// RMSNorm weights start where the norm is the identity: w = 1, or w = 0 for a (1 + w) norm.
InitKind norm_init(const ModelSpec& s) { return s.zero_centered_norm() ? InitKind::kZeros : InitKind::kOnes; }

}  // namespace

std::int64_t ParamEntry::numel() const {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

const ParamEntry& BlockLayout::at(const std::string& n) const {
  for (const auto& e : entries) {
    if (e.name == n) return e;
  }
  OOM_ASSERT(false, ("no parameter named " + n + " in " + name).c_str());
}

bool BlockLayout::has(const std::string& n) const {
  for (const auto& e : entries) {
    if (e.name == n) return true;
  }
  return false;
}

std::int64_t ModelLayout::total_numel() const {
  std::int64_t n = 0;
  for (const auto& b : blocks) n += b.numel;
  return n;
}

BlockLayout outer_layout(const ModelSpec& s) {
  Builder b("outer");
  b.add("embed", {s.vocab, s.hidden});
  b.add("final_norm", {s.hidden}, norm_init(s));
  if (!s.tied_embeddings) b.add("lm_head", {s.vocab, s.hidden});
  return b.take();
}

void check_backend_model(const ModelSpec& s) {
  const auto refuse = [&](const std::string& field, const std::string& value, const std::string& what) {
    throw InputError(s.name, field, value, what + " is not implemented in the LibTorch backend (oom plan, simulate and memory model it)");
  };
  // transformers' DeepSeek-V3 router: sigmoid scores, grouped selection with the correction bias.
  if (s.moe.scoring == "softmax" && s.moe.groups > 1) refuse("n_group", std::to_string(s.moe.groups), "group-limited softmax routing");
  if (s.moe.scoring == "softmax" && s.moe.routed_scaling != 1.0) {
    refuse("routed_scaling_factor", fmt::format("{}", s.moe.routed_scaling), "a routed scaling factor on softmax routing");
  }
  if (s.moe.scoring == "sigmoid" && s.router_aux_loss_coef > 0) {
    refuse("router_aux_loss_coef", fmt::format("{}", s.router_aux_loss_coef), "a load-balancing loss over sigmoid routing (transformers' DeepSeek-V3 has none)");
  }
}

BlockLayout decoder_layout(const ModelSpec& s, int layer) {
  OOM_ASSERT(layer >= 0 && layer < s.layers, "layer index out of range");
  check_backend_model(s);
  const std::int64_t h = s.hidden;
  const LayerKind kind = s.layer_kinds[static_cast<std::size_t>(layer)];
  Builder b("layer." + std::to_string(layer));
  b.add("input_norm", {h}, norm_init(s));
  if (kind == LayerKind::kLinearAttention) {
    const GdnSpec& g = s.gdn;
    const std::int64_t kd = g.key_dim(), vd = g.value_dim();
    b.add("gdn.in_proj_qkvz", {2 * kd + 2 * vd, h});
    b.add("gdn.in_proj_ba", {2 * std::int64_t{g.value_heads}, h});
    b.add("gdn.conv", {2 * kd + vd, g.conv_kernel}, InitKind::kNormal, 0.2);
    b.add("gdn.dt_bias", {g.value_heads}, InitKind::kDtBias);
    b.add("gdn.A_log", {g.value_heads}, InitKind::kALog);
    b.add("gdn.norm", {g.value_head_dim}, InitKind::kOnes);
    b.add("gdn.out_proj", {h, vd});
  } else if (kind == LayerKind::kLatentAttention) {
    // transformers' DeepseekV3Attention, its module names after "attn.".
    const AttentionSpec& a = s.latent_attention;
    const std::int64_t H = a.heads, dqk = a.head_dim, nope = a.head_dim - a.rope_head_dim, dv = a.value_dim();
    if (a.q_lora_rank > 0) {
      b.add("attn.q_a_proj", {a.q_lora_rank, h});
      b.add("attn.q_a_layernorm", {a.q_lora_rank}, InitKind::kOnes);
      b.add("attn.q_b_proj", {H * dqk, a.q_lora_rank});
    } else {
      b.add("attn.q_proj", {H * dqk, h});
    }
    b.add("attn.kv_a_proj_with_mqa", {a.kv_lora_rank + a.rope_head_dim, h});
    b.add("attn.kv_a_layernorm", {a.kv_lora_rank}, InitKind::kOnes);
    b.add("attn.kv_b_proj", {H * (nope + dv), a.kv_lora_rank});
    b.add("attn.o_proj", {h, H * dv});
  } else {
    const AttentionSpec& a = s.attention(kind);
    const std::int64_t qw = std::int64_t{a.heads} * a.head_dim, kvw = std::int64_t{a.kv_heads} * a.head_dim;
    b.add("attn.q_proj", {qw * (a.output_gate ? 2 : 1), h});
    b.add("attn.k_proj", {kvw, h});
    if (!a.k_eq_v) b.add("attn.v_proj", {kvw, h});
    b.add("attn.o_proj", {h, qw});
    if (a.qk_norm) {
      b.add("attn.q_norm", {a.head_dim}, norm_init(s));
      b.add("attn.k_norm", {a.head_dim}, norm_init(s));
    }
  }
  const MoeSpec& m = s.layer_moe(layer);
  if (s.gemma4()) {
    // Gemma 4's sandwich norms (transformers' names: post_attention_layernorm, pre_feedforward_layernorm,
    // post_feedforward_layernorm_1, pre_feedforward_layernorm_2, post_feedforward_layernorm_2,
    // post_feedforward_layernorm), the router's input and per-expert scales, the layer scalar.
    b.add("attn.post_norm", {h}, InitKind::kOnes);
    b.add("dense.pre_norm", {h}, InitKind::kOnes);
    b.add("dense.post_norm", {h}, InitKind::kOnes);
    b.add("moe.pre_norm", {h}, InitKind::kOnes);
    b.add("moe.post_norm", {h}, InitKind::kOnes);
    b.add("ffn.post_norm", {h}, InitKind::kOnes);
    b.add("router.scale", {h}, InitKind::kOnes);
    b.add("router.expert_scale", {m.experts}, InitKind::kOnes);
    b.add("layer_scalar", {1}, InitKind::kOnes);
  } else {
    b.add("post_norm", {h}, norm_init(s));
  }
  if (m.experts > 0) {
    b.add("router", {m.experts, h});
    // The selection bias of sigmoid routing (e_score_correction_bias): a checkpoint buffer, read
    // without gradient, which the cost model does not count.
    if (m.scoring == "sigmoid") b.add("router.bias", {m.experts}, InitKind::kZeros);
  }
  // A dense layer (DeepSeek's first layers) keeps empty expert banks, so every decoder has them.
  b.add("experts.gate", {m.experts, m.expert_intermediate, h});
  b.add("experts.up", {m.experts, m.expert_intermediate, h});
  b.add("experts.down", {m.experts, h, m.expert_intermediate});
  if (m.shared_expert_intermediate > 0) {
    add_swiglu(b, "shared", h, m.shared_expert_intermediate);
    if (m.shared_expert_gate) b.add("shared.expert_gate", {1, h});
  }
  if (m.dense_intermediate > 0) add_swiglu(b, "dense", h, m.dense_intermediate);
  return b.take();
}

ModelLayout model_layout(const ModelSpec& s) {
  ModelLayout m;
  m.blocks.push_back(outer_layout(s));
  for (int l = 0; l < s.layers; ++l) m.blocks.push_back(decoder_layout(s, l));
  return m;
}

}  // namespace oom::backend
