// `oom plot RESULTS.csv --kind throughput|memory [--sweep NAME]` and
// `oom plot TRACE.json --kind timeline`: PNG plots through the Python plotting bridge
// (python/plot_bridge.h: pybind11's embedded interpreter, matplotlib with Agg).
#include <algorithm>
#include <filesystem>
#include <memory>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "cli/cli.h"
#include "costmodel/atomic_file.h"
#include "costmodel/input_error.h"
#include "costmodel/json_input.h"
#include "costmodel/output_path.h"
#include "experiments/ablation.h"
#include "experiments/study.h"
#ifdef OOM_HAVE_PLOT
#include "python/plot_bridge.h"
#endif

namespace oom::cli {
namespace {

struct PlotArgs {
  std::string input, kind, output, sweep, title;
};

// The default output: the input's path without its extension, then "-KIND.png".
std::string default_output(const std::string& input, const std::string& kind) {
  std::filesystem::path p(input);
  return (p.parent_path() / (p.stem().string() + "-" + kind + ".png")).string();
}

// Checks the input is of the form the kind needs, naming the file when it is not, and a CSV's every
// row and cell (check_study_csv(), check_ablation_csv()): a short or long row, or a number that is
// not a finite one, is one line naming the file, the line and the column.
void check_input(const std::string& file, const std::string& kind, const std::string& text) {
  if (kind == "timeline") {
    const nlohmann::json j = parse_json_text(text, file);
    if (!j.is_object() || !(j.contains("traceEvents") || j.contains("stages"))) {
      throw InputError(file, "expected a trace: Chrome trace events (oom simulate --trace) or an object with \"stages\"");
    }
    return;
  }
  if (kind == "ablation") {
    if (!text.starts_with("workload,variant,")) {
      throw InputError(file, "expected an ablation CSV (oom ablation) whose header starts with \"workload,variant,\"");
    }
  } else if (!text.starts_with("sweep,")) {
    throw InputError(file, "expected a study CSV (oom whatif) whose header starts with \"sweep,\"");
  }
  if (text.find('\n') == std::string::npos || text.find('\n') + 1 >= text.size()) throw InputError(file, "the study CSV has no rows");
  // Every row and cell checked here: the plotting code reads the CSV as strings.
  if (kind == "ablation") {
    check_ablation_csv(text, file);
  } else {
    check_study_csv(text, file);
  }
}

}  // namespace

void add_plot_commands(CLI::App& app, Io io) {
  auto a = std::make_shared<PlotArgs>();
  auto* p = app.add_subcommand("plot", "PNG plots: throughput or memory of a study CSV, timeline (Gantt) of a trace");
  p->add_option("input", a->input, "Study CSV (oom whatif) or trace JSON (oom simulate --trace)")->required();
  p->add_option("--kind", a->kind, "throughput | memory | timeline | ablation")->required();
  p->add_option("-o,--output", a->output, "PNG file to write (default: INPUT-KIND.png beside the input)");
  p->add_option("--sweep", a->sweep, "Throughput: only this sweep of the study");
  p->add_option("--title", a->title, "Title instead of the default");
  p->callback([=] {
    if (a->kind != "throughput" && a->kind != "memory" && a->kind != "timeline" && a->kind != "ablation") {
      throw InputError("", "--kind", "\"" + a->kind + "\"", "unknown plot kind (throughput, memory, timeline, ablation)");
    }
    const std::string out = a->output.empty() ? default_output(a->input, a->kind) : a->output;
    check_output_files({out}, {a->input});
    const std::string text = read_input_file(a->input, a->kind == "timeline"   ? "a trace JSON file"
                                                       : a->kind == "ablation" ? "an ablation CSV file"
                                                                               : "a study CSV file");
    check_input(a->input, a->kind, text);
#ifdef OOM_HAVE_PLOT
    if (!a->sweep.empty() && a->kind == "throughput") {
      const auto sweeps = study_csv_sweeps(text);
      if (std::find(sweeps.begin(), sweeps.end(), a->sweep) == sweeps.end()) {
        throw InputError(a->input, "--sweep", "\"" + a->sweep + "\"", fmt::format("no such sweep (the CSV has: {})", fmt::join(sweeps, ", ")));
      }
    }
    const std::string png = render_plot_png(plot_kind_from_name(a->kind, "--kind"), text, a->sweep, a->title);
    write_file_atomically(out, png);
    io.out << fmt::format("wrote {} ({} bytes)\n", out, png.size());
#else
    (void)io;
    throw std::runtime_error("this oom was built without the Python plotting bridge (install pybind11-dev python3-dev python3-matplotlib and rebuild)");
#endif
  });
}

}  // namespace oom::cli
