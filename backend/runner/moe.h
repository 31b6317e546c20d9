// MoE per token chunk in the graph runner: router and shared expert, routed experts, their backward
// (Local path: plan_ops on the chunk's rows; a replay in backward). Over ranks (EP) each dispatch
// all-to-all sends each (token, slot) pair's normalized row to its expert's owner (counts exchanged
// first), the owner runs its experts on the rows it received without autograd, the return sends
// their outputs back and the combine weighs them in; backward sends the returned rows' gradients to
// the owners and the input gradients back. A retained MoE keeps its forward graph for the backward
// (TensorStore::retained_moe). The runner's methods are in moe.cc.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/ATen.h>

#include "backend/plan_ops.h"
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

}  // namespace oom::backend::runner
