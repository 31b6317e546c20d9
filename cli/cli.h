// The `oom` command: parses arguments and dispatches to the libraries.
//
// run() is main() without the process: tests call it with string streams. Exit codes:
// 0 success, 2 bad input (one line on `err` naming file, field and value; nothing written),
// 3 an infeasible workload (later: `oom plan`), 1 an internal error.
#pragma once

#include <functional>
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace CLI {
class App;
}

namespace oom {
class Executor;
class StepEngines;
struct Workload;
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

// Builds the engines the commands offer once (planner/engine/step_engine.h: "analytic", and
// "simgrid" when the command is built with the oom_sim library, OOM_CLI_SIMGRID_ENGINE) and runs
// the command `args` names.
int run(const std::vector<std::string>& args, Io io);

// Parses `args` into `app` and runs the chosen command, mapping errors to the exit codes above.
int run_app(CLI::App& app, const std::vector<std::string>& args, Io io);

// `--nodes N` on a command that reads a workload: the hardware's node spec repeated over N nodes
// (Workload::nodes). apply_nodes_option sets it on `w` when given; N outside 1..kMaxNodes is an InputError.
void add_nodes_option(CLI::App* cmd, std::optional<int>& nodes);
void apply_nodes_option(Workload& w, const std::optional<int>& nodes);

// `--max-stages N` on every command that lowers a plan or a baseline: the most stages one
// StepGraph may have (planner/lowering/graph_size_estimate.h; default kDefaultMaxStages). It sets
// the limit every lowering of the command starts from (set_max_stages_default); run_app puts the
// default back before each command. N below 1 or not finite is an InputError.
void add_max_stages_option(CLI::App* cmd);

// `oom --version` (cli/cmd_version.cc): the version, commit, compiler, backend plugin, SimGrid,
// plots, and the configs and data folders with how each was found; one "key: value" per line.
std::string version_text();
// `oom hardware probe [-o FILE]` (cli/cmd_hardware.cc): a HardwareSpec of this machine.
void add_hardware_commands(CLI::App& app, Io io);

// Each command file adds its subcommands; the callback runs after parsing succeeds. Commands that
// pick a step engine by name keep a copy of `engines` and offer those.
void add_model_commands(CLI::App& app, Io io);
void add_memory_commands(CLI::App& app, Io io);
void add_simulate_commands(CLI::App& app, Io io, const StepEngines& engines);
void add_whatif_commands(CLI::App& app, Io io, const StepEngines& engines);  // oom whatif (experiments/study.h)
void add_ablation_commands(CLI::App& app, Io io, const StepEngines& engines);  // oom ablation (experiments/ablation.h)
void add_plot_commands(CLI::App& app, Io io);    // oom plot (python/plot_bridge.h when built with Python)
void add_diff_commands(CLI::App& app, Io io);
void add_report_paper_commands(CLI::App& app, Io io, const StepEngines& engines);  // oom report-paper (experiments/paper_report.h)

// The LibTorch backend is a plugin (cli/backend_plugin.cc): `oom train`, `oom rank-worker` and
// `oom calibrate --backend` load the shared library liboom_torch.so and run there; every other
// command starts without LibTorch. The library is $OOM_BACKEND_LIBRARY, else liboom_torch.so
// beside the running `oom` (or in ../lib), else the one this build made. A missing or broken
// library is one error line naming it, exit 1.
bool is_backend_command(const std::vector<std::string>& args);
// What the `oom` program starts before it runs `args` (cli/main.cc), while the process is small:
// for a command that is not the backend's, the simulation server of the SimGrid engine where it
// is built in (sim/simgrid_engine.h start_simulation_server).
void start_process_services(const std::vector<std::string>& args);
int run_backend(const std::vector<std::string>& args, Io io);
// The path run_backend would load (the first candidate that exists, else the first candidate).
std::string backend_library_path();
// How to get the plugin where it is missing (one clause, for error lines).
std::string backend_install_hint();
// `oom train` (and `--backend` of `oom calibrate`) as they appear in `oom --help` without the plugin.
void add_backend_command_stubs(CLI::App& app);
// `--backend` and its sibling options on `oom calibrate`, listed for help; the call itself is
// routed to the plugin before parsing (is_backend_command).
std::function<bool()> add_backend_calibration(CLI::App& calibrate, Io io);

// `oom plan` (cli/cmd_plan.cc): --compare-engine names one of `engines` ("simgrid" by default
// where offered) or, through `compare_executor`, an executor that is not a StepEngine
// (nullptr when it knows none): the plugin's "torch", real short executions with the LibTorch backend.
// With `measure_memory` (--measure-memory) the executor measures the device's memory (a CPU stands
// in for a GPU with memory of its own) and the search holds the measured peaks to the GPU budget.
using CompareExecutorFactory = std::function<std::unique_ptr<Executor>(const std::string& name, bool measure_memory)>;
void add_plan_commands(CLI::App& app, Io io, const StepEngines& engines, CompareExecutorFactory compare_executor = {});
// `oom plan --compare-engine torch`: run by the plugin.
bool is_torch_compare(const std::vector<std::string>& args);

// Inside the plugin (cli/backend_main.cc and the cmd_* files it links).
void add_train_commands(CLI::App& app, Io io);
// A run's measured per-use device peaks (TrainResult::device_use_peak_bytes, MemoryUse order) as
// {"dispatch": GiB, ...} and as one line in MiB ("device peak by use (each its own): ...").
nlohmann::json device_use_peaks_json(const std::vector<std::int64_t>& peaks);
std::string device_use_peaks_line(const std::vector<std::int64_t>& peaks);
// `oom train --ranks P` (cli/cmd_train_ranks.cc): the options it adds to `train`, the hook the train
// command calls first (true when it ran the multi-rank trainer: --ranks, or a torchrun rank), and
// the hidden `rank-worker`.
struct TrainRanksOptions;
std::shared_ptr<TrainRanksOptions> add_train_ranks_options(CLI::App* train);
bool run_train_ranks(const backend::TrainOptions& options, const TrainRanksOptions& ranks, bool json, Io io);
void add_rank_worker_command(CLI::App& app, Io io);
// `oom eval` (backend plugin): the mean next-token loss of a checkpoint over a token file.
void add_eval_command(CLI::App& app, Io io);
// `oom device-facts` (hidden): the backend's GPUs as JSON, for `oom hardware probe`.
void add_device_facts_command(CLI::App& app, Io io);
// `oom calibrate --backend`: its options on the plugin's calibrate subcommand; the returned
// function runs it.
std::function<bool()> add_backend_calibration_options(CLI::App& calibrate, Io io);

// Writes `content` to `path` atomically, or to `io.out` when path is "-" or empty.
void emit(const std::string& path, const std::string& content, Io io);

}  // namespace oom::cli
