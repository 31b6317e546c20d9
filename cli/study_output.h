// What `oom whatif` and `oom report-paper` share: the progress bar of a study run and its PNG
// plots (cli/cmd_whatif.cc).
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

#include "cli/cli.h"
#include "experiments/study.h"

namespace oom::cli {

// On a terminal a bar redrawn in place; elsewhere one plain line per finished case.
StudyProgress study_progress(std::ostream& err);
// The PNG files write_study_plots writes for `spec`, relative to its folder: throughput-SWEEP.png
// per sweep, then memory.png; none without the plotting bridge.
std::vector<std::string> study_plot_names(const StudySpec& spec);
// Writes throughput-SWEEP.png per sweep and memory.png of `csv` into `dir` (atomically) and
// returns their paths; without the plotting bridge writes nothing and says so on io.err.
std::vector<std::string> write_study_plots(const StudyResult& r, const std::string& csv, const std::string& dir, Io io);
// A name made safe for a file: letters, digits, '-', '_', '.'; anything else becomes '_'.
std::string file_safe(const std::string& s);

}  // namespace oom::cli
