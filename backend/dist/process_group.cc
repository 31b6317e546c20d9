#include "backend/dist/process_group.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>

// USE_C10D_GLOO (and with NCCL, USE_C10D_NCCL) come from backend/CMakeLists.txt.
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef OOM_BACKEND_NCCL
#include <c10/cuda/CUDAGuard.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include "backend/runtime/device_memory.h"
#include "costmodel/input_error.h"

namespace oom::backend::dist {

struct Communicator::Impl {
  c10::intrusive_ptr<c10d::Store> store;
  // Since PyTorch 2.0 ProcessGroupGloo and ProcessGroupNCCL are c10d::Backend implementations.
  c10::intrusive_ptr<c10d::Backend> group;
  std::chrono::milliseconds timeout{0};
  std::string host;  // Gloo's address (sub-groups bind to it too)

  // The process group of `size` ranks on `on` (NCCL on `device` when it is a GPU, else Gloo).
  c10::intrusive_ptr<c10d::Backend> make_group(const c10::intrusive_ptr<c10d::Store>& on, int rank, int size,
                                               const at::Device& device) const {
#ifdef OOM_BACKEND_NCCL
    if (device.is_cuda()) {
      auto opts = c10d::ProcessGroupNCCL::Options::create();
      opts->timeout = timeout;
      return c10::make_intrusive<c10d::ProcessGroupNCCL>(on, rank, size, opts);
    }
#endif
    (void)device;
    auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
    opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(host));
    opts->threads = 1;
    return c10::make_intrusive<c10d::ProcessGroupGloo>(on, rank, size, opts);
  }

  // Waits for `work` with the timeout; a failure names the collective.
  // Waits for `work`. A collective that failed may still be writing into the tensors it was handed
  // as unowned views: their owners (`buffers`) are then kept for the life of the process.
  void wait(const c10::intrusive_ptr<c10d::Work>& work, const char* what, std::vector<at::Tensor> buffers = {}) const {
    try {
      if (!work->wait(timeout)) throw std::runtime_error("timed out");
    } catch (const std::exception& e) {
      static auto* kept = new std::vector<at::Tensor>();  // never freed, on purpose
      kept->insert(kept->end(), buffers.begin(), buffers.end());
      throw PeerError(std::string(what) + " failed (a peer rank died or stalled): " + e.what());
    }
  }
};

namespace {

void check_options(const CommOptions& o) {
  if (o.world_size < 1) throw InputError("", "world_size", std::to_string(o.world_size), "must be ≥ 1");
  if (o.rank < 0 || o.rank >= o.world_size) {
    throw InputError("", "rank", std::to_string(o.rank), "must be in [0, " + std::to_string(o.world_size) + ")");
  }
  if (o.store == nullptr && o.store_path.empty() && (o.master_addr.empty() || o.master_port <= 0 || o.master_port > 65535)) {
    throw InputError("", "MASTER_ADDR/MASTER_PORT", o.master_addr + ":" + std::to_string(o.master_port),
                     "a rendezvous file or a master address with a port in [1, 65535] is needed");
  }
  if (!(o.timeout_s > 0)) throw InputError("", "timeout_s", std::to_string(o.timeout_s), "must be > 0");
}

std::chrono::milliseconds timeout_of(const CommOptions& o) {
  return std::chrono::milliseconds(static_cast<std::int64_t>(o.timeout_s * 1000.0));
}

[[noreturn]] void rendezvous_failed(const CommOptions& o, const std::exception& e) {
  const std::string where = o.store_path.empty() ? o.master_addr + ":" + std::to_string(o.master_port) : o.store_path;
  throw PeerError("rank " + std::to_string(o.rank) + " of " + std::to_string(o.world_size) + ": rendezvous through " + where +
                  " failed: " + e.what());
}

}  // namespace

c10::intrusive_ptr<c10d::Store> connect_store(const CommOptions& o) {
  check_options(o);
  try {
    c10::intrusive_ptr<c10d::Store> store;
    if (!o.store_path.empty()) {
      store = c10::make_intrusive<c10d::FileStore>(o.store_path, o.world_size);
    } else {
      c10d::TCPStoreOptions to;
      to.port = static_cast<std::uint16_t>(o.master_port);
      to.isServer = o.rank == 0 && o.rank0_serves_store;
      to.numWorkers = o.world_size;
      // Every process registers with rank 0's store (and rank 0 waits for all of them), as
      // torch.distributed's env:// rendezvous does; a worker that does not register leaves the
      // serving rank waiting. torchrun's agent store is joined without it.
      to.waitWorkers = o.rank0_serves_store;
      to.multiTenant = true;
      to.timeout = timeout_of(o);
      store = c10::make_intrusive<c10d::TCPStore>(o.master_addr, to);
    }
    store->setTimeout(timeout_of(o));
    return store;
  } catch (const std::exception& e) {
    rendezvous_failed(o, e);
  }
}

Communicator::Communicator(const CommOptions& o) : impl_(std::make_unique<Impl>()), rank_(o.rank), size_(o.world_size) {
  check_options(o);
  impl_->timeout = timeout_of(o);
  impl_->host = o.host;
  impl_->store = o.store != nullptr ? o.store : connect_store(o);
  try {
    if (o.cuda) {
#ifdef OOM_BACKEND_NCCL
      device_ = at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(o.cuda_device));
      c10::cuda::set_device(static_cast<c10::DeviceIndex>(o.cuda_device));
      impl_->group = impl_->make_group(impl_->store, o.rank, o.world_size, device_);
      backend_ = "nccl";
#else
      throw InputError("", "cuda", "true", "this build has no NCCL process group (LibTorch without CUDA, or nccl.h not found)");
#endif
    } else {
      impl_->group = impl_->make_group(impl_->store, o.rank, o.world_size, device_);
      backend_ = "gloo";
    }
  } catch (const InputError&) {
    throw;
  } catch (const std::exception& e) {
    rendezvous_failed(o, e);
  }
}

