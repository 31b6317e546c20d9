#include "backend/model/model.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <torch/torch.h>

#include "backend/runtime/device_memory.h"
#include "costmodel/input_error.h"

namespace oom::backend {

const at::Tensor& BlockWeights::operator[](const std::string& name) const {
  for (std::size_t i = 0; i < layout->entries.size(); ++i) {
    if (layout->entries[i].name == name) return tensors[i];
  }
  OOM_ASSERT(false, ("no weight named " + name + " in " + layout->name).c_str());
}

at::Tensor BlockWeights::expert(const std::string& name, int e) const {
  const auto bank = experts.find(name);
  return bank != experts.end() ? bank->second.at(static_cast<std::size_t>(e)) : (*this)[name][e];
}

BlockWeights block_views(const BlockLayout& layout, const at::Tensor& flat) {
  OOM_ASSERT(flat.dim() == 1 && flat.numel() == layout.numel, "flat buffer does not match its layout");
  BlockWeights w{&layout, {}, {}};
  w.tensors.reserve(layout.entries.size());
  for (const auto& e : layout.entries) w.tensors.push_back(flat.narrow(0, e.offset, e.numel()).view(e.shape));
  return w;
}

namespace {

// The norm's output in x's dtype and its FP32 1/rms [.., 1].
struct NormParts {
  at::Tensor out, r;
};
NormParts rms_norm_parts(const at::Tensor& x, const at::Tensor& weight, double eps) {
  const auto xf = x.to(at::kFloat);
  const auto r = at::rsqrt(xf.pow(2).mean({-1}, /*keepdim=*/true) + eps);
  const auto y = xf * r;
  return {(weight.defined() ? y * weight.to(at::kFloat) : y).to(x.scalar_type()), r};
}

at::Tensor rms_norm_ops(const at::Tensor& x, const at::Tensor& weight, double eps) { return rms_norm_parts(x, weight, eps).out; }

// The scale model_norm applies: w, or 1 + w in FP32 where spec.zero_centered_norm().
at::Tensor model_norm_scale(const at::Tensor& weight, const ModelSpec& spec) {
  return spec.zero_centered_norm() ? weight.to(at::kFloat) + 1.0 : weight;
}

}  // namespace

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  const auto norm = [eps](const std::vector<at::Tensor>& in) {
    return std::vector<at::Tensor>{rms_norm_ops(in[0], in.size() > 1 ? in[1] : at::Tensor(), eps)};
  };
  return lean_kernel(norm, weight.defined() ? std::vector<at::Tensor>{x, weight} : std::vector<at::Tensor>{x})[0];
}

at::Tensor model_norm(const at::Tensor& x, const at::Tensor& weight, const ModelSpec& spec) {
  return rms_norm(x, model_norm_scale(weight, spec), spec.norm_eps);
}

namespace {

// y = x̂ · w, x̂ = x · r, r = (mean(x²) + eps)^-1/2. Backward from y and r alone: x̂ = y / w,
// dx = r · (g − x̂ · mean(g · x̂)) with g = dy · w, dw = Σ dy · x̂ over the rows.
class NormKeepingOutput : public torch::autograd::Function<NormKeepingOutput> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight, double eps) {
    NormParts n = rms_norm_parts(x, weight, eps);
    ctx->save_for_backward({n.out, n.r, weight});
    return n.out;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx, torch::autograd::variable_list grad_out) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &out = saved[0], &r = saved[1], &weight = saved[2];
    const at::Tensor& dy = grad_out[0];
    if (!dy.defined()) return {at::Tensor(), at::Tensor(), at::Tensor()};
    const auto w = weight.defined() ? weight.to(at::kFloat) : at::Tensor();
    const auto xhat = w.defined() ? out.to(at::kFloat) / w : out.to(at::kFloat);
    const auto g = w.defined() ? dy.to(at::kFloat) * w : dy.to(at::kFloat);
    const auto dx = (r * (g - xhat * (g * xhat).mean({-1}, /*keepdim=*/true))).to(out.scalar_type());
    at::Tensor dw;
    if (weight.defined() && ctx->needs_input_grad(1)) {
      dw = (dy.to(at::kFloat) * xhat).reshape({-1, xhat.size(-1)}).sum(0).to(weight.scalar_type());
    }
    return {dx, dw, at::Tensor()};
  }
};

}  // namespace

