// `oom report-paper -o DIR [--published RECORDS.jsonl] [--studies DIR] [--engine analytic|simgrid] [--smallest]`:
// runs every paper study (experiments/paper/*.json, one per figure or table of the OOM paper) and
// writes DIR/report.md (experiments/paper_report.h) with each study's CSV, JSON and PNG plots in
// DIR/STUDY/. Every input (each study, every workload, the records) is checked before the first
// study runs, so bad input writes nothing; report.md is written last, atomically.
#include <chrono>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <optional>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "cli/cli.h"
#include "cli/study_output.h"
#include "costmodel/atomic_file.h"
#include "costmodel/config_paths.h"
#include "costmodel/input_error.h"
#include "costmodel/output_path.h"
#include "costmodel/version.h"
#include "experiments/paper_report.h"
#include "experiments/plan_finder.h"
#include "experiments/published.h"
#include "planner/engine/step_engine.h"

namespace oom::cli {
namespace {

struct ReportPaperArgs {
  std::string output, published, studies, engine;
  bool no_plots = false, smallest = false;
};

// experiments/paper/ of the shipped data (an install's share/oom, or the source tree:
// costmodel/config_paths.h).
std::string default_studies_dir() { return shipped_data_path("experiments/paper"); }

}  // namespace

void add_report_paper_commands(CLI::App& app, Io io, const StepEngines& engines) {
  auto a = std::make_shared<ReportPaperArgs>();
  auto* c = app.add_subcommand("report-paper", "Run every paper study and write one Markdown report (plots, tables, published errors)");
  add_max_stages_option(c);
  c->add_option("-o,--output", a->output, "Folder for report.md and each study's CSV, JSON and plots")->required();
  c->add_option("--published", a->published, "Recorded step measurements (JSON Lines) to set against the predictions");
  c->add_option("--studies", a->studies, "Folder of study files (default: experiments/paper of the shipped data: share/oom of an install, or the source tree)");
  c->add_option("--engine", a->engine, "Step engine of the baselines (default: each study's, else analytic)");
  c->add_flag("--no-plots", a->no_plots, "Tables only");
  c->add_flag("--smallest", a->smallest, "Only each sweep's smallest workload, with every system: a quick check of the studies");
  c->callback([=] {
    const auto started = std::chrono::steady_clock::now();
    const std::string dir = a->studies.empty() ? default_studies_dir() : a->studies;
    std::vector<StudySpec> specs;
    std::vector<std::string> inputs = {dir, a->published}, outputs = {"report.md"};
    std::map<std::string, std::pair<std::string, std::string>> by_folder;  // DIR/SUB/ of a study -> its file and name
    for (const auto& file : paper_study_files(dir)) {
      StudySpec spec = load_study(file);
      if (a->smallest) spec = smallest_cases(std::move(spec));
      const std::string sub = file_safe(spec.name);
      if (const auto [it, fresh] = by_folder.try_emplace(sub, file, spec.name); !fresh) {
        const auto& [other_file, other_name] = it->second;
        throw InputError(file, "name", "\"" + spec.name + "\"",
                         fmt::format("{} has the same name{}: both studies would write {}/{}/", other_file,
                                     other_name == spec.name ? "" : " as a folder (\"" + other_name + "\")", a->output, sub));
      }
      inputs.push_back(file);
      for (const auto& name : {std::string("study.csv"), std::string("study.json")}) outputs.push_back(sub + "/" + name);
      if (!a->no_plots) {
        for (const auto& p : study_plot_names(spec)) outputs.push_back(sub + "/" + p);
      }
      if (!a->engine.empty()) spec.engine = a->engine;
      if (!engines.has(spec.engine)) throw InputError(file, "engine", "\"" + spec.engine + "\"", "unknown engine");
      for (const auto& sc : expand_study(spec)) resolve_workload(sc.workload, fmt::format("{} (sweep {})", file, sc.sweep));
      specs.push_back(std::move(spec));
    }
    check_output_folder(a->output, outputs, inputs);
    std::optional<RecordSet> records;
    if (!a->published.empty()) {
      records = load_records(a->published);
      StudyResult probe;  // parses every record's plan before the long run
      attach_published(probe, *records, a->published);
    }
    WorkEstimate estimate;
    for (const auto& spec : specs) estimate += estimate_study(spec, study_threads());
    io.err << "estimate: " << estimate.text() << "\n";
    std::vector<PaperSection> sections;
    for (const auto& spec : specs) {
      io.err << fmt::format("{}: {}\n", spec.figure.empty() ? spec.name : spec.figure, spec.name);
      PaperSection s;
      s.result = run_study(spec, engines, &find_plan_by_search, study_progress(io.err), study_threads());
      if (records) attach_published(s.result, *records, a->published);
      const std::string sub = file_safe(spec.name);
      std::filesystem::create_directories(a->output + "/" + sub);
      const std::string csv = study_csv(s.result);
      write_file_atomically(a->output + "/" + sub + "/study.csv", csv);
      write_file_atomically(a->output + "/" + sub + "/study.json", with_oom_version(study_result_to_json(s.result)).dump(2) + "\n");
      if (!a->no_plots) {
        for (const auto& p : write_study_plots(s.result, csv, a->output + "/" + sub, io)) {
          s.plots.push_back(sub + "/" + std::filesystem::path(p).filename().string());
        }
      }
      sections.push_back(std::move(s));
    }
    const double wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    std::string engine = a->engine;
    if (engine.empty()) {
      engine = specs.front().engine;
      for (const auto& spec : specs) {
        if (spec.engine != specs.front().engine) engine = "each study's own";
      }
    }
    write_file_atomically(a->output + "/report.md", paper_report_markdown(sections, engine, wall_s));
    int cases = 0;
    for (const auto& s : sections) cases += static_cast<int>(s.result.rows.size());
    io.out << fmt::format("{} studies, {} cases in {:.1f} s; wrote {}/report.md\n", sections.size(), cases, wall_s, a->output);
  });
}

}  // namespace oom::cli
