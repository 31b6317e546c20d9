// Executor: runs a plan on a workload and reports what a step took (DESIGN.md "Executor").
//
// Configure-then-Compare's "short executions" call it with one and two repeating units of
// decoders to separate fixed from per-layer cost (reference §5). GraphExecutor lowers the plan
// and runs a StepEngine (analytic or SimGrid); the LibTorch backend provides its own Executor for
// real runs. Executors are not required to be thread-safe; use one per thread.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "costmodel/memory.h"
#include "costmodel/units.h"
#include "costmodel/workload.h"
#include "planner/calibration/calibration.h"
#include "planner/engine/step_engine.h"
#include "planner/lowering/step_graph.h"
#include "planner/plan/plan.h"
#include "traces/trace.h"

namespace oom {

// How much of the model to execute.
struct ExecutionUnits {
  int decoder_layers = 0;  // the first N decoders (0 = the whole model)
};

struct Measurement {
  Seconds step_s = 0;
  std::vector<Bytes> gpu_peak_bytes;   // per GPU
  std::vector<Bytes> numa_peak_bytes;  // per NUMA node
  Trace trace;                         // stage timeline (may be empty for executors that do not record)
};

class Executor {
 public:
  virtual ~Executor() = default;
  virtual std::string name() const = 0;
  // Runs one step. Preconditions: validate_plan() accepted `plan` for `ctx.workload`.
  virtual Measurement run(const Plan& plan, const WorkloadContext& ctx, const ExecutionUnits& units) = 0;
  // The memory model's runtime constants for the device this executor measures, where they
  // differ from the CUDA defaults (a CPU standing in for a GPU has no CUDA context and no caching
  // allocator: M_0 = ε = 0); nullopt to keep the caller's.
  virtual std::optional<MemoryConstants> device_memory_constants() const { return std::nullopt; }
};

// Lowers the plan (planner/lowering/step_graph.h) and executes the graph with `engine`, pricing stages
// with a CalibratedDurationModel of `calibration` on the workload's hardware.
class GraphExecutor : public Executor {
 public:
  GraphExecutor(std::unique_ptr<StepEngine> engine, Calibration calibration, LoweringOptions options = {});
  std::string name() const override;
  Measurement run(const Plan& plan, const WorkloadContext& ctx, const ExecutionUnits& units) override;

 private:
  std::unique_ptr<StepEngine> engine_;
  Calibration calibration_;
  LoweringOptions options_;
};

}  // namespace oom
