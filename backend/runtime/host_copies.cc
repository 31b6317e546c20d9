#include "backend/runtime/host_copies.h"

#include "backend/runtime/device_memory.h"
#include "costmodel/input_error.h"

#ifdef OOM_BACKEND_CUDA
#include <map>
#include <memory>
#include <mutex>

#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace oom::backend {
namespace {

#ifdef OOM_BACKEND_CUDA
// A device's copy lanes: its H2D and D2H streams, made once, and the event of the D2H lane's
// latest copy (what a load back waits for).
struct Lanes {
  explicit Lanes(c10::DeviceIndex i)
      : h2d(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, i)), d2h(c10::cuda::getStreamFromPool(false, i)) {}
  c10::cuda::CUDAStream h2d, d2h;
  at::cuda::CUDAEvent d2h_issued;
};

Lanes& lanes_of(c10::DeviceIndex i) {
  static std::mutex mu;
  static std::map<c10::DeviceIndex, std::unique_ptr<Lanes>> all;
  std::lock_guard<std::mutex> lock(mu);
  auto& l = all[i];
  if (!l) l = std::make_unique<Lanes>(i);
  return *l;
}

// Queues `copy` (which reads `src`, a device tensor) on the D2H lane after the compute stream's work
// so far; returns the event of its completion.
template <typename Copy>
std::shared_ptr<at::cuda::CUDAEvent> on_d2h_lane(const at::Tensor& src, Copy&& copy) {
  const c10::DeviceIndex i = src.device().index();
  Lanes& l = lanes_of(i);
  at::cuda::CUDAEvent computed;
  computed.record(c10::cuda::getCurrentCUDAStream(i));
  computed.block(l.d2h);
  {
    c10::cuda::CUDAStreamGuard guard(l.d2h);
    copy();
  }
  src.record_stream(l.d2h);
  auto done = std::make_shared<at::cuda::CUDAEvent>();
  done->record(l.d2h);
  l.d2h_issued.record(l.d2h);
  return done;
}
#endif

// Brings a device range into a host buffer with a function that waits for it.
template <typename Copy>
std::function<void()> device_to_host(const at::Tensor& src, Copy&& copy) {
  if (src.device().is_cpu()) {
    copy();
    return [] {};
  }
#ifdef OOM_BACKEND_CUDA
  auto done = on_d2h_lane(src, copy);
  return [done] { done->synchronize(); };  // on the update worker, before its stage
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
  return device_to_host(grad, [&] { slot.copy_(grad, /*non_blocking=*/true); });
}

std::function<void()> range_to_host(at::Tensor& slot, std::int64_t a, std::int64_t n, const at::Tensor& grad,
                                    std::int64_t base) {
  const at::Tensor src = grad.narrow(0, a - base, n);
  return device_to_host(src, [&] { slot.narrow(0, a, n).copy_(src, /*non_blocking=*/true); });
}

at::Tensor to_host(const at::Tensor& x, bool pinned) {
  if (x.device().is_cpu() && !device_memory::emulated()) return x;  // fresh tensors, never modified in place
  device_memory::OnHost on_host;
  auto h = at::empty(x.sizes(), x.options().device(at::kCPU).pinned_memory(pinned));
  (void)device_to_host(x, [&] { h.copy_(x, /*non_blocking=*/true); });
  return h;
}

at::Tensor load_to_device(const at::Tensor& x, const at::Device& device) {
  if (!x.defined() || !device.is_cuda() || !x.device().is_cpu()) return device_memory::to_device(x, device);
#ifdef OOM_BACKEND_CUDA
  const c10::DeviceIndex i = device.index();
  Lanes& l = lanes_of(i);
  const auto compute = c10::cuda::getCurrentCUDAStream(i);
  // Allocated for the compute stream that reads it; written on the H2D lane after the offloads.
  at::Tensor out = at::empty(x.sizes(), x.options().device(device));
  l.d2h_issued.block(l.h2d);
  {
    c10::cuda::CUDAStreamGuard guard(l.h2d);
    out.copy_(x, /*non_blocking=*/true);
  }
  out.record_stream(l.h2d);
  at::cuda::CUDAEvent loaded;
  loaded.record(l.h2d);
  loaded.block(compute);
  return out;
#else
  OOM_ASSERT(false, "CUDA device in a build without CUDA");
  return x;
#endif
}

std::shared_ptr<void> h2d_lane(const at::Device& device) {
  if (!device.is_cuda()) return nullptr;
#ifdef OOM_BACKEND_CUDA
  return std::make_shared<c10::cuda::CUDAStream>(lanes_of(device.index()).h2d);
#else
  return nullptr;
#endif
}

}  // namespace oom::backend
