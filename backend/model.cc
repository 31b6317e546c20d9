#include "backend/model.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "costmodel/input_error.h"

namespace oom::backend {

const at::Tensor& BlockWeights::operator[](const std::string& name) const {
  for (std::size_t i = 0; i < layout->entries.size(); ++i) {
    if (layout->entries[i].name == name) return tensors[i];
  }
  OOM_ASSERT(false, ("no weight named " + name + " in " + layout->name).c_str());
}

BlockWeights block_views(const BlockLayout& layout, const at::Tensor& flat) {
  OOM_ASSERT(flat.dim() == 1 && flat.numel() == layout.numel, "flat buffer does not match its layout");
  BlockWeights w{&layout, {}};
  w.tensors.reserve(layout.entries.size());
  for (const auto& e : layout.entries) w.tensors.push_back(flat.narrow(0, e.offset, e.numel()).view(e.shape));
  return w;
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  const auto xf = x.to(at::kFloat);
  const auto y = xf * at::rsqrt(xf.pow(2).mean({-1}, /*keepdim=*/true) + eps);
  return (y * weight.to(at::kFloat)).to(x.scalar_type());
}

std::int64_t rotary_dims(const ModelSpec& spec, std::int64_t head_dim) {
  auto r = static_cast<std::int64_t>(std::floor(static_cast<double>(head_dim) * spec.partial_rotary_factor));
  return r - r % 2;
}

at::Tensor apply_rope(const at::Tensor& x, std::int64_t rot, double theta) {
  if (rot <= 0) return x;
  const auto S = x.size(1);
  const auto opts = x.options().dtype(at::kFloat);
  const auto inv_freq = at::pow(theta, at::arange(0, rot, 2, opts) / static_cast<double>(rot)).reciprocal();
  const auto angles = at::outer(at::arange(S, opts), inv_freq);        // [S, rot/2]
  const auto emb = at::cat({angles, angles}, -1).view({1, S, 1, rot});  // [1, S, 1, rot]
  const auto cos = emb.cos(), sin = emb.sin();
  const auto xr = x.narrow(-1, 0, rot).to(at::kFloat);
  const auto x1 = xr.narrow(-1, 0, rot / 2), x2 = xr.narrow(-1, rot / 2, rot / 2);
  const auto rotated = (xr * cos + at::cat({-x2, x1}, -1) * sin).to(x.scalar_type());
  if (rot == x.size(-1)) return rotated;
  return at::cat({rotated, x.narrow(-1, rot, x.size(-1) - rot)}, -1);
}

AttentionOutput attention_core(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
                               std::int64_t window, std::int64_t query_block) {
  const auto H = q_in.size(1), S = q_in.size(2), d = q_in.size(3);
  const auto group = H / k_in.size(1);
  OOM_ASSERT(group * k_in.size(1) == H, "query heads must be a multiple of KV heads");
  const auto q = q_in.to(at::kFloat);
  const auto k = (group == 1 ? k_in : k_in.repeat_interleave(group, 1)).to(at::kFloat);
  const auto v = (group == 1 ? v_in : v_in.repeat_interleave(group, 1)).to(at::kFloat);
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  const auto block = std::max<std::int64_t>(1, query_block);
  const auto idx_opts = q.options().dtype(at::kLong);
  std::vector<at::Tensor> outs, lses;
  for (std::int64_t s0 = 0; s0 < S; s0 += block) {
    const auto s1 = std::min(S, s0 + block);
    const auto lo = window > 0 ? std::max<std::int64_t>(0, s0 - window + 1) : 0;
    const auto qb = q.narrow(2, s0, s1 - s0);
    const auto kb = k.narrow(2, lo, s1 - lo), vb = v.narrow(2, lo, s1 - lo);
    const auto qi = at::arange(s0, s1, idx_opts).unsqueeze(1);
    const auto kj = at::arange(lo, s1, idx_opts).unsqueeze(0);
    auto allowed = kj <= qi;
    if (window > 0) allowed = allowed & (qi - kj < window);
    const auto scores = at::matmul(qb, kb.transpose(-1, -2)).mul(scale).masked_fill(allowed.logical_not(),
                                                                                    -std::numeric_limits<float>::infinity());
    const auto lse = at::logsumexp(scores, {-1});                       // [B, H, blk]
    outs.push_back(at::matmul(at::exp(scores - lse.unsqueeze(-1)), vb));  // [B, H, blk, d]
    lses.push_back(lse);
  }
  return {at::cat(outs, 2), at::cat(lses, 2)};
}

at::Tensor attention_mixing(const at::Tensor& x, const BlockWeights& w, const ModelSpec& spec, LayerKind kind,
                            const ModelOptions& opt, at::Tensor* lse_out) {
  const AttentionSpec& a = spec.attention(kind);
  const std::int64_t B = x.size(0), S = x.size(1), H = a.heads, Hkv = a.kv_heads, d = a.head_dim;
  auto q_all = at::linear(x, w["attn.q_proj"]).view({B, S, H, a.output_gate ? 2 * d : d});
  at::Tensor q = q_all, gate;
  if (a.output_gate) {
    q = q_all.narrow(-1, 0, d);
    gate = q_all.narrow(-1, d, d);
  }
  auto k = at::linear(x, w["attn.k_proj"]).view({B, S, Hkv, d});
  const auto v = a.k_eq_v ? k : at::linear(x, w["attn.v_proj"]).view({B, S, Hkv, d});
  if (a.qk_norm) {
    q = rms_norm(q, w["attn.q_norm"]);
    k = rms_norm(k, w["attn.k_norm"]);
  }
  const auto rot = rotary_dims(spec, d);
  q = apply_rope(q, rot, spec.rope_theta);
  k = apply_rope(k, rot, spec.rope_theta);
  const auto r = attention_core(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), a.window_tokens,
                                opt.attention_query_block);
  if (lse_out != nullptr) *lse_out = r.lse;
  auto o = r.out.transpose(1, 2).to(x.scalar_type());  // [B, S, H, d]
  if (a.output_gate) o = o * at::sigmoid(gate);
  return at::linear(o.reshape({B, S, H * d}), w["attn.o_proj"]);
}

