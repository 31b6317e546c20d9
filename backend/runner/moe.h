// MoE per token chunk in the graph runner: router and shared expert, routed experts, their backward
// (Local path: plan_ops on the chunk's rows; a replay in backward). Over ranks (EP) each dispatch
// all-to-all sends each (token, slot) pair's normalized row to its expert's owner (counts exchanged
// first), the owner runs its experts on the rows it received without autograd, the return sends
// their outputs back and the combine weighs them in; backward sends the returned rows' gradients to
// the owners and the input gradients back. A retained MoE keeps its forward graph for the backward
// (TensorStore::retained_moe). The runner's methods are in moe.cc; the load-balancing loss's in
// load_balance.cc.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/ATen.h>

#include "backend/model/plan_ops.h"
#include "costmodel/routing.h"

namespace oom::backend::runner {

// An expert a chunk's received rows go to: its rows of recv_x, its weights, and where its weights'
// gradients accumulate (this rank's: the decoder's gradient; fetched: their own, llep_fetch).
struct ExpertRows {
  at::Tensor rows;
  plan_ops::ExpertWeights w, dw;
};

// What the step's forward dispatches sent (EP over ranks).
struct DispatchLog {
  std::vector<std::vector<std::int64_t>> dispatch_log;  // rows sent per forward dispatch (layer, chunk order)
  std::vector<std::vector<double>> routed_pairs;        // the step's global (token, expert) pairs per decoder and expert
  RoutingSpec step_routing;  // EP over ranks: the last step's routing histogram (uniform before one)
};

// The load-balancing loss (router_aux_loss_coef > 0) as transformers' load_balancing_loss_func
// computes it for the reference: every MoE decoder's routing of every token of the step's global
// batch together, so f_e (the fraction of the top-k slots expert e took, without gradient) and P_e
// (its mean softmax probability) are means over decoders × tokens jointly, and aux = coef · E ·
// Σ_e f_e · P_e does not split per decoder. The forward passes add each chunk's slot counts and
// probability sums (a replay or a regeneration routes the same tokens again and adds nothing);
// the first backward stage that needs the gradient sums them over the ranks, which fixes f: the
// gradient of aux with respect to a token's probability of expert e is then the constant
// coef · E · f_e / rows, which each MoE chunk's backward adds through its router's softmax. The
// step's loss adds aux.
struct LoadBalance {
  at::Tensor balance_stats;    // [2E + 1] FP64 on the device: slot counts, probability sums, rows (this rank's forward)
  at::Tensor balance_grad;     // [E] FP32: d aux / d (a token's probability of expert e); undefined until summed
  at::Tensor balance_loss;     // 0-dim FP64 on the device: coef · aux, once summed
};

}  // namespace oom::backend::runner
