// `oom whatif [STUDY.json] [-o DIR] [--engine analytic|simgrid] [--published RECORDS.jsonl]
// [--json] [--no-plots] [--smallest] [-j THREADS]`: the what-if study. With no study file it runs the default study
// (experiments/study.h). With --published, recorded step measurements are matched to the rows
// (experiments/published.h): predicted-vs-published columns and errors in the table and CSV,
// published points on the plots. Prints the table, writes study.csv, study.json and the PNG
// plots (throughput per sweep, memory) into DIR,
// and shows a progress bar on stderr (a line per case when stderr is not a terminal). The plan
// search is planner/search/plan_search.h's search_plan(). The cases run on every core (-j: how
// many at once), the outputs the same bytes whatever the threads.
#include <unistd.h>

#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "cli/cli.h"
#include "cli/study_output.h"
#include "costmodel/atomic_file.h"
#include "costmodel/input_error.h"
#include "costmodel/output_path.h"
#include "costmodel/version.h"
#include "experiments/plan_finder.h"
#include "experiments/published.h"
#include "experiments/study.h"
#include "planner/engine/step_engine.h"
#ifdef OOM_HAVE_PLOT
#include "python/plot_bridge.h"
#endif

namespace oom::cli {
namespace {

struct WhatifArgs {
  std::string study_path, output, engine, published;
  bool json = false, no_plots = false, smallest = false;
  int threads = 0;
};

}  // namespace

// On a terminal: "[##########----------] 7/10 label", redrawn in place. Elsewhere (a log file, a
// pipe, a string stream) one plain line per finished case, without control characters.
static void draw_progress(std::ostream& err, bool terminal, int done, int total, const std::string& label) {
  if (!terminal) {
    err << "[" << done << "/" << total << "] " << label << "\n";
    err.flush();
    return;
  }
  constexpr int kWidth = 24;
  const int filled = total > 0 ? done * kWidth / total : kWidth;
  err << "\r[" << std::string(static_cast<std::size_t>(filled), '#') << std::string(static_cast<std::size_t>(kWidth - filled), '-')
      << "] " << done << "/" << total << " " << label << "\x1b[K";
  if (done == total) err << "\n";
  err.flush();
}

std::string file_safe(const std::string& s) {
  std::string out;
  for (const char c : s) out += (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.') ? c : '_';
  return out;
}

StudyProgress study_progress(std::ostream& err) {
  const bool terminal = &err == &std::cerr && isatty(STDERR_FILENO) == 1;
  return [&err, terminal](int done, int total, const std::string& label) { draw_progress(err, terminal, done, total, label); };
}

std::vector<std::string> study_plot_names(const StudySpec& spec) {
  std::vector<std::string> names;
#ifdef OOM_HAVE_PLOT
  for (const auto& sweep : spec.sweeps) names.push_back("throughput-" + file_safe(sweep.name) + ".png");
  names.push_back("memory.png");
#else
  (void)spec;
#endif
  return names;
}

std::vector<std::string> write_study_plots(const StudyResult& r, const std::string& csv, const std::string& dir, Io io) {
  std::vector<std::string> written;
#ifdef OOM_HAVE_PLOT
  const std::vector<std::string> names = study_plot_names(r.spec);
  for (std::size_t i = 0; i < names.size(); ++i) {
    const std::string path = dir + "/" + names[i];
    const bool memory = i == r.spec.sweeps.size();  // the last: memory.png
    write_file_atomically(path, memory ? render_plot_png(PlotKind::kMemory, csv)
                                       : render_plot_png(PlotKind::kThroughput, csv, r.spec.sweeps[i].name));
    written.push_back(path);
  }
#else
  (void)r, (void)csv, (void)dir;
  io.err << "plots skipped: this oom was built without the Python plotting bridge\n";
#endif
  return written;
}

void add_whatif_commands(CLI::App& app, Io io, const StepEngines& engines) {
  auto a = std::make_shared<WhatifArgs>();
  auto* w = app.add_subcommand("whatif", "What-if study: plan search vs baselines over models x hardware x batch x context x budgets");
  add_max_stages_option(w);
  w->add_option("study", a->study_path, "Study file (experiments/*.json); none = the default study");
  w->add_option("-o,--output", a->output, "Folder for study.csv, study.json and the PNG plots (default: results/STUDY)");
  w->add_option("--engine", a->engine, "Step engine for the baselines (default: the study's, else analytic)");
  w->add_option("--published", a->published,
                "Recorded step measurements (JSON Lines, traces/records.h) to overlay: matched by workload and system");
  w->add_flag("--json", a->json, "Print the results as one JSON object instead of the table");
  w->add_flag("--no-plots", a->no_plots, "Write the CSV and JSON only");
  w->add_option("-j,--threads", a->threads, "Cases run at once (default 0: one per core); the outputs are the same whatever it is")
      ->check(CLI::Range(0, 1024));
  w->add_flag("--smallest", a->smallest, "Only each sweep's smallest workload, with every system: a quick check of a study");
  w->callback([=] {
    StudySpec spec = a->study_path.empty() ? default_study() : load_study(a->study_path);
    if (a->smallest) spec = smallest_cases(std::move(spec));
    if (!a->engine.empty()) spec.engine = a->engine;
    if (!engines.has(spec.engine)) throw InputError(a->study_path, "engine", "\"" + spec.engine + "\"", "unknown engine");
    const std::string dir = a->output.empty() ? "results/" + file_safe(spec.name) : a->output;
    std::vector<std::string> outputs = {"study.csv", "study.json"};
    if (!a->no_plots) {
      for (const auto& p : study_plot_names(spec)) outputs.push_back(p);
    }
    check_output_folder(dir, outputs, {a->study_path, a->published});
    // Resolve every case before the long run, so bad input fails at once and writes nothing.
    for (const auto& c : expand_study(spec)) resolve_workload(c.workload, fmt::format("{} (sweep {})", a->study_path.empty() ? "default study" : a->study_path, c.sweep));
    // The records are read before the long run too: a bad line fails at once.
    const std::optional<RecordSet> records =
        a->published.empty() ? std::nullopt : std::optional<RecordSet>(load_records(a->published));
    if (records) {
      StudyResult probe;  // parses every record's plan (attach_published on no rows)
      probe.spec = spec;
      attach_published(probe, *records, a->published);
    }
    const int threads = a->threads > 0 ? a->threads : study_threads();
    const WorkEstimate estimate = estimate_study(spec, threads);  // before any line: it may find bad input
    io.err << "estimate: " << estimate.text() << "\n";
    StudyResult r = run_study(spec, engines, &find_plan_by_search, study_progress(io.err), threads);
    if (records) attach_published(r, *records, a->published);
    std::filesystem::create_directories(dir);
    const std::string csv = study_csv(r);
    write_file_atomically(dir + "/study.csv", csv);
    write_file_atomically(dir + "/study.json", with_oom_version(study_result_to_json(r)).dump(2) + "\n");
    std::vector<std::string> written = {dir + "/study.csv", dir + "/study.json"};
    if (!a->no_plots) {
      for (const auto& p : write_study_plots(r, csv, dir, io)) written.push_back(p);
    }
    if (a->json) {
      io.out << with_oom_version(study_result_to_json(r)).dump(2) << "\n";
    } else {
      io.out << study_table_text(r);
      io.out << fmt::format("wrote {}\n", fmt::join(written, ", "));
    }
  });
}

}  // namespace oom::cli
