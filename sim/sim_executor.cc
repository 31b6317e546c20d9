#include "sim/sim_executor.h"

#include <memory>
#include <utility>

#include "sim/simgrid_engine.h"

namespace oom::sim {

SimExecutor::SimExecutor(Calibration calibration, LoweringOptions options)
    : graph_(std::make_unique<SimGridEngine>(), std::move(calibration), std::move(options)) {}

Measurement SimExecutor::run(const Plan& plan, const WorkloadContext& ctx, const ExecutionUnits& units) {
  return graph_.run(plan, ctx, units);
}

}  // namespace oom::sim