at::Tensor model_norm_keeping_output(const at::Tensor& x, const at::Tensor& weight, const ModelSpec& spec) {
  return NormKeepingOutput::apply(x, model_norm_scale(weight, spec), spec.norm_eps);
}

std::int64_t rotary_dims(const ModelSpec& spec, std::int64_t head_dim) {
  auto r = static_cast<std::int64_t>(std::floor(static_cast<double>(head_dim) * spec.partial_rotary_factor));
  return r - r % 2;
}

namespace {

at::Tensor default_inv_freq(double theta, std::int64_t rot, const at::TensorOptions& opts) {
  return at::pow(theta, at::arange(0, rot, 2, opts) / static_cast<double>(rot)).reciprocal();
}

at::Tensor rotate(const at::Tensor& x, std::int64_t rot, const at::Tensor& inv_freq, double attention_factor,
                  const at::Tensor& positions = {}) {
  if (rot <= 0) return x;
  const auto S = x.size(1);
  const auto opts = x.options().dtype(at::kFloat);
  const auto pos = positions.defined() ? positions.to(opts) : at::arange(S, opts);
  const auto angles = at::outer(pos, inv_freq);                         // [S, rot/2]
  const auto emb = at::cat({angles, angles}, -1).view({1, S, 1, rot});  // [1, S, 1, rot]
  auto cos = emb.cos(), sin = emb.sin();
  if (attention_factor != 1.0) {
    cos = cos * attention_factor;
    sin = sin * attention_factor;
  }
  const auto xr = x.narrow(-1, 0, rot).to(at::kFloat);
  const auto x1 = xr.narrow(-1, 0, rot / 2), x2 = xr.narrow(-1, rot / 2, rot / 2);
  const auto rotated = (xr * cos + at::cat({-x2, x1}, -1) * sin).to(x.scalar_type());
  if (rot == x.size(-1)) return rotated;
  return at::cat({rotated, x.narrow(-1, rot, x.size(-1) - rot)}, -1);
}

double yarn_mscale(double scale, double mscale) { return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0; }

}  // namespace

at::Tensor apply_rope(const at::Tensor& x, std::int64_t rot, double theta) {
  if (rot <= 0) return x;
  return rotate(x, rot, default_inv_freq(theta, rot, x.options().dtype(at::kFloat)), 1.0);
}

RopeFrequencies rope_frequencies(const ModelSpec& spec, std::int64_t head_dim, const at::TensorOptions& options) {
  const auto rot = rotary_dims(spec, head_dim);
  const auto opts = options.dtype(at::kFloat);
  const auto base = default_inv_freq(spec.rope_theta, rot, opts);
  const RopeScaling& y = spec.rope_scaling;
  if (y.type != "yarn" || rot <= 0) return {base, 1.0};
  // YaRN (as transformers' _compute_yarn_parameters): frequencies below the ramp are interpolated
  // (divided by the factor), those above it extrapolated (kept), a linear ramp between.
  double attention = y.attention_factor;
  if (attention <= 0) {
    attention = y.mscale > 0 && y.mscale_all_dim > 0 ? yarn_mscale(y.factor, y.mscale) / yarn_mscale(y.factor, y.mscale_all_dim)
                                                      : yarn_mscale(y.factor, 1.0);
  }
  const double dim = static_cast<double>(rot);
  const auto correction_dim = [&](double rotations) {
    return dim * std::log(static_cast<double>(y.original_max_position) / (rotations * 2 * M_PI)) / (2 * std::log(spec.rope_theta));
  };
  double low = correction_dim(y.beta_fast), high = correction_dim(y.beta_slow);
  if (y.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, dim - 1);
  if (low == high) high += 0.001;
  const auto ramp = ((at::arange(rot / 2, opts) - low) / (high - low)).clamp(0, 1);
  const auto extrapolation = 1 - ramp;
  const auto inv_freq = base / y.factor * (1 - extrapolation) + base * extrapolation;
  return {inv_freq, attention};
}

at::Tensor apply_rope(const at::Tensor& x, const ModelSpec& spec, std::int64_t head_dim, const at::Tensor& positions) {
  const auto rot = rotary_dims(spec, head_dim);
  if (rot <= 0) return x;
  const auto f = rope_frequencies(spec, head_dim, x.options());
  return rotate(x, rot, f.inv_freq, f.attention_factor, positions);
}