Communicator::Communicator(std::unique_ptr<Impl> impl, int rank, int size, std::string backend, at::Device device)
    : impl_(std::move(impl)), rank_(rank), size_(size), backend_(std::move(backend)), device_(device) {}

Communicator::~Communicator() = default;

std::unique_ptr<RankGroup> Communicator::sub_group(const std::vector<int>& members, const std::string& tag) {
  const auto at = std::find(members.begin(), members.end(), rank_);
  OOM_ASSERT(at != members.end() && std::is_sorted(members.begin(), members.end()) && members.back() < size_,
             "a sub-group of ascending ranks of the group, this rank among them");
  auto impl = std::make_unique<Impl>();
  impl->store = c10::make_intrusive<c10d::PrefixStore>(tag, impl_->store);
  impl->timeout = impl_->timeout;
  impl->host = impl_->host;
  const int rank = static_cast<int>(at - members.begin()), size = static_cast<int>(members.size());
  try {
    impl->group = impl->make_group(impl->store, rank, size, device_);
  } catch (const std::exception& e) {
    throw PeerError("rank " + std::to_string(rank_) + ": sub-group " + tag + " failed: " + e.what());
  }
  return std::unique_ptr<RankGroup>(new Communicator(std::move(impl), rank, size, backend_, device_));
}

namespace {

// Every collective runs under device_memory::Tagged(kOther): what the process group allocates
// for itself (Gloo widens BF16 to FP32 to reduce it) is scratch, counted as other on a CPU
// standing in for a GPU (device_memory.h); the buffers it fills are allocated before, under the
// caller's use.
// What a collective hands the process group. Gloo's work keeps its tensors until its worker thread
// lets the work go, which may be after wait() returned: a CPU tensor is handed over as a view that
// owns nothing, so that its storage is released when the caller drops it (the caller holds it until
// the collective is done, which wait() makes it). On a GPU the tensor itself (NCCL's streams order
// its reuse).
at::Tensor unowned(const at::Tensor& t) {
  if (!t.device().is_cpu()) return t;
  return at::from_blob(t.data_ptr(), t.sizes(), t.strides(), t.options());
}

}  // namespace

void Communicator::all_reduce_sum(at::Tensor& t) {
  if (size_ == 1) return;
  OOM_ASSERT(t.is_contiguous(), "all_reduce_sum needs a contiguous tensor");
  OOM_ASSERT(t.device() == device_, "all_reduce_sum: the tensor is not on the communicator's device");
  std::vector<at::Tensor> ts{unowned(t)};
  device_memory::Tagged scratch(MemoryUse::kOther);
  impl_->wait(impl_->group->allreduce(ts), "all-reduce", {t});
}

at::Tensor Communicator::all_gather(const at::Tensor& t) {
  const auto in = t.contiguous().reshape({-1});
  if (size_ == 1) return in.unsqueeze(0).clone();
  OOM_ASSERT(in.device() == device_, "all_gather: the tensor is not on the communicator's device");
  std::vector<at::Tensor> outs;
  for (int r = 0; r < size_; ++r) outs.push_back(at::empty_like(in));
  std::vector<std::vector<at::Tensor>> outputs{{}};
  for (const auto& o : outs) outputs[0].push_back(unowned(o));
  std::vector<at::Tensor> inputs{unowned(in)};
  std::vector<at::Tensor> buffers = outs;
  buffers.push_back(in);
  {
    device_memory::Tagged scratch(MemoryUse::kOther);
    impl_->wait(impl_->group->allgather(outputs, inputs), "all-gather", std::move(buffers));
  }
  return at::stack(outs);
}

at::Tensor Communicator::all_gather_counts(const std::vector<std::int64_t>& counts) {
  const auto t = at::tensor(counts, at::TensorOptions().dtype(at::kLong));
  // NCCL takes only device tensors: the counts travel on the device and come back to the CPU.
  return all_gather(t.to(device_)).cpu();
}

at::Tensor Communicator::all_to_all(const at::Tensor& input, const std::vector<std::int64_t>& send_rows,
                                    const std::vector<std::int64_t>& recv_rows) {
  OOM_ASSERT(static_cast<int>(send_rows.size()) == size_ && static_cast<int>(recv_rows.size()) == size_,
             "all_to_all needs one send and one receive count per rank");
  std::int64_t send_total = 0, recv_total = 0;
  for (auto n : send_rows) send_total += n;
  for (auto n : recv_rows) recv_total += n;
  OOM_ASSERT(input.size(0) == send_total, "all_to_all input rows differ from the send counts");
  auto sizes = input.sizes().vec();
  sizes[0] = recv_total;
  auto out = at::empty(sizes, input.options());
  if (size_ == 1) {
    out.copy_(input);
    return out;
  }
  OOM_ASSERT(input.device() == device_, "all_to_all: the tensor is not on the communicator's device");
  const auto in = input.contiguous();
  auto send = send_rows, recv = recv_rows;
  auto out_view = unowned(out), in_view = unowned(in);
  device_memory::Tagged scratch(MemoryUse::kOther);
  impl_->wait(impl_->group->alltoall_base(out_view, in_view, recv, send), "all-to-all", {out, in});
  return out;
}

void Communicator::barrier() {
  if (size_ == 1) return;
  c10d::BarrierOptions bo;
  bo.timeout = impl_->timeout;
  if (device_.is_cuda()) bo.device_ids = {static_cast<std::int64_t>(device_.index())};
  impl_->wait(impl_->group->barrier(bo), "barrier");
}

}  // namespace oom::backend::dist
