// A kernel that saves only its inputs for the backward and recomputes its intermediates there, as
// the fused kernels the memory model prices do (flash attention keeps q, k, v, O and the
// log-sum-exp; a chunked Gated DeltaNet kernel keeps its inputs and chunk states; a fused RMSNorm
// keeps its input, except the decoder input's norm in a backward, which keeps its output:
// model.h model_norm_keeping_output). Composed of autograd operators, a piece of the model would otherwise hold every
// intermediate its operators save (FP32 score blocks, the WY transform's matrices, an upcast input)
// from its forward until its backward.
//
// recomputed(fn, inputs) runs fn(inputs) without recording, and records one autograd node that holds
// `inputs`; its backward runs fn again with recording on and differentiates that. The arithmetic is
// fn's both times, so values and gradients are those of fn recorded directly (the same operators in
// the same order: bit-identical on a deterministic device). fn must be a pure function of its inputs:
// a tensor it reads that needs a gradient must be one of `inputs` (captured ones get none), and its
// outputs must be fresh tensors, not inputs or views of them. Every input must be defined.
#pragma once

#include <functional>
#include <vector>

#include <ATen/ATen.h>

namespace oom::backend {

using RecomputeFn = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;

std::vector<at::Tensor> recomputed(RecomputeFn fn, const std::vector<at::Tensor>& inputs);

// While alive, this thread's lean kernels (lean_kernel(): the model's norms, each block of the
// attention core, each GDN kernel chunk) are recomputed in the backward instead of keeping their
// FP32 upcasts, score blocks and transform matrices from the forward to the backward. Values and
// gradients are the same operators' either way. The graph runner runs its stages in one; the plain
// reference runs without. Scopes nest (the innermost wins).
class LeanKernels {
 public:
  explicit LeanKernels(bool on = true);
  ~LeanKernels();
  LeanKernels(const LeanKernels&) = delete;
  LeanKernels& operator=(const LeanKernels&) = delete;
  static bool active();

 private:
  bool previous_;
};

// fn(inputs) as a lean kernel: recomputed(fn, inputs) under LeanKernels, else fn's own graph.
std::vector<at::Tensor> lean_kernel(const RecomputeFn& fn, const std::vector<at::Tensor>& inputs);

// out.index_add(0, index, source): the rows of `source` added into the rows `index` of a copy of
// `out`. LibTorch's index_add keeps `source` for its backward (it takes the source's shape from
// it), a copy of rows that a caller has either saved already (the expert outputs a routing-weight
// product keeps) or never needs again. Under LeanKernels the backward keeps only `index`; the
// gradients are index_add's either way (out's: the output gradient; source's: its rows `index`).
at::Tensor lean_index_add(const at::Tensor& out, const at::Tensor& index, const at::Tensor& source);

}  // namespace oom::backend
