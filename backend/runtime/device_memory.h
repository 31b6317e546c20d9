// Device memory of a CPU run that stands in for a GPU: what the compute device would hold,
// measured by the allocator, so that a plan's GPU working set can be checked on any machine.
//
// On a CUDA device the CUDA caching allocator says what the device holds. On a CPU device the
// device and the host share one allocator and the runtime adopts tensors where a GPU would copy
// them (the weight window, gradients to the host, boundaries and O/LSE loaded back), so nothing
// separates the two. With emulation on:
//   - a metering CPU allocator (installed once, ahead of LibTorch's default) counts the bytes
//     allocated while the allocating thread is inside an OnDevice scope, until they are freed;
//     allocations outside one are the host's and pass through untouched;
//   - the runtime copies where a GPU would (to_device, to_host, the ParamWindow's two slots), so
//     the device's tensors and the host's are distinct allocations.
// The graph runner enters OnDevice for every stage on a GPU resource and OnHost for the host
// buffers those stages fill (gradient D2H, kept boundaries and O/LSE). Work LibTorch hands to
// intra-op worker threads allocates there rarely (outputs are allocated before the parallel loop)
// and is not counted. Units: bytes of allocation requests (the allocator's alignment padding is
// not counted, as the CUDA allocator's rounding is not in its "allocated" statistic).
// Each device allocation also carries a MemoryUse (the memory model's tags: dispatch, vocabulary,
// boundaries, optimizer, activations, other): the innermost Tagged scope of the allocating thread
// when it was made, or the use retag() gave it later, so that each use's own peak can be set
// beside the model's (planner/engine/peak_composition.h use_peaks).
// Thread-safe: counters are atomic; scopes are per thread.
#pragma once

#include <array>

#include <ATen/ATen.h>

#include "costmodel/units.h"
#include "planner/lowering/step_graph.h"

namespace oom::backend::device_memory {

// Turns emulation on or off for the process (installs the metering allocator at the first call
// with `on`). Tensors allocated before keep their own deleters and are never counted.
void set_emulated(bool on);
bool emulated();
// Emulation set to `on` for the life of the scope (the process's: a run declares it before the
// runner whose device allocations it meters, so it ends after them); off again at its end.
class Emulation {
 public:
  explicit Emulation(bool on) { set_emulated(on); }
  ~Emulation() { set_emulated(false); }
  Emulation(const Emulation&) = delete;
  Emulation& operator=(const Emulation&) = delete;
};

// Bytes the device holds now, and the most it held since the last reset_peak().
Bytes current_bytes();
Bytes peak_bytes();
// Starts a new peak from what the device holds now.
void reset_peak();
// Bytes each use holds now, and the most each held since the last reset_use_peaks() (each use's
// own peak, which need not fall at the device's peak); reset_use_peaks() starts them anew from
// what each holds now. Kept apart from reset_peak(), which a trace calls per stage.
std::array<Bytes, kMemoryUses> use_bytes();
std::array<Bytes, kMemoryUses> use_peak_bytes();
void reset_use_peaks();
// Counts the allocation that holds `t`'s data under `use` from now on (nothing when `t` is not a
// device allocation): a tensor whose role is known only after it was made (a decoder's output
// that becomes a checkpoint boundary, a gradient made by autograd).
void retag(const at::Tensor& t, MemoryUse use);
// Whether `t`'s data is a device allocation of the emulated device (false without emulation's
// allocator, and for every tensor allocated outside an OnDevice scope).
bool is_device(const at::Tensor& t);

// Device allocations of this thread are counted under `use` while the scope lives (scopes nest;
// the innermost wins; kOther outside any).
class Tagged {
 public:
  explicit Tagged(MemoryUse use);
  ~Tagged();
  Tagged(const Tagged&) = delete;
  Tagged& operator=(const Tagged&) = delete;

 private:
  MemoryUse previous_;
};

// Allocations of this thread count as the device's while an OnDevice is alive, and as the host's
// while a later OnHost is (scopes nest; the innermost wins).
class Side {
 public:
  explicit Side(bool device);
  ~Side();
  Side(const Side&) = delete;
  Side& operator=(const Side&) = delete;

 private:
  bool previous_;
};
struct OnDevice : Side {
  OnDevice() : Side(true) {}
};
struct OnHost : Side {
  OnHost() : Side(false) {}
};

// a @ b (2-D) into `out` (allocated by the caller under its own tag), with what the GEMM library
// allocates for itself while it runs counted as other: on a CPU, oneDNN's packed copies of BF16
// operands (up to ~2.5x an operand); on a GPU that is cuBLAS's workspace, allocated once and part of
// the fixed occupancy, never a use's working set. The same product as at::mm.
void gemm_out(at::Tensor& out, const at::Tensor& a, const at::Tensor& b);
// The same into a fresh tensor of a's dtype, allocated under the caller's tag.
at::Tensor gemm(const at::Tensor& a, const at::Tensor& b);
// out += a @ b, in place (out of a's dtype), the library's scratch counted as other.
void gemm_add(at::Tensor& out, const at::Tensor& a, const at::Tensor& b);

// Where a GPU would copy: `x` on `device` as a device allocation of its own when emulating a
// device on the CPU; otherwise x.to(device) (x itself when already there).
at::Tensor to_device(const at::Tensor& x, const at::Device& device);

}  // namespace oom::backend::device_memory