at::Tensor attention_rope(const at::Tensor& x, const ModelSpec& spec, LayerKind kind, const at::Tensor& positions) {
  const AttentionSpec& a = spec.attention(kind);
  const std::int64_t d = x.size(-1);
  if (a.rope_theta <= 0) return apply_rope(x, spec, d, positions);
  const auto opts = x.options().dtype(at::kFloat);
  if (!a.rope_proportional) return rotate(x, d, default_inv_freq(a.rope_theta, d, opts), 1.0, positions);
  // transformers' _compute_proportional_rope_parameters: int(factor · d // 2) rotating frequencies
  // θ^(−2i/d) (exponents over the whole head), zeros for the rest of the d/2 pairs (i, i + d/2).
  const auto angles = static_cast<std::int64_t>(std::floor(a.rope_partial_factor * static_cast<double>(d) / 2));
  const auto rotating = at::pow(a.rope_theta, at::arange(0, 2 * angles, 2, opts) / static_cast<double>(d)).reciprocal();
  return rotate(x, d, at::cat({rotating, at::zeros({d / 2 - angles}, opts)}), 1.0, positions);
}

double attention_scale(const ModelSpec& spec, const AttentionSpec& a) {
  if (spec.gemma4()) return 1.0;
  const double scale = 1.0 / std::sqrt(static_cast<double>(a.head_dim));
  // transformers' DeepseekV3Attention (yarn_apply_mscale): × mscale(factor, mscale_all_dim)² under YaRN.
  const RopeScaling& y = spec.rope_scaling;
  if (!a.latent() || y.type == "default" || y.mscale_all_dim == 0) return scale;
  const double m = yarn_mscale(y.factor, y.mscale_all_dim);
  return scale * m * m;
}

at::Tensor latent_rope(const at::Tensor& x, const ModelSpec& spec, const at::Tensor& positions) {
  const std::int64_t d = x.size(-1);
  const auto f = rope_frequencies(spec, d, x.options());
  const auto pairs = at::cat({x.slice(-1, 0, d, 2), x.slice(-1, 1, d, 2)}, -1);
  return rotate(pairs, rotary_dims(spec, d), f.inv_freq, f.attention_factor, positions);
}

LatentQkv latent_qkv(const at::Tensor& x, const BlockWeights& w, const ModelSpec& spec, const at::Tensor& positions) {
  const AttentionSpec& a = spec.latent_attention;
  const std::int64_t B = x.size(0), S = x.size(1), H = a.heads, dqk = a.head_dim, dr = a.rope_head_dim;
  const std::int64_t nope = dqk - dr, dv = a.value_dim(), r = a.kv_lora_rank;
  // The latent norms are DeepseekV3RMSNorm(rank) with its default eps (1e-6), not rms_norm_eps.
  const auto q = (a.q_lora_rank > 0 ? at::linear(rms_norm(at::linear(x, w["attn.q_a_proj"]), w["attn.q_a_layernorm"], kNormEps),
                                                 w["attn.q_b_proj"])
                                    : at::linear(x, w["attn.q_proj"]))
                     .view({B, S, H, dqk});
  const auto ckv = at::linear(x, w["attn.kv_a_proj_with_mqa"]);  // [B, S, r + dr]
  const auto kv = at::linear(rms_norm(ckv.narrow(-1, 0, r), w["attn.kv_a_layernorm"], kNormEps), w["attn.kv_b_proj"])
                      .view({B, S, H, nope + dv});
  const auto k_rot = latent_rope(ckv.narrow(-1, r, dr).reshape({B, S, 1, dr}), spec, positions).expand({B, S, H, dr});
  LatentQkv out;
  out.q = at::cat({q.narrow(-1, 0, nope), latent_rope(q.narrow(-1, nope, dr), spec, positions)}, -1);
  out.k = at::cat({kv.narrow(-1, 0, nope), k_rot}, -1);
  out.v = kv.narrow(-1, nope, dv);
  return out;
}

