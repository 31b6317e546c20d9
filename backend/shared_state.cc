#include "backend/shared_state.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <vector>

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
  std::shared_ptr<void> mapping(base, [total](void* p) { ::munmap(p, total); });
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
}

}  // namespace oom::backend
