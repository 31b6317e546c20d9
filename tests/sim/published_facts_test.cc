// The published qualitative facts (reference §3, §4) hold when the SimGrid engine executes the
// lowered steps with the project's H100 calibration: resident layers shorten the batch-32 step,
// an interleaved resident set beats a contiguous one, keeping O/LSE helps at 512K and not at 32K.
// (tests/planner/validation_test.cc checks the same facts with the analytic engine.)
#include <gtest/gtest.h>

#include "tests/common/published_facts.h"

#include "costmodel/workload.h"
#include "planner/calibration/calibration.h"
#include "planner/engine/cost_report.h"
#include "planner/engine/duration_model.h"
#include "planner/lowering/step_graph.h"
#include "sim/simgrid_engine.h"

namespace oom::sim {
namespace {

double simulated_step_s(const Plan& plan, const Workload& w) {
  const WorkloadContext ctx = resolve_workload(w, "test");
  const CalibratedDurationModel durations(ctx.hardware, load_calibration_for(ctx.hardware), ctx.workload.gpus);
  return SimGridEngine().simulate_times(lower(plan, ctx), durations).step_s;
}

TEST(PublishedFactsOnSimGrid, ResidentLayersShortenTheBatch32Step) {
  published_facts::expect_resident_layers_shorten_the_batch32_step(simulated_step_s);
}

TEST(PublishedFactsOnSimGrid, InterleavedResidentSetBeatsContiguousOfTheSameSize) {
  published_facts::expect_interleaved_resident_set_beats_contiguous(simulated_step_s);
}

TEST(PublishedFactsOnSimGrid, KeepingAttentionResultsHelpsAt512KAndNotAt32K) {
  published_facts::expect_keeping_attention_results_helps_at_512k_not_32k(simulated_step_s);
}

}  // namespace
}  // namespace oom::sim
