// Host canonical training state and the per-layer parameter window.
//
// HostState holds, for every block of the ModelLayout (outer block + one per decoder layer), the
// FP32 master weights and the two FP32 Adam moments as flat host buffers, the working copy the compute device reads (FP32 or BF16,
// republished from the master after each update) and a gradient slot the device's gradients land
// in (allocated at first use). The masters, moments and working copies are one host allocation,
// each buffer page-aligned in it, pinned in place when CUDA is present (backend/runtime/pinned_host.h:
// the bytes the state needs, not the caching host allocator's power of two) so transfers are
// asynchronous. A NUMA hook is called once per buffer after allocation and before its pages are
// touched or pinned, so a caller can bind them (e.g. mbind to the socket whose CPU threads run
// AdamW on that layer).
//
// ParamWindow streams working weights to the compute device through two slots: prefetch(ℓ+1)
// starts the copy while layer ℓ computes; acquire(ℓ) waits for it. On a CPU compute device the
// host working copy already is the compute copy, so the window hands it out without copying.
// On CUDA the copies run on the device's H2D lane (backend/runtime/host_copies.h) ordered by events
// against the compute stream.
// Thread-safety: a HostState block may be updated by one thread while others use other blocks;
// a ParamWindow belongs to the thread that drives the step.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "backend/model/layout.h"
#include "costmodel/model_spec.h"

namespace oom::backend {

enum class WorkingPrecision { kFloat32, kBFloat16 };
at::ScalarType working_dtype(WorkingPrecision p);

struct StateOptions {
  WorkingPrecision precision = WorkingPrecision::kFloat32;
  // Called for every host buffer after allocation: (block, buffer name, address, bytes).
  std::function<void(int, const std::string&, void*, std::size_t)> numa_hook;
};

class HostState {
 public:
  HostState(const ModelSpec& spec, StateOptions options = {});

  const ModelSpec& spec() const { return spec_; }
  const ModelLayout& layout() const { return layout_; }
  int blocks() const { return static_cast<int>(layout_.blocks.size()); }
  WorkingPrecision precision() const { return options_.precision; }
  bool pinned() const { return pinned_; }

  // Seeded initialization of the masters (N(0, std²) matrices, ones for norms, GDN decay
  // parameters as in the reference implementation); zeroes moments; publishes working copies.
  void init_from_seed(std::uint64_t seed);
  // Loads masters from a safetensors file named as in backend/io/safetensors.h; every tensor of the
  // layout must be present with its shape. Throws InputError otherwise (state left unchanged).
  void load_safetensors(const std::string& path);
  void save_safetensors(const std::string& path) const;

  at::Tensor& master(int block) { return master_[idx(block)]; }
  at::Tensor& exp_avg(int block) { return m_[idx(block)]; }
  at::Tensor& exp_avg_sq(int block) { return v_[idx(block)]; }
  at::Tensor& working(int block) { return working_[idx(block)]; }
  // The block's host gradient buffer (zeroed), allocated at its first use: a trainer that keeps
  // its own bounded set of gradient buffers (the graph runner's cpu_grad_slots) never makes one.
  at::Tensor& grad_slot(int block);
  const at::Tensor& master(int block) const { return master_[idx(block)]; }
  const at::Tensor& exp_avg(int block) const { return m_[idx(block)]; }
  const at::Tensor& exp_avg_sq(int block) const { return v_[idx(block)]; }

  // Copies (and rounds) the master of `block` into its working copy.
  void publish(int block);

  std::int64_t step = 0;  // optimizer steps taken

 private:
  std::size_t idx(int block) const;
  at::Tensor alloc(int block, const std::string& what, at::ScalarType type);
  void allocate_state();

  ModelSpec spec_;
  ModelLayout layout_;
  StateOptions options_;
  bool pinned_ = false;
  std::vector<at::Tensor> master_, m_, v_, working_, grad_;
};

class ParamWindow {
 public:
  // `transfer_chunk_bytes` > 0: each block is copied in pieces of at most that many bytes (the
  // plan's transfer_chunk_mib); 0: one copy per block.
  ParamWindow(HostState& state, at::Device device, std::int64_t transfer_chunk_bytes = 0);
  // Starts bringing block `block`'s working weights into a free slot (the copy itself only on a
  // CUDA device). OOM_ASSERTs that a slot is free: both holding blocks in use is a schedule error.
  void prefetch(int block);
  // The flat working weights of `block` on the compute device, ready to use on the current stream;
  // its slot is in use until release().
  at::Tensor acquire(int block);
  // Marks the slot of `block` free once the work queued so far on the compute stream is done.
  void release(int block);
  const at::Device& device() const { return device_; }

 private:
  HostState& state_;
  at::Device device_;
  std::int64_t transfer_chunk_bytes_ = 0;
  struct Slot {
    int block = -1;
    bool in_use = false;
    at::Tensor buffer;
    std::shared_ptr<void> ready, free;  // CUDA events (opaque here)
  };
  Slot slots_[2];
  Slot& slot_for(int block);  // the slot holding `block`, else a free one
  std::shared_ptr<void> copy_stream_;
};

}  // namespace oom::backend
