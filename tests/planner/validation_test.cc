// Tests of planner/validation.h with the analytic engine and the project's H100 calibration:
// the published qualitative facts hold (reference §3, §4, §10), the fidelity target on the
// published records is met, the breakdown accounts for the whole step, and records that cannot
// run are reported rather than thrown.
#include "planner/validation.h"

#include <cmath>

#include <gtest/gtest.h>

#include "costmodel/input_error.h"
#include "planner/cost_report.h"

namespace oom {
namespace {

double step_s(const Plan& plan, const Workload& w) {
  const WorkloadContext ctx = resolve_workload(w, "test");
  return simulate_plan(plan, ctx, "analytic", load_calibration_for(ctx.hardware)).trace.step_s;
}

TEST(PublishedFacts, ResidentLayersShortenTheBatch32Step) {
  Plan r0 = default_plan();
  r0.resident_layers.clear();
  const double ratio = step_s(r0, default_workload()) / step_s(default_plan(), default_workload());
  EXPECT_GE(ratio, 1.4);  // published: 8.48 s vs 5.02 s
}

TEST(PublishedFacts, InterleavedResidentSetBeatsContiguousOfTheSameSize) {
  Plan interleaved = default_plan();
  interleaved.resident_layers = {0, 1, 3, 7, 11, 15, 19, 22, 26, 30, 34, 38};
  Plan contiguous = default_plan();
  contiguous.resident_layers = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
  EXPECT_LT(step_s(interleaved, default_workload()), step_s(contiguous, default_workload()));
}

TEST(PublishedFacts, KeepingAttentionResultsHelpsAt512KAndNotAt32K) {
  Plan keep;
  keep.path = ExpertPath::kLocal;
  keep.param_transfer = ParamTransfer::kShard;
  keep.transfer_chunk_mib = 256;
  keep.cpu_grad_slots = 1;
  keep.split = {8, 131072, 262144, 0};
  keep.keep_attention_results = true;
  Plan no_keep = keep;
  no_keep.keep_attention_results = false;
  Workload w = default_workload();
  w.global_batch = 4;
  w.seq_len = 524288;
  w.yarn_factor = 2;
  const double gain_512k = step_s(no_keep, w) / step_s(keep, w) - 1;
  w.seq_len = 32768;
  keep.split = {8, 16384, 32768, 0};
  no_keep.split = keep.split;
  const double gain_32k = step_s(no_keep, w) / step_s(keep, w) - 1;
  EXPECT_GT(gain_512k, 0.10);  // published: 260 s → 200 s
  EXPECT_LT(gain_32k, 0.02);
}

TEST(StepBreakdown, AccountsForEveryInstantOfTheStep) {
  const WorkloadContext ctx = resolve_workload(default_workload(), "test");
  const SimulationResult r = simulate_plan(default_plan(), ctx, "analytic", load_calibration_for(ctx.hardware));
  const StepBreakdown& b = r.breakdown;
  EXPECT_NEAR(b.compute_s + b.exposed_collective_s + b.exposed_transfer_s + b.exposed_cpu_update_s + b.idle_s,
              r.trace.step_s, 1e-9);
  EXPECT_GT(b.compute_s, 0.5 * r.trace.step_s);
  const nlohmann::json j = simulation_to_json(r);
  EXPECT_EQ(j["gpu_peak_gib"].size(), 4u);
  EXPECT_EQ(j["numa_host_gib"].size(), 2u);
  EXPECT_TRUE(j["breakdown"].contains("exposed_cpu_update_s"));
}

TEST(SimulatePlan, UnknownEngineIsBadInput) {
  const WorkloadContext ctx = resolve_workload(default_workload(), "test");
  EXPECT_THROW(simulate_plan(default_plan(), ctx, "warp-drive", load_calibration_for(ctx.hardware)), InputError);
}

TEST(ValidateRecords, PublishedRecordsMeetTheFidelityTarget) {
  const RecordSet records = load_records(std::string(OOM_SOURCE_DIR) + "/traces/paper/paper-calibration.jsonl");
  const ValidationReport r = validate_records(records, "analytic");
  EXPECT_GE(r.count, 15);
  EXPECT_LE(r.median_abs_rel_error, 0.05);
  EXPECT_LE(r.max_abs_rel_error, 0.15);
  int baselines = 0, gpu_peaks = 0;
  for (const auto& p : r.records) {
    baselines += !p.system.empty() && p.status == "ok" ? 1 : 0;
    if (p.gpu_peak_rel_error) {
      ++gpu_peaks;
      EXPECT_LE(std::abs(*p.gpu_peak_rel_error), 0.10) << p.id;
    }
    if (p.host_rel_error) EXPECT_LE(std::abs(*p.host_rel_error), 0.02) << p.id;
  }
  EXPECT_EQ(baselines, 3);  // the FSDP2 baselines are predicted (planner/baselines.h)
  EXPECT_EQ(r.baseline_count, 3);
  EXPECT_GE(gpu_peaks, 6);
  const nlohmann::json j = validation_to_json(r);
  for (const char* key : {"count", "median_abs_rel_error", "max_abs_rel_error", "records"}) EXPECT_TRUE(j.contains(key)) << key;
  EXPECT_TRUE(j["records"][0].contains("predicted_gpu_peak_gib"));
}

TEST(ValidateRecords, ARecordThatCannotRunIsAFailureWithItsReason) {
  RecordSet set;
  StepRecord rec;
  rec.id = "too-many-gpus";
  rec.origin = "test:1";
  rec.workload = default_workload();
  rec.workload.gpus = 16;
  rec.workload.global_batch = 32;
  rec.plan = plan_to_json(default_plan());
  rec.measured.step_s = 1.0;
  set.steps.push_back(rec);
  const ValidationReport r = validate_records(set, "analytic");
  ASSERT_EQ(r.records.size(), 1u);
  EXPECT_EQ(r.records[0].status, "failed");
  EXPECT_NE(r.records[0].reason.find("gpus"), std::string::npos);
  EXPECT_EQ(r.failures, 1);
  EXPECT_EQ(r.count, 0);
}

}  // namespace
}  // namespace oom
