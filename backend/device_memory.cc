#include "backend/device_memory.h"

#include <atomic>
#include <mutex>
#include <unordered_map>

#include <c10/core/CPUAllocator.h>

#include "costmodel/input_error.h"

namespace oom::backend::device_memory {
namespace {

std::atomic<bool> g_emulated{false};
std::atomic<Bytes> g_current{0};
std::atomic<Bytes> g_peak{0};
thread_local bool t_on_device = false;

void add(Bytes n) {
  const Bytes now = g_current.fetch_add(n) + n;
  Bytes peak = g_peak.load();
  while (now > peak && !g_peak.compare_exchange_weak(peak, now)) {
  }
}

// Wraps the CPU allocator it replaces (LibTorch's default, whose data pointer is its own context,
// as oneDNN's raw allocations require): a device allocation is entered in a table with its size and
// leaves it when freed; a host allocation is the wrapped allocator's, untouched.
class MeteringAllocator final : public c10::Allocator {
 public:
  explicit MeteringAllocator(c10::Allocator* base) : base_(base), base_delete_(base->raw_deleter()) {
    OOM_ASSERT(base_delete_ != nullptr, "the CPU allocator has no raw deleter to wrap");
  }

  c10::DataPtr allocate(size_t n) override {
    c10::DataPtr inner = base_->allocate(n);
    if (!t_on_device || !g_emulated.load(std::memory_order_relaxed)) return inner;
    void* data = inner.get();
    OOM_ASSERT(inner.get_context() == data, "the CPU allocator's context is not its data");
    inner.release_context();
    if (data != nullptr) {
      std::lock_guard<std::mutex> lock(mu_);
      sizes_[data] = static_cast<Bytes>(n);
    }
    add(static_cast<Bytes>(n));
    return {data, data, &release, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }

  static MeteringAllocator* instance;

 private:
  static void release(void* data) {
    MeteringAllocator& m = *instance;
    {
      std::lock_guard<std::mutex> lock(m.mu_);
      const auto it = m.sizes_.find(data);
      if (it != m.sizes_.end()) {
        g_current.fetch_sub(it->second);
        m.sizes_.erase(it);
      }
    }
    m.base_delete_(data);
  }
  c10::Allocator* base_;
  c10::DeleterFnPtr base_delete_;
  std::mutex mu_;
  std::unordered_map<void*, Bytes> sizes_;
};
MeteringAllocator* MeteringAllocator::instance = nullptr;

void install() {
  static std::once_flag once;
  std::call_once(once, [] {
    static MeteringAllocator meter(c10::GetCPUAllocator());
    MeteringAllocator::instance = &meter;
    // Above the default allocator's priority, so that it is the one CPU tensors come from.
    c10::SetCPUAllocator(&meter, /*priority=*/100);
    OOM_ASSERT(c10::GetCPUAllocator() == &meter, "the metering CPU allocator was not installed");
  });
}

}  // namespace

void set_emulated(bool on) {
  if (on) install();
  g_emulated.store(on);
}
bool emulated() { return g_emulated.load(); }

Bytes current_bytes() { return g_current.load(); }
Bytes peak_bytes() { return g_peak.load(); }
void reset_peak() { g_peak.store(g_current.load()); }

Side::Side(bool device) : previous_(t_on_device) { t_on_device = device; }
Side::~Side() { t_on_device = previous_; }

at::Tensor to_device(const at::Tensor& x, const at::Device& device) {
  if (!x.defined()) return x;
  if (emulated() && device.is_cpu() && x.device().is_cpu()) {
    OnDevice on_device;
    return x.clone(at::MemoryFormat::Contiguous);
  }
  return x.to(device);
}

}  // namespace oom::backend::device_memory
