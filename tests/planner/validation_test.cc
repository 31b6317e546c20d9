// Tests of planner/calibration/validation.h with the analytic engine and the project's H100 calibration:
// the published qualitative facts hold (reference §3, §4, §10), the fidelity target on the
// published records is met, the breakdown accounts for the whole step, and records that cannot
// run are reported rather than thrown.
#include "planner/calibration/validation.h"

#include <atomic>
#include <cmath>
#include <filesystem>
#include <vector>

#include <gtest/gtest.h>

#include "tests/common/published_facts.h"

#include "costmodel/input_error.h"
#include "planner/engine/analytic_evaluator.h"
#include "planner/engine/cost_report.h"

namespace oom {
namespace {

double step_s(const Plan& plan, const Workload& w) {
  const WorkloadContext ctx = resolve_workload(w, "test");
  return simulate_plan(plan, ctx, StepEngines(), "analytic", load_calibration_for(ctx.hardware)).trace.step_s;
}

TEST(PublishedFacts, ResidentLayersShortenTheBatch32Step) {
  published_facts::expect_resident_layers_shorten_the_batch32_step(step_s);
}

TEST(PublishedFacts, InterleavedResidentSetBeatsContiguousOfTheSameSize) {
  published_facts::expect_interleaved_resident_set_beats_contiguous(step_s);
}

TEST(PublishedFacts, KeepingAttentionResultsHelpsAt512KAndNotAt32K) {
  published_facts::expect_keeping_attention_results_helps_at_512k_not_32k(step_s);
}

TEST(StepBreakdown, AccountsForEveryInstantOfTheStep) {
  const WorkloadContext ctx = resolve_workload(default_workload(), "test");
  const SimulationResult r = simulate_plan(default_plan(), ctx, StepEngines(), "analytic", load_calibration_for(ctx.hardware));
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
  EXPECT_THROW(simulate_plan(default_plan(), ctx, StepEngines(), "warp-drive", load_calibration_for(ctx.hardware)), InputError);
}

TEST(ValidateRecords, PublishedRecordsMeetTheFidelityTarget) {
  const RecordSet records = load_records(std::string(OOM_SOURCE_DIR) + "/traces/paper/paper-calibration.jsonl");
  const ValidationReport r = validate_records(records, StepEngines(), "analytic");
  EXPECT_GE(r.count, 15);
  // In sample (the calibration was fitted on these records and the FSDP2 ones): the constants are
  // held to physical ranges (planner/calibration/calibrate.cc), so they do not absorb what the model lacks;
  // since host sharing is settled (socket cores, DRAM, PCIe switch uplinks) one CPU AdamW rate
  // serves the plan and baseline records, at the price of the plan records' in-sample median
  // (7.4% when this bound was set; 3.1% with the constants refitted on 2026-12-06). The Gemma 4 EP record (−20%; also −20% while its tied embedding table was priced as a second
  // parameter with its own D2H and update) and the RTX 4090 record on uncalibrated estimates are
  // the largest errors (the 4090 +16%, then +27% once GDN's chunked kernels paid their HBM traffic
  // at the 4090's 1 TB/s: its GEMMs at the estimated efficiencies are what runs slow there).
  // Out-of-sample figures: traces/paper/README.md.
  EXPECT_LE(r.median_abs_rel_error, 0.075);
  EXPECT_LE(r.max_abs_rel_error, 0.30);
  EXPECT_LE(r.baseline_median_abs_rel_error, 0.05);  // measured 4.1% (max 5.3%)
  int baselines = 0, gpu_peaks = 0;
  for (const auto& p : r.records) {
    baselines += !p.system.empty() && p.status == "ok" ? 1 : 0;
    if (p.gpu_peak_rel_error) {
      ++gpu_peaks;
      EXPECT_LE(std::abs(*p.gpu_peak_rel_error), 0.10) << p.id;
    }
    if (p.host_rel_error) {
      EXPECT_LE(std::abs(*p.host_rel_error), 0.02) << p.id;
    }
  }
  EXPECT_EQ(baselines, 3);  // the FSDP2 baselines are predicted (planner/lowering/baselines.h)
  EXPECT_EQ(r.baseline_count, 3);
  EXPECT_GE(gpu_peaks, 6);
  const nlohmann::json j = validation_to_json(r);
  for (const char* key : {"count", "median_abs_rel_error", "max_abs_rel_error", "records"}) EXPECT_TRUE(j.contains(key)) << key;
  EXPECT_TRUE(j["records"][0].contains("predicted_gpu_peak_gib"));
}

// Every record file the project ships under traces/paper loads and every step record in it is
// predicted (none fails to run): the files oom calibrate and the class cross-validation read.
TEST(ValidateRecords, EveryShippedRecordFileIsPredicted) {
  int files = 0, predicted = 0;
  for (const auto& e : std::filesystem::directory_iterator(std::string(OOM_SOURCE_DIR) + "/traces/paper")) {
    if (e.path().extension() != ".jsonl") continue;
    ++files;
    const ValidationReport r = validate_records(load_records(e.path().string()), StepEngines(), "analytic");
    EXPECT_EQ(r.failures, 0) << e.path();
    for (const auto& p : r.records) {
      EXPECT_EQ(p.status == "failed", false) << e.path() << ": " << p.id << ": " << p.reason;
      predicted += p.predicted_step_s ? 1 : 0;
    }
  }
  EXPECT_GE(files, 3);  // paper-calibration, paper-records-2, published-baselines
  EXPECT_GE(predicted, 20 + 31 + 2);
}

// The records are predicted on parallel threads (run_jobs); the report keeps the file's order,
// and every prediction is the one a record gets alone.
TEST(ValidateRecords, ParallelPredictionsKeepTheFileOrderAndTheirValues) {
  const RecordSet records = load_records(std::string(OOM_SOURCE_DIR) + "/traces/paper/paper-calibration.jsonl");
  const ValidationReport all = validate_records(records, StepEngines(), "analytic");
  ASSERT_EQ(all.records.size(), records.steps.size());
  for (std::size_t i = 0; i < records.steps.size(); ++i) {
    EXPECT_EQ(all.records[i].id, records.steps[i].id) << i;
    if (i % 5 != 0) continue;  // a sample of records, each predicted by itself
    RecordSet one;
    one.steps.push_back(records.steps[i]);
    const ValidationReport alone = validate_records(one, StepEngines(), "analytic");
    ASSERT_EQ(alone.records.size(), 1u);
    EXPECT_EQ(alone.records[0].status, all.records[i].status) << records.steps[i].id;
    EXPECT_EQ(alone.records[0].predicted_step_s, all.records[i].predicted_step_s) << records.steps[i].id;
  }
}

TEST(RunJobs, CallsEveryJobExactlyOnceOnAnyNumberOfThreads) {
  for (const int threads : {1, 2, 3, 4, 8}) {
    for (const std::size_t jobs : {std::size_t{0}, std::size_t{1}, std::size_t{3}, std::size_t{37}}) {
      std::vector<std::atomic<int>> calls(jobs);
      run_jobs(jobs, threads, [&](std::size_t i) { ++calls[i]; });
      for (std::size_t i = 0; i < jobs; ++i) EXPECT_EQ(calls[i].load(), 1) << threads << " threads, job " << i;
    }
  }
}

TEST(WorkerThreads, AtLeastOneAtMostFourAndNoMoreThanTheJobs) {
  for (const bool waits : {false, true}) {
    EXPECT_EQ(worker_threads(0, waits), 1);
    EXPECT_EQ(worker_threads(1, waits), 1);
    for (const std::size_t jobs : {std::size_t{2}, std::size_t{3}, std::size_t{100}}) {
      const int t = worker_threads(jobs, waits);
      EXPECT_GE(t, 1);
      EXPECT_LE(t, 4);
      EXPECT_LE(static_cast<std::size_t>(t), jobs);
    }
  }
  // Waiting on processes adds a thread, up to the cap.
  EXPECT_GE(worker_threads(100, true), worker_threads(100, false));
}

// An engine that says nothing of its runs (StepEngine's default): one at a time.
class SilentEngine : public StepEngine {
 public:
  std::string name() const override { return "silent"; }
  Trace execute(const StepGraph& g, const DurationModel& durations) const override { return AnalyticEngine().execute(g, durations); }
};

// A process-per-run engine (as the SimGrid one is).
class ForkingEngine : public SilentEngine {
 public:
  EngineConcurrency concurrency() const override { return EngineConcurrency::kInProcess; }
};

TEST(EngineWorkers, AsManyRunsAtOnceAsTheEngineAllows) {
  const StepEngines engines = StepEngines()
                                  .add("silent", [] { return std::make_unique<SilentEngine>(); })
                                  .add("forking", [] { return std::make_unique<ForkingEngine>(); });
  EXPECT_EQ(engine_workers(engines, "analytic", 100), worker_threads(100, false));
  EXPECT_EQ(engine_workers(engines, "forking", 100), worker_threads(100, true));
  EXPECT_EQ(engine_workers(engines, "silent", 100), 1);
  EXPECT_EQ(engine_workers(engines, "abacus", 100), 1);  // not offered: predicting reports it, one at a time
}

// A record's GPU peak is the largest allocated peak (reference §8); the prediction it is compared
// with holds no fragmentation headroom ε, which the simulated (reserved) peak adds.
TEST(ValidateRecords, TheComparedGpuPeakIsTheAllocatedOne) {
  StepRecord rec;
  rec.id = "t4-b32-like";
  rec.origin = "test:1";
  rec.workload = default_workload();
  rec.plan = plan_to_json(default_plan());
  rec.measured.step_s = 5.0;
  rec.measured.gpu_peak_gib = 60.0;
  RecordSet set;
  set.steps.push_back(rec);
  const ValidationReport r = validate_records(set, StepEngines(), "analytic");
  ASSERT_EQ(r.records.size(), 1u);
  ASSERT_TRUE(r.records[0].predicted_gpu_peak_gib.has_value());
  const WorkloadContext ctx = resolve_workload(rec.workload, "test");
  const SimulationResult sim = simulate_plan(default_plan(), ctx, StepEngines(), "analytic", load_calibration_for(ctx.hardware));
  Bytes reserved = 0;
  for (const Bytes b : sim.trace.gpu_peak_bytes) reserved = std::max(reserved, b);
  const MemoryConstants k;
  ASSERT_GT(k.gpu_headroom_fraction, 0);
  EXPECT_NEAR(*r.records[0].predicted_gpu_peak_gib * (1 + k.gpu_headroom_fraction), to_gib(reserved), 1e-6);
  EXPECT_LT(*r.records[0].predicted_gpu_peak_gib, to_gib(reserved));
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
  const ValidationReport r = validate_records(set, StepEngines(), "analytic");
  ASSERT_EQ(r.records.size(), 1u);
  EXPECT_EQ(r.records[0].status, "failed");
  EXPECT_NE(r.records[0].reason.find("gpus"), std::string::npos);
  EXPECT_EQ(r.failures, 1);
  EXPECT_EQ(r.count, 0);
}

}  // namespace
}  // namespace oom
