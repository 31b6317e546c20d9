// MoE stages per token chunk (moe.h): router and shared expert, routed experts, their backward; over
// ranks (EP) the dispatch and return all-to-alls, the owner's experts, the combine.
#include "backend/runner/runner.h"

#include <torch/csrc/autograd/engine.h>
#include <torch/torch.h>

#include "backend/model/recompute.h"
#include "costmodel/input_error.h"

namespace oom::backend::runner {

// Whether a MoE stage of the pass builds autograd graphs: in backward, and in the forward of a
// retained MoE (EP), whose graph the backward uses instead of a recompute.
bool Runner::moe_graph(const Pass& p) const { return p.kind == PassKind::kBackward || (p.kind == PassKind::kForward && retained(p.l)); }

void Runner::router_shared(const Stage& st_, Pass& p) {
  Sub& s = sub_of(p, st_.key);
  Chunk& c = chunk_of(p, s, st_.key);
  const auto tokens = chunk_tokens(s, st_.key);
  const auto h2 = s.h.reshape({-1, s.h.size(-1)}).narrow(0, tokens.first, tokens.second);
  if (!moe_graph(p)) {
    c.hc = h2;
    c.in = ffn_inputs(c.hc, p.w, spec);
    c.r = route_layer(c.in.router, p.w, spec);
    c.d = plan_ops::dense_terms(c.in.dense, p.w, spec);
    count_routing(c, p);
    return;
  }
  // Router, experts and dense MLP read one normalized input, except Gemma 4's (its router reads
  // the residual and each branch has its own norm): the experts' input is a leaf either way.
  const bool one_input = !spec.gemma4();
  c.hc = leaf(h2);
  c.in = ffn_inputs(c.hc, p.w, spec);
  c.xn_l = leaf(c.in.experts);
  c.r = route_layer(one_input ? c.xn_l : c.in.router, p.w, spec);
  c.d = plan_ops::dense_terms(one_input ? c.xn_l : c.in.dense, p.w, spec);
  count_routing(c, p);
  if (p.kind == PassKind::kBackward) keep_dense_graphs(c);
}

// Where the chunk's output values are not computed again (a backward's replay never computes
// them; a retained forward has written them), the shared expert's and the dense MLP's outputs
// are read only through their graphs, each with the output's gradient (outside Gemma 4, whose
// norms read their values): the chunk keeps the graphs' edges, not the outputs [T, h].
void Runner::keep_dense_graphs(Chunk& c) const {
  if (spec.gemma4()) return;
  for (at::Tensor* t : {&c.d.shared, &c.d.dense}) {
    if (t->defined() && t->requires_grad()) c.dense_edges.push_back(torch::autograd::impl::gradient_edge(*t));
    *t = at::Tensor();
  }
}

// The shared expert's and dense MLP's backward for the output gradient dyc (keep_dense_graphs).
void Runner::dense_graphs_backward(Chunk& c, const at::Tensor& dyc) {
  if (c.dense_edges.empty()) return;
  const torch::autograd::variable_list grads(c.dense_edges.size(), dyc);
  torch::autograd::Engine::get_default_engine().execute(c.dense_edges, grads, /*keep_graph=*/false, /*create_graph=*/false,
                                                        /*accumulate_grad=*/true);
  c.dense_edges.clear();
}

void Runner::experts(const Stage& st_, Pass& p) {
  Sub& s = sub_of(p, st_.key);
  Chunk& c = chunk_of(p, s, st_.key);
  if (dist()) {
    owned_experts_forward(c, p);
    return;
  }
  c.routed = routed_experts(moe_graph(p) ? c.xn_l : c.in.experts, c.r, p.w, spec);
  chunk_output(p, s, st_.key, c);
}

// A forward chunk's output rows from its routed branch: a retained MoE keeps the chunk (its graph
// waits for the backward), any other is done with it. In a backward pass the chunk is a replay,
// kept for the backward stages.
void Runner::chunk_output(Pass& p, Sub& s, const StageKey& k, Chunk& c) {
  if (p.kind == PassKind::kBackward) return;
  auto out = rows(output_of(p), s, chunk_tokens(s, k));
  if (moe_graph(p)) {
    // Retained: the output from the graph's values.
    {
      at::NoGradGuard no_grad;
      const auto dense = c.d.dense.defined() ? c.d.dense.detach() : c.d.dense;
      const auto shared = c.d.shared.defined() ? c.d.shared.detach() : c.d.shared;
      out.copy_(ffn_output(c.hc.detach(), c.routed.detach(), shared, dense, p.w, spec));
    }
    keep_dense_graphs(c);
    retained_moe[{p.l, k.chunk}] = std::move(c);
  } else {
    out.copy_(ffn_output(c.hc, c.routed, c.d.shared, c.d.dense, p.w, spec));
  }
  s.chunks.erase(k.chunk);
}

// The gradient of a chunk's output rows dyc with respect to its routed branch, through the
// combination (whose graph c.comb keeps for the router/shared stage).
at::Tensor Runner::routed_gradient(Chunk& c, const Pass& p, const at::Tensor& dyc) {
  auto routed_l = leaf(c.routed);
  c.comb = ffn_output(c.hc, routed_l, c.d.shared, c.d.dense, p.w, spec);
  return torch::autograd::grad({c.comb}, {routed_l}, {dyc}, /*retain_graph=*/true)[0];
}

void Runner::experts_bwd(const Stage& st_, Pass& p) {
  Sub& s = sub_of(p, st_.key);
  Chunk& c = chunk_of(p, s, st_.key);
  if (dist()) {
    // The owner: its experts' backward on the rows it received, from their kept activations,
    // the weights' gradients added where they accumulate (this rank's experts' in the decoder's
    // gradient, the fetched ones' in their own); one expert at a time, with its activations'
    // gradients in three buffers of its rows.
    at::NoGradGuard no_grad;
    const auto dys = c.dy_recv.index_select(0, c.order);
    c.dy_recv = at::Tensor();
    auto dxs = at::empty_like(c.xs);
    std::int64_t a = 0;
    for (const ExpertRows& x : experts_of(c, p, true)) {
      const std::int64_t n = x.rows.numel();
      plan_ops::expert_backward(dys.narrow(0, a, n), c.xs.narrow(0, a, n), plan_ops::expert_rows(c.acts, a, n), x.w, x.dw,
                                spec.activation, plan_ops::expert_activations(n, spec.moe.expert_intermediate, c.xs.options()),
                                dxs.narrow(0, a, n));
      a += n;
    }
    c.d_recv = at::empty_like(dxs).index_copy_(0, c.order, dxs);  // the rows' gradients as received
    c.xs = at::Tensor();  // the rows and their activations are done with
    c.acts = {};
    return;
  }
  const auto dyc = rows(p.dy, s, chunk_tokens(s, st_.key));
  if (!spec.gemma4()) {
    routed_backward(c, p, dyc);
    return;
  }
  // Gemma 4 combines the branches through norms: the routed branch's output gradient first, then
  // its backward.
  routed_backward(c, p, routed_gradient(c, p, dyc));
  c.in.experts.backward(c.xn_l.grad());
}

void Runner::router_shared_bwd(const Stage& st_, Pass& p) {
  Sub& s = sub_of(p, st_.key);
  Chunk& c = chunk_of(p, s, st_.key);
  const auto tokens = chunk_tokens(s, st_.key);
  const auto dyc = rows(p.dy, s, tokens);
  auto dh = s.dh.reshape({-1, s.dh.size(-1)}).narrow(0, tokens.first, tokens.second);
  // Over ranks a dense decoder (DeepSeek's first ones) sends nothing: its MLP is data-parallel,
  // each rank's on its own rows, as on one rank.
  if (dist() && spec.moe_layer(p.l)) {
    // The combination (residual, shared expert, dense MLP), then the experts' input: the
    // gradient its rows got back from their owners plus what the router and the dense branch
    // gave the normalized input. Outside Gemma 4 the combination is a sum: each branch gets the
    // output's gradient, as does the residual.
    if (spec.gemma4()) {
      c.comb.backward(dyc);
    } else {
      dense_graphs_backward(c, dyc);
    }
    const auto g = c.xn_l.grad();
    c.in.experts.backward(g.defined() ? g + c.dxn : c.dxn);
    dh.copy_(spec.gemma4() ? c.hc.grad() : dyc + c.hc.grad());
    s.chunks.erase(st_.key.chunk);
    return;
  }
  if (!spec.gemma4()) {
    dense_graphs_backward(c, dyc);
    c.in.experts.backward(c.xn_l.grad());
    dh.copy_(dyc + c.hc.grad());
  } else {
    c.comb.backward(dyc);
    dh.copy_(c.hc.grad());
  }
  s.chunks.erase(st_.key.chunk);
}

// ---- over ranks (EP): dispatch, owned experts, return, combine ----

// The experts' input of a chunk: the normalized rows (a leaf in a graph).
const at::Tensor& Runner::expert_input(const Chunk& c) { return c.xn_l.defined() ? c.xn_l : c.in.experts; }

void Runner::a2a_dispatch(const Stage& st_, Pass& p) {
  Sub& s = sub_of(p, st_.key);
  Chunk& c = chunk_of(p, s, st_.key);
  const plan_ops::SortedSlots slots = plan_ops::sort_slots_by_expert(c.r, spec.moe);
  const at::Tensor all_counts = ep_group->all_gather_counts(slots.counts);  // the EP group's
  plan_ops::DispatchSplits d = llep() ? plan_ops::balanced_dispatch_splits(all_counts, ep_rank, experts_local, llep_spills[static_cast<std::size_t>(p.l)])
                                      : plan_ops::dispatch_splits(all_counts, ep_rank, experts_local);
  c.send = std::move(d.send);
  c.recv = std::move(d.recv);
  const auto index = [&](const std::vector<std::int64_t>& r) {
    return r.empty() ? at::Tensor() : at::tensor(r, at::TensorOptions().dtype(at::kLong)).to(dev);
  };
  c.expert_rows.clear();
  for (const auto& r : d.owned_rows) c.expert_rows.push_back(index(r));
  c.fetched_rows.clear();
  for (const auto& [e, r] : d.fetched_rows) c.fetched_rows[e] = index(r);
  if (st_.phase == Phase::kForward) {
    dispatch_log.push_back(c.send);
    // The step's routing histogram of the EP group's tokens (run() sums the groups').
    const auto summed = all_counts.sum(0).contiguous();
    const auto* n = summed.data_ptr<std::int64_t>();
    auto& pairs = routed_pairs[static_cast<std::size_t>(p.l)];
    for (int e = 0; e < spec.moe.experts; ++e) pairs[static_cast<std::size_t>(e)] += static_cast<double>(n[e]);
  }
  c.tokens_sorted = slots.tokens;
  c.weights_sorted = slots.weights;
  if (!d.send_order.empty()) {
    const auto order = index(d.send_order);
    c.tokens_sorted = c.tokens_sorted.index_select(0, order);
    c.weights_sorted = c.weights_sorted.index_select(0, order);
  }
  const auto sent = expert_input(c).detach().index_select(0, c.tokens_sorted);
  c.recv_x = ep_group->all_to_all(sent, c.send, c.recv);
}

// The experts a chunk's received rows go to: this rank's, then (PipelinedLLEP) the fetched ones
// of other ranks, each with its rows of recv_x, its weights, and with `grads` where its weights'
// gradients accumulate (ExpertRows).
std::vector<ExpertRows> Runner::experts_of(const Chunk& c, const Pass& p, bool grads) const {
  std::vector<ExpertRows> out;
  for (int j = 0; j < experts_local; ++j) {
    const auto& idx = c.expert_rows[static_cast<std::size_t>(j)];
    if (!idx.defined()) continue;
    const int e = expert0 + j;
    ExpertRows x{idx, own_expert(p, e), {}};
    if (grads) x.dw = {expert_grad(p, "experts.gate", e), expert_grad(p, "experts.up", e), expert_grad(p, "experts.down", e)};
    out.push_back(std::move(x));
  }
  for (const auto& [e, idx] : c.fetched_rows) {
    ExpertRows x{idx, fetched_expert(p, e), {}};
    if (grads) {
      const auto it = p.fetched_grad.find(e);
      OOM_ASSERT(it != p.fetched_grad.end(), "a fetched expert without its gradient");
      x.dw = unpack(it->second, x.w);
    }
    out.push_back(std::move(x));
  }
  return out;
}

// Expert e's gradient in bank `name` (this rank's experts are in the decoder gradient's parts).
at::Tensor Runner::expert_grad(const Pass& p, const char* name, int e) const {
  const ParamEntry& b = p.w.layout->at(name);
  const std::int64_t per = b.numel() / spec.moe.experts;
  return p.grad.range(b.offset + e * per, per).view({b.shape[1], b.shape[2]});
}

// The owner's experts on the rows it received, without autograd, in the experts' order: where a
// backward follows (a replay, a retained forward) the rows and their activations are kept for it.
void Runner::owned_experts_forward(Chunk& c, const Pass& p) {
  at::NoGradGuard no_grad;
  const std::vector<ExpertRows> ex = experts_of(c, p, false);
  std::vector<at::Tensor> rows;
  for (const ExpertRows& x : ex) rows.push_back(x.rows);
  c.order = rows.empty() ? at::empty({0}, at::TensorOptions().dtype(at::kLong).device(dev)) : at::cat(rows);
  OOM_ASSERT(c.order.numel() == c.recv_x.size(0), "received rows of no expert this rank computes");
  c.xs = c.recv_x.index_select(0, c.order);
  c.recv_x = at::Tensor();  // the received rows are the experts' rows from here on
  c.acts = plan_ops::expert_activations(c.xs.size(0), spec.moe.expert_intermediate, c.xs.options());
  auto ys = at::empty_like(c.xs);
  std::int64_t a = 0;
  for (const ExpertRows& x : ex) {
    const std::int64_t n = x.rows.numel();
    plan_ops::expert_forward(c.xs.narrow(0, a, n), x.w, spec.activation, plan_ops::expert_rows(c.acts, a, n), ys.narrow(0, a, n));
    a += n;
  }
  c.y_recv = at::empty_like(ys).index_copy_(0, c.order, ys);  // in the order the rows came
  if (!moe_graph(p)) {
    c.xs = c.order = at::Tensor();
    c.acts = {};
  }
}

void Runner::a2a_return(const Stage& st_, Pass& p) {
  Sub& s = sub_of(p, st_.key);
  Chunk& c = chunk_of(p, s, st_.key);
  const auto back = ep_group->all_to_all(c.y_recv.contiguous(), c.recv, c.send);
  c.y_recv = at::Tensor();  // the outputs have left (the experts' backward reads the kept activations)
  c.back = moe_graph(p) ? leaf(back) : back;
}

void Runner::combine(const Stage& st_, Pass& p) {
  Sub& s = sub_of(p, st_.key);
  Chunk& c = chunk_of(p, s, st_.key);
  if (!spec.moe_layer(p.l)) {  // a dense layer (DeepSeek's first ones): its MLP alone, no routed branch
    c.routed = at::zeros_like(c.hc);
    return chunk_output(p, s, st_.key, c);
  }
  c.routed = lean_index_add(at::zeros_like(expert_input(c)), c.tokens_sorted,
                            c.back * c.weights_sorted.unsqueeze(1).to(c.back.scalar_type()));
  chunk_output(p, s, st_.key, c);
}

void Runner::a2a_grad_dispatch(const Stage& st_, Pass& p) {
  Sub& s = sub_of(p, st_.key);
  Chunk& c = chunk_of(p, s, st_.key);
  const auto dyc = rows(p.dy, s, chunk_tokens(s, st_.key));
  // The routed branch's output gradient through the combination (outside Gemma 4 a sum: the
  // output's), then through the weighted sum: the returned rows' gradients (and the routing
  // weights').
  routed_backward(c, p, spec.gemma4() ? routed_gradient(c, p, dyc) : dyc);
  const auto d_back = c.back.grad().defined() ? c.back.grad() : at::zeros_like(c.back);
  c.dy_recv = ep_group->all_to_all(d_back.contiguous(), c.send, c.recv);
  c.back = c.routed = at::Tensor();  // the returned rows and their gradient are done with
}

void Runner::a2a_grad_return(const Stage& st_, Pass& p) {
  Sub& s = sub_of(p, st_.key);
  Chunk& c = chunk_of(p, s, st_.key);
  const auto d_sorted = ep_group->all_to_all(c.d_recv, c.recv, c.send);
  c.d_recv = c.order = at::Tensor();  // the received rows' gradient is done with
  c.dxn = at::zeros_like(expert_input(c)).index_add(0, c.tokens_sorted, d_sorted);
}

}  // namespace oom::backend::runner
