#include "backend/runtime/host_copies.h"

#include "backend/runtime/device_memory.h"
#include "costmodel/input_error.h"

#ifdef OOM_BACKEND_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace oom::backend {
namespace {

// A function that waits for the copies queued so far on `device`'s current stream.
std::function<void()> copy_done(const at::Device& device) {
  if (device.is_cpu()) return [] {};
#ifdef OOM_BACKEND_CUDA
  auto done = std::make_shared<at::cuda::CUDAEvent>();
  done->record(c10::cuda::getCurrentCUDAStream(device.index()));
  return [done] { done->synchronize(); };
#else
  OOM_ASSERT(false, "CUDA gradient in a build without CUDA");
  return [] {};
#endif
}

}  // namespace

std::function<void()> gradient_to_host(at::Tensor& slot, const at::Tensor& grad) {
  if (grad.device().is_cpu() && !device_memory::emulated()) {
    slot = grad;  // the gradient already is in host memory: adopt it
    return [] {};
  }
  slot.copy_(grad, /*non_blocking=*/true);
  return copy_done(grad.device());
}

std::function<void()> range_to_host(at::Tensor& slot, std::int64_t a, std::int64_t n, const at::Tensor& grad,
                                    std::int64_t base) {
  slot.narrow(0, a, n).copy_(grad.narrow(0, a - base, n), /*non_blocking=*/true);
  return copy_done(grad.device());
}

at::Tensor to_host(const at::Tensor& x, bool pinned) {
  if (x.device().is_cpu() && !device_memory::emulated()) return x;  // fresh tensors, never modified in place
  device_memory::OnHost on_host;
  auto h = at::empty(x.sizes(), x.options().device(at::kCPU).pinned_memory(pinned));
  h.copy_(x, /*non_blocking=*/true);
  return h;
}

}  // namespace oom::backend
