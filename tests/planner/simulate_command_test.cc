// End-to-end tests of `oom simulate`, `oom validate` and `oom calibrate` (cli/cmd_simulate.cc),
// run in-process through oom::cli::run().
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cli/cli.h"
#include "tests/common/run_oom.h"

namespace oom::cli {
namespace {

const std::string kSource = OOM_SOURCE_DIR;

using Result = test_support::OomResult;
constexpr auto& oom = test_support::run_oom;

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("oom-sim-cmd-" + std::to_string(::getpid()) + "-" + name)).string();
}

TEST(SimulateCommand, JsonReportAndPerfettoTrace) {
  const std::string trace = temp_path("trace.json");
  const Result r = oom({"simulate", "--workload", kSource + "/experiments/default/workload.json", "--plan",
                        kSource + "/experiments/default/plan-r23.json", "--trace", trace, "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["engine"], "analytic");
  EXPECT_GT(j["step_s"].get<double>(), 1.0);
  EXPECT_EQ(j["gpu_peak_gib"].size(), 4u);
  EXPECT_TRUE(j["breakdown"].contains("exposed_a2a_s"));
  EXPECT_NE(j["calibration"].get<std::string>().find("configs/calibration/h100-sxm-node.json"), std::string::npos) << j["calibration"];
  std::ifstream in(trace);
  const auto chrome = nlohmann::json::parse(in);
  ASSERT_TRUE(chrome.contains("traceEvents"));
  int complete = 0;
  for (const auto& e : chrome["traceEvents"]) complete += e["ph"] == "X" ? 1 : 0;
  EXPECT_GT(complete, 1000);
  std::filesystem::remove(trace);
}

TEST(SimulateCommand, OneNodesStagesStandForEveryNodesUnlessEveryRankIsAsked) {
  // The default plan on two DGX H200 nodes: by default one node's stages (8 ranks) stand for the
  // 16; --every-rank lowers all of them. Same step time and the same 16 GPU peaks, both engines.
  const std::string workload = temp_path("two-nodes.json");
  {
    std::ofstream out(workload);
    out << R"({"model": "qwen3.6-35b-a3b", "hardware": "h200-sxm-node", "nodes": 2, "gpus": 16, "global_batch": 32, "seq_len": 4096})";
  }
  for (const std::string engine : {"analytic", "simgrid"}) {
    std::vector<std::string> args{"simulate", "--workload", workload, "--plan", kSource + "/experiments/default/plan-r23.json",
                                  "--engine", engine, "--json"};
    const Result one = oom(args);
    args.push_back("--every-rank");
    const Result every = oom(args);
    ASSERT_EQ(one.code, 0) << one.err;
    ASSERT_EQ(every.code, 0) << every.err;
    const auto a = nlohmann::json::parse(one.out), b = nlohmann::json::parse(every.out);
    EXPECT_EQ(a["ranks_emitted"], 8) << engine;
    EXPECT_EQ(b["ranks_emitted"], 0) << engine;
    EXPECT_GT(b["stages"].get<int>(), a["stages"].get<int>() * 3 / 2) << engine;
    EXPECT_NEAR(a["step_s"].get<double>(), b["step_s"].get<double>(), 1e-9 * b["step_s"].get<double>()) << engine;
    EXPECT_EQ(a["gpu_peak_gib"], b["gpu_peak_gib"]) << engine;
    EXPECT_EQ(a["gpu_peak_gib"].size(), 16u) << engine;
    EXPECT_EQ(a["numa_host_gib"], b["numa_host_gib"]) << engine;
    // No calibration of the H200 node: the H100 node's, transferred (the engine's own fit).
    const std::string source = a["calibration"];
    EXPECT_NE(source.find("h100-sxm-node" + std::string(engine == "simgrid" ? ".simgrid" : "") + ".json transferred"), std::string::npos) << source;
  }
  std::filesystem::remove(workload);
}

TEST(SimulateCommand, UnknownEngineIsBadInputNamingTheOption) {
  const Result r = oom({"simulate", "--workload", kSource + "/experiments/default/workload.json", "--plan",
                        kSource + "/experiments/default/plan-r23.json", "--engine", "abacus"});
  EXPECT_EQ(r.code, kExitBadInput);
  EXPECT_NE(r.err.find("--engine"), std::string::npos);
  EXPECT_NE(r.err.find("abacus"), std::string::npos);
}

TEST(ValidateCommand, JsonSummaryOfThePublishedRecords) {
  const Result r = oom({"validate", kSource + "/traces/paper/paper-calibration.jsonl", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_GE(j["count"].get<int>(), 15);
  EXPECT_LE(j["median_abs_rel_error"].get<double>(), 0.075);  // see ValidateRecords in validation_test.cc
  for (const auto& rec : j["records"]) {
    EXPECT_TRUE(rec.contains("id"));
    EXPECT_TRUE(rec.contains("predicted_step_s"));
    EXPECT_TRUE(rec.contains("measured_step_s"));
    EXPECT_TRUE(rec.contains("rel_error"));
  }
}

TEST(ValidateCommand, TextTablePredictsBaselineSystems) {
  const Result r = oom({"validate", kSource + "/traces/paper/paper-calibration.jsonl"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("t4-b32 "), std::string::npos);
  EXPECT_EQ(r.out.find("skipped"), std::string::npos);
  EXPECT_NE(r.out.find("3 baseline-system records"), std::string::npos);
  EXPECT_NE(r.out.find("median |error|"), std::string::npos);
}

// One operator record (a GDN forward at 64K on the H100): a fit of it is quick.
void write_one_operator_record(const std::string& path) {
  std::ofstream(path) << R"({"id": "op", "kind": "operator", "model": "qwen3.6-35b-a3b", "hardware": "h100-sxm-node", )"
                      << R"("layer_type": "linear_attention", "op": "gdn_mixing_forward", "batch": 1, "seq_len": 65536, )"
                      << R"("measured": {"time_s": 0.02}})" << "\n";
}

TEST(CalibrateCommand, MissingRecordsFileIsBadInputAndWritesNothing) {
  const std::string out = temp_path("cal.json");
  const Result r = oom({"calibrate", "--records", "/nonexistent/records.jsonl", "--hardware", "h100-sxm-node", "-o", out});
  EXPECT_EQ(r.code, kExitBadInput);
  EXPECT_FALSE(std::filesystem::exists(out));
}

TEST(CalibrateCommand, WritesACalibrationFileForTheHardware) {
  // One operator record: a quick fit whose output must load back.
  const std::string records = temp_path("records.jsonl");
  write_one_operator_record(records);
  const std::string out = temp_path("cal.json");
  const Result r = oom({"calibrate", "--records", records, "--hardware", "h100-sxm-node", "-o", out, "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  std::ifstream in(out);
  const auto cal = nlohmann::json::parse(in);
  EXPECT_EQ(cal["hardware"], "h100-sxm-node");
  const auto summary = nlohmann::json::parse(r.out);
  EXPECT_LT(std::abs(summary["records"][0]["rel_error"].get<double>()), 0.01);
  std::filesystem::remove(out);
  std::filesystem::remove(records);
}

TEST(CalibrateCommand, SearchOptionsReachTheFit) {
  // The one-operator fit of the test above from one start, then from four each run to convergence:
  // more starts, more iterations; the prior's weight moves the fitted constant.
  const std::string records = temp_path("records-search.jsonl");
  write_one_operator_record(records);
  const std::string out = temp_path("cal-search.json");
  auto fit = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = {"calibrate", "--records", records, "--hardware", "h100-sxm-node", "-o", out, "--json"};
    args.insert(args.end(), extra.begin(), extra.end());
    const Result r = oom(args);
    EXPECT_EQ(r.code, 0) << r.err;
    return r.code == 0 ? nlohmann::json::parse(r.out) : nlohmann::json::object();
  };
  const auto one = fit({"--starts", "1"});
  const auto four = fit({"--starts", "4", "--screen-iterations", "0", "--finalists", "4"});
  const auto pulled = fit({"--starts", "1", "--prior-weight", "5"});
  std::filesystem::remove(out);
  std::filesystem::remove(records);
  ASSERT_TRUE(one.contains("iterations") && four.contains("iterations") && pulled.contains("calibration"));
  EXPECT_GT(four["iterations"].get<int>(), one["iterations"].get<int>());
  // A strong pull to the estimate leaves the record's error larger than a weak one.
  EXPECT_GT(std::abs(pulled["records"][0]["rel_error"].get<double>()), std::abs(one["records"][0]["rel_error"].get<double>()));
}

TEST(CalibrateCommand, HoldOutChoosesTheRecordsTheFitOnlyPredicts) {
  // Two operator records: `--hold-out op2` fits `op` alone and predicts `op2`; `none` fits both.
  const std::string records = temp_path("records-hold-out.jsonl");
  write_one_operator_record(records);
  std::ofstream(records, std::ios::app) << R"({"id": "op2", "kind": "operator", "model": "qwen3.6-35b-a3b", "hardware": "h100-sxm-node", )"
                                        << R"("layer_type": "linear_attention", "op": "gdn_mixing_forward", "batch": 1, "seq_len": 131072, )"
                                        << R"("measured": {"time_s": 0.04}})" << "\n";
  const std::string out = temp_path("cal-hold-out.json");
  auto held = [&](const std::string& hold_out) {
    const Result r = oom({"calibrate", "--records", records, "--hardware", "h100-sxm-node", "-o", out, "--json", "--hold-out", hold_out});
    EXPECT_EQ(r.code, 0) << r.err;
    std::map<std::string, bool> h;
    if (r.code != 0) return h;
    const auto summary = nlohmann::json::parse(r.out);
    for (const auto& row : summary["records"]) h[row["id"].get<std::string>()] = row["held_out"].get<bool>();
    return h;
  };
  const auto one = held("op2");
  const auto none = held("none");
  std::filesystem::remove(out);
  std::filesystem::remove(records);
  EXPECT_EQ(one, (std::map<std::string, bool>{{"op", false}, {"op2", true}}));
  EXPECT_EQ(none, (std::map<std::string, bool>{{"op", false}, {"op2", false}}));
}

TEST(CalibrateCommand, CrossValidationByGpuCountPredictsEachGroupFromTheOther) {
  // Two groups: the four-GPU step records and the one-GPU operator records; each is predicted by
  // a fit on the other alone. A few records of the published set keep the fits short.
  const std::string records = temp_path("cv.jsonl");
  {
    std::ifstream in(kSource + "/traces/paper/paper-calibration.jsonl");
    std::ofstream out(records);
    for (std::string line; std::getline(in, line);) {
      for (const char* id : {"\"t4-b32\"", "\"g-gemma4-b32\"", "\"g-gemma4-b32-fsdp2\"", "\"op-g4-moe-64k\"", "\"op-g4-sliding-64k\""}) {
        if (line.find(std::string("\"id\": ") + id) != std::string::npos) out << line << "\n";
      }
    }
  }
  const Result r = oom({"calibrate", "--records", records, "--hardware", "h100-sxm-node", "--cross-validate", "gpus", "--json"});
  std::filesystem::remove(records);
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["grouping"], "gpus");
  EXPECT_EQ(j["engine"], "analytic");
  ASSERT_EQ(j["groups"].size(), 2u);
  EXPECT_EQ(j["groups"][0]["group"], "4");
  EXPECT_EQ(j["groups"][1]["group"], "1");
  EXPECT_EQ(j["fits"], 2);
  EXPECT_EQ(j["step"]["count"], 2);
  EXPECT_EQ(j["operator"]["count"], 2);
  EXPECT_TRUE(j["groups"][0].contains("calibration"));
  for (const auto& rec : j["records"]) EXPECT_NE(rec["status"], "not_predicted") << rec["id"];
}

TEST(ValidateCommand, ExplainShowsTheBreakdownBesideThePublishedOne) {
  const Result r = oom({"validate", kSource + "/traces/paper/paper-calibration.jsonl", "--explain", "t4-b32-r0", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["id"], "t4-b32-r0");
  ASSERT_TRUE(j["published"].is_object());
  EXPECT_EQ(j["published"]["mechanisms"]["non_compute_s"], 4.55);
  double total = 0;
  for (const auto& [m, s] : j["exposed_s"].items()) total += s.get<double>();
  EXPECT_NEAR(total, j["step_s"].get<double>(), 1e-6);
  EXPECT_GT(j["exposed_s"]["cpu_adamw"].get<double>(), 0.0);  // no resident layers: CPU updates show
  const Result none = oom({"validate", kSource + "/traces/paper/paper-calibration.jsonl", "--explain", "g-qwen3-b32"});
  ASSERT_EQ(none.code, 0) << none.err;
  EXPECT_EQ(none.out.find("Published:"), std::string::npos);  // no published breakdown for it
}

}  // namespace
}  // namespace oom::cli
