// Plot bridge: PNG plots of study CSVs and traces, drawn by matplotlib (Agg) in Python.
//
// The plotting code is python/oom_plots.py, compiled into the library as text and run in the
// process's Python interpreter through pybind11: the embedded interpreter in the `oom` command
// (started on first use and kept for the life of the process), or the running interpreter when
// the `oom` Python module calls it. The caller writes the returned bytes with
// write_file_atomically(). Not thread-safe: call from one thread (the interpreter's lock is held).
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

namespace oom {

enum class PlotKind { kThroughput, kMemory, kTimeline, kAblation };

// "throughput", "memory", "timeline", "ablation"; nullopt-like empty result for anything else is not offered:
// plot_kind_from_name() throws InputError naming `field` for an unknown name.
PlotKind plot_kind_from_name(const std::string& name, const std::string& field);

// Python could not draw the plot (matplotlib missing, bad input text). what() is one line.
class PlotError : public std::runtime_error {
 public:
  explicit PlotError(const std::string& what) : std::runtime_error(what) {}
};

// The PNG bytes of a plot. `input_text` is a study CSV (throughput, memory) or a trace JSON
// (timeline: Chrome trace events or traces/trace.h's form) or an ablation CSV (ablation). `sweep` restricts a throughput plot
// to one sweep ("" = one panel per sweep); `title` replaces the default title when not empty.
// Throws PlotError when Python fails; nothing is written.
std::string render_plot_png(PlotKind kind, const std::string& input_text, const std::string& sweep = "",
                            const std::string& title = "");

// The sweep names of a study CSV, in order (as the plots group them).
std::vector<std::string> study_csv_sweeps(const std::string& csv_text);

}  // namespace oom
