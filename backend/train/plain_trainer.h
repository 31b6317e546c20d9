// The plain in-memory trainer: the reference the streamed runtime is checked against.
//
// Every weight is its own FP32 leaf tensor on the CPU, the loss is one autograd graph over the
// whole model (backend/model/model.h, the same functions the streamed runtime calls), gradients are
// clipped with torch::nn::utils::clip_grad_norm_ and the update is torch::optim::AdamW. Nothing
// is streamed, checkpointed or overlapped. Not thread-safe.
#pragma once

#include <memory>
#include <vector>

#include <ATen/ATen.h>

#include "backend/runtime/runtime.h"
#include "backend/runtime/state.h"

namespace oom::backend {

class PlainTrainer {
 public:
  // Copies the masters of `init` (its moments must be zero: a fresh optimizer).
  PlainTrainer(const HostState& init, TrainerConfig config);
  ~PlainTrainer();
  PlainTrainer(const PlainTrainer&) = delete;
  PlainTrainer& operator=(const PlainTrainer&) = delete;

  // One step; with config.accumulate = K the batch runs as K micro-batches whose gradients autograd
  // sums (each loss scaled by 1/K), then one clip and one update.
  StepStats step(const at::Tensor& tokens, const at::Tensor& targets);
  // The learning rate of the following steps.
  void set_lr(double lr);
  // The current weights as one flat FP32 tensor per block, in layout order (copies).
  std::vector<at::Tensor> flat_params() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace oom::backend
