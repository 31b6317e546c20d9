// `oom ablation STUDY.json [-o DIR] [--engine analytic|simgrid] [--json] [--no-plots] [--smallest]`: a matched
// component study (experiments/ablation.h): one plan on the same workloads with and without a
// schedule. Prints the table (each variant's time, GPU peak and the study's peak beside the
// reference's, the best variant at equal throughput, the published figure), writes ablation.csv,
// ablation.json and ablation.png into DIR (default results/NAME), with a progress line per case.
#include <filesystem>
#include <memory>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "cli/cli.h"
#include "cli/study_output.h"
#include "costmodel/atomic_file.h"
#include "costmodel/input_error.h"
#include "costmodel/output_path.h"
#include "costmodel/version.h"
#include "experiments/ablation.h"
#ifdef OOM_HAVE_PLOT
#include "python/plot_bridge.h"
#endif

namespace oom::cli {
namespace {

struct AblationArgs {
  std::string study_path, output, engine;
  bool json = false, no_plots = false, smallest = false;
};

}  // namespace

void add_ablation_commands(CLI::App& app, Io io, const StepEngines& engines) {
  auto a = std::make_shared<AblationArgs>();
  auto* c = app.add_subcommand("ablation", "Matched component study: one plan with and without a schedule (experiments/flat-*.json)");
  add_max_stages_option(c);
  c->add_option("study", a->study_path, "Ablation study file (experiments/flat-*.json)")->required();
  c->add_option("-o,--output", a->output, "Folder for ablation.csv, ablation.json and ablation.png (default: results/NAME)");
  c->add_option("--engine", a->engine, "Step engine (default: the study's, else analytic)");
  c->add_flag("--json", a->json, "Print the results as one JSON object instead of the table");
  c->add_flag("--no-plots", a->no_plots, "Write the CSV and JSON only");
  c->add_flag("--smallest", a->smallest, "Only the smallest workload, with every variant: a quick check of a study");
  c->callback([=] {
    AblationSpec spec = load_ablation(a->study_path);
    if (a->smallest) spec = smallest_cases(std::move(spec));
    if (!a->engine.empty()) spec.engine = a->engine;
    const std::string dir = a->output.empty() ? "results/" + file_safe(spec.name) : a->output;
    std::vector<std::string> outputs = {"ablation.csv", "ablation.json"};
#ifdef OOM_HAVE_PLOT
    if (!a->no_plots) outputs.push_back("ablation.png");
#endif
    check_output_folder(dir, outputs, {a->study_path});
    const WorkEstimate estimate = estimate_ablation(spec, a->study_path);  // before any line: it may find bad input
    io.err << "estimate: " << estimate.text() << "\n";
    const AblationResult r = run_ablation(spec, engines, a->study_path, study_progress(io.err));
    std::filesystem::create_directories(dir);
    const std::string csv = ablation_csv(r);
    write_file_atomically(dir + "/ablation.csv", csv);
    write_file_atomically(dir + "/ablation.json", with_oom_version(ablation_result_to_json(r)).dump(2) + "\n");
    std::vector<std::string> written = {dir + "/ablation.csv", dir + "/ablation.json"};
    if (!a->no_plots) {
#ifdef OOM_HAVE_PLOT
      write_file_atomically(dir + "/ablation.png", render_plot_png(PlotKind::kAblation, csv, "", spec.name + ": " + spec.description));
      written.push_back(dir + "/ablation.png");
#else
      io.err << "plots skipped: this oom was built without the Python plotting bridge\n";
#endif
    }
    if (a->json) {
      io.out << with_oom_version(ablation_result_to_json(r)).dump(2) << "\n";
    } else {
      io.out << ablation_table_text(r) << fmt::format("wrote {}\n", fmt::join(written, ", "));
    }
  });
}

}  // namespace oom::cli