at::Tensor gdn_chunk(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
                     const at::Tensor& beta, at::Tensor& state) {
  const auto C = q.size(2);
  const auto opts = q.options();
  const auto gc = g.cumsum(-1);                                                           // [B, H, C]
  const auto decay = (gc.unsqueeze(-1) - gc.unsqueeze(-2)).tril().exp().tril();           // Γ_ij, i ≥ j
  const auto kb = k * beta.unsqueeze(-1);
  const auto vb = v * beta.unsqueeze(-1);
  const auto strict = (at::matmul(kb, k.transpose(-1, -2)) * decay).tril(-1);             // L
  const auto eye = at::eye(C, opts).expand_as(strict);
  // T = (I + L)⁻¹ by a unit lower-triangular solve (the UT transform of the WY form).
  const auto T = at::linalg_solve_triangular(strict + eye, eye, /*upper=*/false, /*left=*/true,
                                             /*unitriangular=*/true);
  const auto u = at::matmul(T, vb);                                                        // [B, H, C, dv]
  const auto wk = at::matmul(T, kb * gc.exp().unsqueeze(-1));                             // [B, H, C, dk]
  const auto v_new = u - at::matmul(wk, state);
  const auto intra = (at::matmul(q, k.transpose(-1, -2)) * decay).tril();
  const auto out = at::matmul(q * gc.exp().unsqueeze(-1), state) + at::matmul(intra, v_new);
  const auto g_last = gc.narrow(-1, C - 1, 1);                                            // [B, H, 1]
  const auto k_decayed = k * (g_last - gc).exp().unsqueeze(-1);
  state = state * g_last.exp().unsqueeze(-1) + at::matmul(k_decayed.transpose(-1, -2), v_new);
  return out;
}

