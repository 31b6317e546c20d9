// The `oom` command: parses arguments and dispatches to the libraries.
//
// run() is main() without the process: tests call it with string streams. Exit codes:
// 0 success, 2 bad input (one line on `err` naming file, field and value; nothing written),
// 3 an infeasible workload (later: `oom plan`), 1 an internal error.
#pragma once

#include <functional>
#include <iosfwd>
#include <string>
#include <vector>

namespace CLI {
class App;
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
void add_diff_commands(CLI::App& app, Io io);
void add_train_commands(CLI::App& app, Io io);  // only with the LibTorch backend (OOM_HAVE_BACKEND)
// `oom calibrate --backend`: adds its options to the calibrate subcommand and returns what the
// subcommand's callback runs first (true when --backend was given and ran). Backend builds only.
std::function<bool()> add_backend_calibration(CLI::App& calibrate, Io io);

// Writes `content` to `path` atomically, or to `io.out` when path is "-" or empty.
void emit(const std::string& path, const std::string& content, Io io);

}  // namespace oom::cli
