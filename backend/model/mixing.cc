// The decoder's token mixing (model.h): partial rotary embeddings (+ YaRN), softmax attention with
// its log-sum-exp (full or sliding window, GQA, output gate, K = V), DeepSeek-V3's latent attention
// (MLA) and chunked Gated DeltaNet. The feed-forward half is ffn.cc; the weights' views, norms,
// the decoder layer, embeddings and the loss are model.cc.
#include "backend/model/model.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <torch/torch.h>

#include "costmodel/input_error.h"

namespace oom::backend {

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

}  // namespace oom::backend
