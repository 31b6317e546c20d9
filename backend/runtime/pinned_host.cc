#include "backend/runtime/pinned_host.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>

#include <ATen/Context.h>

#ifdef OOM_BACKEND_CUDA
#include <cuda_runtime_api.h>
#endif

namespace oom::backend {

std::size_t host_page_bytes() { return static_cast<std::size_t>(::sysconf(_SC_PAGESIZE)); }

std::shared_ptr<void> map_host_region(std::size_t bytes) {
  const std::size_t page = host_page_bytes();
  const std::size_t size = std::max<std::size_t>(page, (bytes + page - 1) / page * page);
  void* base = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) {
    throw std::runtime_error("cannot map " + std::to_string(size) + " bytes of host memory: " + std::strerror(errno));
  }
  return {base, [size](void* p) { ::munmap(p, size); }};
}

std::shared_ptr<void> pin_in_place(void* data, std::size_t bytes) {
#ifdef OOM_BACKEND_CUDA
  if (bytes == 0 || !at::hasCUDA()) return nullptr;
  const cudaError_t e = cudaHostRegister(data, bytes, cudaHostRegisterPortable);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();  // clear it
    throw std::runtime_error("cannot pin " + std::to_string(bytes) + " bytes of host memory (cudaHostRegister): " + cudaGetErrorString(e));
  }
  return {data, [](void* p) { (void)cudaHostUnregister(p); }};
#else
  (void)data;
  (void)bytes;
  return nullptr;
#endif
}

}  // namespace oom::backend
