// The decoder's feed-forward half (model.h): top-k routing (softmax, or DeepSeek-V3's sigmoid with
// its selection bias and group-limited top-k), the load-balancing loss, gated MLPs, the routed
// experts with the shared expert and the dense MLP beside them. The token mixing is mixing.cc; the
// weights' views, norms, the decoder layer, embeddings and the loss are model.cc.
#include "backend/model/model.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <torch/torch.h>

#include "costmodel/input_error.h"

namespace oom::backend {

namespace {

// transformers' DeepseekV3TopkRouter: FP32 sigmoid scores; the experts chosen on the scores plus
// the selection bias (no gradient) within the best topk_groups groups (a group's score: the sum of
// its two best); the weights are the chosen experts' scores, renormalized (+1e-20) where
// norm_topk_prob, × routed_scaling.
Routing route_sigmoid(const at::Tensor& x2d, const at::Tensor& router_weight, const at::Tensor& bias, const MoeSpec& moe) {
  const auto scores = at::sigmoid(at::linear(x2d.to(at::kFloat), router_weight.to(at::kFloat)));  // [T, E]
  at::Tensor ids;
  {
    at::NoGradGuard no_grad;
    auto choice = bias.defined() ? scores.detach() + bias.detach().to(at::kFloat) : scores.detach();
    if (moe.groups > 1) {
      const std::int64_t T = choice.size(0), per = moe.experts / moe.groups;
      const auto group_scores = std::get<0>(choice.view({T, moe.groups, per}).topk(std::min<std::int64_t>(2, per), -1)).sum(-1);
      const auto group_idx = std::get<1>(at::topk(group_scores, moe.topk_groups, -1, /*largest=*/true, /*sorted=*/false));
      const auto kept = at::zeros_like(group_scores).scatter_(1, group_idx, 1.0).unsqueeze(-1).expand({T, moe.groups, per}).reshape({T, moe.experts});
      choice = choice.masked_fill(kept == 0, -std::numeric_limits<float>::infinity());
    }
    ids = std::get<1>(at::topk(choice, moe.top_k, -1, /*largest=*/true, /*sorted=*/true));
  }
  auto weights = scores.gather(1, ids);
  if (moe.norm_topk_prob) weights = weights / (weights.sum({-1}, true) + 1e-20);
  if (moe.routed_scaling != 1.0) weights = weights * moe.routed_scaling;
  return {ids, weights, scores};
}

}  // namespace

Routing route(const at::Tensor& x2d, const at::Tensor& router_weight, const MoeSpec& moe, const at::Tensor& bias) {
  if (moe.scoring == "sigmoid") return route_sigmoid(x2d, router_weight, bias, moe);
  const auto probs = at::softmax(at::linear(x2d, router_weight).to(at::kFloat), -1);
  auto [weights, ids] = at::topk(probs, moe.top_k, -1, /*largest=*/true, /*sorted=*/true);
  if (moe.norm_topk_prob) weights = weights / weights.sum({-1}, true);
  return {ids, weights, probs};
}

Routing route_layer(const at::Tensor& router_in, const BlockWeights& w, const ModelSpec& spec) {
  if (!w.has("router")) {
    // A dense layer: no expert takes a token.
    const auto T = router_in.size(0);
    return {at::empty({T, 0}, router_in.options().dtype(at::kLong)), at::empty({T, 0}, router_in.options().dtype(at::kFloat)),
            at::empty({T, 0}, router_in.options().dtype(at::kFloat))};
  }
  if (!spec.gemma4()) return route(router_in, w["router"], spec.moe, w.has("router.bias") ? w["router.bias"] : at::Tensor());
  // transformers' Gemma4TextRouter.
  const auto xs = rms_norm(router_in, at::Tensor(), spec.norm_eps) * w["router.scale"] *
                  (1.0 / std::sqrt(static_cast<double>(spec.hidden)));
  MoeSpec moe = spec.moe;
  moe.norm_topk_prob = true;  // Gemma 4 always renormalizes the top-k probabilities
  Routing r = route(xs, w["router"], moe);
  r.weights = r.weights *
              w["router.expert_scale"].to(at::kFloat).index_select(0, r.expert_ids.reshape({-1})).view(r.expert_ids.sizes());
  return r;
}

at::Tensor gated_mlp(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& up, const at::Tensor& down,
                     const std::string& activation) {
  const auto g = at::linear(x, gate);
  const auto u = at::linear(x, up);
  // The gated activation as a fused kernel keeps it: its two inputs, not the activation as well.
  const auto gated = lean_kernel(
      [activation](const std::vector<at::Tensor>& in) { return std::vector<at::Tensor>{gated_activation(in[0], in[1], activation)}; },
      {g, u})[0];
  return at::linear(gated, down);
}

bool is_gelu(const std::string& activation) { return activation.rfind("gelu", 0) == 0; }

at::Tensor gated_activation(const at::Tensor& g, const at::Tensor& u, const std::string& activation) {
  return (is_gelu(activation) ? at::gelu(g, "tanh") : at::silu(g)) * u;
}

void RouterStats::add(const Routing& routing, int experts) {
  const auto counts = at::bincount(routing.expert_ids.reshape({-1}), {}, experts).to(at::kFloat);
  const auto sums = routing.probs.sum(0);
  slot_counts = slot_counts.defined() ? slot_counts + counts : counts;
  prob_sums = prob_sums.defined() ? prob_sums + sums : sums;
  rows += routing.probs.size(0);
}

void RouterStats::add_detached(const RouterStats& other) {
  at::NoGradGuard no_grad;
  slot_counts = slot_counts.defined() ? slot_counts + other.slot_counts : other.slot_counts;
  prob_sums = prob_sums.defined() ? prob_sums + other.prob_sums.detach() : other.prob_sums.detach();
  rows += other.rows;
}

at::Tensor router_aux_loss(const RouterStats& stats, int experts) {
  OOM_ASSERT(stats.rows > 0, "router statistics of no tokens");
  const double rows = static_cast<double>(stats.rows);
  return (stats.slot_counts / rows * (stats.prob_sums / rows)).sum() * static_cast<double>(experts);
}

at::Tensor routed_experts(const at::Tensor& x2, const Routing& r, const BlockWeights& w, const ModelSpec& spec) {
  const MoeSpec& m = spec.moe;
  auto out = at::zeros_like(x2);
  // Dispatch: the (token, slot) pairs of each expert, sorted by expert, one gather per expert.
  const auto flat_ids = r.expert_ids.reshape({-1});
  const auto order = std::get<1>(at::sort(flat_ids, /*stable=*/true, 0, false));
  const auto counts = at::bincount(flat_ids, {}, m.experts).to(at::kCPU);
  const auto* count = counts.data_ptr<std::int64_t>();
  const auto tokens_sorted = at::div(order, m.top_k, "floor");
  const auto weights_sorted = r.weights.reshape({-1}).index_select(0, order);
  std::int64_t start = 0;
  for (int e = 0; e < m.experts; ++e) {
    const auto n = count[e];
    if (n == 0) continue;
    const auto tok = tokens_sorted.narrow(0, start, n);
    const auto ye = gated_mlp(x2.index_select(0, tok), w.expert("experts.gate", e), w.expert("experts.up", e),
                              w.expert("experts.down", e), spec.activation);
    out = lean_index_add(out, tok, ye * weights_sorted.narrow(0, start, n).unsqueeze(1).to(ye.scalar_type()));
    start += n;
  }
  return out;
}

at::Tensor moe_ffn(const at::Tensor& x, const BlockWeights& w, const ModelSpec& spec, RouterStats* stats) {
  OOM_ASSERT(!spec.gemma4(), "Gemma 4's feed-forward half is ffn_half");
  const MoeSpec& m = spec.moe;
  const auto shape = x.sizes().vec();
  const auto x2 = x.reshape({-1, x.size(-1)});
  // Each branch the layer's weights have: routed experts (none in a dense layer), the shared
  // expert (gated or not), the dense MLP.
  at::Tensor out;
  const auto add = [&out](const at::Tensor& t) { out = out.defined() ? out + t : t; };
  if (w.has("router")) {
    const auto r = route_layer(x2, w, spec);
    if (stats != nullptr) stats->add(r, m.experts);
    add(routed_experts(x2, r, w, spec));
  }
  if (w.has("shared.gate")) {
    const auto s = gated_mlp(x2, w["shared.gate"], w["shared.up"], w["shared.down"], spec.activation);
    add(w.has("shared.expert_gate") ? at::sigmoid(at::linear(x2, w["shared.expert_gate"])) * s : s);
  }
  if (w.has("dense.gate")) add(gated_mlp(x2, w["dense.gate"], w["dense.up"], w["dense.down"], spec.activation));
  return out.view(shape);
}

at::Tensor post_mixing(const at::Tensor& mixed, const BlockWeights& w, const ModelSpec& spec) {
  return spec.gemma4() ? model_norm(mixed, w["attn.post_norm"], spec) : mixed;
}

FfnInputs ffn_inputs(const at::Tensor& a2d, const BlockWeights& w, const ModelSpec& spec) {
  if (!spec.gemma4()) {
    const auto xn = model_norm(a2d, w["post_norm"], spec);
    return {xn, xn, xn};
  }
  return {a2d, model_norm(a2d, w["moe.pre_norm"], spec), model_norm(a2d, w["dense.pre_norm"], spec)};
}

at::Tensor ffn_output(const at::Tensor& a, const at::Tensor& routed, const at::Tensor& shared, const at::Tensor& dense,
                      const BlockWeights& w, const ModelSpec& spec) {
  if (!spec.gemma4()) {
    auto out = routed;
    if (shared.defined()) out = out + shared;
    if (dense.defined()) out = out + dense;
    return a + out;
  }
  OOM_ASSERT(dense.defined() && !shared.defined(), "Gemma 4 layers have a dense MLP and no shared expert");
  const auto f = model_norm(dense, w["dense.post_norm"], spec) + model_norm(routed, w["moe.post_norm"], spec);
  return (a + model_norm(f, w["ffn.post_norm"], spec)) * w["layer_scalar"].detach().to(a.scalar_type());
}

at::Tensor ffn_half(const at::Tensor& a, const BlockWeights& w, const ModelSpec& spec, RouterStats* stats) {
  if (!spec.gemma4()) return a + moe_ffn(model_norm(a, w["post_norm"], spec), w, spec, stats);
  const auto a2 = a.reshape({-1, a.size(-1)});
  const auto in = ffn_inputs(a2, w, spec);
  const auto r = route_layer(in.router, w, spec);
  if (stats != nullptr) stats->add(r, spec.moe.experts);
  const auto routed = routed_experts(in.experts, r, w, spec);
  const auto dense = gated_mlp(in.dense, w["dense.gate"], w["dense.up"], w["dense.down"], spec.activation);
  return ffn_output(a2, routed, at::Tensor(), dense, w, spec).view(a.sizes());
}

}  // namespace oom::backend
