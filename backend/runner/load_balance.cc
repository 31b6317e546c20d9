// The load-balancing loss of the graph runner (moe.h, LoadBalance): the forward's routing
// statistics, their sum over the ranks, and the gradient each MoE chunk's backward adds through
// its router.
#include "backend/runner/runner.h"

#include <torch/torch.h>

#include "costmodel/input_error.h"

namespace oom::backend::runner {

// Adds a forward chunk's routing to the step's statistics: per expert the top-k slots it took and
// the sum of its probability over the chunk's tokens, and the tokens.
void Runner::count_routing(const Chunk& c, const Pass& p) {
  if (!balance_on() || p.kind != PassKind::kForward || !spec.moe_layer(p.l)) return;
  OOM_ASSERT(!balance_grad.defined(), "a forward routing after the load-balancing loss was summed");
  at::NoGradGuard no_grad;
  const int E = spec.moe.experts;
  // Slots per expert by an index_add (bincount's CUDA kernel reads its range back to the host).
  const auto ids = c.r.expert_ids.reshape({-1});
  const auto counts = at::zeros({E}, c.r.probs.options().dtype(at::kDouble)).index_add_(0, ids, at::ones({ids.numel()}, c.r.probs.options().dtype(at::kDouble)));
  const auto sums = c.r.probs.detach().to(at::kDouble).sum(0);
  const auto rows = at::full({1}, static_cast<double>(c.r.probs.size(0)), counts.options());
  const auto now = at::cat({counts, sums, rows});
  if (balance_stats.defined()) {
    balance_stats.add_(now);
  } else {
    balance_stats = now;
  }
}

// The gradient of coef · aux with respect to each token's probability of expert e, [E]; the first
// call sums the forward's statistics over the ranks (every rank makes it at the same stage: the
// first backward of a MoE chunk, or the step's end) and sets the step's coef · aux.
const at::Tensor& Runner::load_balance_grad() {
  if (balance_grad.defined()) return balance_grad;
  const int E = spec.moe.experts;
  at::Tensor t = balance_stats.defined() ? balance_stats.clone()
                                         : at::zeros({2 * E + 1}, at::TensorOptions().dtype(at::kDouble).device(dev));
  OOM_ASSERT(dist() || balance_stats.defined(), "the load-balancing loss of a step that routed no token");
  if (dist()) group->all_reduce_sum(t);
  // Read on the device (no host synchronisation): rows, the tokens routed over the ranks.
  const auto rows = t.narrow(0, 2 * E, 1);
  const auto f = t.narrow(0, 0, E) / rows;
  const auto prob = t.narrow(0, E, E) / rows;
  const double scale = spec.router_aux_loss_coef * static_cast<double>(E);
  balance_loss = scale * (f * prob).sum();
  balance_grad = (f * scale / rows).to(at::kFloat);
  return balance_grad;
}

// The routed branch's backward from its output gradient `grad`; with the load-balancing loss, the
// router's softmax gets its gradient in the same backward (the routing weights and the
// probabilities share the softmax's graph).
void Runner::routed_backward(Chunk& c, const Pass& p, const at::Tensor& grad) {
  if (!balance_on() || !spec.moe_layer(p.l)) {
    c.routed.backward(grad);
    return;
  }
  const at::Tensor& g = load_balance_grad();
  torch::autograd::backward({c.routed, c.r.probs}, {grad, g.unsqueeze(0).expand_as(c.r.probs)});
}

}  // namespace oom::backend::runner
