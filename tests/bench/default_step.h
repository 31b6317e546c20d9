// The default workload's lowered step (Qwen3.6-35B-A3B on four H100s, batch 32 at 4K, plan R23)
// with its calibrated duration model: the common subject of the engine benchmarks. Built once,
// read-only afterwards.
#pragma once

#include "costmodel/workload.h"
#include "planner/calibration/calibration.h"
#include "planner/engine/cost_report.h"
#include "planner/engine/duration_model.h"
#include "planner/lowering/step_graph.h"
#include "tests/common/cluster_workload.h"

namespace oom::bench {

struct DefaultStep {
  WorkloadContext ctx;
  StepGraph graph;
  CalibratedDurationModel durations;
};

// The default model's experts over `nodes` DGX H200 nodes, two 4K sequences per GPU: the cluster
// benchmarks' workload.
inline WorkloadContext cluster_workload(int nodes) { return test_support::cluster_workload("qwen3.6-35b-a3b", nodes); }

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
