// Device ↔ host copies the trainers share, on the copy lanes the StepGraph gives them: gradients
// into host slots (whole or a range) with a function that waits for the copy, tensors kept on the
// host, and host tensors loaded back. On a CPU device nothing is copied where the tensor can be
// adopted, unless a device is emulated (backend/runtime/device_memory.h).
//
// On a CUDA device every copy runs on its lane, never on the compute stream: one H2D and one D2H
// stream per device (the StepGraph's `gpuN.h2d` and `gpuN.d2h` resources), ordered by events:
//   - a D2H copy waits for the compute stream's work queued so far (its source is computed), and
//     its source is recorded on the D2H lane so that the caching allocator does not hand its
//     memory out again before the copy has read it;
//   - an H2D load waits for the D2H lane's copies issued so far (the offload it loads back is one
//     of them: the graph's d2h → h2d dependency), and the compute stream waits for the load before
//     its next kernel; the destination is recorded on the H2D lane;
//   - pinned host buffers from LibTorch's host allocator are handed out again only after the
//     events of the copies that used them (the allocator records them at each copy); a gradient
//     slot the runner reuses is refilled only after the update that read it (the StepGraph's
//     update → D2H dependency, waited for on the host before the copy is issued);
//   - every copy is non-blocking: the host waits only where it reads a copy's result (a CPU
//     update waits for its gradient's D2H event on the update worker).
// No LibTorch CUDA types in this header.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

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
// On a CUDA device the copy is queued on the D2H lane; load_to_device() orders itself after it.
at::Tensor to_host(const at::Tensor& x, bool pinned);
// A host tensor (one to_host() made, or a batch) on `device`, ready for the compute stream's next
// kernels: on a CUDA device copied on the H2D lane; elsewhere device_memory::to_device().
at::Tensor load_to_device(const at::Tensor& x, const at::Device& device);
// The H2D lane of a CUDA device as an opaque c10::cuda::CUDAStream, which the parameter window's
// weight copies run on too; null on any other device.
std::shared_ptr<void> h2d_lane(const at::Device& device);

}  // namespace oom::backend
