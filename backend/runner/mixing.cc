// Mixing stages of a decoder pass: attention (input projections, the core per query-head group
// with shared K/V, the O/LSE kept on the host and loaded back, the output projection, and their
// backward: flash-style from the kept O/LSE, else from the core's graph or a per-group re-forward)
// and Gated DeltaNet (the core per sequence chunk with the FP32 state handed between chunks, as many
// sequences a call as the lowering prices, each chunk recomputed from its kept start state in the
// backward).
#include "backend/runner/runner.h"

#include <algorithm>

#include <torch/torch.h>

#include "backend/runner/block_grad.h"
#include "backend/runtime/device_memory.h"
#include "backend/runtime/host_copies.h"
#include "costmodel/memory.h"

namespace oom::backend::runner {

namespace {

at::Tensor grad_of(const at::Tensor& t) { return t.defined() ? t.grad() : t; }

// Rows [b0, b0 + n) of a batch-first tensor (undefined stays undefined).
at::Tensor batch_rows(const at::Tensor& t, std::int64_t b0, std::int64_t n) { return t.defined() ? t.narrow(0, b0, n) : t; }

plan_ops::GdnInputs gdn_rows(const plan_ops::GdnInputs& in, std::int64_t b0, std::int64_t n) {
  return {batch_rows(in.qkv, b0, n), batch_rows(in.z, b0, n), batch_rows(in.beta, b0, n), batch_rows(in.g, b0, n)};
}

}  // namespace

void Runner::mix_proj(const Stage& st_, Pass& p) {
  Sub& s = sub_of(p, st_.key);
  const int l = p.l;
  const bool bwd = p.kind == PassKind::kBackward;
  const auto& x = bwd ? s.x_l : s.x;
  // In a backward the input norm keeps its output, not the decoder input (released by mix_out).
  const auto xn = bwd ? model_norm_keeping_output(x, p.w["input_norm"], spec) : model_norm(x, p.w["input_norm"], spec);
  if (attention(l)) {
    s.in = plan_ops::attention_inputs(xn, p.w, spec, spec.layer_kinds[static_cast<std::size_t>(l)], positions);
    if (bwd) {
      // K/V leaves in FP32: their gradients accumulate over the query-head groups in FP32.
      s.q_l = leaf(s.in.q), s.k_l = leaf(s.in.k.to(at::kFloat)), s.v_l = leaf(s.in.v.to(at::kFloat)), s.gate_l = leaf(s.in.gate);
    }
    s.outs.assign(static_cast<std::size_t>(groups(l)), at::Tensor());
    s.lses = s.outs;
  } else {
    s.gin = plan_ops::gdn_inputs(xn, p.w, spec);
    if (bwd) s.glin = {leaf(s.gin.qkv), leaf(s.gin.z), leaf(s.gin.beta), leaf(s.gin.g)};
    const GdnSpec& g = spec.gdn;
    s.state = at::zeros({s.n, g.value_heads, g.key_head_dim, g.value_head_dim}, x.options().dtype(at::kFloat).requires_grad(false));
  }
}

// The core over queries q and keys k, v of layer l: over the piece's own keys, or under context
// parallelism over the sequence's (context.cc).
AttentionOutput Runner::core(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int l) {
  if (cp_ranks > 1) return piece_attention(q, k, v, l);
  return attention_core(q, k, v, attn(l).window_tokens, cfg.model.attention_query_block, scale(l));
}

void Runner::attn_core(const Stage& st_, Pass& p) {
  Sub& s = sub_of(p, st_.key);
  const int l = p.l, G = groups(l), g = st_.key.head_group;
  if (p.kind != PassKind::kBackward) {
    const at::Tensor& k = cp_ranks > 1 ? s.kf : s.in.k;
    const at::Tensor& v = cp_ranks > 1 ? s.vf : s.in.v;
    auto r = core(plan_ops::query_group(s.in.q, G, g), plan_ops::kv_group(k, G, g), plan_ops::kv_group(v, G, g), l);
    s.outs[static_cast<std::size_t>(g)] = r.out;
    s.lses[static_cast<std::size_t>(g)] = r.lse.unsqueeze(-1);
    return;
  }
  const at::Tensor& k = cp_ranks > 1 ? s.kf : s.k_l;
  const at::Tensor& v = cp_ranks > 1 ? s.vf : s.v_l;
  if (G == 1) {
    s.out_graph = core(s.q_l, k, v, l).out;
    s.outs[0] = s.out_graph.detach();
  } else {
    at::NoGradGuard no_grad;  // the groups' statistics are recomputed per group in backward
    s.outs[static_cast<std::size_t>(g)] =
        core(plan_ops::query_group(s.q_l, G, g), plan_ops::kv_group(k, G, g), plan_ops::kv_group(v, G, g), l).out;
  }
}

void Runner::olse_d2h(const Stage& st_, Pass& p) {
  Sub& s = sub_of(p, st_.key);
  // O as the model keeps it, in the activations' dtype (BF16 in a BF16 run; o_proj reads it so,
  // and the flash-style backward as a flash kernel does); the LSE stays FP32. The groups' FP32
  // outputs go.
  s.out = plan_ops::merge_groups(s.outs).to(s.x.scalar_type());
  const auto lse = plan_ops::merge_groups(s.lses).squeeze(-1);
  s.outs.clear();
  s.lses.clear();
  auto& kept = olse[p.l];
  kept.resize(sub_index(st_.key) + 1);
  kept[sub_index(st_.key)] = {to_host(s.out, st.pinned()), to_host(lse, st.pinned())};
}

void Runner::olse_h2d(const Stage& st_, Pass& p) {
  Sub& s = sub_of(p, st_.key);
  const OLse& kept = olse.at(p.l).at(sub_index(st_.key));
  s.out = load_to_device(kept.out, dev);
  if (p.kind == PassKind::kBackward) s.lse = load_to_device(kept.lse, dev);
}

// The sequences [first, first + count) of each GDN core call over `n` sequences: as many a call
// as the lowering prices a piece with (costmodel gdn_call_shape: C/S with whole-sequence pieces,
// else all of them).
std::vector<std::pair<std::int64_t, std::int64_t>> Runner::gdn_call_rows(std::int64_t n) const {
  const std::int64_t per = gdn_call_shape(n, S, plan.split.gdn_chunk_tokens).call_seqs;
  std::vector<std::pair<std::int64_t, std::int64_t>> rows;
  for (std::int64_t b0 = 0; b0 < n; b0 += per) rows.emplace_back(b0, std::min(per, n - b0));
  return rows;
}

// One GDN piece's recurrence over the sub-batch's sequences, a call per gdn_call_rows entry;
// `state` [n, Hv, dk, dv] in, the end states out.
at::Tensor Runner::gdn_calls(const plan_ops::GdnInputs& in, std::int64_t s0, std::int64_t C, const Pass& p, at::Tensor& state) {
  const auto calls = gdn_call_rows(in.qkv.size(0));
  if (calls.size() == 1) return plan_ops::gdn_core(in, s0, C, p.w, spec, cfg.model.gdn_chunk_tokens, state);
  std::vector<at::Tensor> outs, ends;
  for (const auto& [b0, m] : calls) {
    at::Tensor end = state.narrow(0, b0, m);
    outs.push_back(plan_ops::gdn_core(gdn_rows(in, b0, m), s0, C, p.w, spec, cfg.model.gdn_chunk_tokens, end));
    ends.push_back(end);
  }
  state = at::cat(ends, 0);
  return at::cat(outs, 0);
}

void Runner::gdn_core(const Stage& st_, Pass& p) {
  if (cp_ranks > 1) {
    // The pieces run in the state chain, in the lowering's correction stage (context.cc).
    if (st_.key.chunk == gdn_call_shape(B, S, plan.split.gdn_chunk_tokens).pieces) gdn_chain(st_, p);
    return;
  }
  Sub& s = sub_of(p, st_.key);
  const auto [s0, C] = piece(S, plan.split.gdn_chunk_tokens, st_.key.chunk);
  if (p.kind != PassKind::kBackward) {
    s.outs.push_back(gdn_calls(s.gin, s0, C, p, s.state));
    return;
  }
  at::NoGradGuard no_grad;
  s.starts.push_back(s.state);  // gdn_core replaces the state tensor, so this one stays the chunk's start
  s.outs.push_back(gdn_calls(s.glin, s0, C, p, s.state));
}

void Runner::mix_out(const Stage& st_, Pass& p) {
  Sub& s = sub_of(p, st_.key);
  const int l = p.l;
  const auto dtype = s.x.scalar_type();
  const bool bwd = p.kind == PassKind::kBackward;
  if (attention(l)) {
    if (!s.out.defined()) s.out = plan_ops::merge_groups(s.outs);
    if (bwd) {
      s.out_l = leaf(s.out);
      s.mixed = post_mixing(plan_ops::attention_output(s.out_l, s.gate_l, p.w, dtype), p.w, spec);
    } else {
      s.mixed = post_mixing(plan_ops::attention_output(s.out, s.in.gate, p.w, dtype), p.w, spec);
    }
  } else {
    const auto o = s.outs.size() == 1 ? s.outs[0] : at::cat(s.outs, 2);
    if (bwd) {
      s.out_l = leaf(o);
      s.mixed = plan_ops::gdn_output(s.out_l, s.glin.z, p.w, spec, dtype);
    } else {
      s.mixed = plan_ops::gdn_output(o, s.gin.z, p.w, spec, dtype);
    }
  }
  s.h = s.x + (bwd ? s.mixed.detach() : s.mixed);
  if (bwd) {
    s.dh = at::empty_like(s.x);
    // The replay has read the decoder input for the last time once its last sub-batch is here: the
    // norm kept its output, the residual sum is made, and what is left of the input (this pass's
    // tensors, the leaves the gradient lands on) needs only its shape. Its memory goes now, as
    // the lowering releases the boundary at this stage, not at the end of the decoder's backward.
    if (s.b0 + s.n == B) p.x.storage().unsafeGetStorageImpl()->reset();
  }
}

void Runner::mix_out_bwd(const Stage& st_, Pass& p) {
  Sub& s = sub_of(p, st_.key);
  s.mixed.backward(s.dh);
  s.dout = s.out_l.grad();
}

void Runner::mix_core_bwd(const Stage& st_, Pass& p) {
  Sub& s = sub_of(p, st_.key);
  const int l = p.l;
  if (!attention(l)) {
    if (cp_ranks > 1) {
      // The pieces' backward runs in the state chain, in the lowering's correction stage (context.cc).
      if (st_.key.chunk == gdn_call_shape(B, S, plan.split.gdn_chunk_tokens).pieces) gdn_grad_chain(st_, p);
      return;
    }
    const auto [s0, C] = piece(S, plan.split.gdn_chunk_tokens, st_.key.chunk);
    const at::Tensor& start0 = s.starts.at(static_cast<std::size_t>(st_.key.chunk));
    // Each call recomputed and differentiated on its own, so one call's autograd graph lives at a time.
    std::vector<at::Tensor> dstarts;
    for (const auto& [b0, m] : gdn_call_rows(start0.size(0))) {
      auto start = leaf(batch_rows(start0, b0, m));
      auto state = start;
      const auto out = plan_ops::gdn_core(gdn_rows(s.glin, b0, m), s0, C, p.w, spec, cfg.model.gdn_chunk_tokens, state);
      backward_defined({out, state}, {batch_rows(s.dout.narrow(2, s0, C), b0, m), batch_rows(s.dstate, b0, m)});
      dstarts.push_back(start.grad());
    }
    const bool all = std::all_of(dstarts.begin(), dstarts.end(), [](const at::Tensor& d) { return d.defined(); });
    s.dstate = dstarts.size() == 1 ? dstarts[0] : all ? at::cat(dstarts, 0) : at::Tensor();
    return;
  }
  const AttentionSpec& a = attn(l);
  const int G = groups(l), g = st_.key.head_group;
  if (plan.keep_attention_results) {
    // Flash-style backward from the kept O/LSE, without recomputing the core.
    // Under context parallelism dK and dV are the whole sequence's (context.cc scatters them).
    const at::Tensor& k = cp_ranks > 1 ? s.kf : s.k_l;
    if (!s.dq.defined()) {
      s.dq = at::zeros(s.q_l.sizes(), s.q_l.options().dtype(at::kFloat));
      s.dk = at::zeros(k.sizes(), k.options().dtype(at::kFloat));
      s.dv = at::zeros((cp_ranks > 1 ? s.vf : s.v_l).sizes(), k.options().dtype(at::kFloat));
    }
    const auto q = plan_ops::query_group(s.in.q.detach(), G, g);
    const auto kg = plan_ops::kv_group((cp_ranks > 1 ? s.kf : s.in.k).detach(), G, g);
    const auto vg = plan_ops::kv_group((cp_ranks > 1 ? s.vf : s.in.v).detach(), G, g);
    const auto out = plan_ops::query_group(s.out, G, g), lse = plan_ops::query_group(s.lse.unsqueeze(-1), G, g).squeeze(-1);
    const auto dout = plan_ops::query_group(s.dout, G, g);
    auto grads = cp_ranks > 1 ? piece_attention_backward(q, kg, vg, out, lse, dout, l)
                              : plan_ops::attention_core_backward(q, kg, vg, out, lse, dout, a.window_tokens,
                                                                  cfg.model.attention_query_block, scale(l));
    plan_ops::query_group(s.dq, G, g).copy_(grads.dq);
    plan_ops::kv_group(s.dk, G, g).add_(grads.dk.to(at::kFloat));  // the group's KV head
    plan_ops::kv_group(s.dv, G, g).add_(grads.dv.to(at::kFloat));
  } else if (G == 1) {
    s.out_graph.backward(s.dout);
  } else {
    s.group_graph.backward(plan_ops::query_group(s.dout, G, g));  // K/V gradients accumulate over groups
  }
}

void Runner::attn_core_refwd(const Stage& st_, Pass& p) {
  Sub& s = sub_of(p, st_.key);
  const int G = groups(p.l), g = st_.key.head_group;
  const at::Tensor& k = cp_ranks > 1 ? s.kf : s.k_l;
  const at::Tensor& v = cp_ranks > 1 ? s.vf : s.v_l;
  s.group_graph = core(plan_ops::query_group(s.q_l, G, g), plan_ops::kv_group(k, G, g), plan_ops::kv_group(v, G, g), p.l).out;
}

void Runner::mix_proj_bwd(const Stage& st_, Pass& p) {
  Sub& s = sub_of(p, st_.key);
  if (attention(p.l)) {
    at::Tensor dq = s.dq, dk = s.dk, dv = s.dv;
    if (!plan.keep_attention_results) {
      dq = s.q_l.grad(), dk = (cp_ranks > 1 ? s.kf : s.k_l).grad(), dv = (cp_ranks > 1 ? s.vf : s.v_l).grad();
    }
    if (cp_ranks > 1) dk = scatter_sequence(dk), dv = scatter_sequence(dv);  // the ring's reduce-scatter
    backward_defined({s.in.q, s.in.k, s.in.v, s.in.gate},
                     {dq.to(s.in.q.scalar_type()), dk.to(s.in.k.scalar_type()), dv.to(s.in.v.scalar_type()), grad_of(s.gate_l)});
  } else {
    backward_defined({s.gin.qkv, s.gin.z, s.gin.beta, s.gin.g},
                     {grad_of(s.glin.qkv), grad_of(s.glin.z), grad_of(s.glin.beta), grad_of(s.glin.g)});
  }
  output_of(p).narrow(0, s.b0, s.n).copy_(s.dh + s.x_l.grad());
  p.subs.erase(static_cast<int>(sub_index(st_.key)));
}

}  // namespace oom::backend::runner
