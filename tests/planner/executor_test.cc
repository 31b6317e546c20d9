// Tests of planner/engine/executor.h: GraphExecutor lowers and runs a plan; short executions of one and
// two repeating units separate fixed from per-layer cost (reference §5).
#include "planner/engine/executor.h"

#include <gtest/gtest.h>

#include "planner/engine/cost_report.h"

namespace oom {
namespace {

TEST(GraphExecutor, ShortExecutionsScaleWithTheUnitsRun) {
  const WorkloadContext ctx = resolve_workload(default_workload(), "test");
  GraphExecutor executor(StepEngines().make("analytic"), load_calibration_for(ctx.hardware));
  EXPECT_EQ(executor.name(), "analytic");
  Plan r0 = default_plan();
  r0.resident_layers.clear();
  const Measurement four = executor.run(r0, ctx, {4});    // one 3 GDN + 1 attention unit
  const Measurement eight = executor.run(r0, ctx, {8});   // two units
  const Measurement full = executor.run(r0, ctx, {0});    // the whole model
  EXPECT_GT(eight.step_s, four.step_s);
  EXPECT_GT(full.step_s, eight.step_s);
  // Per-unit cost from the two short runs, extrapolated to 10 units, lands near the full step.
  const double per_unit = eight.step_s - four.step_s;
  const double fixed = four.step_s - per_unit;
  EXPECT_NEAR(fixed + 10 * per_unit, full.step_s, 0.15 * full.step_s);
  ASSERT_EQ(full.gpu_peak_bytes.size(), 4u);
  ASSERT_EQ(full.numa_peak_bytes.size(), 2u);
  EXPECT_EQ(full.trace.engine, "analytic");
  EXPECT_DOUBLE_EQ(full.trace.step_s, full.step_s);
}

}  // namespace
}  // namespace oom
