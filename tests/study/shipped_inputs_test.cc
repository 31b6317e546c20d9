// Every shipped input runs: each file under configs/ and experiments/ loads and validates with the
// project's loaders (the folders are listed when the test runs, so a new file is covered, and a
// file no loader claims fails), and every shipped study and ablation runs its smallest cases
// through the command that runs it (`--smallest`: each sweep's smallest workload with every
// system; an ablation's smallest workload with every variant), the paper studies through
// `oom report-paper`'s own loading of experiments/paper/. A shipped study that fails stops CI.
// Under AddressSanitizer the what-if studies over more than 16 GPUs are left out (below).
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "tests/common/sanitized.h"

#include "cli/cli.h"
#include "tests/common/run_oom.h"
#include "costmodel/hardware_spec.h"
#include "costmodel/json_input.h"
#include "costmodel/model_spec.h"
#include "costmodel/workload.h"
#include "experiments/ablation.h"
#include "experiments/paper_report.h"
#include "experiments/study.h"
#include "planner/calibration/calibration.h"
#include "planner/plan/plan.h"

namespace fs = std::filesystem;

namespace oom {
namespace {

const fs::path kSrc = OOM_SOURCE_DIR;

// Every regular file under the source tree's `folder`, sorted, as paths relative to the source root.
std::vector<fs::path> files_under(const std::string& folder) {
  std::vector<fs::path> out;
  for (const auto& e : fs::recursive_directory_iterator(kSrc / folder)) {
    if (e.is_regular_file()) out.push_back(fs::relative(e.path(), kSrc));
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A study file of experiments/ (a what-if study) or an ablation (experiments/ablation.h): the
// ablation has "variants", the study "sweeps". nullopt: neither.
enum class StudyKind { kStudy, kAblation };
std::optional<StudyKind> study_kind(const fs::path& path) {
  const nlohmann::json j = read_json_file(path.string());
  if (j.is_object() && j.contains("variants")) return StudyKind::kAblation;
  if (j.is_object() && j.contains("sweeps")) return StudyKind::kStudy;
  return std::nullopt;
}

// The study files of experiments/ itself (not its subfolders) of one kind.
std::vector<fs::path> top_level_studies(StudyKind kind) {
  std::vector<fs::path> out;
  for (const auto& rel : files_under("experiments")) {
    if (rel.parent_path() == "experiments" && rel.extension() == ".json" && study_kind(kSrc / rel) == kind) out.push_back(kSrc / rel);
  }
  return out;
}

// Every case of a study resolves (what `oom whatif` and `oom report-paper` check before they run).
void check_study(const StudySpec& spec, const std::string& file) {
  const auto cases = expand_study(spec);
  EXPECT_FALSE(cases.empty()) << file;
  for (const auto& c : cases) resolve_workload(c.workload, fmt::format("{} (sweep {})", file, c.sweep));
}

// Every case of an ablation resolves and its plan validates (what `oom ablation` checks first).
void check_ablation(const AblationSpec& spec, const std::string& file) {
  for (const auto& w : spec.workloads) {
    const WorkloadContext ctx = resolve_workload(w.workload, fmt::format("{} (workload '{}')", file, w.name));
    for (const auto& v : spec.variants) ablation_plan(spec, v, ctx, file);
  }
}

// Google Benchmark's JSON read through scripts/plot-bench-scaling.py's own reader (load_runs),
// where the system's Python is there; else its shape as that reader needs it.
void check_benchmark_output(const fs::path& path) {
  if (fs::exists("/usr/bin/python3")) {
    const std::string command = fmt::format(
        "/usr/bin/python3 -c 'import importlib.util, sys; s = importlib.util.spec_from_file_location(\"b\", sys.argv[1]); "
        "m = importlib.util.module_from_spec(s); s.loader.exec_module(m); m.load_runs(sys.argv[2])' '{}' '{}'",
        (kSrc / "scripts/plot-bench-scaling.py").string(), path.string());
    EXPECT_EQ(std::system(command.c_str()), 0) << command;
    return;
  }
  const nlohmann::json j = read_json_file(path.string());
  ASSERT_TRUE(j.contains("benchmarks") && j["benchmarks"].is_array() && !j["benchmarks"].empty()) << path;
  for (const auto& b : j["benchmarks"]) EXPECT_TRUE(b.contains("gpus") && b.contains("stages") && b.contains("real_time")) << path;
}

// Checks one shipped file with the loader that claims it and returns what claimed it; "" when
// no loader does.
std::string check_shipped_file(const fs::path& rel, const std::set<fs::path>& paper_studies) {
  const fs::path path = kSrc / rel;
  const std::string folder = rel.parent_path().string();
  const std::string ext = rel.extension().string();
  if (ext == ".md") {
    EXPECT_FALSE(read_text(path).empty()) << rel;
    return "documentation";
  }
  if (folder == "experiments" && (ext == ".cc" || ext == ".h" || rel.filename() == "CMakeLists.txt")) {
    return "the experiments library's source (the build compiles it)";
  }
  if (ext != ".json" && ext != ".png") return "";
  if (folder == "configs/models" && ext == ".json") {
    load_model_spec(path.string());
    return "load_model_spec";
  }
  if (folder == "configs/hardware" && ext == ".json") {
    const HardwareSpec h = load_hardware_spec(path.string());
    load_calibration_for(h);  // its calibration: its own file, its node's, or one transferred
    return "load_hardware_spec";
  }
  if (folder == "configs/calibration" && ext == ".json") {
    // NAME.json or NAME.ENGINE.json: the constants of hardware NAME (calibration_path()).
    const std::string name = rel.filename().string().substr(0, rel.filename().string().find('.'));
    load_calibration_file(path.string(), load_hardware_spec(name));
    return "load_calibration_file";
  }
  if (folder == "experiments/default" && rel.filename() == "workload.json") {
    resolve_workload(load_workload(path.string()), path.string());
    return "load_workload";
  }
  if (folder == "experiments/default" && rel.filename().string().starts_with("plan-") && ext == ".json") {
    const WorkloadContext ctx = resolve_workload(load_workload((kSrc / "experiments/default/workload.json").string()), "workload.json");
    validate_plan(load_plan(path.string()), ctx.model, ctx.workload, path.string());
    return "load_plan + validate_plan (on experiments/default/workload.json)";
  }
  if (folder == "experiments/paper" && paper_studies.contains(path)) {
    check_study(load_study(path.string()), path.string());
    return "load_study (report-paper's paper_study_files)";
  }
  if (folder == "experiments" && ext == ".json") {
    const auto kind = study_kind(path);
    if (kind == StudyKind::kStudy) {
      check_study(load_study(path.string()), path.string());
      return "load_study";
    }
    if (kind == StudyKind::kAblation) {
      check_ablation(load_ablation(path.string()), path.string());
      return "load_ablation";
    }
    return "";
  }
  if (folder == "experiments/bench" && ext == ".json") {
    check_benchmark_output(path);
    return "scripts/plot-bench-scaling.py";
  }
  if (folder == "experiments/bench" && ext == ".png") {
    // The plot of the benchmark output beside it.
    EXPECT_TRUE(read_text(path).starts_with("\x89PNG\r\n\x1a\n")) << rel;
    EXPECT_TRUE(fs::exists(fs::path(path).replace_extension(".json"))) << rel << " has no benchmark output beside it";
    return "a PNG of the benchmark output beside it";
  }
  return "";
}

TEST(ShippedInputs, EveryFileUnderConfigsAndExperimentsLoadsWithItsLoader) {
  std::set<fs::path> paper_studies;
  for (const auto& f : paper_study_files((kSrc / "experiments/paper").string())) paper_studies.insert(f);
  int files = 0;
  for (const char* folder : {"configs", "experiments"}) {
    for (const auto& rel : files_under(folder)) {
      ++files;
      std::string claimed;
      try {
        claimed = check_shipped_file(rel, paper_studies);
      } catch (const std::exception& e) {
        ADD_FAILURE() << rel.string() << ": " << e.what();
        continue;
      }
      EXPECT_NE(claimed, "") << rel.string() << ": no loader claims this file (add its loader to this test)";
    }
  }
  EXPECT_GT(files, 50);
  EXPECT_EQ(paper_studies.size(), 15u);
}

// A fresh output folder for one command.
fs::path output_folder(const std::string& name) {
  const fs::path dir = fs::path(::testing::TempDir()) / ("oom-shipped-" + name);
  fs::remove_all(dir);
  return dir;
}

// Under AddressSanitizer (a Debug build) the studies are not run: their smallest cases take 48 s
// in the normal build (what-if 33 s, the paper catalogue 15 s) and 362 s and 443 s sanitized, of
// CTest's 600 s, where one plan search takes up to 160 s. There each study's smallest cases are
// expanded, resolved and sized (estimate_study: every plan field and workload checked, the stage
// counts estimated); the normal build, which CI runs as well, runs them all.
using test_support::kSanitized;

// The sanitized form: every case of the study's smallest cases resolved, and the study sized.
void resolve_and_size(const StudySpec& spec, const std::string& file) {
  for (const auto& c : expand_study(spec)) resolve_workload(c.workload, fmt::format("{} (sweep {})", file, c.sweep));
  const WorkEstimate estimate = estimate_study(spec);
  EXPECT_GT(estimate.cases, 0) << file;
  std::cout << file << ": resolved and sized under the sanitizer (" << estimate.text() << "); the normal build runs it\n";
}

TEST(ShippedStudies, EveryWhatifStudyAndTheDefaultRunTheirSmallestCases) {
  std::vector<std::string> studies;
  for (const auto& f : top_level_studies(StudyKind::kStudy)) studies.push_back(f.string());
  ASSERT_FALSE(studies.empty());
  studies.emplace_back();  // the built-in default study of `oom whatif`
  for (const auto& file : studies) {
    const StudySpec spec = smallest_cases(file.empty() ? default_study() : load_study(file));
    const auto cases = expand_study(spec);
    if (kSanitized) {
      resolve_and_size(spec, file.empty() ? "default study" : file);
      continue;
    }
    const fs::path out = output_folder(file.empty() ? "default" : fs::path(file).stem().string());
    std::vector<std::string> args = {"whatif"};
    if (!file.empty()) args.push_back(file);
    args.insert(args.end(), {"--smallest", "-o", out.string(), "--no-plots"});
    const auto r = test_support::run_oom(args);
    ASSERT_EQ(r.code, cli::kExitOk) << (file.empty() ? "default study" : file) << ": " << r.err;
    // Every case is a row, and the CSV passes the check `oom plot` makes (absent values included).
    const std::string csv = read_text(out / "study.csv");
    EXPECT_NO_THROW(check_study_csv(csv, (out / "study.csv").string()));
    EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), static_cast<long>(cases.size()) + 1) << file;
    fs::remove_all(out);
  }
}

TEST(ShippedStudies, EveryPaperStudyRunsItsSmallestCasesThroughReportPaper) {
  if (kSanitized) {
    for (const auto& file : paper_study_files((kSrc / "experiments/paper").string())) resolve_and_size(smallest_cases(load_study(file)), file);
    return;
  }
  const fs::path out = output_folder("report-paper");
  // No --studies: report-paper's own folder, experiments/paper beside the configs.
  const auto r = test_support::run_oom({"report-paper", "--smallest", "-o", out.string(), "--no-plots"});
  ASSERT_EQ(r.code, cli::kExitOk) << r.err;
  const std::string report = read_text(out / "report.md");
  for (const auto& file : paper_study_files((kSrc / "experiments/paper").string())) {
    const StudySpec spec = load_study(file);
    EXPECT_NE(report.find(spec.name), std::string::npos) << spec.name << " is not in report.md";
    const fs::path csv = out / spec.name / "study.csv";
    const std::string text = read_text(csv);
    EXPECT_NO_THROW(check_study_csv(text, csv.string()));
    EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), static_cast<long>(expand_study(smallest_cases(spec)).size()) + 1) << file;
  }
  fs::remove_all(out);
}

TEST(ShippedStudies, EveryAblationRunsItsSmallestCase) {
  const auto ablations = top_level_studies(StudyKind::kAblation);
  ASSERT_FALSE(ablations.empty());
  for (const auto& file : ablations) {
    const fs::path out = output_folder(file.stem().string());
    const auto r = test_support::run_oom({"ablation", file.string(), "--smallest", "-o", out.string(), "--no-plots"});
    ASSERT_EQ(r.code, cli::kExitOk) << file << ": " << r.err;
    const std::string csv = read_text(out / "ablation.csv");
    EXPECT_NO_THROW(check_ablation_csv(csv, (out / "ablation.csv").string()));
    EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), static_cast<long>(load_ablation(file.string()).variants.size()) + 1) << file;
    fs::remove_all(out);
  }
}

}  // namespace
}  // namespace oom
