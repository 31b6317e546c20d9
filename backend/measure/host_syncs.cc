#include "backend/measure/host_syncs.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string_view>

#include <ATen/core/function_schema.h>
#include <ATen/record_function.h>

#include "backend/runtime/device_memory.h"

namespace oom::backend::host_syncs {
namespace {

thread_local std::int64_t t_syncs = 0;
thread_local int t_depth = 0;  // counted calls this thread is inside
std::mutex g_mu;
std::uint64_t g_callback = 0;
int g_users = 0;  // callers that started counting and have not stopped it
std::atomic<bool> g_counting{false};

// The operators of rule 2 (host_syncs.h): their CUDA kernels read a size back from the device.
constexpr std::string_view kSizeOnDevice[] = {"aten::nonzero", "aten::masked_select", "aten::bincount", "aten::unique_dim",
                                              "aten::_unique", "aten::_unique2", "aten::unique_consecutive",
                                              "aten::unique_dim_consecutive"};

std::optional<c10::IValue> argument(const at::RecordFunction& fn, const char* name) {
  const auto schema = fn.operator_schema();
  if (!schema) return std::nullopt;
  const auto index = schema->argumentIndexWithName(name);
  const auto inputs = fn.inputs();
  if (!index || static_cast<std::size_t>(*index) >= inputs.size()) return std::nullopt;
  return inputs[static_cast<std::size_t>(*index)];
}

bool is_true(const std::optional<c10::IValue>& v) { return v && v->isBool() && v->toBool(); }

bool device_side(const at::Tensor& t) { return t.is_cuda() || device_memory::is_device(t); }

// Rule 3: a copy into host memory from the device that CUDA runs synchronously.
bool host_copy(const at::RecordFunction& fn) {
  const auto inputs = fn.inputs();
  if (inputs.size() < 2 || !inputs[0].isTensor() || !inputs[1].isTensor()) return false;
  const at::Tensor& dst = inputs[0].toTensor();
  const at::Tensor& src = inputs[1].toTensor();
  if (!dst.defined() || !src.defined() || !dst.is_cpu() || !device_side(src)) return false;
  if (device_memory::is_device(dst)) return false;  // an emulated device's own copy
  const bool non_blocking = inputs.size() > 2 && inputs[2].isBool() && inputs[2].toBool();
  return src.is_cuda() ? !(non_blocking && dst.is_pinned()) : !non_blocking;
}

// Rule 3 on an emulated device: `to` towards the CPU of a device allocation aliases it on a CPU
// and is a blocking D2H copy on a GPU. (A CUDA tensor's copies are counted at their copy_.)
bool emulated_host_to(const at::RecordFunction& fn) {
  const auto inputs = fn.inputs();
  if (inputs.empty() || !inputs[0].isTensor()) return false;
  const at::Tensor& self = inputs[0].toTensor();
  if (!self.defined() || self.is_cuda() || !device_memory::is_device(self)) return false;
  const auto device = argument(fn, "device");
  if (!device || !device->isDevice() || !device->toDevice().is_cpu()) return false;
  return !is_true(argument(fn, "non_blocking"));
}

bool is_sync(const at::RecordFunction& fn) {
  const std::string_view name = fn.name();
  if (name == "aten::_local_scalar_dense") return true;
  for (const auto op : kSizeOnDevice) {
    if (name == op) return true;
  }
  if (name == "aten::repeat_interleave") {
    const auto repeats = argument(fn, "repeats");
    const auto size = argument(fn, "output_size");
    return (repeats && repeats->isTensor()) && !(size && !size->isNone());
  }
  if (name == "aten::copy_") return host_copy(fn);
  if (name == "aten::to" || name == "aten::_to_copy") return emulated_host_to(fn);
  return false;
}

struct Counted : at::ObserverContext {};

std::unique_ptr<at::ObserverContext> enter(const at::RecordFunction& fn) {
  if (t_depth > 0) {
    ++t_depth;
    return std::make_unique<Counted>();
  }
  if (!is_sync(fn)) return nullptr;
  ++t_syncs;
  ++t_depth;
  return std::make_unique<Counted>();
}

void leave(const at::RecordFunction&, at::ObserverContext* ctx) {
  if (ctx != nullptr && t_depth > 0) --t_depth;
}

}  // namespace

void count(bool on) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_users = std::max(0, g_users + (on ? 1 : -1));
  on = g_users > 0;
  if (on && g_callback == 0) {
    g_callback = at::addGlobalCallback(at::RecordFunctionCallback(enter, leave)
                                           .needsInputs(true)
                                           .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION}));
  } else if (!on && g_callback != 0) {
    at::removeCallback(g_callback);
    g_callback = 0;
  }
  g_counting.store(on);
}

bool counting() { return g_counting.load(); }

std::int64_t on_this_thread() { return t_syncs; }

void note_host_sync() {
  if (g_counting.load()) ++t_syncs;
}

}  // namespace oom::backend::host_syncs
