#include "backend/layout.h"

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
  // DeepSeek-V3 style decoders are modelled by the cost model and the engines (oom plan, simulate,
  // memory, whatif); the LibTorch decoder does not implement them.
  const auto refuse = [&](const std::string& field, const std::string& value, const std::string& what) {
    throw InputError(s.name, field, value, what + " is not implemented in the LibTorch backend (oom plan, simulate and memory model it)");
  };
  if (s.count(LayerKind::kLatentAttention) > 0) refuse("kv_lora_rank", std::to_string(s.latent_attention.kv_lora_rank), "latent attention (MLA)");
  if (s.first_dense_layers > 0) refuse("first_k_dense_replace", std::to_string(s.first_dense_layers), "a dense first layer");
  if (s.moe.shared_expert_intermediate > 0 && !s.moe.shared_expert_gate) refuse("shared_expert_gate", "false", "an ungated shared expert");
  if (s.moe.scoring != "softmax") refuse("scoring_func", s.moe.scoring, "sigmoid routing");
  if (s.moe.groups > 1) refuse("n_group", std::to_string(s.moe.groups), "group-limited routing");
  if (s.moe.routed_scaling != 1.0) refuse("routed_scaling_factor", fmt::format("{}", s.moe.routed_scaling), "a routed scaling factor");
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
  const MoeSpec& m = s.moe;
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
  b.add("router", {m.experts, h});
  b.add("experts.gate", {m.experts, m.expert_intermediate, h});
  b.add("experts.up", {m.experts, m.expert_intermediate, h});
  b.add("experts.down", {m.experts, h, m.expert_intermediate});
  if (m.shared_expert_intermediate > 0) {
    add_swiglu(b, "shared", h, m.shared_expert_intermediate);
    b.add("shared.expert_gate", {1, h});
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
