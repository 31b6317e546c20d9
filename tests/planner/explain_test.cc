// Tests of planner/calibration/explain.h: each instant of rank 0's step is charged to one mechanism in the
// stated order (so the exposed times add up to the step), busy times are per resource, and the
// published breakdowns ship as data that loads and meets the record it explains.
#include "planner/calibration/explain.h"

#include <cmath>

#include <gtest/gtest.h>

#include "costmodel/input_error.h"

namespace oom {
namespace {

const std::string kSrc = OOM_SOURCE_DIR;

TraceStage stage(const std::string& name, const std::string& kind, const std::string& resource, Seconds start, Seconds end) {
  TraceStage s;
  s.name = name;
  s.key = *parse_stage_key(name);
  s.kind = kind;
  s.resource = resource;
  s.start_s = start;
  s.end_s = end;
  return s;
}

Seconds exposed(const StepExplanation& e, const std::string& mechanism) {
  for (const auto& [m, s] : e.exposed_s) {
    if (m == mechanism) return s;
  }
  return -1;
}

TEST(ExplainTrace, ChargesEachInstantOnceComputeFirstThenCopiesThenCpuThenWait) {
  Trace t;
  t.engine = "analytic";
  t.stages = {stage("g0.fwd.L0.attn.proj", "gemm", "gpu0.compute", 0, 1),
              stage("g0.fwd.L1.weights.h2d", "h2d", "gpu0.h2d", 0.5, 2),           // 1 s exposed after compute ends
              stage("g0.opt.L0.layer.cpu_adamw", "cpu_adamw", "numa0.cpu_update.r0", 1.5, 3),  // 1 s exposed after H2D
              stage("g1.fwd.L0.attn.proj", "gemm", "gpu1.compute", 0, 4),  // another rank: not counted
              stage("g0.fwd.L2.moe.experts", "expert_gemm", "gpu0.compute", 3.5, 4)};
  t.step_s = 4;
  const StepExplanation e = explain_trace(t, 0);
  EXPECT_DOUBLE_EQ(exposed(e, "compute.gemm"), 1.0);
  EXPECT_DOUBLE_EQ(exposed(e, "compute.expert_gemm"), 0.5);
  EXPECT_DOUBLE_EQ(exposed(e, "h2d"), 1.0);
  EXPECT_DOUBLE_EQ(exposed(e, "cpu_adamw"), 1.0);
  EXPECT_DOUBLE_EQ(exposed(e, "wait"), 0.5);  // 3.0–3.5: rank 0 runs nothing
  Seconds total = 0;
  for (const auto& [m, s] : e.exposed_s) total += s;
  EXPECT_DOUBLE_EQ(total, t.step_s);
  ASSERT_EQ(e.resources.size(), 3u);  // gpu0.compute, gpu0.h2d, numa0.cpu_update.r0
  EXPECT_EQ(e.resources[0].resource, "gpu0.compute");
  EXPECT_DOUBLE_EQ(e.resources[0].busy_s, 1.5);
  EXPECT_EQ(e.resources[0].stages, 2);
  EXPECT_DOUBLE_EQ(e.compute_by_kind_s.at("gemm"), 1.0);
}

TEST(PublishedBreakdowns, ShipAsDataWithTheirSources) {
  const auto b = load_published_breakdowns(kSrc + "/traces/paper/published-breakdowns.json");
  ASSERT_GE(b.size(), 2u);
  for (const auto& x : b) EXPECT_FALSE(x.source.empty()) << x.record;
  EXPECT_EQ(b[1].record, "t4-b32");
  EXPECT_DOUBLE_EQ(b[1].mechanisms_s.at("compute_with_replay_s"), 3.93);
  EXPECT_THROW(load_published_breakdowns(kSrc + "/traces/paper/no-such-file.json"), InputError);
}

TEST(ExplainRecord, PredictsTheRecordAndMeetsItsPublishedBreakdown) {
  const std::string file = kSrc + "/traces/paper/paper-calibration.jsonl";
  const RecordSet records = load_records(file);
  const auto published = load_published_breakdowns(kSrc + "/traces/paper/published-breakdowns.json");
  const StepExplanation e = explain_record(records, file, "t4-b32", StepEngines(), "analytic", published);
  ASSERT_TRUE(e.published.has_value());
  EXPECT_EQ(e.published->record, "t4-b32");
  ASSERT_TRUE(e.measured_step_s.has_value());
  EXPECT_DOUBLE_EQ(*e.measured_step_s, 5.02);
  Seconds total = 0;
  for (const auto& [m, s] : e.exposed_s) total += s;
  EXPECT_NEAR(total, e.step_s, 1e-9 * e.step_s);
  EXPECT_GT(e.compute_by_kind_s.at("expert_gemm"), 0.0);
  EXPECT_TRUE(e.layer_forward_s.count("linear_attention"));
  EXPECT_TRUE(e.layer_forward_s.count("moe"));
  // The GPU peak by memory use, with the stage that reached it: t4-b32 holds 23 decoders' resident
  // expert state, so the optimizer's part is the largest; the parts and the base add up to the peak.
  ASSERT_TRUE(e.peak.has_value());
  EXPECT_GT(e.peak->of(MemoryUse::kOptimizer), e.peak->of(MemoryUse::kDispatch));
  Bytes parts = e.peak->base;
  for (const Bytes b : e.peak->by_use) parts += b;
  EXPECT_EQ(parts, e.peak->total);
  EXPECT_NEAR(static_cast<double>(e.peak->total) / static_cast<double>(kGiB), e.gpu_allocated_gib, 1e-9);
  const std::string text = explanation_text(e);
  EXPECT_NE(text.find("  GPU 0 at " + e.peak->stage + ": base"), std::string::npos) << text;
  EXPECT_TRUE(explanation_to_json(e)["gpu_peak_composition"].is_object());
  EXPECT_NE(text.find("compute_with_replay_s"), std::string::npos);
  EXPECT_NE(text.find("Fig. 1b"), std::string::npos);
  EXPECT_THROW(explain_record(records, file, "t4-b999", StepEngines(), "analytic", published), InputError);
}

// A recorded local run carries its measured compute breakdown; the explanation sets the
// prediction's in the same form beside it (paper records have none).
TEST(ExplainRecord, ShowsTheMeasuredComputeBreakdownBesideThePredictedOne) {
  const std::string file = kSrc + "/traces/recorded/local-cpu.jsonl";
  const RecordSet records = load_records(file);
  const StepExplanation e = explain_record(records, file, "tiny-moe-mixtral-b4s64-plain", StepEngines(), "analytic", {});
  ASSERT_FALSE(e.measured_compute_s.empty());
  EXPECT_GT(e.measured_compute_s.at("backward.attention"), 0.0);
  EXPECT_GT(e.predicted_compute_s.at("backward.attention"), 0.0);
  EXPECT_GT(e.predicted_compute_s.at("forward.expert_gemm"), 0.0);
  Seconds predicted = 0, busy = 0;
  for (const auto& [k, s] : e.predicted_compute_s) predicted += s;
  for (const auto& [k, s] : e.compute_by_kind_s) busy += s;
  EXPECT_LE(predicted, busy * (1 + 1e-9));  // the optimizer's compute stages are left out
  EXPECT_NE(explanation_text(e).find("beside the measured breakdown"), std::string::npos);
  EXPECT_TRUE(explanation_to_json(e).contains("measured_compute_s"));
  const StepExplanation paper =
      explain_record(load_records(kSrc + "/traces/paper/paper-calibration.jsonl"), "paper", "t4-b32", StepEngines(), "analytic", {});
  EXPECT_TRUE(paper.measured_compute_s.empty());
  EXPECT_FALSE(explanation_to_json(paper).contains("measured_compute_s"));
}

}  // namespace
}  // namespace oom
