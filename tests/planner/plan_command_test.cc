// End-to-end tests of `oom plan` (cli/cmd_plan.cc), run in-process through oom::cli::run():
// the JSON report, the plan file it writes, budget flags, exit code 3 with one line for an
// infeasible workload, exit code 2 for bad input.
#include <filesystem>
#include <fstream>
#include <sstream>

#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cli/cli.h"
#include "planner/plan/plan.h"
#include "tests/common/run_oom.h"

namespace oom::cli {
namespace {

const std::string kSource = OOM_SOURCE_DIR;
const std::string kWorkload = kSource + "/experiments/default/workload.json";

using Result = test_support::OomResult;
constexpr auto& oom = test_support::run_oom;

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("oom-plan-cmd-" + std::to_string(::getpid()) + "-" + name)).string();
}

TEST(PlanCommand, JsonReportAndPlanFile) {
  const std::string file = temp_path("plan.json");
  const Result r = oom({"plan", "--workload", kWorkload, "--json", "-o", file});
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  for (const char* key : {"path", "plan", "predicted_step_s", "gpu_peak_gib", "host_gib", "alternatives"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
  EXPECT_EQ(j["path"], "ep");
  ASSERT_EQ(j["alternatives"].size(), 1u);
  EXPECT_EQ(j["alternatives"][0]["path"], "local");
  EXPECT_GT(j["predicted_step_s"].get<double>(), 1.0);
  EXPECT_LE(j["gpu_peak_gib"].get<double>(), 80.0);
  // The written file is the chosen plan and `oom simulate` accepts it.
  EXPECT_EQ(load_plan(file), plan_from_json(j["plan"], "test"));
  const Result sim = oom({"simulate", "--workload", kWorkload, "--plan", file, "--json"});
  ASSERT_EQ(sim.code, 0) << sim.err;
  EXPECT_NEAR(nlohmann::json::parse(sim.out)["step_s"].get<double>(), j["predicted_step_s"].get<double>(), 1e-6);
  std::filesystem::remove(file);
}

TEST(PlanCommand, TextReportNamesBothPaths) {
  const Result r = oom({"plan", "--workload", kWorkload, "--path", "auto"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("chosen:"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("best of the other path:"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("tokens/s"), std::string::npos);
}

TEST(PlanCommand, LocalPlanWithoutPartitionsSaysNoOperatorSplits) {
  // Qwen3-30B-A3B at 4K (attention only, no GDN to chunk): the Local search splits no operator.
  // (Qwen3.6's search takes a 16K GDN chunk here, within the tie of the fastest at a lower peak.)
  const std::string file = temp_path("qwen3-workload.json");
  std::ofstream(file) << R"({"model": "qwen3-30b-a3b", "hardware": "h100-sxm-node", "gpus": 4, "global_batch": 32, "seq_len": 4096})";
  const Result r = oom({"plan", "--workload", file, "--path", "local", "--json"});
  std::filesystem::remove(file);
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(plan_from_json(j["plan"], "test").split, SplitSpec{}) << r.out;
  const std::string notes = j["plan"]["notes"].get<std::string>();
  EXPECT_NE(notes.find("no operator splits"), std::string::npos) << notes;
  EXPECT_EQ(notes.find("head group 0"), std::string::npos) << notes;
}

TEST(PlanCommand, PresetBasePricesBothBasePlansAsTheyAre) {
  const Result r = oom({"plan", "--workload", kWorkload, "--preset", "base", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["preset"], "base");
  ASSERT_EQ(j["alternatives"].size(), 1u);
  const Plan chosen = plan_from_json(j["plan"], "test");
  const Plan other = plan_from_json(j["alternatives"][0]["plan"], "test");
  const Plan& ep = chosen.path == ExpertPath::kEp ? chosen : other;
  const Plan& local = chosen.path == ExpertPath::kEp ? other : chosen;
  EXPECT_TRUE(ep.resident_layers.empty() && ep.moe_retained_layers.empty()) << "Base EP: R0/K0";
  EXPECT_EQ(ep.routing_chunk_tokens, 65536);
  EXPECT_EQ(local.path, ExpertPath::kLocal);
  EXPECT_EQ(local.split, SplitSpec{}) << "Base Local: no operator splits";
  EXPECT_FALSE(local.keep_attention_results);
  EXPECT_TRUE(local.boundaries.host_kept_all);
  EXPECT_LE(j["predicted_step_s"].get<double>(), j["alternatives"][0]["predicted_step_s"].get<double>()) << "the faster is chosen";
  // The search does better than Base at batch 32 (residency).
  const Result searched = oom({"plan", "--workload", kWorkload, "--json"});
  ASSERT_EQ(searched.code, 0) << searched.err;
  EXPECT_LT(nlohmann::json::parse(searched.out)["predicted_step_s"].get<double>(), j["predicted_step_s"].get<double>());
}

TEST(PlanCommand, PresetBaseOverItsBudgetExits3NamingBothPaths) {
  const Result r = oom({"plan", "--workload", kWorkload, "--preset", "base", "--gpu-budget-gib", "5"});
  EXPECT_EQ(r.code, kExitInfeasible);
  EXPECT_NE(r.err.find("base ep: GPU budget 5.0 GiB"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("base local: GPU budget 5.0 GiB"), std::string::npos) << r.err;
}

TEST(PlanCommand, ComparesWithTheSimGridEngineWhenBuiltWithIt) {
  const Result r = oom({"plan", "--workload", kWorkload, "--compare-engine", "simgrid", "--json"});
  if (r.code == kExitBadInput && r.err.find("--compare-engine") != std::string::npos) {
    GTEST_SKIP() << "the oom command was built without the SimGrid engine";
  }
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["compare_engine"], "simgrid");
  EXPECT_GT(j["compared_step_s"].get<double>(), 1.0);
  EXPECT_GT(j["alternatives"][0]["compared_step_s"].get<double>(), j["compared_step_s"].get<double>());
}

TEST(PlanCommand, InfeasibleWorkloadExitsThreeWithOneLine) {
  const std::string file = temp_path("never.json");
  const Result r = oom({"plan", "--workload", kWorkload, "--gpu-budget-gib", "4", "-o", file});
  EXPECT_EQ(r.code, kExitInfeasible);
  EXPECT_EQ(r.err.rfind("infeasible: GPU budget 4.0 GiB < ", 0), 0u) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_FALSE(std::filesystem::exists(file));
}

TEST(PlanCommand, BadInputExitsTwo) {
  EXPECT_EQ(oom({"plan", "--workload", kWorkload, "--path", "pipeline"}).code, kExitBadInput);
  EXPECT_EQ(oom({"plan", "--workload", kWorkload, "--gpu-budget-gib", "-1"}).code, kExitBadInput);
  EXPECT_EQ(oom({"plan", "--workload", kWorkload, "--compare-engine", "nope"}).code, kExitBadInput);
  EXPECT_EQ(oom({"plan", "--workload", kSource + "/no/such/workload.json"}).code, kExitBadInput);
  // Measured peaks need an executor that measures.
  const Result m = oom({"plan", "--workload", kWorkload, "--compare-engine", "analytic", "--measure-memory"});
  EXPECT_EQ(m.code, kExitBadInput);
  EXPECT_NE(m.err.find("--measure-memory"), std::string::npos) << m.err;
  EXPECT_EQ(std::count(m.err.begin(), m.err.end(), '\n'), 1) << m.err;
}

}  // namespace
}  // namespace oom::cli
