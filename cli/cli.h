// The `oom` command: parses arguments and dispatches to the libraries.
//
// run() is main() without the process: tests call it with string streams. Exit codes:
// 0 success, 2 bad input (one line on `err` naming file, field and value; nothing written),
// 3 an infeasible workload (later: `oom plan`), 1 an internal error.
#pragma once

#include <functional>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace oom::backend {
struct TrainOptions;
}

namespace oom::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitInternal = 1;
inline constexpr int kExitBadInput = 2;
inline constexpr int kExitInfeasible = 3;

// Streams a command writes to.
struct Io {
  std::ostream& out;
  std::ostream& err;
};

int run(const std::vector<std::string>& args, Io io);

// Each command file adds its subcommands; the callback runs after parsing succeeds.
void add_model_commands(CLI::App& app, Io io);
void add_memory_commands(CLI::App& app, Io io);
void add_simulate_commands(CLI::App& app, Io io);
void add_whatif_commands(CLI::App& app, Io io);  // oom whatif (experiments/study.h)
void add_plot_commands(CLI::App& app, Io io);    // oom plot (python/plot_bridge.h when built with Python)
void add_report_paper_commands(CLI::App& app, Io io);  // oom report-paper (experiments/paper_report.h)
void add_train_commands(CLI::App& app, Io io);  // only with the LibTorch backend (OOM_HAVE_BACKEND)
// `oom train --ranks P` (cli/cmd_train_ranks.cc): the options it adds to `train`, the hook the train
// command calls first (true when it ran the multi-rank trainer), and the hidden `rank-worker`.
struct TrainRanksOptions;
std::shared_ptr<TrainRanksOptions> add_train_ranks_options(CLI::App* train);
bool run_train_ranks(const backend::TrainOptions& options, const TrainRanksOptions& ranks, bool json, Io io);
void add_rank_worker_command(CLI::App& app, Io io);
void add_diff_commands(CLI::App& app, Io io);
// `oom calibrate --backend`: adds its options to the calibrate subcommand and returns what the
// subcommand's callback runs first (true when --backend was given and ran). Backend builds only.
std::function<bool()> add_backend_calibration(CLI::App& calibrate, Io io);

// Writes `content` to `path` atomically, or to `io.out` when path is "-" or empty.
void emit(const std::string& path, const std::string& content, Io io);

}  // namespace oom::cli
