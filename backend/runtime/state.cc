#include "backend/runtime/state.h"

#include <cmath>
#include <memory>

#include <ATen/CPUGeneratorImpl.h>

#include "backend/io/safetensors.h"
#include "backend/runtime/device_memory.h"
#include "backend/runtime/host_copies.h"
#include "backend/runtime/pinned_host.h"
#include "costmodel/input_error.h"

#ifdef OOM_BACKEND_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace oom::backend {

at::ScalarType working_dtype(WorkingPrecision p) {
  return p == WorkingPrecision::kBFloat16 ? at::kBFloat16 : at::kFloat;
}

HostState::HostState(const ModelSpec& spec, StateOptions options)
    : spec_(spec), layout_(model_layout(spec)), options_(std::move(options)), pinned_(at::hasCUDA()) {
  allocate_state();
}

namespace {

// A host region and its pinning: the pinning goes first (members end in reverse order).
struct PinnedRegion {
  std::shared_ptr<void> memory, pin;
};

}  // namespace

// One region for every block's master, moments and working copy, each buffer page-aligned; the
// NUMA hook binds each buffer's pages before anything touches them, then the region is pinned.
void HostState::allocate_state() {
  const std::size_t page = host_page_bytes();
  const auto aligned = [page](std::size_t n) { return (n + page - 1) / page * page; };
  const at::ScalarType types[] = {at::kFloat, at::kFloat, at::kFloat, working_dtype(options_.precision)};
  const char* names[] = {"master", "exp_avg", "exp_avg_sq", "working"};
  std::size_t total = 0;
  for (const auto& block : layout_.blocks) {
    for (const at::ScalarType t : types) total += aligned(static_cast<std::size_t>(block.numel) * at::elementSize(t));
  }
  auto region = std::make_shared<PinnedRegion>();
  region->memory = map_host_region(total);
  char* cursor = static_cast<char*>(region->memory.get());
  std::vector<at::Tensor>* lists[] = {&master_, &m_, &v_, &working_};
  for (int b = 0; b < blocks(); ++b) {
    const std::int64_t numel = layout_.blocks[static_cast<std::size_t>(b)].numel;
    for (int k = 0; k < 4; ++k) {
      auto t = at::from_blob(cursor, {numel}, [region](void*) {}, at::TensorOptions().dtype(types[k]));
      if (options_.numa_hook) options_.numa_hook(b, names[k], cursor, static_cast<std::size_t>(t.nbytes()));
      lists[k]->push_back(t);
      cursor += aligned(static_cast<std::size_t>(t.nbytes()));
    }
    grad_.emplace_back();
  }
  for (int b = 0; b < blocks(); ++b) {
    m_[idx(b)].zero_();
    v_[idx(b)].zero_();
  }
  if (pinned_) region->pin = pin_in_place(region->memory.get(), total);
}

at::Tensor& HostState::grad_slot(int block) {
  at::Tensor& g = grad_[idx(block)];
  if (!g.defined()) g = alloc(block, "grad", working_dtype(options_.precision)).zero_();
  return g;
}

std::size_t HostState::idx(int block) const {
  OOM_ASSERT(block >= 0 && block < blocks(), "block index out of range");
  return static_cast<std::size_t>(block);
}

at::Tensor HostState::alloc(int block, const std::string& what, at::ScalarType type) {
  const std::int64_t numel = layout_.blocks[static_cast<std::size_t>(block)].numel;
  const std::size_t bytes = static_cast<std::size_t>(numel) * at::elementSize(type);
  auto region = std::make_shared<PinnedRegion>();
  region->memory = map_host_region(bytes);
  auto t = at::from_blob(region->memory.get(), {numel}, [region](void*) {}, at::TensorOptions().dtype(type));
  if (options_.numa_hook) options_.numa_hook(block, what, t.data_ptr(), bytes);
  if (pinned_) region->pin = pin_in_place(region->memory.get(), bytes);
  return t;
}

void HostState::init_from_seed(std::uint64_t seed) {
  auto gen = at::detail::createCPUGenerator(seed);
  for (int b = 0; b < blocks(); ++b) {
    const auto& block = layout_.blocks[static_cast<std::size_t>(b)];
    for (const auto& e : block.entries) {
      auto t = master_[idx(b)].narrow(0, e.offset, e.numel());
      switch (e.init) {
        case InitKind::kNormal: t.normal_(0.0, e.init_std, gen); break;
        case InitKind::kOnes: t.fill_(1.0); break;
        case InitKind::kZeros: t.zero_(); break;
        case InitKind::kALog: t.uniform_(1.0, 16.0, gen).log_(); break;
        case InitKind::kDtBias: {
          const auto dt = t.uniform_(std::log(1e-3), std::log(1e-1), gen).exp();
          t.copy_(dt + at::log(-at::expm1(-dt)));  // inverse softplus
          break;
        }
      }
    }
    m_[idx(b)].zero_();
    v_[idx(b)].zero_();
    publish(b);
  }
  step = 0;
}

namespace {
std::string tensor_name(int block, const std::string& entry) {
  return block == 0 ? entry : "layers." + std::to_string(block - 1) + "." + entry;
}
}  // namespace

