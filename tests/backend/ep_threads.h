// One step of an EP plan through the graph runner on P ranks run as threads of this process
// (FileStore rendezvous in `dir`, the ranks' host state shared through a file there as the rank
// processes share it), for gradient checks: each rank's loss, gradient norm and host gradient
// buffers, and the step's gradient of every block, assembled from what each rank sent to the host
// (its slice of the common parts, its own experts). Errors of a rank come back as its message
// (empty when it succeeded).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "backend/runtime/runtime.h"
#include "backend/runtime/state.h"
#include "planner/plan/plan.h"

namespace oom::backend::testing {

struct EpThreadsStep {
  std::vector<double> losses, norms;
  std::vector<int> host_buffers;   // host gradient buffers held between steps (host_gradient_buffers)
  std::vector<std::string> errors;
  std::vector<at::Tensor> grads;   // per block, flat, layout order: the ranks' sent gradients summed
};

// `init` is copied (masters; moments zero); it is not changed.
EpThreadsStep ep_step_in_threads(const HostState& init, const at::Tensor& tokens, const at::Tensor& targets,
                                 const TrainerConfig& config, const Plan& plan, int ranks, const std::string& dir);

}  // namespace oom::backend::testing