namespace {

at::Tensor l2_normalize(const at::Tensor& x) { return x * at::rsqrt(x.pow(2).sum({-1}, true) + 1e-6); }

}  // namespace

at::Tensor gdn_mixing(const at::Tensor& x, const BlockWeights& w, const ModelSpec& spec, const ModelOptions& opt) {
  const GdnSpec& g = spec.gdn;
  const auto B = x.size(0), S = x.size(1);
  const std::int64_t kd = g.key_dim(), vd = g.value_dim(), Hk = g.key_heads, Hv = g.value_heads;
  const std::int64_t dk = g.key_head_dim, dv = g.value_head_dim, K = g.conv_kernel, conv_dim = 2 * kd + vd;
  const auto qkvz = at::linear(x, w["gdn.in_proj_qkvz"]);  // [B, S, 2kd + 2vd]
  const auto ba = at::linear(x, w["gdn.in_proj_ba"]);      // [B, S, 2Hv]
  const auto qkv_pre = qkvz.narrow(-1, 0, conv_dim).transpose(1, 2).to(at::kFloat);  // [B, conv_dim, S]
  const auto z = qkvz.narrow(-1, conv_dim, vd).reshape({B, S, Hv, dv});
  const auto beta_all = at::sigmoid(ba.narrow(-1, 0, Hv).to(at::kFloat)).transpose(1, 2);  // [B, Hv, S]
  const auto a = ba.narrow(-1, Hv, Hv).to(at::kFloat) + w["gdn.dt_bias"].to(at::kFloat);
  const auto g_all = (-at::exp(w["gdn.A_log"].to(at::kFloat)) * at::softplus(a)).transpose(1, 2);  // [B, Hv, S]
  const auto conv_w = w["gdn.conv"].to(at::kFloat).unsqueeze(1);  // [conv_dim, 1, K]

  const auto chunk = std::max<std::int64_t>(1, opt.gdn_chunk_tokens);
  const double q_scale = 1.0 / std::sqrt(static_cast<double>(dk));
  GdnState st{at::zeros({B, Hv, dk, dv}, x.options().dtype(at::kFloat)),
              at::zeros({B, conv_dim, K - 1}, x.options().dtype(at::kFloat))};
  std::vector<at::Tensor> outs;
  for (std::int64_t s0 = 0; s0 < S; s0 += chunk) {
    const auto C = std::min(chunk, S - s0);
    // Causal depthwise conv over [left context | chunk], then SiLU.
    const auto with_ctx = at::cat({st.conv_context, qkv_pre.narrow(2, s0, C)}, 2);  // [B, conv_dim, K-1+C]
    st.conv_context = with_ctx.narrow(2, C, K - 1);
    const auto conv = at::silu(at::conv1d(with_ctx, conv_w, at::Tensor(), at::IntArrayRef{1}, at::IntArrayRef{0}, at::IntArrayRef{1}, conv_dim)).transpose(1, 2);  // [B, C, conv_dim]
    auto q = conv.narrow(-1, 0, kd).reshape({B, C, Hk, dk});
    auto k = conv.narrow(-1, kd, kd).reshape({B, C, Hk, dk});
    const auto v = conv.narrow(-1, 2 * kd, vd).reshape({B, C, Hv, dv}).transpose(1, 2);
    if (Hv != Hk) {
      q = q.repeat_interleave(Hv / Hk, 2);
      k = k.repeat_interleave(Hv / Hk, 2);
    }
    q = l2_normalize(q).transpose(1, 2) * q_scale;  // [B, Hv, C, dk]
    k = l2_normalize(k).transpose(1, 2);
    outs.push_back(gdn_chunk(q, k, v, g_all.narrow(2, s0, C), beta_all.narrow(2, s0, C), st.recurrent));
  }
  const auto o = at::cat(outs, 2).transpose(1, 2);  // [B, S, Hv, dv] FP32
  const auto gated = rms_norm(o, w["gdn.norm"]) * at::silu(z.to(at::kFloat));
  return at::linear(gated.reshape({B, S, vd}).to(x.scalar_type()), w["gdn.out_proj"]);
}