AttentionOutput attention_core(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
                               std::int64_t window, std::int64_t query_block, double scale_in, std::int64_t query0) {
  const auto H = q_in.size(1), S = q_in.size(2), d = q_in.size(3);
  const auto group = H / k_in.size(1);
  OOM_ASSERT(group * k_in.size(1) == H, "query heads must be a multiple of KV heads");
  OOM_ASSERT(k_in.size(2) >= query0 + S, "the keys reach the last query");
  const auto q = q_in.to(at::kFloat);
  const auto k = (group == 1 ? k_in : k_in.repeat_interleave(group, 1)).to(at::kFloat);
  const auto v = (group == 1 ? v_in : v_in.repeat_interleave(group, 1)).to(at::kFloat);
  const double scale = scale_in > 0 ? scale_in : 1.0 / std::sqrt(static_cast<double>(d));
  const auto block = std::max<std::int64_t>(1, query_block);
  const auto idx_opts = q.options().dtype(at::kLong);
  std::vector<at::Tensor> outs, lses;
  for (std::int64_t b0 = 0; b0 < S; b0 += block) {
    const auto b1 = std::min(S, b0 + block);
    const auto s0 = query0 + b0, s1 = query0 + b1;  // the block's places in the sequence
    const auto lo = window > 0 ? std::max<std::int64_t>(0, s0 - window + 1) : 0;
    // Queries s0..s1 over keys lo..s1 → {O block, LSE block}.
    const RecomputeFn attend = [=](const std::vector<at::Tensor>& x) -> std::vector<at::Tensor> {
      const auto qi = at::arange(s0, s1, idx_opts).unsqueeze(1);
      const auto kj = at::arange(lo, s1, idx_opts).unsqueeze(0);
      auto allowed = kj <= qi;
      if (window > 0) allowed = allowed & (qi - kj < window);
      const auto scores = at::matmul(x[0], x[1].transpose(-1, -2)).mul(scale).masked_fill(allowed.logical_not(),
                                                                                        -std::numeric_limits<float>::infinity());
      const auto lse = at::logsumexp(scores, {-1});                  // [B, H, blk]
      return {at::matmul(at::exp(scores - lse.unsqueeze(-1)), x[2]), lse};  // [B, H, blk, d]
    };
    const auto r = lean_kernel(attend, {q.narrow(2, b0, b1 - b0), k.narrow(2, lo, s1 - lo), v.narrow(2, lo, s1 - lo)});
    outs.push_back(r[0]);
    lses.push_back(r[1]);
  }
  return {at::cat(outs, 2), at::cat(lses, 2)};
}

at::Tensor attention_mixing(const at::Tensor& x, const BlockWeights& w, const ModelSpec& spec, LayerKind kind,
                            const ModelOptions& opt, at::Tensor* lse_out) {
  const AttentionSpec& a = spec.attention(kind);
  const std::int64_t B = x.size(0), S = x.size(1), H = a.heads, Hkv = a.kv_heads, d = a.head_dim;
  if (a.latent()) {
    const LatentQkv l = latent_qkv(x, w, spec);
    const auto r = attention_core(l.q.transpose(1, 2), l.k.transpose(1, 2), l.v.transpose(1, 2), a.window_tokens,
                                  opt.attention_query_block, attention_scale(spec, a));
    if (lse_out != nullptr) *lse_out = r.lse;
    const auto o = r.out.transpose(1, 2).to(x.scalar_type());  // [B, S, H, d_v]
    return at::linear(o.reshape({B, S, H * a.value_dim()}), w["attn.o_proj"]);
  }
  auto q_all = at::linear(x, w["attn.q_proj"]).view({B, S, H, a.output_gate ? 2 * d : d});
  at::Tensor q = q_all, gate;
  if (a.output_gate) {
    q = q_all.narrow(-1, 0, d);
    gate = q_all.narrow(-1, d, d);
  }
  auto k = at::linear(x, w["attn.k_proj"]).view({B, S, Hkv, d});
  auto v = a.k_eq_v ? k : at::linear(x, w["attn.v_proj"]).view({B, S, Hkv, d});
  if (a.qk_norm) {
    q = model_norm(q, w["attn.q_norm"], spec);
    k = model_norm(k, w["attn.k_norm"], spec);
  }
  if (spec.gemma4()) v = rms_norm(v, at::Tensor(), spec.norm_eps);
  q = attention_rope(q, spec, kind);
  k = attention_rope(k, spec, kind);
  const auto r = attention_core(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), a.window_tokens,
                                opt.attention_query_block, attention_scale(spec, a));
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

