// The `oom` command in-process: outputs, help, and bad input answered with one line and exit 2.
#include "cli/cli.h"

#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "costmodel/json_input.h"
#include "costmodel/version.h"
#include "tests/common/run_oom.h"

namespace oom::cli {
namespace {

using Result = test_support::OomResult;
constexpr auto& oom = test_support::run_oom;

std::string source(const std::string& rel) { return std::string(OOM_SOURCE_DIR) + "/" + rel; }

class TempDir {
 public:
  TempDir() : path_(std::filesystem::temp_directory_path() / ("oom_cli_test_" + std::to_string(::getpid()))) {
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string file(const std::string& name, const std::string& content) const {
    const auto p = path_ / name;
    std::ofstream(p) << content;
    return p.string();
  }
  std::string path(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

int lines(const std::string& s) { return static_cast<int>(std::count(s.begin(), s.end(), '\n')); }

// The backend is a plugin: `oom --help` lists `train` without loading it, and a missing library
// is one line naming it, exit 1, whichever backend command asked for it.
TEST(CliBackendPlugin, HelpListsTrainWithoutTheLibrary) {
  const Result r = oom({"--help"});
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("train"), std::string::npos);
  const Result c = oom({"calibrate", "--help"});
  EXPECT_NE(c.out.find("--backend"), std::string::npos);
}

TEST(CliBackendPlugin, MissingLibraryIsOneLineNamingIt) {
  ::setenv("OOM_BACKEND_LIBRARY", "/nonexistent/liboom_torch.so", 1);
  for (const auto& args : std::vector<std::vector<std::string>>{{"train", "--steps", "1"},
                                                                 {"calibrate", "--backend", "--quick"},
                                                                 {"rank-worker", "--job", "j", "--rank", "0"}}) {
    const Result r = oom(args);
    EXPECT_EQ(r.code, 1) << args[0];
    EXPECT_NE(r.err.find("/nonexistent/liboom_torch.so"), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_EQ(r.out, "");
  }
  ::unsetenv("OOM_BACKEND_LIBRARY");
  // Commands that do not train never look for it.
  EXPECT_TRUE(is_backend_command({"train"}));
  EXPECT_TRUE(is_backend_command({"calibrate", "--backend"}));
  EXPECT_FALSE(is_backend_command({"calibrate", "--records", "r.jsonl"}));
  EXPECT_FALSE(is_backend_command({"model", "show", "train"}));
}

TEST(Cli, ModelShowJsonReportsMixtralTotals) {
  const Result r = oom({"model", "show", "mixtral-8x7b", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_TRUE(j["total_params"].is_number_integer());
  EXPECT_TRUE(j["active_params"].is_number_integer());
  EXPECT_NEAR(j["total_params"].get<double>() / 1e9, 46.70, 0.005);
  EXPECT_EQ(j["params_per_layer"].size(), 32u);
}

TEST(Cli, ModelShowTextAndPathInput) {
  const Result r = oom({"model", "show", source("configs/models/gemma4-26b-a4b.json")});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("5 full attention, 25 sliding attention"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("V = K"), std::string::npos);
}

TEST(Cli, MemoryJsonCarriesEq2AndHostPerNuma) {
  const Result r = oom({"memory", "--workload", source("experiments/default/workload.json"), "--plan",
                        source("experiments/default/plan-r23.json"), "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_GT(j["gpu"]["eq2"]["state_bytes"].get<long long>(), 50LL << 30);
  EXPECT_EQ(j["host"].size(), 2u);
}

TEST(Cli, DefaultReportMatchesTheDefaultFiles) {
  const Result a = oom({"report", "--json"});
  const Result b = oom({"report", "--json", "--workload", source("experiments/default/workload.json"), "--plan",
                        source("experiments/default/plan-r23.json")});
  ASSERT_EQ(a.code, 0) << a.err;
  ASSERT_EQ(b.code, 0) << b.err;
  auto ja = nlohmann::json::parse(a.out), jb = nlohmann::json::parse(b.out);
  ja["plan"].erase("notes");
  jb["plan"].erase("notes");
  EXPECT_EQ(ja, jb);
}

TEST(Cli, OutputFileIsWrittenAtomically) {
  TempDir t;
  const std::string out = t.path("report.json");
  const Result r = oom({"report", "--json", "-o", out});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(r.out.empty());
  std::ifstream in(out);
  EXPECT_NO_THROW(nlohmann::json::parse(in));
}

TEST(Cli, HelpEverywhere) {
  for (const auto& args : std::vector<std::vector<std::string>>{
           {"--help"}, {"model", "--help"}, {"model", "show", "--help"}, {"memory", "--help"}, {"report", "--help"}}) {
    const Result r = oom(args);
    EXPECT_EQ(r.code, 0) << args.back();
    EXPECT_NE(r.out.find("Usage"), std::string::npos) << r.out;
  }
  EXPECT_NE(oom({"memory", "--help"}).out.find("--workload"), std::string::npos);
}

// Each bad input: one line on stderr naming file and field, exit 2, nothing written.
TEST(Cli, BadInputIsOneLineExit2AndNothingWritten) {
  TempDir t;
  const std::string plan = source("experiments/default/plan-r23.json");
  const std::string wl = source("experiments/default/workload.json");
  struct Case {
    std::string name;
    std::vector<std::string> args;
    std::string expect;
  };
  const std::string bad_model = t.file("w1.json", R"({"model": "gpt-9", "hardware": "h100-sxm-node", "gpus": 4, "global_batch": 32, "seq_len": 4096})");
  const std::string bad_hw = t.file("w2.json", R"({"model": "qwen3.6-35b-a3b", "hardware": "tpu", "gpus": 4, "global_batch": 32, "seq_len": 4096})");
  const std::string bad_type = t.file("w3.json", R"({"model": "qwen3.6-35b-a3b", "hardware": "h100-sxm-node", "gpus": "four", "global_batch": 32, "seq_len": 4096})");
  const std::string missing_field = t.file("w4.json", R"({"model": "qwen3.6-35b-a3b", "hardware": "h100-sxm-node", "gpus": 4, "seq_len": 4096})");
  const std::string malformed = t.file("p1.json", R"({"version": 1, "path": "ep",)");
  const std::string out_of_range = t.file("p2.json", R"({"version": 1, "path": "ep", "resident_layers": [0, 40], "moe_retained_layers": [],
    "routing_chunk_tokens": 65536, "param_transfer": "full", "transfer_chunk_mib": 64, "cpu_grad_slots": 2,
    "split": {"attention_head_group": 0, "gdn_chunk_tokens": 0, "moe_chunk_tokens": 0, "sub_batch_seqs": 0},
    "keep_attention_results": false, "boundaries": {"host_kept": "all", "gpu_held": [], "regenerate_cap": 1}})");
  const std::vector<Case> cases = {
      {"missing file", {"memory", "--workload", t.path("nope.json"), "--plan", plan}, "nope.json: file not found"},
      {"malformed JSON", {"memory", "--workload", wl, "--plan", malformed}, "p1.json: field 'path': value \"ep\",: malformed JSON"},
      {"missing field", {"memory", "--workload", missing_field, "--plan", plan}, "w4.json: field 'global_batch': value (missing)"},
      {"wrong type", {"memory", "--workload", bad_type, "--plan", plan}, "w3.json: field 'gpus': value \"four\": expected an integer"},
      {"unknown model", {"memory", "--workload", bad_model, "--plan", plan}, "w1.json: field 'model': value \"gpt-9\": unknown model"},
      {"unknown hardware", {"memory", "--workload", bad_hw, "--plan", plan}, "w2.json: field 'hardware': value \"tpu\": unknown hardware"},
      {"layer out of range", {"memory", "--workload", wl, "--plan", out_of_range}, "p2.json: field 'resident_layers[1]': value 40: layer index out of range 0..39"},
      {"unknown model name", {"model", "show", "no-such"}, "field 'model': value \"no-such\": unknown model"},
  };
  for (const auto& c : cases) {
    std::vector<std::string> args = c.args;
    const std::string out = t.path("out-" + std::to_string(&c - cases.data()) + ".json");
    if (args[0] != "model") {
      args.push_back("-o");
      args.push_back(out);
    }
    const Result r = oom(args);
    EXPECT_EQ(r.code, 2) << c.name;
    EXPECT_EQ(lines(r.err), 1) << c.name << ": " << r.err;
    EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << c.name;
    EXPECT_NE(r.err.find(c.expect), std::string::npos) << c.name << ": " << r.err;
    EXPECT_TRUE(r.out.empty()) << c.name;
    EXPECT_FALSE(std::filesystem::exists(out)) << c.name;
  }
}

// Progress on a stream that is not a terminal: one plain line per case, no carriage returns or
// terminal control sequences in logs.
TEST(Cli, WhatifProgressIsPlainLinesWhenNotATerminal) {
  TempDir dir;
  const Result r = oom({"whatif", source("tests/study/data/small-study.json"), "-o", dir.path("out"), "--no-plots"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("[1/2] "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("[2/2] "), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find('\r'), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find('\x1b'), std::string::npos) << r.err;
}

// `oom ablation`: the optimizer study runs, reports each variant against the reference and the
// published figure, and writes its CSV and JSON; the streamed update shortens the step's tail.
TEST(Cli, AblationRunsAMatchedComponentStudy) {
  TempDir dir;
  const Result r = oom({"ablation", source("experiments/flat-optimizer.json"), "-o", dir.path("out"), "--no-plots", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["schedule"], "optimizer");
  EXPECT_EQ(j["rows"].size(), 8u);  // 2 workloads × 4 variants
  EXPECT_DOUBLE_EQ(j["rows"][0]["tail_speedup"].get<double>(), 1.0);
  // The shipped study's estimate comes first, on stderr: its cases and a wall time.
  EXPECT_EQ(r.err.rfind("estimate: 8 cases, ", 0), 0u) << r.err;
  EXPECT_NE(r.err.find(" stages: about "), std::string::npos) << r.err;
  for (const auto& b : j["best"]) {
    EXPECT_NE(b["variant"], "serial per-group update");
    EXPECT_GT(b["tail_speedup"].get<double>(), 1.0);
  }
  EXPECT_DOUBLE_EQ(j["paper"]["tail_speedup"].get<double>(), 2.05);
  EXPECT_TRUE(std::filesystem::exists(dir.path("out/ablation.csv")));
  EXPECT_TRUE(std::filesystem::exists(dir.path("out/ablation.json")));
  EXPECT_NE(oom({"ablation", "--help"}).out.find("--engine"), std::string::npos);
}

// --max-stages raises the stage limit: a plan the default refuses before building (naming its
// field) gets past the check with it, here to the next check (an unknown engine), so that nothing
// large is built; and lowered under the graph of every candidate, the plan search skips them all
// and says so.
TEST(Cli, MaxStagesRaisesTheLimitEveryLoweringChecks) {
  TempDir dir;
  nlohmann::json w = nlohmann::json::parse(std::ifstream(source("experiments/default/workload.json")));
  w["global_batch"] = 4;
  w["seq_len"] = 262144;
  nlohmann::json p = nlohmann::json::parse(std::ifstream(source("experiments/default/plan-r23.json")));
  p["routing_chunk_tokens"] = 1;
  const std::string workload = dir.file("w.json", w.dump()), plan = dir.file("p.json", p.dump());
  const std::vector<std::string> simulate = {"simulate", "--workload", workload, "--plan", plan, "--engine", "bogus"};
  const Result refused = oom(simulate);
  EXPECT_EQ(refused.code, 2);
  EXPECT_EQ(refused.err.rfind("error: " + plan + ": field 'routing_chunk_tokens': value 1: would lower to ", 0), 0u) << refused.err;
  std::vector<std::string> raised = simulate;
  raised.insert(raised.end(), {"--max-stages", "1e12"});
  const Result past = oom(raised);
  EXPECT_EQ(past.code, 2);
  EXPECT_NE(past.err.find("field '--engine'"), std::string::npos) << past.err;
  // The limit is the command's: the next command starts from the default again.
  EXPECT_EQ(oom(simulate).err, refused.err);

  const Result search = oom({"plan", "--workload", source("experiments/default/workload.json"), "--max-stages", "100"});
  EXPECT_EQ(search.code, 3) << search.err;
  EXPECT_NE(search.err.find("skipped, over the stage limit"), std::string::npos) << search.err;
  EXPECT_EQ(lines(search.err), 1) << search.err;
}

TEST(Cli, UnknownCommandOrOptionExits2) {
  EXPECT_EQ(oom({"frobnicate"}).code, 2);
  EXPECT_EQ(oom({"model", "show", "tiny-moe", "--bogus"}).code, 2);
  EXPECT_EQ(lines(oom({"frobnicate"}).err), 1);
}

// `oom --version`: one "key: value" line per fact a bug report needs.
TEST(CliVersion, PrintsVersionCommitCompilerBackendSimgridAndConfigs) {
  const Result r = oom({"--version"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("oom " + oom_version_text() + "\n", 0), 0u) << r.out;
  for (const char* key : {"\nversion: ", "\ncommit: ", "\ncompiler: ", "\nbackend: ", "\nbackend build: ", "\nsimgrid: ", "\nplots: ",
                          "\nconfigs: ", "\ndata: "}) {
    EXPECT_NE(r.out.find(key), std::string::npos) << key << " missing from\n" << r.out;
  }
  EXPECT_NE(r.out.find("\nversion: " + std::string(oom_project_version()) + "\n"), std::string::npos) << r.out;
  // The tests run with OOM_CONFIG_DIR set: the line says so.
  EXPECT_NE(r.out.find("\nconfigs: " + std::string(std::getenv("OOM_CONFIG_DIR")) + " (OOM_CONFIG_DIR)\n"), std::string::npos) << r.out;
  EXPECT_TRUE(r.err.empty()) << r.err;
  const std::string commit(oom_git_commit());
  EXPECT_TRUE(commit == "unknown" || commit.find_first_not_of("0123456789abcdef") >= 12) << commit;
}

// Every file the tool writes carries its version at the root, and the readers take it back: a
// trace (`oom diff` reads it), a plan (`oom simulate` reads it), a study's JSON.
TEST(CliVersion, TracesPlansAndStudiesCarryTheVersion) {
  const TempDir dir;
  const std::string workload = source("experiments/default/workload.json"), plan = source("experiments/default/plan-r23.json");
  const std::string trace = dir.path("t.json");
  ASSERT_EQ(oom({"simulate", "--workload", workload, "--plan", plan, "--trace", trace}).code, 0);
  EXPECT_EQ(read_json_file(trace)[kOomVersionKey], oom_version_text());
  const Result diff = oom({"diff", trace, trace, "--summary"});
  EXPECT_EQ(diff.code, 0) << diff.err;
  const std::string found = dir.path("plan.json");
  ASSERT_EQ(oom({"plan", "--workload", workload, "-o", found}).code, 0);
  EXPECT_EQ(read_json_file(found)[kOomVersionKey], oom_version_text());
  const Result again = oom({"simulate", "--workload", workload, "--plan", found});
  EXPECT_EQ(again.code, 0) << again.err;
  const Result study = oom({"whatif", source("tests/study/data/small-study.json"), "--smallest", "--no-plots", "-o", dir.path("study")});
  ASSERT_EQ(study.code, 0) << study.err;
  EXPECT_EQ(read_json_file(dir.path("study/study.json"))[kOomVersionKey], oom_version_text());
}

// `oom hardware probe`: this machine's spec, which `oom plan` and `oom simulate` accept as the
// workload's hardware; the CPUs and NUMA nodes are the OS's (costmodel tests check them in detail).
TEST(CliHardwareProbe, WritesASpecThatSimulateAccepts) {
  const TempDir dir;
  const std::string spec = dir.path("this-machine.json");
  const Result probe = oom({"hardware", "probe", "-o", spec});
  ASSERT_EQ(probe.code, 0) << probe.err;
  const nlohmann::json j = read_json_file(spec);
  EXPECT_EQ(j[kOomVersionKey], oom_version_text());
  EXPECT_EQ(j["provenance"]["numa.cores"], "measured");
  EXPECT_EQ(j["provenance"]["numa.dram_gib"], "measured");
  int cores = 0;
  for (const auto& n : j["numa"]) cores += n["cores"].get<int>();
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  EXPECT_EQ(cores, CPU_COUNT(&set));  // nproc
  const std::string workload =
      dir.file("w.json", nlohmann::json{{"model", "tiny-moe"}, {"hardware", spec}, {"gpus", 1}, {"global_batch", 2}, {"seq_len", 256}}.dump());
  const std::string plan = dir.path("plan.json");
  const Result planned = oom({"plan", "--workload", workload, "-o", plan});
  ASSERT_EQ(planned.code, 0) << planned.err;
  const Result sim = oom({"simulate", "--workload", workload, "--plan", plan, "--json"});
  ASSERT_EQ(sim.code, 0) << sim.err;
  EXPECT_GT(nlohmann::json::parse(sim.out)["step_s"].get<double>(), 0.0) << sim.out;
  // Its output is checked like every other: a folder is refused before any probing.
  const Result refused = oom({"hardware", "probe", "-o", dir.path("")});
  EXPECT_EQ(refused.code, 2);
  EXPECT_EQ(lines(refused.err), 1) << refused.err;
}

TEST(CliModel, HelpSaysAModelMayBeAHuggingFaceConfig) {
  const Result r = oom({"model", "--help"});
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("Hugging Face config.json"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace oom::cli
