#include "backend/io/hf_weights.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "backend/model/model.h"
#include "costmodel/input_error.h"

namespace oom::backend {
namespace {

bool starts_with(const std::string& s, const char* p) { return s.rfind(p, 0) == 0; }

bool interleaved_gdn(const ModelSpec& s) { return starts_with(s.model_type, "qwen3_next"); }
bool mixtral_names(const ModelSpec& s) { return starts_with(s.model_type, "mixtral"); }
// DeepSeek-V3 (and Kimi-K2, the same modules): mlp.shared_experts, the dense first layers' mlp.*_proj.
bool deepseek_names(const ModelSpec& s) { return starts_with(s.model_type, "deepseek_v3") || starts_with(s.model_type, "kimi_k2"); }
std::string shared_name(const ModelSpec& s, const std::string& part) {
  if (part == "expert_gate") return "shared_expert_gate.weight";
  return (deepseek_names(s) ? "shared_experts." : "shared_expert.") + part + "_proj.weight";
}

// Gemma 4's per-layer tensors outside attention and the experts: our entry → transformers' name
// under model.layers.N. (the router's projection, scales and the layer_scalar buffer included).
const std::vector<std::pair<std::string, std::string>>& gemma4_names() {
  static const std::vector<std::pair<std::string, std::string>> names = {
      {"input_norm", "input_layernorm.weight"},
      {"attn.post_norm", "post_attention_layernorm.weight"},
      {"dense.pre_norm", "pre_feedforward_layernorm.weight"},
      {"dense.post_norm", "post_feedforward_layernorm_1.weight"},
      {"moe.pre_norm", "pre_feedforward_layernorm_2.weight"},
      {"moe.post_norm", "post_feedforward_layernorm_2.weight"},
      {"ffn.post_norm", "post_feedforward_layernorm.weight"},
      {"router", "router.proj.weight"},
      {"router.scale", "router.scale"},
      {"router.expert_scale", "router.per_expert_scale"},
      {"layer_scalar", "layer_scalar"},
      {"dense.gate", "mlp.gate_proj.weight"},
      {"dense.up", "mlp.up_proj.weight"},
      {"dense.down", "mlp.down_proj.weight"},
  };
  return names;
}
const std::string* gemma4_name(const std::string& entry) {
  for (const auto& [ours, hf] : gemma4_names()) {
    if (ours == entry) return &hf;
  }
  return nullptr;
}

// The GDN widths the projections are cut by: key/value dims, heads, head dims, value heads per key head.
struct GdnDims {
  std::int64_t kd, vd, Hk, Hv, dk, dv, rep;
};
GdnDims gdn_dims(const GdnSpec& g) {
  return {g.key_dim(), g.value_dim(), g.key_heads, g.value_heads, g.key_head_dim, g.value_head_dim,
          std::int64_t{g.value_heads} / g.key_heads};
}

std::string shape_text(at::IntArrayRef shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

// Name lookups with the checkpoint's prefix, shape checks, and (in the copy pass) the copies.
class Reader {
 public:
  Reader(const HfTensorSource& source, std::string origin) : source_(source), origin_(std::move(origin)) {
    for (const char* p : {"model.language_model.", "model."}) {
      if (source_(std::string(p) + "embed_tokens.weight")) {
        prefix_ = p;
        break;
      }
    }
  }
  const std::string& prefix() const { return prefix_; }
  bool has(const std::string& name) const { return source_(name).has_value(); }

  // The tensor `name` with exactly `shape` (a [C, 1, K] conv weight may stand for [C, K]).
  at::Tensor get(const std::string& name, std::vector<std::int64_t> shape) {
    auto t = source_(name);
    if (!t) throw InputError(origin_, "tensor", "'" + name + "'", "missing from the checkpoint");
    std::int64_t numel = 1;
    for (auto d : shape) numel *= d;
    const bool same = t->sizes().vec() == shape || (t->dim() == 3 && t->size(1) == 1 && shape.size() == 2 &&
                                                    t->size(0) == shape[0] && t->size(2) == shape[1]);
    if (!same || t->numel() != numel) {
      throw InputError(origin_, "tensor '" + name + "'", shape_text(t->sizes()),
                       "has that shape; the config asks for " + shape_text(shape));
    }
    const auto type = t->scalar_type();
    if (type != at::kFloat && type != at::kBFloat16 && type != at::kHalf && type != at::kDouble) {
      throw InputError(origin_, "tensor '" + name + "'", std::string(c10::toString(type)),
                       "is not a floating-point tensor");
    }
    read_.push_back(name);
    return t->reshape(shape);
  }
  std::vector<std::string> take_names() { return std::move(read_); }
  std::size_t names_read() const { return read_.size(); }
  const std::string& name(std::size_t i) const { return read_[i]; }

 private:
  const HfTensorSource& source_;
  std::string origin_;
  std::string prefix_ = "model.";
  std::vector<std::string> read_;
};

// Where the routed experts, router and shared expert of layer l live.
std::string moe_prefix(const ModelSpec& s, const Reader& r, const std::string& lp) {
  if (s.gemma4()) return lp;
  if (r.has(lp + "block_sparse_moe.gate.weight")) return lp + "block_sparse_moe.";
  if (r.has(lp + "mlp.gate.weight")) return lp + "mlp.";
  return lp + (mixtral_names(s) ? "block_sparse_moe." : "mlp.");
}

// Our layout's value of one entry, assembled from the checkpoint (FP32 or the stored dtype).
using Assign = std::function<void(const at::Tensor& dst)>;

// The reads of one block: every entry's tensor checked, and a copy deferred to the second pass.
std::vector<Assign> plan_block(const ModelSpec& s, const BlockLayout& layout, int block, Reader& r) {
  std::vector<Assign> out;
  const auto copy = [](at::Tensor src) { return [src](const at::Tensor& dst) { dst.copy_(src); }; };
  const std::string& P = r.prefix();
  const auto shape = [&](const std::string& entry) { return layout.at(entry).shape; };
  if (block == 0) {
    out.push_back(copy(r.get(P + "embed_tokens.weight", shape("embed"))));
    out.push_back(copy(r.get(P + "norm.weight", shape("final_norm"))));
    if (!s.tied_embeddings) out.push_back(copy(r.get("lm_head.weight", shape("lm_head"))));
    return out;
  }
  const int l = block - 1;
  const std::string lp = fmt::format("{}layers.{}.", P, l);
  const std::int64_t h = s.hidden;
  for (const auto& e : layout.entries) {
    const std::string& n = e.name;
    if (const std::string* hf = s.gemma4() ? gemma4_name(n) : nullptr) {
      out.push_back(copy(r.get(lp + *hf, e.shape)));
    } else if (n == "input_norm") {
      out.push_back(copy(r.get(lp + "input_layernorm.weight", e.shape)));
    } else if (n == "post_norm") {
      out.push_back(copy(r.get(lp + "post_attention_layernorm.weight", e.shape)));
    } else if (starts_with(n, "attn.")) {
      const std::string hf = n.substr(5);  // q_proj, k_proj, v_proj, o_proj, q_norm, k_norm
      out.push_back(copy(r.get(lp + "self_attn." + hf + ".weight", e.shape)));
    } else if (starts_with(n, "gdn.")) {
      const std::string A = lp + "linear_attn.";
      const auto [kd, vd, Hk, Hv, dk, dv, rep] = gdn_dims(s.gdn);
      if (n == "gdn.in_proj_qkvz") {
        if (interleaved_gdn(s)) {
          // Per key head g: [q_g | k_g | v of its rep value heads | z of them].
          const auto w = r.get(A + "in_proj_qkvz.weight", e.shape).view({Hk, 2 * dk + 2 * rep * dv, h});
          out.push_back([w, dk, dv, rep, h](const at::Tensor& dst) {
            dst.copy_(at::cat({w.narrow(1, 0, dk).reshape({-1, h}), w.narrow(1, dk, dk).reshape({-1, h}),
                               w.narrow(1, 2 * dk, rep * dv).reshape({-1, h}),
                               w.narrow(1, 2 * dk + rep * dv, rep * dv).reshape({-1, h})}));
          });
        } else {
          const auto qkv = r.get(A + "in_proj_qkv.weight", {2 * kd + vd, h});
          const auto z = r.get(A + "in_proj_z.weight", {vd, h});
          out.push_back([qkv, z](const at::Tensor& dst) { dst.copy_(at::cat({qkv, z})); });
        }
      } else if (n == "gdn.in_proj_ba") {
        if (interleaved_gdn(s)) {
          const auto w = r.get(A + "in_proj_ba.weight", e.shape).view({Hk, 2 * rep, h});
          out.push_back([w, rep, h](const at::Tensor& dst) {
            dst.copy_(at::cat({w.narrow(1, 0, rep).reshape({-1, h}), w.narrow(1, rep, rep).reshape({-1, h})}));
          });
        } else {
          const auto b = r.get(A + "in_proj_b.weight", {Hv, h});
          const auto a = r.get(A + "in_proj_a.weight", {Hv, h});
          out.push_back([b, a](const at::Tensor& dst) { dst.copy_(at::cat({b, a})); });
        }
      } else if (n == "gdn.conv") {
        out.push_back(copy(r.get(A + "conv1d.weight", e.shape)));
      } else if (n == "gdn.norm") {
        out.push_back(copy(r.get(A + "norm.weight", e.shape)));
      } else {  // dt_bias, A_log, out_proj
        const std::string hf = n.substr(4);
        out.push_back(copy(r.get(A + hf + (hf == "out_proj" ? ".weight" : ""), e.shape)));
      }
    } else if (n == "router") {
      out.push_back(copy(r.get(moe_prefix(s, r, lp) + "gate.weight", e.shape)));
    } else if (n == "router.bias") {
      out.push_back(copy(r.get(moe_prefix(s, r, lp) + "gate.e_score_correction_bias", e.shape)));
    } else if (starts_with(n, "dense.")) {  // a dense first layer's MLP
      out.push_back(copy(r.get(lp + "mlp." + n.substr(6) + "_proj.weight", e.shape)));
    } else if (starts_with(n, "experts.") && e.numel() == 0) {
      out.push_back([](const at::Tensor&) {});  // a dense layer's empty bank
    } else if (starts_with(n, "experts.")) {
      const MoeSpec& m = s.moe;
      const std::string M = moe_prefix(s, r, lp) + "experts.";
      const std::string part = n.substr(8);  // gate, up, down
      const std::int64_t I = m.expert_intermediate;
      if (r.has(M + "gate_up_proj") || r.has(M + "down_proj")) {
        if (part == "down") {
          out.push_back(copy(r.get(M + "down_proj", e.shape)));
        } else {
          const auto gu = r.get(M + "gate_up_proj", {m.experts, 2 * I, h});
          out.push_back(copy(gu.narrow(1, part == "gate" ? 0 : I, I)));
        }
      } else {
        const bool w123 = r.has(M + "0.w1.weight");
        const std::string hf = w123 ? (part == "gate" ? "w1" : part == "up" ? "w3" : "w2") : part + "_proj";
        std::vector<at::Tensor> experts;
        const std::vector<std::int64_t> one(e.shape.begin() + 1, e.shape.end());
        for (int x = 0; x < m.experts; ++x) experts.push_back(r.get(fmt::format("{}{}.{}.weight", M, x, hf), one));
        out.push_back([experts](const at::Tensor& dst) {
          for (std::size_t x = 0; x < experts.size(); ++x) dst[static_cast<std::int64_t>(x)].copy_(experts[x]);
        });
      }
    } else if (starts_with(n, "shared.")) {
      const std::string M = moe_prefix(s, r, lp);
      out.push_back(copy(r.get(M + shared_name(s, n.substr(7)), e.shape)));  // gate, up, down, expert_gate
    } else {
      throw InputError("", "model", s.name, "has weight " + n + ", which no Hugging Face checkpoint maps");
    }
  }
  return out;
}

}  // namespace

void check_hf_architecture(const ModelSpec& s, const std::string& origin) {
  for (const char* t : {"qwen3_5_moe", "qwen3_next", "qwen3_moe", "mixtral", "gemma4", "deepseek_v3", "kimi_k2"}) {
    if (starts_with(s.model_type, t)) return;
  }
  throw InputError(origin, "model_type", "\"" + s.model_type + "\"",
                   "Hugging Face checkpoints are read and written for qwen3_5_moe, qwen3_next, qwen3_moe, mixtral, gemma4, "
                   "deepseek_v3 and kimi_k2");
}

std::vector<std::string> load_hf_blocks(const ModelSpec& spec, const ModelLayout& layout, const HfTensorSource& source,
                                        std::vector<at::Tensor>& blocks, const std::string& origin,
                                        const std::function<void(const std::string&)>& loaded) {
  check_hf_architecture(spec, origin);
  OOM_ASSERT(blocks.size() == layout.blocks.size(), "one buffer per layout block");
  Reader r(source, origin);
  std::vector<std::vector<Assign>> plans;
  std::vector<std::size_t> names_end;  // per block: the end of its names in the reader's list
  for (std::size_t b = 0; b < layout.blocks.size(); ++b) {
    plans.push_back(plan_block(spec, layout.blocks[b], static_cast<int>(b), r));
    names_end.push_back(r.names_read());
  }
  at::NoGradGuard no_grad;
  std::size_t first = 0;
  for (std::size_t b = 0; b < layout.blocks.size(); ++b) {
    const auto views = block_views(layout.blocks[b], blocks[b]);
    for (std::size_t i = 0; i < plans[b].size(); ++i) plans[b][i](views.tensors[i]);
    if (loaded) {
      for (std::size_t i = first; i < names_end[b]; ++i) loaded(r.name(i));
    }
    first = names_end[b];
  }
  return r.take_names();
}

std::vector<std::pair<std::string, at::Tensor>> hf_tensors_of_block(const ModelSpec& s, const ModelLayout& layout,
                                                                    int block, const at::Tensor& flat) {
  check_hf_architecture(s, "");
  const auto w = block_views(layout.blocks[static_cast<std::size_t>(block)], flat);
  std::vector<std::pair<std::string, at::Tensor>> out;
  if (block == 0) {
    out.emplace_back("model.embed_tokens.weight", w["embed"]);
    out.emplace_back("model.norm.weight", w["final_norm"]);
    if (!s.tied_embeddings) out.emplace_back("lm_head.weight", w["lm_head"]);
    return out;
  }
  const std::string lp = fmt::format("model.layers.{}.", block - 1);
  const std::int64_t h = s.hidden;
  const std::string M = lp + (s.gemma4() ? "" : mixtral_names(s) ? "block_sparse_moe." : "mlp.");
  for (std::size_t i = 0; i < w.tensors.size(); ++i) {
    const std::string& n = w.layout->entries[i].name;
    const at::Tensor& t = w.tensors[i];
    if (const std::string* hf = s.gemma4() ? gemma4_name(n) : nullptr) {
      out.emplace_back(lp + *hf, t);
    } else if (s.gemma4() && starts_with(n, "experts.")) {
      // Gemma 4 checkpoints hold the experts fused: gate_up_proj [E, 2I, h] and down_proj [E, h, I].
      if (n == "experts.gate") out.emplace_back(M + "experts.gate_up_proj", at::cat({t, w["experts.up"]}, 1));
      if (n == "experts.down") out.emplace_back(M + "experts.down_proj", t);
    } else if (n == "input_norm") {
      out.emplace_back(lp + "input_layernorm.weight", t);
    } else if (n == "post_norm") {
      out.emplace_back(lp + "post_attention_layernorm.weight", t);
    } else if (starts_with(n, "attn.")) {
      out.emplace_back(lp + "self_attn." + n.substr(5) + ".weight", t);
    } else if (starts_with(n, "gdn.")) {
      const std::string A = lp + "linear_attn.";
      const auto [kd, vd, Hk, Hv, dk, dv, rep] = gdn_dims(s.gdn);
      if (n == "gdn.in_proj_qkvz") {
        if (interleaved_gdn(s)) {
          const auto q = t.narrow(0, 0, kd).view({Hk, dk, h}), k = t.narrow(0, kd, kd).view({Hk, dk, h});
          const auto v = t.narrow(0, 2 * kd, vd).view({Hk, rep * dv, h}), z = t.narrow(0, 2 * kd + vd, vd).view({Hk, rep * dv, h});
          out.emplace_back(A + "in_proj_qkvz.weight", at::cat({q, k, v, z}, 1).reshape({-1, h}));
        } else {
          out.emplace_back(A + "in_proj_qkv.weight", t.narrow(0, 0, 2 * kd + vd));
          out.emplace_back(A + "in_proj_z.weight", t.narrow(0, 2 * kd + vd, vd));
        }
      } else if (n == "gdn.in_proj_ba") {
        if (interleaved_gdn(s)) {
          out.emplace_back(A + "in_proj_ba.weight", at::cat({t.narrow(0, 0, Hv).view({Hk, rep, h}),
                                                             t.narrow(0, Hv, Hv).view({Hk, rep, h})}, 1).reshape({-1, h}));
        } else {
          out.emplace_back(A + "in_proj_b.weight", t.narrow(0, 0, Hv));
          out.emplace_back(A + "in_proj_a.weight", t.narrow(0, Hv, Hv));
        }
      } else if (n == "gdn.conv") {
        out.emplace_back(A + "conv1d.weight", t.unsqueeze(1));
      } else if (n == "gdn.norm") {
        out.emplace_back(A + "norm.weight", t);
      } else {
        const std::string hf = n.substr(4);
        out.emplace_back(A + hf + (hf == "out_proj" ? ".weight" : ""), t);
      }
    } else if (n == "router") {
      out.emplace_back(M + "gate.weight", t);
    } else if (n == "router.bias") {
      out.emplace_back(M + "gate.e_score_correction_bias", t);
    } else if (starts_with(n, "dense.")) {
      out.emplace_back(lp + "mlp." + n.substr(6) + "_proj.weight", t);
    } else if (starts_with(n, "experts.")) {
      const std::string part = n.substr(8);
      const std::string hf = mixtral_names(s) ? (part == "gate" ? "w1" : part == "up" ? "w3" : "w2") : part + "_proj";
      for (std::int64_t x = 0; x < t.size(0); ++x) out.emplace_back(fmt::format("{}experts.{}.{}.weight", M, x, hf), t[x]);
    } else if (starts_with(n, "shared.")) {
      const std::string part = n.substr(7);
      out.emplace_back(M + shared_name(s, part), t);
    }
  }
  return out;
}

}  // namespace oom::backend
