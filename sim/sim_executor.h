// SimExecutor: the Executor (planner/engine/executor.h) that lowers a plan and simulates the step on
// SimGrid — the default executor of Configure-then-Compare's short executions where no real
// hardware is at hand.
//
// It is a GraphExecutor over sim::SimGridEngine: the step is priced by a CalibratedDurationModel
// of the given calibration on the workload's hardware, and contention between flows comes from
// the SimGrid platform (sim/platform.h). Every run() forks one simulation process
// (sim/isolated_run.h), so runs are independent and repeatable. Not thread-safe: one per thread.
#pragma once

#include <string>

#include "planner/calibration/calibration.h"
#include "planner/engine/executor.h"
#include "planner/lowering/step_graph.h"

namespace oom::sim {

class SimExecutor : public Executor {
 public:
  explicit SimExecutor(Calibration calibration, LoweringOptions options = {});
  std::string name() const override { return "simgrid"; }
  // Lowers the first `units.decoder_layers` decoders (all when 0) and simulates the step.
  // Preconditions: validate_plan() accepted `plan` for `ctx.workload`. Throws what lowering and
  // SimGridEngine::execute() throw.
  Measurement run(const Plan& plan, const WorkloadContext& ctx, const ExecutionUnits& units) override;

 private:
  GraphExecutor graph_;
};

}  // namespace oom::sim
