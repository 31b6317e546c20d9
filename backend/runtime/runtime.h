// The trainer configuration the graph runner (backend/train/plan_runtime.h, backend/runner/graph_runner.h) shares
// with the plain in-memory trainer (backend/train/plain_trainer.h) it must match, the statistics a step
// returns, and the clipping rule both apply.
//
// Every launch of `oom train` (one process, --ranks P, torchrun) runs a lowered StepGraph through
// the graph runner; without --plan the run lowers a default plan (default_run_plan,
// backend/train/plan_runtime.h). The plain trainer is the reference the runner is tested against.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include <ATen/ATen.h>

#include "backend/model/model.h"
#include "backend/optim/adamw.h"
#include "backend/runtime/state.h"

namespace oom::backend {

struct TrainerConfig {
  AdamWConfig adam;
  double max_grad_norm = 0.0;  // 0 = no clipping
  ModelOptions model;
  int adam_threads = 0;         // 0 = LibTorch's intra-op thread count
  // Micro-batches per optimizer step (PlainTrainer): step() splits its B sequences into this many
  // equal parts, runs forward and backward on each, sums the gradients (each micro-batch's loss
  // scaled by 1/K, so the loss is the mean over all B sequences) and runs one AdamW update.
  // PlanTrainer takes 1: train() runs a plan's K micro-batches as its sub-batches
  // (split.sub_batch_seqs).
  int accumulate = 1;
};

struct StepStats {
  double loss = 0.0;
  double grad_norm = 0.0;  // global L2 norm before clipping (0 when clipping is off)
};

// Torch's clip coefficient for a global L2 gradient norm: min(1, max_norm / (norm + 1e-6)).
double clip_coefficient(double total_norm, double max_norm);

}  // namespace oom::backend