void HostState::load_safetensors(const std::string& path) {
  const auto tensors = read_safetensors(path);
  std::vector<at::Tensor> loaded;
  for (int b = 0; b < blocks(); ++b) {
    auto flat = at::empty_like(master_[idx(b)]);
    for (const auto& e : layout_.blocks[static_cast<std::size_t>(b)].entries) {
      const auto name = tensor_name(b, e.name);
      const auto it = tensors.find(name);
      if (it == tensors.end()) throw InputError(path, name, "missing", "tensor not in the file");
      if (it->second.sizes().vec() != e.shape) {
        throw InputError(path, name, c10::str(it->second.sizes()), "shape differs from the model's " + c10::str(at::IntArrayRef(e.shape)));
      }
      flat.narrow(0, e.offset, e.numel()).copy_(it->second.reshape({-1}));
    }
    loaded.push_back(flat);
  }
  for (int b = 0; b < blocks(); ++b) {
    master_[idx(b)].copy_(loaded[idx(b)]);
    m_[idx(b)].zero_();
    v_[idx(b)].zero_();
    publish(b);
  }
  step = 0;
}

void HostState::save_safetensors(const std::string& path) const {
  std::map<std::string, at::Tensor> out;
  for (int b = 0; b < blocks(); ++b) {
    for (const auto& e : layout_.blocks[static_cast<std::size_t>(b)].entries) {
      out.emplace(tensor_name(b, e.name), master_[idx(b)].narrow(0, e.offset, e.numel()).view(e.shape));
    }
  }
  write_safetensors(path, out);
}

void HostState::publish(int block) { working_[idx(block)].copy_(master_[idx(block)]); }

// ---------------------------------------------------------------------------------------------
// ParamWindow

ParamWindow::ParamWindow(HostState& state, at::Device device, std::int64_t transfer_chunk_bytes)
    : state_(state), device_(device), transfer_chunk_bytes_(transfer_chunk_bytes) {
  // Two slots of the largest block on a GPU, and on a CPU standing in for one (backend/runtime/device_memory.h:
  // counted as the device's); a plain CPU window hands out the host's working copies instead.
  if (device_.is_cuda() || device_memory::emulated()) {
    std::int64_t max_numel = 0;
    for (const auto& b : state.layout().blocks) max_numel = std::max(max_numel, b.numel);
    device_memory::OnDevice on_device;
    for (auto& s : slots_) {
      s.buffer = at::empty({max_numel}, at::TensorOptions().dtype(working_dtype(state.precision())).device(device_));
    }
  }
#ifdef OOM_BACKEND_CUDA
  if (device_.is_cuda()) {
    for (auto& s : slots_) {
      s.ready = std::make_shared<at::cuda::CUDAEvent>();
      s.free = std::make_shared<at::cuda::CUDAEvent>();
    }
    copy_stream_ = h2d_lane(device_);  // the device's H2D lane (backend/runtime/host_copies.h)
  }
#endif
}

namespace {

// `src` into the front of `dst` in copies of at most `piece_bytes` (0: one copy), queued on the
// current stream.
void copy_in_pieces(at::Tensor& dst, const at::Tensor& src, std::int64_t piece_bytes) {
  const std::int64_t n = src.numel();
  const std::int64_t step = piece_bytes > 0 ? std::max<std::int64_t>(1, piece_bytes / src.element_size()) : n;
  for (std::int64_t a = 0; a < n; a += step) {
    const std::int64_t len = std::min(step, n - a);
    dst.narrow(0, a, len).copy_(src.narrow(0, a, len), /*non_blocking=*/true);
  }
}

}  // namespace

ParamWindow::Slot& ParamWindow::slot_for(int block) {
  for (auto& s : slots_) {
    if (s.block == block) return s;
  }
  for (auto& s : slots_) {
    if (!s.in_use && s.block < 0) return s;
  }
  for (auto& s : slots_) {
    if (!s.in_use) return s;  // a prefetched block not yet used gives way
  }
  OOM_ASSERT(false, "the parameter window's two slots are both in use");
  return slots_[0];
}

void ParamWindow::prefetch(int block) {
  Slot& s = slot_for(block);
  if (s.block == block) return;
  s.block = block;
  if (!device_.is_cuda()) {
    // On a CPU the window copies only when it stands in for a GPU's (its slots exist).
    if (s.buffer.defined()) copy_in_pieces(s.buffer, state_.working(block), transfer_chunk_bytes_);
    return;
  }
#ifdef OOM_BACKEND_CUDA
  auto& stream = *std::static_pointer_cast<c10::cuda::CUDAStream>(copy_stream_);
  auto& ready = *std::static_pointer_cast<at::cuda::CUDAEvent>(s.ready);
  auto& free = *std::static_pointer_cast<at::cuda::CUDAEvent>(s.free);
  c10::cuda::CUDAStreamGuard guard(stream);
  free.block(stream);  // the compute stream is done with the slot's previous block
  copy_in_pieces(s.buffer, state_.working(block), transfer_chunk_bytes_);
  ready.record(stream);
#endif
}

at::Tensor ParamWindow::acquire(int block) {
  prefetch(block);
  Slot& s = slot_for(block);
  s.in_use = true;
  if (!device_.is_cuda()) return s.buffer.defined() ? s.buffer.narrow(0, 0, state_.working(block).numel()) : state_.working(block);
#ifdef OOM_BACKEND_CUDA
  std::static_pointer_cast<at::cuda::CUDAEvent>(s.ready)->block(c10::cuda::getCurrentCUDAStream(device_.index()));
  return s.buffer.narrow(0, 0, state_.working(block).numel());
#else
  OOM_ASSERT(false, "CUDA device requested in a build without CUDA");
#endif
}

void ParamWindow::release(int block) {
  Slot& s = slot_for(block);
  OOM_ASSERT(s.block == block && s.in_use, "releasing a block the window does not hold");
  s.in_use = false;
  s.block = -1;  // the next use copies again: the host copy is republished after each update
  if (!device_.is_cuda()) return;
#ifdef OOM_BACKEND_CUDA
  std::static_pointer_cast<at::cuda::CUDAEvent>(s.free)->record(c10::cuda::getCurrentCUDAStream(device_.index()));
#endif
}

}  // namespace oom::backend
