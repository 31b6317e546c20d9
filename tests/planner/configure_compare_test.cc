// Tests of planner/search/configure_compare.h: short executions of one and two repeating units
// extrapolate to full depth (exactly for an executor whose cost is affine in depth; within a few
// percent of the full analytic step for real plans) and the faster path wins (reference §5).
#include "planner/search/configure_compare.h"

#include <gtest/gtest.h>

#include "planner/engine/cost_report.h"
#include "planner/search/plan_pricing.h"

namespace oom {
namespace {

// A fake executor: fixed cost plus a per-decoder cost that depends on residency and retention.
class AffineExecutor : public Executor {
 public:
  std::string name() const override { return "affine"; }
  Measurement run(const Plan& plan, const WorkloadContext& ctx, const ExecutionUnits& units) override {
    const int n = units.decoder_layers > 0 ? units.decoder_layers : ctx.model.layers;
    layers_run.push_back(n);
    Measurement m;
    m.step_s = 2.0;
    for (int l = 0; l < n; ++l) {
      m.step_s += plan.is_resident(l) ? 0.1 : 0.3;
      m.step_s -= plan.is_moe_retained(l) ? 0.05 : 0.0;
    }
    m.gpu_peak_bytes = {static_cast<Bytes>(n)};
    return m;
  }
  std::vector<int> layers_run;
};

TEST(ShortExecutions, ExtrapolateExactlyWhenCostIsAffineInDepth) {
  const WorkloadContext ctx = resolve_workload(default_workload(), "test");  // 40 decoders, unit 4
  AffineExecutor ex;
  const Plan p = default_plan();  // 23 resident layers
  const ShortExecutionEstimate e = estimate_by_short_executions(ex, p, ctx);
  EXPECT_EQ(e.unit_layers, 4);
  EXPECT_EQ(ex.layers_run, (std::vector<int>{4, 8, 8}));  // 1 unit, 2 units, 2 units with the resident share
  EXPECT_EQ(e.executions, 3);
  EXPECT_FALSE(e.full_depth);
  EXPECT_NEAR(e.step_s, 2.0 + 23 * 0.1 + 17 * 0.3, 1e-9);
  EXPECT_EQ(e.gpu_peak_bytes, 8);
  // Resident and retained together: one share run, scaled as a whole (close, not exact).
  Plan both = p;
  both.moe_retained_layers = {36, 37, 38, 39};
  AffineExecutor ex3;
  EXPECT_NEAR(estimate_by_short_executions(ex3, both, ctx).step_s, 2.0 + 23 * 0.1 + 17 * 0.3 - 4 * 0.05, 0.02 * 9.2);
  // A Local plan runs the two unit executions only.
  AffineExecutor ex2;
  Plan local;
  local.path = ExpertPath::kLocal;
  EXPECT_NEAR(estimate_by_short_executions(ex2, local, ctx).step_s, 2.0 + 40 * 0.3, 1e-9);
  EXPECT_EQ(ex2.layers_run.size(), 2u);
  // A model of at most two units runs once, whole.
  Workload tiny;
  tiny.model = "tiny-moe";  // 4 decoders, one unit of 3 GDN + 1 attention
  tiny.hardware = "local-cpu";
  tiny.gpus = 1;
  AffineExecutor ex4;
  const ShortExecutionEstimate whole = estimate_by_short_executions(ex4, local, resolve_workload(tiny, "test"));
  EXPECT_TRUE(whole.full_depth);
  EXPECT_EQ(ex4.layers_run, (std::vector<int>{4}));
}

TEST(ShortExecutions, LandNearTheFullDepthAnalyticStep) {
  const WorkloadContext ctx = resolve_workload(default_workload(), "test");
  const Calibration cal = load_calibration_for(ctx.hardware);
  GraphExecutor ex(StepEngines().make("analytic"), cal);
  const PlanPricer pricer(ctx, cal);
  Plan local;
  local.path = ExpertPath::kLocal;
  local.param_transfer = ParamTransfer::kShard;
  local.cpu_grad_slots = 1;
  for (const Plan& p : {default_plan(), local}) {
    const Seconds full = pricer.price(p).step_s;
    EXPECT_NEAR(estimate_by_short_executions(ex, p, ctx).step_s, full, 0.10 * full) << path_name(p.path);
  }
}

TEST(ConfigureThenCompare, TheSmallerExtrapolatedStepWins) {
  const WorkloadContext ctx = resolve_workload(default_workload(), "test");
  AffineExecutor ex;
  Plan streamed = default_plan();
  streamed.resident_layers.clear();
  const CompareResult r = configure_then_compare(ex, {streamed, default_plan()}, ctx);
  ASSERT_EQ(r.estimates.size(), 2u);
  EXPECT_EQ(r.winner, 1u);
  EXPECT_LT(r.estimates[1].step_s, r.estimates[0].step_s);
}

}  // namespace
}  // namespace oom
