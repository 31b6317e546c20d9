#include "python/plot_bridge.h"

#include <pybind11/embed.h>

#include "costmodel/input_error.h"
#include "python/oom_plots_source.h"  // generated: kOomPlotsSource, the text of python/oom_plots.py

namespace py = pybind11;

namespace oom {
namespace {

// The module made from oom_plots.py, created once. It is never destroyed: it lives as long as the
// interpreter, which the process keeps until exit.
py::object& plots() {
  static py::object* module = [] {
    if (!Py_IsInitialized()) py::initialize_interpreter();
    auto* m = new py::object(py::module_::import("types").attr("ModuleType")("oom_plots"));
    py::exec(kOomPlotsSource, m->attr("__dict__"));
    return m;
  }();
  return *module;
}

template <typename F>
auto with_python(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const py::error_already_set& e) {
    std::string what = e.what();
    const auto nl = what.find('\n');
    throw PlotError("plotting failed in Python: " + (nl == std::string::npos ? what : what.substr(0, nl)));
  }
}

}  // namespace

PlotKind plot_kind_from_name(const std::string& name, const std::string& field) {
  if (name == "throughput") return PlotKind::kThroughput;
  if (name == "memory") return PlotKind::kMemory;
  if (name == "timeline") return PlotKind::kTimeline;
  if (name == "ablation") return PlotKind::kAblation;
  throw InputError("", field, "\"" + name + "\"", "unknown plot kind (throughput, memory, timeline, ablation)");
}

std::string render_plot_png(PlotKind kind, const std::string& input_text, const std::string& sweep, const std::string& title) {
  return with_python([&] {
    const char* name = kind == PlotKind::kThroughput ? "throughput"
                       : kind == PlotKind::kMemory   ? "memory"
                       : kind == PlotKind::kTimeline ? "timeline"
                                                     : "ablation";
    const py::bytes png = plots().attr("render")(name, input_text, sweep, title);
    return std::string(png);
  });
}

std::vector<std::string> study_csv_sweeps(const std::string& csv_text) {
  return with_python([&] {
    std::vector<std::string> out;
    for (const auto& s : plots().attr("sweeps_of")(plots().attr("read_rows")(csv_text))) out.push_back(s.cast<std::string>());
    return out;
  });
}

}  // namespace oom