GdnChunkInputs gdn_chunk_inputs(const at::Tensor& with_context, const at::Tensor& conv_w, const GdnSpec& g) {
  const std::int64_t kd = g.key_dim(), vd = g.value_dim(), Hk = g.key_heads, Hv = g.value_heads;
  const std::int64_t dk = g.key_head_dim, dv = g.value_head_dim, conv_dim = 2 * kd + vd;
  const auto B = with_context.size(0), C = with_context.size(2) - (g.conv_kernel - 1);
  const auto conv = at::silu(at::conv1d(with_context, conv_w, at::Tensor(), at::IntArrayRef{1}, at::IntArrayRef{0},
                                        at::IntArrayRef{1}, conv_dim)).transpose(1, 2);  // [B, C, conv_dim]
  auto q = conv.narrow(-1, 0, kd).reshape({B, C, Hk, dk});
  auto k = conv.narrow(-1, kd, kd).reshape({B, C, Hk, dk});
  const auto v = conv.narrow(-1, 2 * kd, vd).reshape({B, C, Hv, dv}).transpose(1, 2);
  if (Hv != Hk) {
    q = q.repeat_interleave(Hv / Hk, 2);
    k = k.repeat_interleave(Hv / Hk, 2);
  }
  const double q_scale = 1.0 / std::sqrt(static_cast<double>(dk));
  return {l2_normalize(q).transpose(1, 2) * q_scale, l2_normalize(k).transpose(1, 2), v};
}

at::Tensor gdn_mixing(const at::Tensor& x, const BlockWeights& w, const ModelSpec& spec, const ModelOptions& opt) {
  const GdnSpec& g = spec.gdn;
  const auto B = x.size(0), S = x.size(1);
  const std::int64_t kd = g.key_dim(), vd = g.value_dim(), Hv = g.value_heads;
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
  GdnState st{at::zeros({B, Hv, dk, dv}, x.options().dtype(at::kFloat)),
              at::zeros({B, conv_dim, K - 1}, x.options().dtype(at::kFloat))};
  std::vector<at::Tensor> outs;
  for (std::int64_t s0 = 0; s0 < S; s0 += chunk) {
    const auto C = std::min(chunk, S - s0);
    // Causal depthwise conv over [left context | chunk], then SiLU.
    const auto with_ctx = at::cat({st.conv_context, qkv_pre.narrow(2, s0, C)}, 2);  // [B, conv_dim, K-1+C]
    st.conv_context = with_ctx.narrow(2, C, K - 1);
    const auto in = gdn_chunk_inputs(with_ctx, conv_w, g);
    outs.push_back(gdn_chunk(in.q, in.k, in.v, g_all.narrow(2, s0, C), beta_all.narrow(2, s0, C), st.recurrent));
  }
  const auto o = at::cat(outs, 2).transpose(1, 2);  // [B, S, Hv, dv] FP32
  const auto gated = rms_norm(o, w["gdn.norm"], spec.norm_eps) * at::silu(z.to(at::kFloat));
  return at::linear(gated.reshape({B, S, vd}).to(x.scalar_type()), w["gdn.out_proj"]);
}

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

at::Tensor decoder_layer(const at::Tensor& x, const BlockWeights& w, const ModelSpec& spec, int layer,
                         const ModelOptions& opt, RouterStats* stats) {
  const LayerKind kind = spec.layer_kinds[static_cast<std::size_t>(layer)];
  const auto xn = model_norm(x, w["input_norm"], spec);
  const auto mixed = kind == LayerKind::kLinearAttention ? gdn_mixing(xn, w, spec, opt)
                                                         : attention_mixing(xn, w, spec, kind, opt);
  return ffn_half(x + post_mixing(mixed, w, spec), w, spec, stats);
}

at::Tensor embed(const at::Tensor& tokens, const BlockWeights& outer, const ModelSpec& spec) {
  const auto& table = outer["embed"];
  const auto x = at::embedding(table, tokens);
  if (!spec.gemma4()) return x;
  // transformers' Gemma4TextScaledWordEmbedding: × √h cast to the table's dtype.
  return x * at::scalar_tensor(std::sqrt(static_cast<double>(spec.hidden)), table.options().dtype(table.scalar_type()));
}

