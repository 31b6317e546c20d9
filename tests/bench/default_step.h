// The default workload's lowered step (Qwen3.6-35B-A3B on four H100s, batch 32 at 4K, plan R23)
// with its calibrated duration model: the common subject of the engine benchmarks. Built once,
// read-only afterwards.
#pragma once

#include "costmodel/workload.h"
#include "planner/calibration/calibration.h"
#include "planner/engine/cost_report.h"
#include "planner/engine/duration_model.h"
#include "planner/lowering/step_graph.h"

namespace oom::bench {

struct DefaultStep {
  WorkloadContext ctx;
  StepGraph graph;
  CalibratedDurationModel durations;
};

inline const DefaultStep& default_step() {
  static const DefaultStep step = [] {
    WorkloadContext ctx = resolve_workload(default_workload(), "default workload");
    StepGraph g = lower(default_plan(), ctx);
    CalibratedDurationModel d(ctx.hardware, load_calibration_for(ctx.hardware), ctx.workload.gpus);
    return DefaultStep{std::move(ctx), std::move(g), std::move(d)};
  }();
  return step;
}

}  // namespace oom::bench
