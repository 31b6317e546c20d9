#include "backend/dist/process_group.h"

#include <chrono>
#include <stdexcept>

#ifndef USE_C10D_GLOO
#define USE_C10D_GLOO 1
#endif
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#ifdef OOM_BACKEND_NCCL
#ifndef USE_C10D_NCCL
#define USE_C10D_NCCL 1
#endif
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include "costmodel/input_error.h"

namespace oom::backend::dist {

struct Communicator::Impl {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::ProcessGroup> group;
  std::chrono::milliseconds timeout{0};

  // Waits for `work` with the timeout; a failure names the collective.
  void wait(const c10::intrusive_ptr<c10d::Work>& work, const char* what) const {
    try {
      if (!work->wait(timeout)) throw std::runtime_error("timed out");
    } catch (const std::exception& e) {
      throw std::runtime_error(std::string(what) + " failed (a peer rank died or stalled): " + e.what());
    }
  }
};

Communicator::Communicator(const CommOptions& o) : impl_(std::make_unique<Impl>()), rank_(o.rank), size_(o.world_size) {
  if (o.world_size < 1) throw InputError("", "world_size", std::to_string(o.world_size), "must be ≥ 1");
  if (o.rank < 0 || o.rank >= o.world_size) {
    throw InputError("", "rank", std::to_string(o.rank), "must be in [0, " + std::to_string(o.world_size) + ")");
  }
  if (o.store_path.empty()) throw InputError("", "store_path", "", "a rendezvous file is needed");
  if (!(o.timeout_s > 0)) throw InputError("", "timeout_s", std::to_string(o.timeout_s), "must be > 0");
  impl_->timeout = std::chrono::milliseconds(static_cast<std::int64_t>(o.timeout_s * 1000.0));
  try {
    impl_->store = c10::make_intrusive<c10d::FileStore>(o.store_path, o.world_size);
    impl_->store->setTimeout(impl_->timeout);
    if (o.cuda) {
#ifdef OOM_BACKEND_NCCL
      auto opts = c10d::ProcessGroupNCCL::Options::create();
      opts->timeout = impl_->timeout;
      impl_->group = c10::make_intrusive<c10d::ProcessGroupNCCL>(impl_->store, o.rank, o.world_size, opts);
      backend_ = "nccl";
#else
      throw InputError("", "cuda", "true", "this build has no NCCL process group (CPU LibTorch)");
#endif
    } else {
      auto opts = c10d::ProcessGroupGloo::Options::create(impl_->timeout);
      opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(o.host));
      opts->threads = 1;
      impl_->group = c10::make_intrusive<c10d::ProcessGroupGloo>(impl_->store, o.rank, o.world_size, opts);
      backend_ = "gloo";
    }
  } catch (const InputError&) {
    throw;
  } catch (const std::exception& e) {
    throw std::runtime_error("rank " + std::to_string(o.rank) + " of " + std::to_string(o.world_size) +
                             ": rendezvous through " + o.store_path + " failed: " + e.what());
  }
}

Communicator::~Communicator() = default;

void Communicator::all_reduce_sum(at::Tensor& t) {
  if (size_ == 1) return;
  OOM_ASSERT(t.is_contiguous(), "all_reduce_sum needs a contiguous tensor");
  std::vector<at::Tensor> ts{t};
  impl_->wait(impl_->group->allreduce(ts), "all-reduce");
}

at::Tensor Communicator::all_gather(const at::Tensor& t) {
  const auto in = t.contiguous().reshape({-1});
  if (size_ == 1) return in.unsqueeze(0).clone();
  std::vector<at::Tensor> outs;
  for (int r = 0; r < size_; ++r) outs.push_back(at::empty_like(in));
  std::vector<std::vector<at::Tensor>> outputs{outs};
  std::vector<at::Tensor> inputs{in};
  impl_->wait(impl_->group->allgather(outputs, inputs), "all-gather");
  return at::stack(outputs[0]);
}

at::Tensor Communicator::all_gather_counts(const std::vector<std::int64_t>& counts) {
  const auto t = at::tensor(counts, at::TensorOptions().dtype(at::kLong));
  return all_gather(t);
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
  auto in = input.contiguous();
  auto send = send_rows, recv = recv_rows;
  impl_->wait(impl_->group->alltoall_base(out, in, recv, send), "all-to-all");
  return out;
}

void Communicator::barrier() {
  if (size_ == 1) return;
  impl_->wait(impl_->group->barrier(), "barrier");
}

}  // namespace oom::backend::dist