namespace {

at::Tensor capped(const at::Tensor& logits, double softcap) {
  return softcap > 0 ? at::tanh(logits / softcap) * softcap : logits;
}

// Cross-entropy through the vocabulary projection, chunk by chunk in both directions: the forward
// keeps the per-token log-sum-exp, the backward recomputes each chunk's logits from xn and head.
// A chunk's working set is its logits in the head's dtype while they are cast and one FP32 [n, V]
// buffer (the log-sum-exp is taken in place), as the memory model's logits workspace has it; on a
// CPU standing in for a GPU it is counted as the vocabulary's (device_memory.h), the hidden-state
// gradient as activations and the head's gradient as the optimizer's.
//
// The head's gradient is each block's BF16 softmax gradient (the one dL/dx takes) against its
// hidden states, as the reference's linear backward has it. Where the head already has a gradient
// buffer of its own dtype (the graph runner allocates it before the loss's backward) the products
// are added into it and no gradient is returned, so nothing of [V, h] is allocated beside it; over
// more than one block of a BF16 head they are summed in an FP32 accumulator first (the memory
// model's 4 B per head element for the loss's backward), added in in sixteenths of its rows.
class ChunkedCrossEntropy : public torch::autograd::Function<ChunkedCrossEntropy> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& xn, const at::Tensor& head,
                            const at::Tensor& targets, double softcap, std::int64_t chunk) {
    const auto N = xn.size(0);
    device_memory::Tagged vocabulary(MemoryUse::kVocabulary);
    auto lse = at::empty({N}, xn.options().dtype(at::kFloat));
    auto total = at::zeros({}, xn.options().dtype(at::kFloat));
    for (std::int64_t t0 = 0; t0 < N; t0 += chunk) {
      const auto n = std::min(chunk, N - t0);
      auto logits = device_memory::gemm(xn.narrow(0, t0, n), head.t()).to(at::kFloat);  // [n, V]
      if (softcap > 0) logits.div_(softcap).tanh_().mul_(softcap);          // in place: one [n, V] buffer
      const auto target = logits.gather(1, targets.narrow(0, t0, n).unsqueeze(1)).squeeze(1);
      // log Σ exp(logits − max) + max, the exponentials in the logits' own buffer.
      const auto m = std::get<0>(logits.max(1, /*keepdim=*/true));
      const auto l = logits.sub_(m).exp_().sum(1).log_().add_(m.squeeze(1));
      lse.narrow(0, t0, n).copy_(l);
      total += (l - target).sum();
    }
    ctx->save_for_backward({xn, head, targets, lse});
    ctx->saved_data["softcap"] = softcap;
    ctx->saved_data["chunk"] = chunk;
    return total / static_cast<double>(N);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    const auto saved = ctx->get_saved_variables();
    const auto &xn = saved[0], &head = saved[1], &targets = saved[2], &lse = saved[3];
    const double softcap = ctx->saved_data["softcap"].toDouble();
    const std::int64_t chunk = ctx->saved_data["chunk"].toInt();
    const auto N = xn.size(0);
    const auto g = grad_out[0].to(at::kFloat) / static_cast<double>(N);
    at::Tensor dx, into = head.is_leaf() ? head.grad() : at::Tensor(), acc;
    const bool in_place = into.defined() && into.scalar_type() == head.scalar_type() && into.sizes() == head.sizes();
    const bool fp32_sum = N > chunk && head.scalar_type() != at::kFloat;
    {
      device_memory::Tagged hidden(MemoryUse::kActivations);
      dx = at::empty_like(xn);
    }
    {
      device_memory::Tagged gradient(MemoryUse::kOptimizer);
      if (fp32_sum) {
        acc = at::zeros(head.sizes(), head.options().dtype(at::kFloat));
      } else if (!in_place) {
        into = at::zeros(head.sizes(), head.options());
      }
    }
    device_memory::Tagged vocabulary(MemoryUse::kVocabulary);
    for (std::int64_t t0 = 0; t0 < N; t0 += chunk) {
      const auto n = std::min(chunk, N - t0);
      const auto xc = xn.narrow(0, t0, n);
      // In place on one [n, V] buffer: logits → softmax − one-hot → × dL/dloss.
      auto d = device_memory::gemm(xc, head.t()).to(at::kFloat);
      const auto target = targets.narrow(0, t0, n).unsqueeze(1);
      const auto lse_c = lse.narrow(0, t0, n).unsqueeze(1);
      if (softcap > 0) {
        // Capped logits cap·t with t = tanh(logits / cap), whose derivative 1 − t² scales the
        // gradient: softmax·g·(1 − t²) column block by column block (a [n, V/16] factor at a
        // time), then −g·(1 − t²) at each target.
        d.div_(softcap).tanh_();
        const auto t_target = d.gather(1, target);
        const std::int64_t V = d.size(1), cols = (V + 15) / 16;
        for (std::int64_t c0 = 0; c0 < V; c0 += cols) {
          auto block = d.narrow(1, c0, std::min(cols, V - c0));
          const auto slope = 1.0 - block * block;
          block.mul_(softcap).sub_(lse_c).exp_().mul_(g).mul_(slope);
        }
        d.scatter_add_(1, target, (t_target * t_target - 1.0) * g);
      } else {
        d.sub_(lse_c).exp_();
        d.scatter_add_(1, target, at::full({n, 1}, -1.0, d.options()));
        d.mul_(g);
      }
      if (fp32_sum) {
        {
          const auto dw = d.to(head.scalar_type());
          auto rows = dx.narrow(0, t0, n);
          device_memory::gemm_out(rows, dw, head);
          d.copy_(dw);  // the head's gradient takes the same BF16 softmax gradient
        }  // the BF16 copy released before the head's gradient product
        acc.addmm_(d.t(), xc.to(at::kFloat));
      } else {
        d = d.to(head.scalar_type());  // the FP32 buffer released (a no-op for an FP32 head)
        auto rows = dx.narrow(0, t0, n);
        device_memory::gemm_out(rows, d, head);
        device_memory::gemm_add(into, d.t(), xc);
      }
    }
    device_memory::Tagged gradient(MemoryUse::kOptimizer);
    if (fp32_sum) {
      if (!in_place) return {dx, acc.to(head.scalar_type()), at::Tensor(), at::Tensor(), at::Tensor()};
      const std::int64_t rows = head.size(0), piece = std::max<std::int64_t>(1, (rows + 15) / 16);
      for (std::int64_t r0 = 0; r0 < rows; r0 += piece) {
        const auto n = std::min(piece, rows - r0);
        into.narrow(0, r0, n).add_(acc.narrow(0, r0, n).to(head.scalar_type()));
      }
    }
    return {dx, in_place ? at::Tensor() : into, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

const at::Tensor& head_weight(const BlockWeights& outer, const ModelSpec& spec) {
  return spec.tied_embeddings ? outer["embed"] : outer["lm_head"];
}

}  // namespace

at::Tensor chunked_cross_entropy(const at::Tensor& xn, const at::Tensor& head, const at::Tensor& targets,
                                 double softcap, std::int64_t chunk_tokens) {
  return ChunkedCrossEntropy::apply(xn, head, targets, softcap, std::max<std::int64_t>(1, chunk_tokens));
}

at::Tensor head_logits(const at::Tensor& x, const BlockWeights& outer, const ModelSpec& spec) {
  const auto xn = model_norm(x, outer["final_norm"], spec);
  return capped(at::linear(xn, head_weight(outer, spec)).to(at::kFloat), spec.final_logit_softcap);
}

at::Tensor head_loss(const at::Tensor& x, const at::Tensor& targets, const BlockWeights& outer, const ModelSpec& spec,
                     std::int64_t chunk_tokens) {
  const auto xn = model_norm(x, outer["final_norm"], spec);
  return chunked_cross_entropy(xn.reshape({-1, xn.size(-1)}), head_weight(outer, spec), targets.reshape({-1}),
                               spec.final_logit_softcap, chunk_tokens);
}

at::Tensor model_logits(const at::Tensor& tokens, const std::vector<BlockWeights>& weights, const ModelSpec& spec,
                        const ModelOptions& opt) {
  OOM_ASSERT(static_cast<int>(weights.size()) == spec.layers + 1, "one weight block per layer plus the outer block");
  auto x = embed(tokens, weights[0], spec);
  for (int l = 0; l < spec.layers; ++l) x = decoder_layer(x, weights[1 + l], spec, l, opt);
  return head_logits(x, weights[0], spec);
}

at::Tensor model_loss(const at::Tensor& tokens, const at::Tensor& targets, const std::vector<BlockWeights>& weights,
                      const ModelSpec& spec, const ModelOptions& opt) {
  OOM_ASSERT(static_cast<int>(weights.size()) == spec.layers + 1, "one weight block per layer plus the outer block");
  auto x = embed(tokens, weights[0], spec);
  const bool aux = spec.router_aux_loss_coef > 0;
  RouterStats stats;
  for (int l = 0; l < spec.layers; ++l) x = decoder_layer(x, weights[1 + l], spec, l, opt, aux ? &stats : nullptr);
  const auto loss = head_loss(x, targets, weights[0], spec, opt.loss_chunk_tokens);
  return aux ? loss + spec.router_aux_loss_coef * router_aux_loss(stats, spec.moe.experts) : loss;
}

}  // namespace oom::backend
