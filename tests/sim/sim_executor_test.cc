// Tests of sim/sim_executor.h: the SimGrid executor lowers and simulates a plan, and its short
// executions (one and two decoders) behave as Configure-then-Compare needs.
#include "sim/sim_executor.h"

#include <gtest/gtest.h>

#include "costmodel/workload.h"
#include "planner/engine/analytic_evaluator.h"
#include "planner/engine/cost_report.h"
#include "planner/engine/step_engine.h"
#include "sim/simgrid_engine.h"

namespace oom::sim {
namespace {

TEST(SimExecutorTest, MeasuresTheSimulatedStep) {
  const WorkloadContext ctx = resolve_workload(default_workload(), "test");
  SimExecutor exec(load_calibration_for(ctx.hardware));
  EXPECT_EQ(exec.name(), "simgrid");
  const Measurement m = exec.run(default_plan(), ctx, {});
  EXPECT_EQ(m.trace.engine, "simgrid");
  EXPECT_GT(m.step_s, 0);
  EXPECT_EQ(m.step_s, m.trace.step_s);
  EXPECT_EQ(m.gpu_peak_bytes.size(), 4u);
  EXPECT_EQ(m.numa_peak_bytes.size(), 2u);
  EXPECT_EQ(m.gpu_peak_bytes, m.trace.gpu_peak_bytes);
  for (const Bytes b : m.gpu_peak_bytes) EXPECT_GT(b, 0);
}

TEST(SimExecutorTest, ShortExecutionsGrowWithTheirDecoders) {
  const WorkloadContext ctx = resolve_workload(default_workload(), "test");
  SimExecutor exec(load_calibration_for(ctx.hardware));
  const double one = exec.run(default_plan(), ctx, {1}).step_s;
  const double two = exec.run(default_plan(), ctx, {2}).step_s;
  const double all = exec.run(default_plan(), ctx, {}).step_s;
  EXPECT_LT(one, two);
  EXPECT_LT(two, all);
}

TEST(SimExecutorTest, MatchesAGraphExecutorOverTheSimGridEngine) {
  const WorkloadContext ctx = resolve_workload(default_workload(), "test");
  const Calibration c = load_calibration_for(ctx.hardware);
  SimExecutor sim(c);
  GraphExecutor graph(make_simgrid_engine(), c);
  EXPECT_TRUE(sim.run(default_plan(), ctx, {2}).trace == graph.run(default_plan(), ctx, {2}).trace);
}

}  // namespace
}  // namespace oom::sim
