// Host memory for the state a GPU copies to and from: allocated once, exactly the bytes asked, and
// pinned in place (cudaHostRegister), so that every copy of it is asynchronous. LibTorch's caching
// host allocator, which pinned_memory(true) goes through, rounds each allocation up to a power of
// two (up to twice the host memory the simulator budgets for the state) and keeps it cached.
// Thread-safe (no shared state but CUDA's).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>

namespace oom::backend {

// A page-aligned host region of `bytes` (an anonymous mapping: its pages are placed where they are
// first touched, so a NUMA hook can bind them before), unmapped when the last owner goes; get() is
// its base. Throws std::runtime_error when the mapping fails.
std::shared_ptr<void> map_host_region(std::size_t bytes);
// Pins [data, data + bytes) in place until the returned handle goes (cudaHostRegister, portable to
// every device's context; unregistered at the handle's end, which must come before the memory's
// owner frees it). Null in a build without CUDA or on a machine without a GPU; throws
// std::runtime_error when CUDA refuses.
std::shared_ptr<void> pin_in_place(void* data, std::size_t bytes);

// The page size the regions align to.
std::size_t host_page_bytes();

}  // namespace oom::backend
