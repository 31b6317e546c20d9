#include "tests/backend/reference_ops.h"

#include <unistd.h>

#include <cmath>
#include <limits>

namespace oom::backend::testing {

double rel_diff(const at::Tensor& a, const at::Tensor& b) {
  const auto af = a.detach().to(at::kDouble), bf = b.detach().to(at::kDouble);
  const double scale = std::max(bf.abs().max().item<double>(), 1e-30);
  return (af - bf).abs().max().item<double>() / scale;
}

double rel_l2(const at::Tensor& a, const at::Tensor& b) {
  const auto ad = a.to(at::kDouble), bd = b.to(at::kDouble);
  return (ad - bd).norm().item<double>() / std::max(bd.norm().item<double>(), 1e-30);
}

std::filesystem::path scratch_dir(const std::string& prefix, const std::string& tag) {
  auto dir = std::filesystem::temp_directory_path() / (prefix + "-" + tag + "-" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

AttentionOutput reference_attention(const at::Tensor& q, const at::Tensor& k_in, const at::Tensor& v_in,
                                    std::int64_t window) {
  const auto H = q.size(1), S = q.size(2), d = q.size(3), group = H / k_in.size(1);
  const auto k = k_in.repeat_interleave(group, 1).to(at::kFloat), v = v_in.repeat_interleave(group, 1).to(at::kFloat);
  auto scores = at::matmul(q.to(at::kFloat), k.transpose(-1, -2)) / std::sqrt(static_cast<double>(d));
  auto mask = at::ones({S, S}, at::kBool).tril();
  if (window > 0) mask = mask & at::ones({S, S}, at::kBool).triu(-(window - 1));
  scores = scores.masked_fill(mask.logical_not(), -std::numeric_limits<float>::infinity());
  return {at::matmul(at::softmax(scores, -1), v), at::logsumexp(scores, {-1})};
}

at::Tensor reference_gdn_recurrent(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
                                   const at::Tensor& beta, at::Tensor& state) {
  std::vector<at::Tensor> outs;
  for (std::int64_t t = 0; t < q.size(2); ++t) {
    const auto qt = q.select(2, t), kt = k.select(2, t), vt = v.select(2, t);  // [B, H, d]
    state = state * g.select(2, t).exp().unsqueeze(-1).unsqueeze(-1);
    const auto kv = at::matmul(kt.unsqueeze(-2), state).squeeze(-2);        // Sᵀk [B, H, dv]
    const auto delta = (vt - kv) * beta.select(2, t).unsqueeze(-1);
    state = state + at::matmul(kt.unsqueeze(-1), delta.unsqueeze(-2));
    outs.push_back(at::matmul(qt.unsqueeze(-2), state).squeeze(-2));
  }
  return at::stack(outs, 2);
}

at::Tensor reference_gdn_mixing(const at::Tensor& x, const BlockWeights& w, const ModelSpec& spec) {
  const GdnSpec& g = spec.gdn;
  const auto B = x.size(0), S = x.size(1);
  const std::int64_t kd = g.key_dim(), vd = g.value_dim(), Hk = g.key_heads, Hv = g.value_heads;
  const std::int64_t dk = g.key_head_dim, dv = g.value_head_dim, K = g.conv_kernel, conv_dim = 2 * kd + vd;
  const auto qkvz = at::linear(x, w["gdn.in_proj_qkvz"]);
  const auto ba = at::linear(x, w["gdn.in_proj_ba"]);
  const auto pre = qkvz.narrow(-1, 0, conv_dim);  // [B, S, conv_dim]
  const auto& cw = w["gdn.conv"];                 // [conv_dim, K]
  std::vector<at::Tensor> conv_steps;
  for (std::int64_t t = 0; t < S; ++t) {
    auto acc = at::zeros({B, conv_dim}, x.options());
    for (std::int64_t j = 0; j < K; ++j) {
      const auto src = t - (K - 1) + j;
      if (src >= 0) acc = acc + pre.select(1, src) * cw.select(1, j);
    }
    conv_steps.push_back(at::silu(acc));
  }
  const auto conv = at::stack(conv_steps, 1);
  auto q = conv.narrow(-1, 0, kd).reshape({B, S, Hk, dk}).repeat_interleave(Hv / Hk, 2);
  auto k = conv.narrow(-1, kd, kd).reshape({B, S, Hk, dk}).repeat_interleave(Hv / Hk, 2);
  const auto v = conv.narrow(-1, 2 * kd, vd).reshape({B, S, Hv, dv}).transpose(1, 2);
  q = (q / (q.pow(2).sum({-1}, true) + 1e-6).sqrt()).transpose(1, 2) / std::sqrt(static_cast<double>(dk));
  k = (k / (k.pow(2).sum({-1}, true) + 1e-6).sqrt()).transpose(1, 2);
  const auto beta = at::sigmoid(ba.narrow(-1, 0, Hv)).transpose(1, 2);
  const auto gg = (-w["gdn.A_log"].exp() * at::softplus(ba.narrow(-1, Hv, Hv) + w["gdn.dt_bias"])).transpose(1, 2);
  auto state = at::zeros({B, Hv, dk, dv}, x.options());
  const auto o = reference_gdn_recurrent(q, k, v, gg, beta, state).transpose(1, 2);  // [B, S, Hv, dv]
  const auto z = qkvz.narrow(-1, conv_dim, vd).reshape({B, S, Hv, dv});
  const auto normed = o / (o.pow(2).mean({-1}, true) + kNormEps).sqrt() * w["gdn.norm"];
  return at::linear((normed * at::silu(z)).reshape({B, S, vd}), w["gdn.out_proj"]);
}

at::Tensor reference_moe(const at::Tensor& x, const BlockWeights& w, const ModelSpec& spec) {
  const MoeSpec& m = spec.moe;
  const auto x2 = x.reshape({-1, x.size(-1)});
  const auto T = x2.size(0);
  // Dense gates: the softmax restricted to the k largest per row (found by a full sort).
  const auto probs = at::softmax(at::linear(x2, w["router"]), -1);
  const auto chosen = std::get<1>(probs.detach().sort(-1, /*descending=*/true)).narrow(-1, 0, m.top_k);
  const auto selected = at::zeros({T, m.experts}, x.options().dtype(at::kBool)).scatter(1, chosen, true);
  auto dense_gates = probs * selected;
  if (m.norm_topk_prob) dense_gates = dense_gates / dense_gates.sum({-1}, true);
  auto out = at::zeros_like(x2);
  for (int e = 0; e < m.experts; ++e) {
    const auto y = gated_mlp(x2, w["experts.gate"][e], w["experts.up"][e], w["experts.down"][e], spec.activation);
    out = out + dense_gates.select(1, e).unsqueeze(1) * y;
  }
  if (m.shared_expert_intermediate > 0) {
    out = out + at::sigmoid(at::linear(x2, w["shared.expert_gate"])) *
                    gated_mlp(x2, w["shared.gate"], w["shared.up"], w["shared.down"], spec.activation);
  }
  if (m.dense_intermediate > 0) out = out + gated_mlp(x2, w["dense.gate"], w["dense.up"], w["dense.down"], spec.activation);
  return out.view(x.sizes());
}

ReferenceGradients reference_gradients(const HostState& state, const at::Tensor& tokens, const at::Tensor& targets,
                                       const ModelOptions& options) {
  std::vector<at::Tensor> flats;
  std::vector<BlockWeights> weights;
  for (int b = 0; b < state.blocks(); ++b) {
    flats.push_back(state.master(b).clone().requires_grad_(true));
    weights.push_back(block_views(state.layout().blocks[static_cast<std::size_t>(b)], flats.back()));
  }
  const auto loss = model_loss(tokens, targets, weights, state.spec(), options);
  loss.backward();
  ReferenceGradients r;
  r.loss = loss.item<double>();
  double sq = 0.0;
  for (const auto& f : flats) {
    sq += f.grad().to(at::kDouble).pow(2).sum().item<double>();
    r.blocks.push_back(f.grad());
  }
  r.norm = std::sqrt(sq);
  return r;
}

}  // namespace oom::backend::testing
