#include "backend/model/plan_ops.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "backend/runtime/device_memory.h"
#include "costmodel/input_error.h"
#include "costmodel/memory.h"

namespace oom::backend::plan_ops {

AttentionInputs attention_inputs(const at::Tensor& x, const BlockWeights& w, const ModelSpec& spec, LayerKind kind,
                                 const at::Tensor& positions) {
  const AttentionSpec& a = spec.attention(kind);
  const std::int64_t B = x.size(0), S = x.size(1), H = a.heads, Hkv = a.kv_heads, d = a.head_dim;
  AttentionInputs r;
  if (a.latent()) {
    const LatentQkv l = latent_qkv(x, w, spec, positions);
    r.q = l.q.transpose(1, 2);
    r.k = l.k.transpose(1, 2);
    r.v = l.v.transpose(1, 2);
    return r;
  }
  auto q_all = at::linear(x, w["attn.q_proj"]).view({B, S, H, a.output_gate ? 2 * d : d});
  at::Tensor q = q_all;
  if (a.output_gate) {
    q = q_all.narrow(-1, 0, d);
    r.gate = q_all.narrow(-1, d, d);
  }
  auto k = at::linear(x, w["attn.k_proj"]).view({B, S, Hkv, d});
  auto v = a.k_eq_v ? k : at::linear(x, w["attn.v_proj"]).view({B, S, Hkv, d});
  if (a.qk_norm) {
    q = model_norm(q, w["attn.q_norm"], spec);
    k = model_norm(k, w["attn.k_norm"], spec);
  }
  if (spec.gemma4()) v = rms_norm(v, at::Tensor(), spec.norm_eps);
  r.q = attention_rope(q, spec, kind, positions).transpose(1, 2);
  r.k = attention_rope(k, spec, kind, positions).transpose(1, 2);
  r.v = v.transpose(1, 2);
  return r;
}

int attention_groups(const AttentionSpec& a, int group_heads) {
  const int per_kv = a.heads / std::max(1, a.kv_heads);
  OOM_ASSERT(group_heads <= 0 || group_heads >= per_kv || per_kv % group_heads == 0,
             "head group must divide the query heads per KV group");
  return attention_head_groups(a, group_heads);
}

at::Tensor query_group(const at::Tensor& q, int groups, int index) {
  if (groups == 1) return q;
  const auto g = q.size(1) / groups;
  return q.narrow(1, index * g, g);
}

at::Tensor kv_group(const at::Tensor& k, int groups, int index) {
  if (groups == 1) return k;
  const auto per_kv_head = groups / k.size(1);  // groups of one KV head
  OOM_ASSERT(per_kv_head * k.size(1) == groups, "groups must split every KV group alike");
  return k.narrow(1, index / per_kv_head, 1);
}

at::Tensor merge_groups(const std::vector<at::Tensor>& parts) { return parts.size() == 1 ? parts[0] : at::cat(parts, 1); }

at::Tensor attention_output(const at::Tensor& out, const at::Tensor& gate, const BlockWeights& w, at::ScalarType dtype) {
  const auto B = out.size(0), H = out.size(1), S = out.size(2), d = out.size(3);
  auto o = out.transpose(1, 2).to(dtype);  // [B, S, H, d]
  if (gate.defined()) o = o * at::sigmoid(gate);
  return at::linear(o.reshape({B, S, H * d}), w["attn.o_proj"]);
}

AttentionGrads attention_core_backward(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
                                       const at::Tensor& out_in, const at::Tensor& lse_in, const at::Tensor& dout_in,
                                       std::int64_t window, std::int64_t query_block, double scale_in, std::int64_t query0) {
  const auto B = q_in.size(0), H = q_in.size(1), S = q_in.size(2), d = q_in.size(3), Hkv = k_in.size(1), Sk = k_in.size(2);
  const auto group = H / Hkv;
  const auto q = q_in.to(at::kFloat);
  const auto k = (group == 1 ? k_in : k_in.repeat_interleave(group, 1)).to(at::kFloat);
  const auto v = (group == 1 ? v_in : v_in.repeat_interleave(group, 1)).to(at::kFloat);
  const auto lse = lse_in.to(at::kFloat);
  const double scale = scale_in > 0 ? scale_in : 1.0 / std::sqrt(static_cast<double>(d));
  const auto block = std::max<std::int64_t>(1, query_block);
  const auto idx_opts = q.options().dtype(at::kLong);
  auto dq = at::zeros_like(q), dk = at::zeros_like(k), dv = at::zeros_like(v);
  // Tiles of `block` queries × `block` keys, as a flash backward's thread blocks: the score-sized
  // temporaries (P, dP, dS) of one tile at a time, not of a query block over all its keys.
  for (std::int64_t b0 = 0; b0 < S; b0 += block) {
    const auto b1 = std::min(S, b0 + block);
    const auto s0 = query0 + b0, s1 = query0 + b1;  // the block's places in the sequence
    const auto lo = window > 0 ? std::max<std::int64_t>(0, s0 - window + 1) : 0;
    const auto qb = q.narrow(2, b0, b1 - b0);
    // O and dO in FP32 a query block at a time (O is kept in the activations' dtype).
    const auto dob = dout_in.narrow(2, b0, b1 - b0).to(at::kFloat);
    const auto lse_b = lse.narrow(2, b0, b1 - b0).unsqueeze(-1);
    const auto D_b = (dob * out_in.narrow(2, b0, b1 - b0).to(at::kFloat)).sum(-1, /*keepdim=*/true);  // D = Σ dO ⊙ O
    const auto qi = at::arange(s0, s1, idx_opts).unsqueeze(1);
    auto dq_b = dq.narrow(2, b0, b1 - b0);
    for (std::int64_t k0 = lo; k0 < s1; k0 += block) {
      const auto k1 = std::min(s1, k0 + block);
      const auto kb = k.narrow(2, k0, k1 - k0), vb = v.narrow(2, k0, k1 - k0);
      const auto kj = at::arange(k0, k1, idx_opts).unsqueeze(0);
      auto allowed = kj <= qi;
      if (window > 0) allowed = allowed & (qi - kj < window);
      const auto p = at::exp(at::matmul(qb, kb.transpose(-1, -2)).mul_(scale).sub_(lse_b)).masked_fill_(allowed.logical_not(), 0.0);
      dv.narrow(2, k0, k1 - k0).add_(at::matmul(p.transpose(-1, -2), dob));
      const auto ds = at::matmul(dob, vb.transpose(-1, -2)).sub_(D_b).mul_(p).mul_(scale);
      dq_b.add_(at::matmul(ds, kb));
      dk.narrow(2, k0, k1 - k0).add_(at::matmul(ds.transpose(-1, -2), qb));
    }
  }
  if (group > 1) {
    dk = dk.view({B, Hkv, group, Sk, d}).sum(2);
    dv = dv.view({B, Hkv, group, Sk, d}).sum(2);
  }
  return {dq.to(q_in.scalar_type()), dk.to(k_in.scalar_type()), dv.to(v_in.scalar_type())};
}

GdnInputs gdn_inputs(const at::Tensor& x, const BlockWeights& w, const ModelSpec& spec) {
  const GdnSpec& g = spec.gdn;
  const auto B = x.size(0), S = x.size(1);
  const std::int64_t kd = g.key_dim(), vd = g.value_dim(), Hv = g.value_heads, dv = g.value_head_dim;
  const std::int64_t conv_dim = 2 * kd + vd;
  const auto qkvz = at::linear(x, w["gdn.in_proj_qkvz"]);
  const auto ba = at::linear(x, w["gdn.in_proj_ba"]);
  GdnInputs r;
  r.qkv = qkvz.narrow(-1, 0, conv_dim).transpose(1, 2).to(at::kFloat);
  r.z = qkvz.narrow(-1, conv_dim, vd).reshape({B, S, Hv, dv});
  r.beta = at::sigmoid(ba.narrow(-1, 0, Hv).to(at::kFloat)).transpose(1, 2);
  const auto a = ba.narrow(-1, Hv, Hv).to(at::kFloat) + w["gdn.dt_bias"].to(at::kFloat);
  r.g = (-at::exp(w["gdn.A_log"].to(at::kFloat)) * at::softplus(a)).transpose(1, 2);
  return r;
}

at::Tensor gdn_core(const GdnInputs& in, std::int64_t s0, std::int64_t C, const BlockWeights& w, const ModelSpec& spec,
                    std::int64_t kernel_chunk, at::Tensor& state, const at::Tensor& left_context) {
  const GdnSpec& g = spec.gdn;
  const auto B = in.qkv.size(0);
  const std::int64_t K = g.conv_kernel, conv_dim = 2 * g.key_dim() + g.value_dim();
  // Left context: the K − 1 pre-conv channels before s0 (zeros before the sequence start).
  const auto from = std::max<std::int64_t>(0, s0 - (K - 1));
  std::vector<at::Tensor> parts;
  if (left_context.defined()) {
    OOM_ASSERT(s0 == 0 && left_context.size(2) == K - 1, "a given left context precedes the first token");
    parts.push_back(left_context);
  } else if (s0 - from < K - 1) {
    parts.push_back(at::zeros({B, conv_dim, K - 1 - (s0 - from)}, in.qkv.options()));
  }
  if (s0 > from) parts.push_back(in.qkv.narrow(2, from, s0 - from));
  parts.push_back(in.qkv.narrow(2, s0, C));
  const auto with_ctx = at::cat(parts, 2);  // [B, conv_dim, K − 1 + C]
  const auto conv_w = w["gdn.conv"].to(at::kFloat).unsqueeze(1);
  // One kernel chunk: causal conv over [left context | chunk], SiLU, L2 norms, the chunk's recurrence.
  // A lean kernel: under LeanKernels recomputed in the backward, so each chunk keeps only its inputs and start
  // state, as a chunked GDN kernel does, not the WY transform's intermediates.
  const RecomputeFn kernel = [g](const std::vector<at::Tensor>& x) -> std::vector<at::Tensor> {
    const auto qkv = gdn_chunk_inputs(x[0], x[1], g);
    auto st = x[4];
    auto out = gdn_chunk(qkv.q, qkv.k, qkv.v, x[3], x[2], st);
    return {out, st};
  };
  const auto beta = in.beta.narrow(2, s0, C), gl = in.g.narrow(2, s0, C);
  const auto chunk = std::max<std::int64_t>(1, kernel_chunk);
  std::vector<at::Tensor> outs;
  for (std::int64_t c0 = 0; c0 < C; c0 += chunk) {
    const auto n = std::min(chunk, C - c0);
    const auto r = lean_kernel(kernel, {with_ctx.narrow(2, c0, n + K - 1), conv_w, beta.narrow(2, c0, n), gl.narrow(2, c0, n), state});
    outs.push_back(r[0]);
    state = r[1];
  }
  return outs.size() == 1 ? outs[0] : at::cat(outs, 2);
}

at::Tensor gdn_output(const at::Tensor& o_in, const at::Tensor& z, const BlockWeights& w, const ModelSpec& spec,
                      at::ScalarType dtype) {
  const auto o = o_in.transpose(1, 2);  // [B, S, Hv, dv]
  const auto B = o.size(0), S = o.size(1);
  const auto gated = rms_norm(o, w["gdn.norm"], spec.norm_eps) * at::silu(z.to(at::kFloat));
  return at::linear(gated.reshape({B, S, spec.gdn.value_dim()}).to(dtype), w["gdn.out_proj"]);
}

DenseTerms dense_terms(const at::Tensor& x2, const BlockWeights& w, const ModelSpec& spec) {
  // Gemma 4's dense MLP reads its own pre-norm: x2 is FfnInputs::dense there.
  DenseTerms d;
  if (w.has("shared.gate") && !w.has("shared.expert_gate")) {
    d.shared = gated_mlp(x2, w["shared.gate"], w["shared.up"], w["shared.down"], spec.activation);  // DeepSeek: no gate
  } else if (w.has("shared.gate")) {
    // gated_mlp's operators, with the gate's product a lean kernel of the activation: it keeps the
    // activation (which the down projection keeps too) and recomputes the projection's output [T, h]
    // in its backward, instead of keeping that output from the forward to the backward.
    const auto gated = lean_kernel(
        [act = spec.activation](const std::vector<at::Tensor>& in) { return std::vector<at::Tensor>{gated_activation(in[0], in[1], act)}; },
        {at::linear(x2, w["shared.gate"]), at::linear(x2, w["shared.up"])})[0];
    d.shared = lean_kernel(
        [](const std::vector<at::Tensor>& in) { return std::vector<at::Tensor>{at::sigmoid(in[2]) * at::linear(in[0], in[1])}; },
        {gated, w["shared.down"], at::linear(x2, w["shared.expert_gate"])})[0];
  }
  if (w.has("dense.gate")) {
    d.dense = gated_mlp(x2, w["dense.gate"], w["dense.up"], w["dense.down"], spec.activation);
  }
  return d;
}

namespace {
// act(g) into `out` (same shape).
void activation_into(at::Tensor& out, const at::Tensor& g, const std::string& activation) {
  if (is_gelu(activation)) {
    at::gelu_out(out, g, "tanh");
  } else {
    at::silu_out(out, g);
  }
}
// linear's weight gradient dyᵀ·x (as autograd forms it) added into `into`; the GEMM's scratch is not
// the caller's use.
void add_weight_grad(const at::Tensor& into, const at::Tensor& dy, const at::Tensor& x) {
  into.add_(device_memory::gemm(dy.t(), x));
}
}  // namespace

void expert_forward(const at::Tensor& x, const ExpertWeights& w, const std::string& activation, ExpertActivations a,
                    at::Tensor y) {
  // x·Wᵀ as at::linear forms it, written where the caller keeps it.
  device_memory::gemm_out(a.g, x, w[0].t());
  device_memory::gemm_out(a.u, x, w[1].t());
  activation_into(a.gated, a.g, activation);
  a.gated.mul_(a.u);
  device_memory::gemm_out(y, a.gated, w[2].t());
}

void expert_backward(const at::Tensor& dy, const at::Tensor& x, const ExpertActivations& a, const ExpertWeights& w,
                     const ExpertWeights& dw, const std::string& activation, ExpertActivations work, at::Tensor dx) {
  // The down projection's backward; then the product's (each factor's gradient is the output
  // gradient times the other factor), the activation's, and the gate and up projections'.
  add_weight_grad(dw[2], dy, a.gated);
  at::Tensor& d_gated = work.gated;
  device_memory::gemm_out(d_gated, dy, w[2]);
  activation_into(work.u, a.g, activation);
  work.u.mul_(d_gated);       // d_up = d_gated · act(g)
  d_gated.mul_(a.u);          // d_act = d_gated · up
  if (is_gelu(activation)) {  // d_gate = act'(g) · d_act
    at::gelu_backward_out(work.g, d_gated, a.g, "tanh");
  } else {
    at::silu_backward_out(work.g, d_gated, a.g);
  }
  add_weight_grad(dw[0], work.g, x);
  add_weight_grad(dw[1], work.u, x);
  device_memory::gemm_out(dx, work.g, w[0]);
  device_memory::gemm_add(dx, work.u, w[1]);
}

ExpertActivations expert_rows(const ExpertActivations& a, std::int64_t start, std::int64_t n) {
  return {a.g.narrow(0, start, n), a.u.narrow(0, start, n), a.gated.narrow(0, start, n)};
}

ExpertActivations expert_activations(std::int64_t rows, std::int64_t intermediate, const at::TensorOptions& options) {
  return {at::empty({rows, intermediate}, options), at::empty({rows, intermediate}, options), at::empty({rows, intermediate}, options)};
}

SortedSlots sort_slots_by_expert(const Routing& r, const MoeSpec& moe) {
  const auto flat_ids = r.expert_ids.reshape({-1});
  const auto order = std::get<1>(at::sort(flat_ids, /*stable=*/true, 0, false));
  const auto counts = at::bincount(flat_ids, {}, moe.experts).to(at::kCPU).contiguous();
  SortedSlots out;
  out.tokens = at::div(order, moe.top_k, "floor");
  out.weights = r.weights.reshape({-1}).index_select(0, order);
  out.counts.assign(counts.data_ptr<std::int64_t>(), counts.data_ptr<std::int64_t>() + moe.experts);
  return out;
}

DispatchSplits dispatch_splits(const at::Tensor& all_counts, int rank, int experts_local) {
  const auto counts = all_counts.to(at::kCPU).contiguous();
  const std::int64_t P = counts.size(0), E = counts.size(1);
  const auto* ac = counts.data_ptr<std::int64_t>();
  DispatchSplits d;
  d.send.assign(static_cast<std::size_t>(P), 0);
  d.recv.assign(static_cast<std::size_t>(P), 0);
  d.owned_rows.resize(static_cast<std::size_t>(experts_local));
  for (std::int64_t e = 0; e < E; ++e) d.send[static_cast<std::size_t>(e / experts_local)] += ac[rank * E + e];
  std::int64_t row = 0;
  for (std::int64_t q = 0; q < P; ++q) {
    for (int j = 0; j < experts_local; ++j) {
      const std::int64_t n = ac[q * E + std::int64_t{rank} * experts_local + j];
      d.recv[static_cast<std::size_t>(q)] += n;
      for (std::int64_t i = 0; i < n; ++i) d.owned_rows[static_cast<std::size_t>(j)].push_back(row + i);
      row += n;
    }
  }
  return d;
}

DispatchSplits balanced_dispatch_splits(const at::Tensor& all_counts, int rank, int experts_local,
                                        const std::vector<std::pair<int, int>>& copies) {
  if (copies.empty()) return dispatch_splits(all_counts, rank, experts_local);
  const auto counts = all_counts.to(at::kCPU).contiguous();
  const std::int64_t P = counts.size(0), E = counts.size(1);
  std::vector<std::vector<int>> helpers(static_cast<std::size_t>(E));
  for (const auto& [e, h] : copies) {
    OOM_ASSERT(e >= 0 && e < E, "a copy of an expert the counts do not have");
    helpers[static_cast<std::size_t>(e)].push_back(h);
  }
  const auto* ac = counts.data_ptr<std::int64_t>();
  const auto count = [&](std::int64_t q, std::int64_t e) { return ac[q * E + e]; };
  const auto owner = [&](std::int64_t e) { return static_cast<int>(e / experts_local); };
  std::vector<std::int64_t> rows(static_cast<std::size_t>(E), 0), load(static_cast<std::size_t>(P), 0);
  std::int64_t total = 0;
  for (std::int64_t e = 0; e < E; ++e) {
    for (std::int64_t q = 0; q < P; ++q) rows[static_cast<std::size_t>(e)] += count(q, e);
    load[static_cast<std::size_t>(owner(e))] += rows[static_cast<std::size_t>(e)];
    total += rows[static_cast<std::size_t>(e)];
  }
  const std::int64_t target = (total + P - 1) / P;
  // quota[e][k]: rows of expert e that helper helpers[e][k] computes.
  std::vector<std::vector<std::int64_t>> quota(static_cast<std::size_t>(E));
  for (std::int64_t e = 0; e < E; ++e) quota[static_cast<std::size_t>(e)].assign(helpers[static_cast<std::size_t>(e)].size(), 0);
  for (int r = 0; r < P; ++r) {
    auto& mine = load[static_cast<std::size_t>(r)];
    if (mine <= target) continue;
    std::vector<std::int64_t> lent;
    for (std::int64_t e = 0; e < E; ++e) {
      if (owner(e) == r && !helpers[static_cast<std::size_t>(e)].empty()) lent.push_back(e);
    }
    std::stable_sort(lent.begin(), lent.end(), [&](std::int64_t a, std::int64_t b) {
      return rows[static_cast<std::size_t>(a)] > rows[static_cast<std::size_t>(b)];
    });
    for (const std::int64_t e : lent) {
      const auto& hs = helpers[static_cast<std::size_t>(e)];
      auto& q = quota[static_cast<std::size_t>(e)];
      std::int64_t left = rows[static_cast<std::size_t>(e)];
      for (const auto n : q) left -= n;
      while (mine > target && left > 0) {
        std::size_t best = hs.size();
        for (std::size_t k = 0; k < hs.size(); ++k) {
          const auto h = static_cast<std::size_t>(hs[k]);
          if (load[h] < target && (best == hs.size() || load[h] < load[static_cast<std::size_t>(hs[best])])) best = k;
        }
        if (best == hs.size()) break;
        const auto h = static_cast<std::size_t>(hs[best]);
        const std::int64_t moved = std::min({mine - target, left, target - load[h]});
        q[best] += moved;
        load[h] += moved;
        mine -= moved;
        left -= moved;
      }
      if (mine <= target) break;
    }
  }
  // Source q's rows of expert e per destination, in the order the destinations take them.
  const auto pieces = [&](std::int64_t q, std::int64_t e) {
    std::vector<std::pair<int, std::int64_t>> out;
    std::int64_t from = 0;
    for (std::int64_t s = 0; s < q; ++s) from += count(s, e);
    const std::int64_t to = from + count(q, e);
    std::int64_t at = 0;
    const auto take = [&](int dest, std::int64_t n) {
      const std::int64_t a = std::max(at, from), b = std::min(at + n, to);
      out.emplace_back(dest, std::max<std::int64_t>(0, b - a));
      at += n;
    };
    const auto& hs = helpers[static_cast<std::size_t>(e)];
    for (std::size_t k = 0; k < hs.size(); ++k) take(hs[k], quota[static_cast<std::size_t>(e)][k]);
    take(owner(e), rows[static_cast<std::size_t>(e)] - at);
    return out;
  };
  DispatchSplits d;
  d.send.assign(static_cast<std::size_t>(P), 0);
  d.recv.assign(static_cast<std::size_t>(P), 0);
  d.owned_rows.resize(static_cast<std::size_t>(experts_local));
  // This rank's rows: expert-sorted positions of each piece, then regrouped by destination.
  std::vector<std::vector<std::int64_t>> to_dest(static_cast<std::size_t>(P));
  std::int64_t start = 0;
  for (std::int64_t e = 0; e < E; ++e) {
    std::int64_t at = start;
    for (const auto& [dest, n] : pieces(rank, e)) {
      for (std::int64_t i = 0; i < n; ++i) to_dest[static_cast<std::size_t>(dest)].push_back(at + i);
      d.send[static_cast<std::size_t>(dest)] += n;
      at += n;
    }
    start += count(rank, e);
  }
  for (const auto& v : to_dest) d.send_order.insert(d.send_order.end(), v.begin(), v.end());
  // The received rows: by source rank, then expert.
  std::int64_t row = 0;
  for (std::int64_t q = 0; q < P; ++q) {
    for (std::int64_t e = 0; e < E; ++e) {
      std::int64_t n = 0;
      for (const auto& [dest, m] : pieces(q, e)) n += dest == rank ? m : 0;
      if (n == 0) continue;
      auto& list = owner(e) == rank ? d.owned_rows[static_cast<std::size_t>(e % experts_local)] : d.fetched_rows[static_cast<int>(e)];
      for (std::int64_t i = 0; i < n; ++i) list.push_back(row + i);
      d.recv[static_cast<std::size_t>(q)] += n;
      row += n;
    }
  }
  return d;
}

// --- Ring-DTP ---
namespace {

// The logits of tokens [t0, t0 + n) of xn against a shard [V/P, h], FP32, softcapped; with the
// softcap also t = tanh(logits / cap) for the cap's derivative.
at::Tensor shard_logits(const at::Tensor& xn, const at::Tensor& shard, std::int64_t t0, std::int64_t n, double softcap,
                        at::Tensor* t = nullptr) {
  auto l = device_memory::gemm(xn.narrow(0, t0, n), shard.t()).to(at::kFloat);
  if (softcap > 0) {
    l.div_(softcap).tanh_();
    if (t != nullptr) *t = l.clone();
    l.mul_(softcap);
  }
  return l;
}

// Rows of targets [t0, t0 + n) that fall in the shard [v0, v0 + V/P), and their column there.
std::pair<at::Tensor, at::Tensor> targets_in_shard(const at::Tensor& targets, std::int64_t t0, std::int64_t n,
                                                   std::int64_t v0, std::int64_t rows) {
  const auto local = targets.narrow(0, t0, n) - v0;
  const auto mine = ((local >= 0) & (local < rows)).nonzero().squeeze(1);
  return {mine, local.index_select(0, mine)};
}

}  // namespace

RingLse ring_lse_start(std::int64_t n, const at::TensorOptions& options) {
  const auto o = options.dtype(at::kFloat);
  return {at::full({n}, -std::numeric_limits<float>::infinity(), o), at::zeros({n}, o), at::zeros({n}, o)};
}

void ring_fold(RingLse& s, const at::Tensor& xn, const at::Tensor& shard, std::int64_t v0, const at::Tensor& targets,
               double softcap, std::int64_t chunk) {
  const std::int64_t N = xn.size(0), rows = shard.size(0), step = std::max<std::int64_t>(1, chunk);
  for (std::int64_t t0 = 0; t0 < N; t0 += step) {
    const std::int64_t n = std::min(step, N - t0);
    auto l = shard_logits(xn, shard, t0, n, softcap);
    const auto [mine, col] = targets_in_shard(targets, t0, n, v0, rows);
    if (mine.numel() > 0) s.target.narrow(0, t0, n).index_copy_(0, mine, l.index_select(0, mine).gather(1, col.unsqueeze(1)).squeeze(1));
    auto m = s.max.narrow(0, t0, n), sum = s.sum.narrow(0, t0, n);
    const auto m_new = at::maximum(m, std::get<0>(l.max(1)));
    // The block's exponentials in its own logits buffer: one FP32 [n, V/P] buffer.
    sum.mul_(at::exp(m - m_new)).add_(l.sub_(m_new.unsqueeze(1)).exp_().sum(1));
    m.copy_(m_new);
  }
}

at::Tensor ring_lse(const RingLse& s) { return s.max + at::log(s.sum); }

void ring_backward(const at::Tensor& xn, const at::Tensor& shard, std::int64_t v0, const at::Tensor& targets,
                   const at::Tensor& lse, double scale, double softcap, std::int64_t chunk, at::Tensor& dxn,
                   at::Tensor& dshard) {
  const std::int64_t N = xn.size(0), rows = shard.size(0), step = std::max<std::int64_t>(1, chunk);
  for (std::int64_t t0 = 0; t0 < N; t0 += step) {
    const std::int64_t n = std::min(step, N - t0);
    at::Tensor t;
    // softmax − one-hot over the shard's columns, × dL/dlogit, through the cap.
    auto d = shard_logits(xn, shard, t0, n, softcap, &t);
    d.sub_(lse.narrow(0, t0, n).unsqueeze(1)).exp_();
    const auto [mine, col] = targets_in_shard(targets, t0, n, v0, rows);
    if (mine.numel() > 0) d.index_put_({mine, col}, d.index({mine, col}) - 1.0);
    d.mul_(scale);
    if (softcap > 0) d.mul_(t.mul_(t).neg_().add_(1));
    // The shard's gradient first; then dL/dx of the block's rows, the product in the shard's dtype
    // added into the FP32 partial, with d released once cast: one [n, V/P] FP32 buffer at a time.
    dshard.addmm_(d.t(), xn.narrow(0, t0, n).to(at::kFloat));
    at::Tensor dw = d.to(shard.scalar_type());
    d = at::Tensor();
    const at::Tensor rows = device_memory::gemm(dw, shard);
    dw = at::Tensor();
    dxn.narrow(0, t0, n).add_(rows);
  }
}

}  // namespace oom::backend::plan_ops
