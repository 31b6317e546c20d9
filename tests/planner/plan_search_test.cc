// Tests of planner/search/plan_search.h against the published behaviour (reference §3–§5): at 4K on four
// H100s the chosen path flips from EP (global batch 16–64) to Local (128–256) and the EP plan
// shifts memory from resident state to retained activations as the batch grows; on four RTX 4090s
// at 1K context and global batch 1024 a plan fits 24 GB per GPU; infeasible workloads name the
// budget, the shortfall and where.
#include "planner/search/plan_search.h"

#include <map>

#include <gtest/gtest.h>

#include "costmodel/input_error.h"
#include "planner/engine/work_counts.h"
#include "planner/lowering/memory_report.h"
#include "planner/search/plan_pricing.h"

namespace oom {
namespace {

WorkloadContext workload(const std::string& hardware, std::int64_t batch, std::int64_t seq,
                         std::optional<double> gpu_gib = std::nullopt, const nlohmann::json& routing = nullptr) {
  Workload w;
  if (!routing.is_null()) w.routing = routing_from_json(routing, "test", "routing");
  w.model = "qwen3.6-35b-a3b";
  w.hardware = hardware;
  w.gpus = 4;
  w.global_batch = batch;
  w.seq_len = seq;
  w.gpu_budget_gib = gpu_gib;
  return resolve_workload(w, "test");
}

// The default search at 4K on four H100s, run once per batch for the suite.
const PlanSearchResult& search_at_4k(std::int64_t batch) {
  static std::map<std::int64_t, PlanSearchResult> cache;
  auto it = cache.find(batch);
  if (it == cache.end()) {
    const WorkloadContext ctx = workload("h100-sxm-node", batch, 4096);
    it = cache.emplace(batch, search_plan(ctx, load_calibration_for(ctx.hardware))).first;
  }
  return it->second;
}

// The EP plan of a search: the chosen one or the alternative.
const PlanChoice& ep_choice(const PlanSearchResult& r) {
  if (r.chosen.plan.path == ExpertPath::kEp) return r.chosen;
  for (const PlanChoice& a : r.alternatives) {
    if (a.plan.path == ExpertPath::kEp) return a;
  }
  ADD_FAILURE() << "no EP plan";
  return r.chosen;
}

// One test case (CTest runs each case in its own process, so the searches are shared here):
// the path flips from EP to Local, and, reference §3, the EP plan moves memory from resident
// state to retained activations as the batch grows (published: R23 at 32, R3/K4 at 64, R1/K1 at
// 128).
TEST(PlanSearch, At4KThePathFlipsFromEpToLocalAndTheEpPlanShiftsStateToActivations) {
  std::vector<std::size_t> resident, retained;
  for (std::int64_t batch : {16, 32, 64, 128, 256}) {
    const PlanSearchResult& r = search_at_4k(batch);
    if (batch <= 128) {
      const Plan& ep = ep_choice(r).plan;
      resident.push_back(ep.resident_layers.size());
      retained.push_back(ep.moe_retained_layers.size());
    }
    const ExpertPath expected = batch <= 64 ? ExpertPath::kEp : ExpertPath::kLocal;
    EXPECT_EQ(r.chosen.plan.path, expected) << "batch " << batch << ": " << plan_search_text(r);
    ASSERT_EQ(r.alternatives.size(), 1u);
    EXPECT_NE(r.alternatives[0].plan.path, r.chosen.plan.path);
    EXPECT_EQ(r.compare_engine, "analytic");
    EXPECT_GT(r.chosen.compared_step_s, 0);
    EXPECT_NEAR(r.chosen.tokens_per_s, batch * 4096 / r.chosen.predicted_step_s, 1e-6);
  }
  for (std::size_t i = 1; i < resident.size(); ++i) EXPECT_LE(resident[i], resident[i - 1]) << i;
  EXPECT_LT(resident.back(), resident.front());
  EXPECT_GT(retained.back() + retained[2], retained.front());
}

TEST(PlanSearch, OnFourRtx4090sAt1KAndBatch1024APlanFits24GB) {
  const WorkloadContext ctx = workload("rtx4090-node", 1024, 1024, 24e9 / static_cast<double>(kGiB));
  const PlanSearchResult r = search_plan(ctx, load_calibration_for(ctx.hardware));
  EXPECT_LE(r.chosen.gpu_peak_bytes, Bytes{24'000'000'000});
  EXPECT_LE(static_memory(ctx, r.chosen.plan).gpu.eq2.total(), Bytes{24'000'000'000});
  EXPECT_NO_THROW(validate_plan(r.chosen.plan, ctx.model, ctx.workload, "test"));
}

// A plan priced again (by the same pricer or one sharing its memo, notes aside) is answered from
// the memo without lowering: the same figures, the caller's plan; another depth is priced anew.
TEST(PlanPricing, APlanPricedAgainComesFromTheMemoWithTheSameFigures) {
  const WorkloadContext ctx = workload("h100-sxm-node", 16, 4096);
  const PlanPricer pricer(ctx, load_calibration_for(ctx.hardware));
  const PlanPricer flat(pricer, bounded_flat_schedules());
  Plan p;
  p.path = ExpertPath::kEp;
  p.resident_layers = {0, 1};
  const WorkCounts before = thread_work_counts();
  const PricedPlan first = pricer.price(p);
  p.notes = "the same plan, other notes";
  const PricedPlan again = flat.price(p);
  const PricedPlan shallow = pricer.price(p, 4);
  const WorkCounts d = thread_work_counts() - before;
  EXPECT_EQ(again.step_s, first.step_s);
  EXPECT_EQ(again.gpu_peak_bytes, first.gpu_peak_bytes);
  EXPECT_EQ(again.numa_peak_bytes, first.numa_peak_bytes);
  EXPECT_EQ(again.plan.notes, p.notes);
  EXPECT_LT(shallow.step_s, first.step_s);
  EXPECT_EQ(d.priced, 3);
  EXPECT_EQ(d.price_hits, 1);
  EXPECT_EQ(d.lowerings, 2);
}

TEST(PlanSearch, OnePathOnlyHasNoAlternativesAndNoComparison) {
  const WorkloadContext ctx = workload("h100-sxm-node", 32, 4096);
  PlanSearchOptions o;
  o.path = "ep";
  const PlanSearchResult r = search_plan(ctx, load_calibration_for(ctx.hardware), o);
  EXPECT_EQ(r.chosen.plan.path, ExpertPath::kEp);
  EXPECT_TRUE(r.alternatives.empty());
  EXPECT_TRUE(r.compare_engine.empty());
}

TEST(PlanSearch, JsonCarriesThePlanItsPredictionAndTheAlternatives) {
  const PlanSearchResult& r = search_at_4k(32);
  const nlohmann::json j = plan_search_to_json(r);
  for (const char* key : {"path", "plan", "predicted_step_s", "gpu_peak_gib", "host_gib", "alternatives"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
  EXPECT_EQ(j["path"], "ep");
  EXPECT_EQ(plan_from_json(j["plan"], "test"), r.chosen.plan);
  ASSERT_EQ(j["alternatives"].size(), 1u);
  EXPECT_EQ(j["alternatives"][0]["path"], "local");
  EXPECT_TRUE(j["alternatives"][0].contains("predicted_step_s"));
  EXPECT_TRUE(j["alternatives"][0].contains("plan"));
}

TEST(PlanSearch, InfeasibleWorkloadNamesTheBudgetByHowMuchAndWhere) {
  const WorkloadContext ctx = workload("h100-sxm-node", 32, 4096, 4.0);
  try {
    search_plan(ctx, load_calibration_for(ctx.hardware));
    FAIL() << "expected InfeasibleWorkload";
  } catch (const InfeasibleWorkload& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    EXPECT_EQ(what.rfind("GPU budget 4.0 GiB < ", 0), 0u) << what;
    EXPECT_NE(what.find(" GiB needed by "), std::string::npos) << what;
    EXPECT_NE(what.find("smallest"), std::string::npos) << what;
  }
}

// The shortfall line never shows a positive budget as 0.0 GiB or two equal numbers.
TEST(BudgetShortfall, MessageShowsAsManyDecimalsAsTellTheNumbersApart) {
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  const auto bytes = [&](double gib) { return static_cast<Bytes>(gib * kGiB); };
  EXPECT_EQ((BudgetShortfall{"GPU", bytes(4.0), bytes(5.3), "decoder 0"}.message()),
            "GPU budget 4.0 GiB < 5.3 GiB needed by decoder 0");
  EXPECT_EQ((BudgetShortfall{"GPU", bytes(0.05), bytes(1.5), ""}.message()), "GPU budget 0.05 GiB < 1.50 GiB needed");
  EXPECT_EQ((BudgetShortfall{"host NUMA node 1", bytes(1.52), bytes(1.534), "x"}.message()),
            "host NUMA node 1 budget 1.52 GiB < 1.53 GiB needed by x");
  // Under 0.1 GiB needed (the tiny models): MiB.
  EXPECT_EQ((BudgetShortfall{"GPU", bytes(0.0006), bytes(0.00062), "decoder 0"}.message()),
            "GPU budget 0.61 MiB < 0.63 MiB needed by decoder 0");
}

// FLAT: under skewed routing and a tight GPU budget, the EP plan bounds its dispatch peak with
// PipelinedLLEP and says that this is the peak that binds; schedules that do not pay are left out.
TEST(PlanSearch, FlatSchedulesArePickedWhereAPeakBindsAndTheBindingPeakIsNamed) {
  // 131,072 tokens per GPU under 30 GiB with skewed routing: PipelinedLLEP bounds the dispatch,
  // which leaves the mixing sublayers' activations the largest part at the GPU peak (a GDN
  // decoder's saved tensors for all 131,072 tokens, its core backward's workspace and what the
  // core's forward saved for it).
  const WorkloadContext ctx = workload("h100-sxm-node", 32, 16384, 30.0, {{"kind", "zipf"}, {"skew", 1.4}});
  const Calibration cal = load_calibration_for(ctx.hardware);
  PlanSearchOptions o;
  o.path = "ep";
  const PlanSearchResult r = search_plan(ctx, cal, o);
  EXPECT_EQ(r.chosen.plan.flat.expert_dispatch, ExpertDispatch::kPipelinedLlep);
  EXPECT_EQ(r.chosen.binding.peak, "activations");
  EXPECT_EQ(r.chosen.binding.bounded_by, "nothing: the mixing sublayers run unsplit");
  // The peak is in a GDN core's backward, after the MoE backward released its dispatch buffers.
  EXPECT_NE(r.chosen.peak.stage.find("gdn"), std::string::npos) << r.chosen.peak.stage;
  EXPECT_LT(r.chosen.peak.of(MemoryUse::kDispatch), r.chosen.binding.bytes);
  EXPECT_NE(r.chosen.plan.notes.find("FLAT: PipelinedLLEP"), std::string::npos);
  EXPECT_LE(r.chosen.gpu_peak_bytes, 30 * kGiB);
  EXPECT_EQ(plan_search_to_json(r)["binding_peak"]["peak"], "activations");
  // Without the schedules no EP plan is as fast within the budget.
  const PlanPricer plain(ctx, cal);
  Plan without = r.chosen.plan;
  without.flat = FlatSchedules{};
  const PricedPlan p = plain.price(without);
  EXPECT_TRUE(p.gpu_peak_max() > 30 * kGiB || p.step_s > r.chosen.predicted_step_s);
  // Refining never trades the budget for speed, and never returns a slower plan.
  const PricedPlan refined = refine_flat_schedules(plain, plain.price(without));
  EXPECT_LE(refined.step_s, p.step_s);
}

// A stand-in for a real executor that holds `factor` times what the memory model predicts for
// each short execution (the analytic engine's step and peaks, scaled).
class HeavierExecutor : public Executor {
 public:
  HeavierExecutor(double factor, const Calibration& calibration)
      : factor_(factor), inner_(StepEngines().make("analytic"), calibration) {}
  std::string name() const override { return "heavier"; }
  Measurement run(const Plan& plan, const WorkloadContext& ctx, const ExecutionUnits& units) override {
    Measurement m = inner_.run(plan, ctx, units);
    for (Bytes& b : m.gpu_peak_bytes) b = static_cast<Bytes>(factor_ * static_cast<double>(b));
    ++runs;
    return m;
  }
  int runs = 0;

 private:
  double factor_;
  GraphExecutor inner_;
};

// Measured peaks held to the budget: the chosen plan's measured peak (Eq. 2 around the short
// executions' peak plus the model's deeper decoders) is within the budget even where the model's
// own choice for that budget would measure over it, and the model budget it was configured under
// is tighter.
TEST(PlanSearch, HoldsMeasuredPeaksToTheGpuBudget) {
  const WorkloadContext ctx = workload("h100-sxm-node", 32, 4096, 40.0);
  const Calibration cal = load_calibration_for(ctx.hardware);
  PlanSearchOptions o;
  o.path = "ep";
  const PlanSearchResult model_only = search_plan(ctx, cal, o);
  EXPECT_LE(model_only.chosen.gpu_peak_bytes, ctx.gpu_budget_bytes());
  EXPECT_EQ(model_only.chosen.measured_gpu_peak_bytes, 0);
  EXPECT_EQ(model_only.measured_attempts, 0);

  HeavierExecutor heavier(1.3, cal);
  o.compare_executor = &heavier;
  o.hold_measured_gpu_peak = true;
  const PlanSearchResult held = search_plan(ctx, cal, o);
  EXPECT_GT(heavier.runs, 0);
  EXPECT_GT(held.chosen.measured_gpu_peak_bytes, 0);
  EXPECT_LE(held.chosen.measured_gpu_peak_bytes, ctx.gpu_budget_bytes());
  EXPECT_GE(held.measured_attempts, 2);  // the model's own choice measured over 40 GiB
  EXPECT_LT(held.model_gpu_budget_bytes, ctx.gpu_budget_bytes());
  EXPECT_LT(held.chosen.gpu_peak_bytes, model_only.chosen.gpu_peak_bytes);
  EXPECT_LT(held.chosen.plan.resident_layers.size(), model_only.chosen.plan.resident_layers.size());
  const nlohmann::json j = plan_search_to_json(held);
  EXPECT_TRUE(j.contains("measured_gpu_peak_gib"));
  EXPECT_EQ(j["measured_attempts"], held.measured_attempts);
  EXPECT_NE(plan_search_text(held).find("GPU peak measured by the short executions"), std::string::npos);

  // An executor far heavier than any plan the model fits: infeasible, saying what it measured.
  HeavierExecutor far(20.0, cal);
  o.compare_executor = &far;
  try {
    search_plan(ctx, cal, o);
    FAIL() << "expected InfeasibleWorkload";
  } catch (const InfeasibleWorkload& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.rfind("GPU budget 40.00 GiB: ", 0), 0u) << what;
    EXPECT_NE(what.find("on the heavier executor"), std::string::npos) << what;
  }
  // Without an executor that measures, holding measured peaks is refused.
  o.compare_executor = nullptr;
  EXPECT_THROW(search_plan(ctx, cal, o), InputError);
}

TEST(PlanSearch, RejectsAnUnknownPathOrEngine) {
  const WorkloadContext ctx = workload("h100-sxm-node", 32, 4096);
  PlanSearchOptions o;
  o.path = "pipeline";
  EXPECT_THROW(search_plan(ctx, load_calibration_for(ctx.hardware), o), InputError);
  o.path = "auto";
  o.compare_engine = "nope";
  EXPECT_THROW(search_plan(ctx, load_calibration_for(ctx.hardware), o), InputError);
}

}  // namespace
}  // namespace oom
