// PipelinedLLEP (llep.h): the placement of spilled experts, their fetch and their gradients' return.
#include "backend/runner/runner.h"

#include <algorithm>
#include <set>

#include <torch/torch.h>

#include "costmodel/input_error.h"
#include "costmodel/routing.h"

namespace oom::backend::runner {

const ExpertWeights& Runner::fetched_expert(const Pass& p, int e) const {
  const auto it = p.fetched.find(e);
  OOM_ASSERT(it != p.fetched.end(), "rows of an expert this rank did not fetch");
  return it->second;
}

std::int64_t Runner::expert_numel(int l) const {
  const auto& layout = st.layout().blocks[static_cast<std::size_t>(1 + l)];
  std::int64_t n = 0;
  for (const char* bank : kExpertBanks) n += layout.at(bank).numel() / spec.moe.experts;
  return n;
}

// Expert e's (gate, up, down) as one row; in reverse, a row as the three shapes of `like`.
at::Tensor Runner::pack(const ExpertWeights& w) {
  return at::cat({w[0].detach().reshape(-1), w[1].detach().reshape(-1), w[2].detach().reshape(-1)});
}

ExpertWeights Runner::unpack(const at::Tensor& row, const ExpertWeights& like) {
  ExpertWeights out;
  std::int64_t at0 = 0;
  for (std::size_t i = 0; i < 3; ++i) {
    const auto n = like[i].numel();
    out[i] = row.narrow(0, at0, n).view(like[i].sizes());
    at0 += n;
  }
  return out;
}

ExpertWeights Runner::own_expert(const Pass& p, int e) const {
  return {p.w.expert("experts.gate", e).detach(), p.w.expert("experts.up", e).detach(), p.w.expert("experts.down", e).detach()};
}

// One exchange over the decoder's (expert, helper) pairs: with `to_helpers` each owner sends
// make(e) to each helper of e, else each helper sends make(e) to e's owner; returns (expert,
// row) in the order the rows arrive (by source rank, then pair).
std::vector<std::pair<int, at::Tensor>> Runner::llep_exchange(int l, bool to_helpers, const std::function<at::Tensor(int)>& make,
                                                              const at::TensorOptions& options) {
  const auto& spills = llep_spills[static_cast<std::size_t>(l)];
  const auto from = [&](int e, int h) { return to_helpers ? owner_of(e) : h; };
  const auto to = [&](int e, int h) { return to_helpers ? h : owner_of(e); };
  std::vector<std::int64_t> send(static_cast<std::size_t>(P), 0), recv(static_cast<std::size_t>(P), 0);
  std::vector<at::Tensor> rows;
  for (int d = 0; d < P; ++d) {
    for (const auto& [e, h] : spills) {
      if (from(e, h) != R || to(e, h) != d) continue;
      rows.push_back(make(e));
      ++send[static_cast<std::size_t>(d)];
    }
  }
  std::vector<int> arriving;
  for (int q = 0; q < P; ++q) {
    for (const auto& [e, h] : spills) {
      if (to(e, h) != R || from(e, h) != q) continue;
      arriving.push_back(e);
      ++recv[static_cast<std::size_t>(q)];
    }
  }
  const auto input = rows.empty() ? at::empty({0, expert_numel(l)}, options) : at::stack(rows);
  const auto received = group->all_to_all(input, send, recv);
  std::vector<std::pair<int, at::Tensor>> out;
  for (std::size_t i = 0; i < arriving.size(); ++i) out.emplace_back(arriving[i], received[static_cast<std::int64_t>(i)]);
  return out;
}

// The helpers receive the spilled experts' weights from their owners; in a backward each with a
// zeroed gradient beside it, which the experts' backward adds into (a retained forward's chunks
// too: their backward runs in this pass).
void Runner::llep_fetch(Pass& p) {
  at::NoGradGuard no_grad;
  const auto arrived = llep_exchange(p.l, true, [&](int e) { return pack(own_expert(p, e)); }, p.wflat.options());
  p.fetched.clear();
  p.fetched_grad.clear();
  for (const auto& [e, row] : arrived) {
    p.fetched[e] = unpack(row, own_expert(p, e));
    if (p.kind == PassKind::kBackward) p.fetched_grad[e] = at::zeros({row.numel()}, p.grad.parts.front().second.options());
  }
}

// The helpers send the spilled experts' gradients to their owners, which add them into the
// experts' gradients; the helpers' copies of those experts and their gradients are done with.
void Runner::llep_grad_return(Pass& p) {
  at::NoGradGuard no_grad;
  const auto gradient = [&](int e) {
    const auto it = p.fetched_grad.find(e);
    OOM_ASSERT(it != p.fetched_grad.end(), "a fetched expert without its gradient");
    return it->second;
  };
  const auto arrived = llep_exchange(p.l, false, gradient, p.grad.parts.front().second.options());
  for (const auto& [e, row] : arrived) {
    const ExpertWeights own{expert_grad(p, "experts.gate", e), expert_grad(p, "experts.up", e), expert_grad(p, "experts.down", e)};
    const ExpertWeights add = unpack(row, own);
    for (std::size_t i = 0; i < 3; ++i) own[i].add_(add[i]);
  }
  p.fetched.clear();
  p.fetched_grad.clear();
}

// PipelinedLLEP: the (expert, helper) pairs of every decoder from llep_routing, which the graph
// was lowered with (its fetch stages are exactly the decoders with pairs), and a fresh histogram.
void Runner::place_fetched_experts(const StepGraph& g) {
  const int E = spec.moe.experts, L = spec.layers;
  const std::vector<LlepBalance> balance = ep_layer_balance(llep_routing, E, L, P, true);
  llep_spills.assign(static_cast<std::size_t>(L), {});
  for (int l = 0; l < L; ++l) {
    auto& pairs = llep_spills[static_cast<std::size_t>(l)];
    pairs = balance[static_cast<std::size_t>(l)].spills;
    std::sort(pairs.begin(), pairs.end());
  }
  std::set<int> fetching;
  for (const Stage& s : g.stages) {
    if (s.key.part == StagePart::kLlep && s.key.op == StageOp::kFetch) fetching.insert(s.layer);
  }
  for (int l = 0; l < L; ++l) {
    OOM_ASSERT(fetching.count(l) == (llep_spills[static_cast<std::size_t>(l)].empty() ? 0u : 1u),
               "the graph was lowered with another routing than the runner's (GraphRunner::routing())");
  }
}

}  // namespace oom::backend::runner
