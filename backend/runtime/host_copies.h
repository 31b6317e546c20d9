// Device ↔ host copies the trainers share: gradients into host slots (whole or a range) with a
// function that waits for the copy, and tensors kept on the host. On a CPU device nothing is
// copied where the tensor can be adopted, unless a device is emulated (backend/runtime/device_memory.h).
// No LibTorch CUDA types in this header.
#pragma once

#include <cstdint>
#include <functional>

#include <ATen/ATen.h>

namespace oom::backend {

// Brings a whole device gradient into the host slot (on a CPU device the gradient is adopted as
// the slot); returns a function that waits for the copy.
std::function<void()> gradient_to_host(at::Tensor& slot, const at::Tensor& grad);
// Copies elements [a, a + n) of a device gradient whose element 0 is element `base` of the slot's
// coordinates into that range of the host slot; returns a function that waits for the copy.
std::function<void()> range_to_host(at::Tensor& slot, std::int64_t a, std::int64_t n, const at::Tensor& grad,
                                    std::int64_t base = 0);
// `x` on the host (pinned when asked): x itself on a CPU device (callers keep fresh tensors only).
at::Tensor to_host(const at::Tensor& x, bool pinned);

}  // namespace oom::backend
