// experiments/study.h: study files, their expansion, the runner with a fake plan search, the
// table and the CSV.
#include "experiments/study.h"

#include <gtest/gtest.h>

#include <stdexcept>

#include "costmodel/input_error.h"

namespace oom {
namespace {

nlohmann::json small_study() {
  return nlohmann::json::parse(R"({
    "name": "small", "description": "tiny model, two GPUs",
    "baselines": ["fsdp2-offload", "megatrain"],
    "sweeps": [{"name": "batch", "models": ["tiny-moe"], "hardware": ["h100-sxm-node"], "gpus": [2],
                "global_batch": [2, 4], "seq_len": [256], "host_budget_gib": [null, 64]}]})");
}

// A plan search stand-in: a fixed plan whose throughput is 1000 tokens/s per sequence per GPU,
// infeasible beyond 1 sequence per GPU.
StudyPlan fake_search(const WorkloadContext& ctx) {
  if (ctx.workload.seqs_per_gpu() > 1) throw std::runtime_error("GPU budget 1.0 GiB < 2.0 GiB needed by decoder 0 backward");
  StudyPlan p;
  p.summary = plan_summary(p.plan);
  p.tokens_per_s = 1000.0 * static_cast<double>(ctx.workload.global_batch);
  p.step_s = static_cast<double>(ctx.workload.global_batch * ctx.workload.seq_len) / p.tokens_per_s;
  p.gpu_peak_bytes = kGiB;
  p.host_bytes_per_numa = {kGiB, kGiB};
  return p;
}

TEST(StudyFile, RoundTripsThroughJson) {
  const StudySpec s = study_from_json(small_study(), "small.json");
  const StudySpec t = study_from_json(study_to_json(s), "again.json");
  EXPECT_EQ(study_to_json(t), study_to_json(s));
  ASSERT_EQ(s.baselines.size(), 2u);
  EXPECT_EQ(s.baselines[1], BaselineSystem::kMegaTrain);
  ASSERT_EQ(s.sweeps[0].host_budget_gib.size(), 2u);
  EXPECT_FALSE(s.sweeps[0].host_budget_gib[0].has_value());
  EXPECT_EQ(*s.sweeps[0].host_budget_gib[1], 64.0);
}

TEST(StudyFile, BadFieldsAreInputErrorsNamingTheField) {
  auto message = [](nlohmann::json j) {
    try {
      study_from_json(j, "s.json");
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  nlohmann::json j = small_study();
  j["sweeps"][0]["seqs_per_gpu"] = {1};
  EXPECT_NE(message(j).find("global_batch and seqs_per_gpu"), std::string::npos) << message(j);
  j = small_study();
  j["baselines"] = {"fsdp2-offload", "deepspeed"};
  EXPECT_NE(message(j).find("baselines[1]"), std::string::npos) << message(j);
  j = small_study();
  j["sweeps"][0]["seq_len"] = nlohmann::json::array();
  EXPECT_NE(message(j).find("sweeps[0].seq_len"), std::string::npos) << message(j);
  j = small_study();
  j["sweeps"][0]["host_budget_gib"] = {-1};
  EXPECT_NE(message(j).find("host_budget_gib[0]"), std::string::npos) << message(j);
  j = small_study();
  j["sweep"] = j["sweeps"];
  EXPECT_NE(message(j).find("sweep"), std::string::npos) << message(j);
}

TEST(DefaultStudy, FourKBatchesAndLongContextsWithOneSequencePerGpu) {
  const std::vector<StudyCase> cases = expand_study(default_study());
  ASSERT_EQ(cases.size(), 10u);
  EXPECT_EQ(cases[0].sweep, "batch");
  EXPECT_EQ(cases[0].workload.global_batch, 16);
  EXPECT_EQ(cases[4].workload.global_batch, 256);
  for (int i = 5; i < 10; ++i) {
    EXPECT_EQ(cases[static_cast<std::size_t>(i)].sweep, "context");
    EXPECT_EQ(cases[static_cast<std::size_t>(i)].workload.seqs_per_gpu(), 1);
  }
  EXPECT_EQ(cases[9].workload.seq_len, 1048576);
  EXPECT_EQ(cases[9].workload.yarn_factor, 4.0) << "1M tokens need 4x YaRN over 256K positions";
  EXPECT_EQ(cases[5].workload.yarn_factor, 1.0);
  for (const auto& c : cases) EXPECT_NO_THROW(resolve_workload(c.workload, "default study"));
}

TEST(RunStudy, RowsCarryThePlanTheBaselinesAndTheSpeedupOverTheBestBaseline) {
  const StudySpec spec = study_from_json(small_study(), "small.json");
  std::vector<int> seen;
  const StudyResult r = run_study(spec, &fake_search, [&](int done, int total, const std::string&) {
    seen.push_back(done);
    EXPECT_EQ(total, 4);
  });
  EXPECT_EQ(seen, (std::vector<int>{1, 2, 3, 4}));
  ASSERT_EQ(r.rows.size(), 4u);
  const StudyRow& row = r.rows[0];
  ASSERT_TRUE(row.plan.has_value());
  ASSERT_EQ(row.baselines.size(), 2u);
  double best = 0;
  for (const auto& b : row.baselines) {
    if (b.fits()) best = std::max(best, b.tokens_per_s);
    EXPECT_TRUE(b.trace.stages.empty()) << "rows keep numbers, not traces";
  }
  ASSERT_GT(best, 0);
  ASSERT_TRUE(row.speedup.has_value());
  EXPECT_DOUBLE_EQ(*row.speedup, row.plan->tokens_per_s / best);
  // Batch 4 on 2 GPUs: the fake search finds nothing; the row says why and has no speedup.
  const StudyRow& infeasible = r.rows[2];
  EXPECT_FALSE(infeasible.plan.has_value());
  EXPECT_NE(infeasible.infeasible.find("GPU budget"), std::string::npos);
  EXPECT_FALSE(infeasible.speedup.has_value());
}

TEST(RunStudy, TableAndCsvHaveOneLinePerCaseAndEveryBaselineColumn) {
  const StudyResult r = run_study(study_from_json(small_study(), "small.json"), &fake_search);
  const std::string csv = study_csv(r);
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 5);
  EXPECT_TRUE(csv.starts_with("sweep,model,hardware,gpus,global_batch,seq_len,"));
  for (const char* col : {"fsdp2-offload_tokens_per_s", "megatrain_oom", "host_gib", "speedup"}) {
    EXPECT_NE(csv.find(col), std::string::npos) << col;
  }
  EXPECT_NE(csv.find("infeasible,\"GPU budget"), std::string::npos);
  const std::string table = study_table_text(r);
  EXPECT_NE(table.find("fsdp2-offload"), std::string::npos);
  EXPECT_NE(table.find("no plan fits: GPU budget"), std::string::npos);
  EXPECT_NE(table.find("4 cases"), std::string::npos);
  const nlohmann::json j = study_result_to_json(r);
  EXPECT_EQ(j["rows"].size(), 4u);
  EXPECT_TRUE(j["rows"][2]["plan"].is_null());
}

TEST(RunStudy, AWorkloadThatDoesNotResolveIsBadInput) {
  nlohmann::json j = small_study();
  j["sweeps"][0]["gpus"] = {64};
  j["sweeps"][0]["global_batch"] = {64};
  EXPECT_THROW(run_study(study_from_json(j, "s.json"), &fake_search), InputError);
}

TEST(PlanSummary, NamesPathResidencyAndPartitions) {
  Plan ep;
  ep.resident_layers = {0, 1, 3};
  ep.moe_retained_layers = {38, 39};
  EXPECT_EQ(plan_summary(ep), "ep R3/K2 c64K");
  Plan local;
  local.path = ExpertPath::kLocal;
  local.param_transfer = ParamTransfer::kShard;
  local.split.attention_head_group = 2;
  local.keep_attention_results = true;
  EXPECT_EQ(plan_summary(local), "local shard h2 O/LSE");
}

}  // namespace
}  // namespace oom
