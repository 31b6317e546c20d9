// planner/lowering/baselines.h on the SimGrid engine: the baselines run in both engines on the same graph;
// the engines differ only in how shared links, sockets and DRAM are divided, so their step times
// stay within a small factor of each other.
#include <gtest/gtest.h>

#include "planner/engine/step_engine.h"
#include "planner/engine/baseline_run.h"
#include "planner/lowering/baselines.h"
#include "sim/simgrid_engine.h"

namespace oom {
namespace {

TEST(BaselinesOnSimGrid, EverySystemRunsInBothEnginesWithCloseStepTimes) {
  const StepEngines engines = simulator_engines();
  Workload w;
  w.model = "tiny-moe";
  w.hardware = "h100-sxm-node";
  w.gpus = 2;
  w.global_batch = 4;
  w.seq_len = 512;
  const WorkloadContext ctx = resolve_workload(w, "test");
  const Calibration c = load_calibration_for(ctx.hardware);
  for (const auto s : all_baseline_systems()) {
    const BaselineResult analytic = run_baseline(s, ctx, engines, "analytic", c);
    const BaselineResult simgrid = run_baseline(s, ctx, engines, "simgrid", c);
    ASSERT_TRUE(analytic.fits() && simgrid.fits()) << baseline_system_name(s);
    EXPECT_EQ(simgrid.trace.engine, "simgrid");
    EXPECT_EQ(simgrid.trace.stages.size(), analytic.trace.stages.size());
    EXPECT_GE(simgrid.step_s, analytic.step_s * 0.5) << baseline_system_name(s);
    EXPECT_LE(simgrid.step_s, analytic.step_s * 2.0) << baseline_system_name(s);
  }
}

}  // namespace
}  // namespace oom