Routing route(const at::Tensor& x2d, const at::Tensor& router_weight, const MoeSpec& moe) {
  const auto probs = at::softmax(at::linear(x2d, router_weight).to(at::kFloat), -1);
  auto [weights, ids] = at::topk(probs, moe.top_k, -1, /*largest=*/true, /*sorted=*/true);
  if (moe.norm_topk_prob) weights = weights / weights.sum({-1}, true);
  return {ids, weights};
}

at::Tensor gated_mlp(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& up, const at::Tensor& down,
                     const std::string& activation) {
  const auto g = at::linear(x, gate);
  const auto act = activation.rfind("gelu", 0) == 0 ? at::gelu(g, "tanh") : at::silu(g);
  return at::linear(act * at::linear(x, up), down);
}

at::Tensor moe_ffn(const at::Tensor& x, const BlockWeights& w, const ModelSpec& spec) {
  const MoeSpec& m = spec.moe;
  const auto shape = x.sizes().vec();
  const auto x2 = x.reshape({-1, x.size(-1)});
  const auto r = route(x2, w["router"], m);
  const auto& eg = w["experts.gate"];
  const auto& eu = w["experts.up"];
  const auto& ed = w["experts.down"];
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
    const auto ye = gated_mlp(x2.index_select(0, tok), eg[e], eu[e], ed[e], spec.activation);
    out = out.index_add(0, tok, ye * weights_sorted.narrow(0, start, n).unsqueeze(1).to(ye.scalar_type()));
    start += n;
  }
  if (m.shared_expert_intermediate > 0) {
    const auto s = gated_mlp(x2, w["shared.gate"], w["shared.up"], w["shared.down"], spec.activation);
    out = out + at::sigmoid(at::linear(x2, w["shared.expert_gate"])) * s;
  }
  if (m.dense_intermediate > 0) out = out + gated_mlp(x2, w["dense.gate"], w["dense.up"], w["dense.down"], spec.activation);
  return out.view(shape);
}

at::Tensor decoder_layer(const at::Tensor& x, const BlockWeights& w, const ModelSpec& spec, int layer,
                         const ModelOptions& opt) {
  const LayerKind kind = spec.layer_kinds[static_cast<std::size_t>(layer)];
  const auto xn = rms_norm(x, w["input_norm"]);
  const auto mixed = kind == LayerKind::kLinearAttention ? gdn_mixing(xn, w, spec, opt)
                                                         : attention_mixing(xn, w, spec, kind, opt);
  const auto h = x + mixed;
  return h + moe_ffn(rms_norm(h, w["post_norm"]), w, spec);
}

at::Tensor embed(const at::Tensor& tokens, const BlockWeights& outer) { return at::embedding(outer["embed"], tokens); }

at::Tensor head_loss(const at::Tensor& x, const at::Tensor& targets, const BlockWeights& outer, const ModelSpec& spec) {
  const auto xn = rms_norm(x, outer["final_norm"]);
  const auto& head = spec.tied_embeddings ? outer["embed"] : outer["lm_head"];
  auto logits = at::linear(xn, head).to(at::kFloat);
  if (spec.final_logit_softcap > 0) logits = at::tanh(logits / spec.final_logit_softcap) * spec.final_logit_softcap;
  return at::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}));
}

at::Tensor model_loss(const at::Tensor& tokens, const at::Tensor& targets, const std::vector<BlockWeights>& weights,
                      const ModelSpec& spec, const ModelOptions& opt) {
  OOM_ASSERT(static_cast<int>(weights.size()) == spec.layers + 1, "one weight block per layer plus the outer block");
  auto x = embed(tokens, weights[0]);
  for (int l = 0; l < spec.layers; ++l) x = decoder_layer(x, weights[1 + l], spec, l, opt);
  return head_loss(x, targets, weights[0], spec);
}

}  // namespace oom::backend
