// One EpTrainer step on P ranks run as threads of this process (FileStore rendezvous in `dir`),
// for gradient checks: each rank's loss, gradient norm and host-slot use, and the gradients
// gathered to rank 0. Errors of a rank come back as its message (empty when it succeeded).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "backend/dist/ep_trainer.h"
#include "backend/state.h"

namespace oom::backend::testing {

struct EpThreadsStep {
  std::vector<double> losses, norms;
  std::vector<int> slots_used;
  std::vector<std::int64_t> resident_bytes;  // device expert bytes held between steps
  std::vector<std::string> errors;
  std::vector<at::Tensor> grads;             // rank 0's gather: per block, flat, layout order
};

EpThreadsStep ep_step_in_threads(const HostState& init, const at::Tensor& tokens, const at::Tensor& targets,
                                 const dist::EpConfig& config, int ranks, const std::string& dir);

}  // namespace oom::backend::testing
