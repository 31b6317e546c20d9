// Host synchronisations of a traced step: the calls that make the host wait for the device.
//
// A step that keeps the GPU busy issues work and never waits for it, but for the step's loss and
// the clipping norm it prints. While a step records (StageRecorder), every ATen operator call is
// classified here and a sync counted on the thread that makes it; a stage keeps the syncs its
// thread made between its start and end (TraceStage::syncs), the step those of the driving thread
// from start to finish (Trace::host_syncs), stages and the step's loss and norm together.
//
// What counts as one sync (an outermost call: a counted call inside a counted call is not counted
// again, so `x.item()` is one sync, not item's nested `_local_scalar_dense` too):
//   1. `aten::_local_scalar_dense`: a tensor's value read into a C++ number (`item()`, a tensor
//      used as a bool or a size); on a GPU it waits for the tensor's stream.
//   2. The operators whose CUDA kernels wait for a size they compute on the device before they
//      can allocate their output: `aten::nonzero` (and boolean indexing, which calls it),
//      `aten::masked_select`, `aten::bincount`, `aten::unique*`, `aten::repeat_interleave` of a
//      repeats tensor without output_size.
//   3. A copy into host memory from the device (`aten::copy_`, what `to(kCPU)` and `cpu()` do)
//      that is blocking or lands in non-pinned memory (CUDA copies such a copy synchronously).
// On a CUDA device 3 reads the tensors' devices and pinning. On a CPU device the device is
// emulated (backend/runtime/device_memory.h): with emulation a copy from a device allocation to a
// host one asked blocking counts, and so does `aten::to`/`_to_copy` towards the CPU of a device
// allocation (on a CPU it aliases; on a GPU it is a blocking D2H copy: the runtime therefore never
// calls `to(device)` on a tensor already on its device, which a CPU could not tell from it); a host buffer's pinning is
// the runtime's to ask (HostState::pinned) and its copies are issued non-blocking, so a blocking
// copy is what a CPU run can tell apart. Without emulation the CPU has no device allocations and
// counts 1 and 2 only.
//   4. Explicit waits of the driving thread (an event's or a stream's synchronize) that runtime
//      code notes with note_host_sync(); the recorder's own synchronisation, which serialises a
//      traced step's timing on a GPU, is the measurement's and is not counted.
// Thread-safety: counts are per thread; counting starts and stops process-wide.
#pragma once

#include <cstdint>

namespace oom::backend::host_syncs {

// Starts (true) or stops counting every thread's ATen calls: counting lasts while any caller that
// started it has not stopped it (recorders of ranks run as threads in one process overlap).
void count(bool on);
bool counting();
// The syncs the calling thread made while counting (monotonic; take differences).
std::int64_t on_this_thread();
// An explicit wait for the device by runtime code (an event's or a stream's synchronize).
void note_host_sync();

}  // namespace oom::backend::host_syncs
