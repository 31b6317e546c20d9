// TorchExecutor: the Executor (planner/engine/executor.h) of real short executions with the LibTorch
// backend, so Configure-then-Compare and `oom calibrate --backend` can hold predictions against
// measured steps.
//
// run() builds the workload's model (only its first `units.decoder_layers` decoders when given),
// seeds its weights, draws random byte tokens for global_batch × seq_len, checks the plan
// (check_plan_for_run: one rank, Local path) and runs `warmup_steps` and then `measured_steps`
// untraced steps with the plan-driven runtime (backend/train/plan_runtime.h) on the CPU
// (or the first CUDA device when LibTorch has one), then one traced step. The Measurement: the
// median of the untraced steps' times, the traced step's stage trace (engine "torch"), its device
// allocator peak (CUDA, or the emulated device's with `device_memory` on the CPU) and host resident-set peak (`clock` chooses wall or process CPU time).
// No LibTorch types in this header. Not thread-safe; one per thread.
#pragma once

#include <cstdint>
#include <string>

#include "planner/engine/executor.h"

namespace oom::backend {

struct TorchExecutorOptions {
  int warmup_steps = 1;
  int measured_steps = 3;
  std::uint64_t seed = 0;
  int threads = 0;      // LibTorch intra-op threads; 0 = leave as is
  bool use_cuda = true;  // the first CUDA device when present
  // What a step's time is: its wall time (default), or the process CPU time it used, which other
  // load on a shared machine does not inflate (equal to the wall time on an idle machine when the
  // step runs on one thread and its CPU updates are small).
  enum class Clock { kWall, kProcessCpu };
  Clock clock = Clock::kWall;
  // On the CPU, stand in for a GPU (backend/runtime/device_memory.h): BF16 working weights, as the memory
  // model assumes, and the device side's allocations measured, so that the Measurement's GPU peak
  // is what a device would hold (on a CUDA device its allocator says so in any case).
  bool device_memory = false;
};

class TorchExecutor : public Executor {
 public:
  explicit TorchExecutor(TorchExecutorOptions options = {});
  std::string name() const override { return "torch"; }
  // Throws InputError when the plan cannot run here (see check_plan_for_run).
  Measurement run(const Plan& plan, const WorkloadContext& ctx, const ExecutionUnits& units) override;
  // M_0 = ε = 0 when it stands a CPU in for a GPU (`device_memory` and no CUDA device).
  std::optional<MemoryConstants> device_memory_constants() const override;

 private:
  TorchExecutorOptions options_;
};

// The first `layers` decoders of `m` (all when layers ≤ 0 or ≥ m.layers).
ModelSpec truncated_model(const ModelSpec& m, int layers);
// `plan` with its per-decoder lists restricted to decoders below `layers`.
Plan truncated_plan(const Plan& plan, int layers);

}  // namespace oom::backend
