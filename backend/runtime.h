// The streamed, checkpointed training step, and the trainer configuration it shares with the
// plain in-memory trainer (backend/plain_trainer.h) it must match.
//
// One step of StreamedTrainer:
//   forward   the outer block (embeddings, final norm, LM head) stays on the compute device for the
//             step; each decoder layer ℓ runs without autograd on weights acquired from the
//             ParamWindow (ℓ+1 is prefetched meanwhile) and its input is kept on the host as the
//             layer's checkpoint; the head computes the loss with autograd.
//             With retain_last_decoder the last decoder instead runs with autograd and keeps its graph.
//   backward  for ℓ = L−1 … 0: the layer is recomputed from its host checkpoint with autograd on a
//             flat leaf of its working weights, backpropagated with the output gradient, and its
//             flat gradient is brought back into the host gradient slot; AdamW for ℓ is handed to a
//             worker thread at once and overlaps with the backward of ℓ−1 (CUDA: the host copy
//             waits on an event of the compute stream). Last the embedding backward and the outer
//             block's update.
//   clipping  with max_grad_norm > 0 the update needs the global gradient norm, so gradients are
//             parked in the host slots and the per-block updates run after backward (still on the
//             worker, one block after another, republishing as they go).
// Every block's working copy is republished from its master after its update. FP32 on CPU matches
// the plain trainer within float rounding (tested: ≤ 1e-5 relative after several steps).
// Not thread-safe: one thread drives step(); the worker thread is internal.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include <ATen/ATen.h>

#include "backend/adamw.h"
#include "backend/model.h"
#include "backend/state.h"

namespace oom::backend {

class JobQueue;

struct TrainerConfig {
  AdamWConfig adam;
  double max_grad_norm = 0.0;  // 0 = no clipping
  ModelOptions model;
  int adam_threads = 0;         // 0 = LibTorch's intra-op thread count
  // StreamedTrainer: the last decoder keeps its autograd graph from the forward instead of being
  // recomputed (its backward follows the head at once). Off by default: on the 2-core CPU it made
  // the tiny-moe step slower (tests/bench/step_bench.cc, BM_StreamedStep/4/128/0/1 vs /0/0).
  bool retain_last_decoder = false;
  // Micro-batches per optimizer step: step() splits its B sequences into this many equal parts,
  // runs forward and backward on each, sums the gradients (each micro-batch's loss scaled by 1/K,
  // so the loss is the mean over all B sequences) and runs one AdamW update. PlainTrainer and
  // StreamedTrainer; PlanTrainer takes 1 (train() runs a plan's K micro-batches as its sub-batches)
  // and the multi-rank trainer has none.
  int accumulate = 1;
};

struct StepStats {
  double loss = 0.0;
  double grad_norm = 0.0;  // global L2 norm before clipping (0 when clipping is off)
};

class StreamedTrainer {
 public:
  // `state` must outlive the trainer. `device` is the compute device (CPU or CUDA).
  StreamedTrainer(HostState& state, TrainerConfig config, at::Device device = at::kCPU);
  ~StreamedTrainer();
  StreamedTrainer(const StreamedTrainer&) = delete;
  StreamedTrainer& operator=(const StreamedTrainer&) = delete;

  // One optimizer step on tokens/targets int64 [B, S] (host), B divisible by config.accumulate
  // (InputError naming --accumulate otherwise). Increments state.step.
  StepStats step(const at::Tensor& tokens, const at::Tensor& targets);
  // The learning rate of the following steps (a schedule sets it before each step).
  void set_lr(double lr) { config_.adam.lr = lr; }

 private:
  void update_block(int block, double grad_scale);
  double micro_batch(const at::Tensor& tokens, const at::Tensor& targets, int k, std::vector<double>& sq_norm,
                     std::vector<std::function<void()>>& grad_ready);

  HostState& state_;
  TrainerConfig config_;
  at::Device device_;
  ParamWindow window_;
  std::unique_ptr<JobQueue> worker_;  // CPU AdamW of finished blocks
  std::vector<at::Tensor> accumulated_;  // accumulate > 1: FP32 gradient sums per block, on the host
};

// Global L2 norm of gradients given per-block squared norms, and torch's clip coefficient
// min(1, max_norm / (norm + 1e-6)).
double clip_coefficient(double total_norm, double max_norm);

}  // namespace oom::backend
