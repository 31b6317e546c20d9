#include "backend/runtime/device_memory.h"

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
thread_local MemoryUse t_use = MemoryUse::kOther;

void raise(std::atomic<Bytes>& peak, Bytes now) {
  Bytes p = peak.load();
  while (now > p && !peak.compare_exchange_weak(p, now)) {
  }
}

// Per use: held now and the own peak. Changed under the allocator's lock.
std::array<std::atomic<Bytes>, kMemoryUses> g_use_current{};
std::array<std::atomic<Bytes>, kMemoryUses> g_use_peak{};

void add(Bytes n, MemoryUse use) {
  raise(g_peak, g_current.fetch_add(n) + n);
  auto& held = g_use_current[static_cast<std::size_t>(use)];
  raise(g_use_peak[static_cast<std::size_t>(use)], held.fetch_add(n) + n);
}

struct Entry {
  Bytes bytes = 0;
  MemoryUse use = MemoryUse::kOther;
};

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
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (data != nullptr) sizes_[data] = {static_cast<Bytes>(n), t_use};
      add(static_cast<Bytes>(n), t_use);
    }
    return {data, data, &release, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }

  // Moves the allocation at `data` (when it is a device one) to `use`.
  void retag(const void* data, MemoryUse use) {
    std::lock_guard<std::mutex> lock(mu_);
    const auto it = sizes_.find(const_cast<void*>(data));
    if (it == sizes_.end() || it->second.use == use) return;
    g_use_current[static_cast<std::size_t>(it->second.use)].fetch_sub(it->second.bytes);
    it->second.use = use;
    auto& held = g_use_current[static_cast<std::size_t>(use)];
    raise(g_use_peak[static_cast<std::size_t>(use)], held.fetch_add(it->second.bytes) + it->second.bytes);
  }
  bool holds(const void* data) {
    std::lock_guard<std::mutex> lock(mu_);
    return sizes_.count(const_cast<void*>(data)) > 0;
  }
  // Resets the uses' peaks to what each holds now (under the lock, so that no allocation is half
  // counted).
  void reset_use_peaks() {
    std::lock_guard<std::mutex> lock(mu_);
    for (int u = 0; u < kMemoryUses; ++u) g_use_peak[static_cast<std::size_t>(u)].store(g_use_current[static_cast<std::size_t>(u)].load());
  }

  static MeteringAllocator* instance;

 private:
  static void release(void* data) {
    MeteringAllocator& m = *instance;
    {
      std::lock_guard<std::mutex> lock(m.mu_);
      const auto it = m.sizes_.find(data);
      if (it != m.sizes_.end()) {
        g_current.fetch_sub(it->second.bytes);
        g_use_current[static_cast<std::size_t>(it->second.use)].fetch_sub(it->second.bytes);
        m.sizes_.erase(it);
      }
    }
    m.base_delete_(data);
  }
  c10::Allocator* base_;
  c10::DeleterFnPtr base_delete_;
  std::mutex mu_;
  std::unordered_map<void*, Entry> sizes_;
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
void reset_use_peaks() {
  if (MeteringAllocator::instance != nullptr) MeteringAllocator::instance->reset_use_peaks();
}

std::array<Bytes, kMemoryUses> use_bytes() {
  std::array<Bytes, kMemoryUses> out{};
  for (std::size_t u = 0; u < out.size(); ++u) out[u] = g_use_current[u].load();
  return out;
}
std::array<Bytes, kMemoryUses> use_peak_bytes() {
  std::array<Bytes, kMemoryUses> out{};
  for (std::size_t u = 0; u < out.size(); ++u) out[u] = g_use_peak[u].load();
  return out;
}

void retag(const at::Tensor& t, MemoryUse use) {
  if (!t.defined() || MeteringAllocator::instance == nullptr || !t.has_storage()) return;
  MeteringAllocator::instance->retag(t.storage().data_ptr().get(), use);
}

bool is_device(const at::Tensor& t) {
  if (!t.defined() || MeteringAllocator::instance == nullptr || !t.has_storage() || !t.is_cpu()) return false;
  return MeteringAllocator::instance->holds(t.storage().data_ptr().get());
}

Tagged::Tagged(MemoryUse use) : previous_(t_use) { t_use = use; }
Tagged::~Tagged() { t_use = previous_; }

Side::Side(bool device) : previous_(t_on_device) { t_on_device = device; }
Side::~Side() { t_on_device = previous_; }

void gemm_out(at::Tensor& out, const at::Tensor& a, const at::Tensor& b) {
  Tagged scratch(MemoryUse::kOther);
  at::mm_out(out, a, b);
}

void gemm_add(at::Tensor& out, const at::Tensor& a, const at::Tensor& b) {
  Tagged scratch(MemoryUse::kOther);
  out.addmm_(a, b);
}

at::Tensor gemm(const at::Tensor& a, const at::Tensor& b) {
  at::Tensor out = at::empty({a.size(0), b.size(1)}, a.options());
  gemm_out(out, a, b);
  return out;
}

at::Tensor to_device(const at::Tensor& x, const at::Device& device) {
  if (!x.defined()) return x;
  if (emulated() && device.is_cpu() && x.device().is_cpu()) {
    OnDevice on_device;
    return x.clone(at::MemoryFormat::Contiguous);
  }
  return x.to(device);
}

}  // namespace oom::backend::device_memory
