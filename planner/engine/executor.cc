#include "planner/engine/executor.h"

#include "costmodel/input_error.h"
#include "planner/engine/work_counts.h"

namespace oom {

GraphExecutor::GraphExecutor(std::unique_ptr<StepEngine> engine, Calibration calibration, LoweringOptions options)
    : engine_(std::move(engine)), calibration_(std::move(calibration)), options_(options) {
  OOM_ASSERT(engine_ != nullptr, "GraphExecutor needs an engine");
}

std::string GraphExecutor::name() const { return engine_->name(); }

Measurement GraphExecutor::run(const Plan& plan, const WorkloadContext& ctx, const ExecutionUnits& units) {
  LoweringOptions options = options_;
  options.decoder_layers = units.decoder_layers;
  const StepGraph g = lower(plan, ctx, options);
  ++thread_work_counts().lowerings;
  ++thread_work_counts().simulations;
  const CalibratedDurationModel durations(ctx.hardware, calibration_, ctx.workload.gpus);
  Measurement m;
  m.trace = engine_->execute(g, durations);
  m.step_s = m.trace.step_s;
  m.gpu_peak_bytes = m.trace.gpu_peak_bytes;
  m.numa_peak_bytes = m.trace.numa_peak_bytes;
  return m;
}

}  // namespace oom
