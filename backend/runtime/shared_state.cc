#include "backend/runtime/shared_state.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/runtime/pinned_host.h"

namespace oom::backend {

void share_host_state(HostState& state, const std::string& path, bool create) {
  const auto fail = [&](const char* what) {
    throw std::runtime_error(std::string("shared host state ") + path + ": " + what + ": " + std::strerror(errno));
  };
  // Per block: master, exp_avg, exp_avg_sq, working, each at a 64-byte aligned offset.
  using Buffer = at::Tensor& (HostState::*)(int);
  const Buffer buffers[] = {&HostState::master, &HostState::exp_avg, &HostState::exp_avg_sq, &HostState::working};
  std::vector<std::size_t> offsets;
  std::size_t total = 0;
  for (int b = 0; b < state.blocks(); ++b) {
    for (const Buffer buf : buffers) {
      offsets.push_back(total);
      total += (static_cast<std::size_t>((state.*buf)(b).nbytes()) + 63) / 64 * 64;
    }
  }
  const int fd = create ? ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600) : ::open(path.c_str(), O_RDWR);
  if (fd < 0) fail(create ? "cannot create" : "cannot open");
  if (create && ::ftruncate(fd, static_cast<off_t>(total)) != 0) {
    ::close(fd);
    fail("cannot size");
  }
  struct stat info {};
  if (::fstat(fd, &info) != 0 || static_cast<std::size_t>(info.st_size) != total) {
    ::close(fd);
    throw std::runtime_error("shared host state " + path + ": " + std::to_string(info.st_size) + " bytes, expected " +
                             std::to_string(total) + " for " + state.spec().name);
  }
  void* base = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (base == MAP_FAILED) fail("cannot map");
  // The mapping, pinned in this process when CUDA is present (each process pins its own mapping;
  // the pinning ends before the unmapping: members end in reverse order).
  struct Mapping {
    std::shared_ptr<void> memory, pin;
  };
  auto mapping = std::make_shared<Mapping>();
  mapping->memory = std::shared_ptr<void>(base, [total](void* p) { ::munmap(p, total); });
  std::size_t i = 0;
  for (int b = 0; b < state.blocks(); ++b) {
    for (const Buffer buf : buffers) {
      at::Tensor& t = (state.*buf)(b);
      char* where = static_cast<char*>(base) + offsets[i++];
      auto view = at::from_blob(where, t.sizes(), [mapping](void*) {}, t.options().pinned_memory(false));
      if (create) view.copy_(t);
      t = view;
    }
  }
  if (state.pinned()) mapping->pin = pin_in_place(base, total);
}

NodeStateSync::NodeStateSync(HostState& state, RankGroup& group, at::Device device, bool leader)
    : state_(state), group_(group), device_(device), leader_(leader) {}

void NodeStateSync::before_step() {
  if (!leader_) return;
  snapshot_.clear();
  for (int b = 0; b < state_.blocks(); ++b) {
    for (at::Tensor* t : {&state_.master(b), &state_.exp_avg(b), &state_.exp_avg_sq(b)}) snapshot_.push_back(t->clone());
  }
}

void NodeStateSync::after_step() {
  std::size_t k = 0;
  for (int b = 0; b < state_.blocks(); ++b) {
    for (at::Tensor* t : {&state_.master(b), &state_.exp_avg(b), &state_.exp_avg_sq(b)}) {
      at::Tensor values, counts;
      if (leader_) {
        const at::Tensor changed = t->ne(snapshot_.at(k++));
        values = at::where(changed, *t, at::zeros_like(*t));
        counts = changed.to(at::kFloat);
      } else {
        values = at::zeros_like(*t);
        counts = at::zeros_like(*t);
      }
      values = values.to(device_).contiguous();
      counts = counts.to(device_).contiguous();
      group_.all_reduce_sum(values);
      group_.all_reduce_sum(counts);
      if (!leader_) continue;
      counts = counts.cpu();
      if (counts.max().item<float>() > 1.0f) {
        throw std::logic_error("node states: an element of block " + std::to_string(b) + " was updated on two nodes");
      }
      t->copy_(at::where(counts > 0, values.cpu(), *t));
    }
    if (leader_) state_.publish(b);
  }
  snapshot_.clear();
  group_.barrier();
}

}  // namespace oom::backend
