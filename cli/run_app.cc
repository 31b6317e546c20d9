// What every `oom` entry point does with a parsed command line: the exit codes of cli/cli.h and
// one line on `err` for whatever went wrong; options several commands share. Shared by the `oom` program and the backend plugin.
#include <cmath>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "cli/cli.h"
#include "costmodel/atomic_file.h"
#include "costmodel/input_error.h"
#include "costmodel/workload.h"
#include "planner/lowering/graph_size_estimate.h"
#include "planner/search/plan_search.h"

namespace oom::cli {

void emit(const std::string& path, const std::string& content, Io io) {
  if (path.empty() || path == "-") {
    io.out << content;
  } else {
    write_file_atomically(path, content);
  }
}

int run_app(CLI::App& app, const std::vector<std::string>& args, Io io) {
  // CLI11 parses argv in reverse order from a vector.
  std::vector<std::string> reversed(args.rbegin(), args.rend());
  set_max_stages_default(kDefaultMaxStages);  // a previous command's --max-stages does not carry over
  try {
    app.parse(reversed);
  } catch (const CLI::CallForHelp&) {
    io.out << app.help();
    return kExitOk;
  } catch (const CLI::CallForAllHelp&) {
    io.out << app.help("", CLI::AppFormatMode::All);
    return kExitOk;
  } catch (const CLI::ParseError& e) {
    // Subcommand help requests arrive as CallForHelp from the subcommand.
    io.err << "error: " << e.what() << " (see oom --help)\n";
    return kExitBadInput;
  } catch (const InputError& e) {
    io.err << "error: " << e.what() << "\n";
    return kExitBadInput;
  } catch (const InfeasibleWorkload& e) {
    io.err << "infeasible: " << e.what() << "\n";
    return kExitInfeasible;
  } catch (const std::exception& e) {
    io.err << "error: " << e.what() << "\n";
    return kExitInternal;
  }
  return kExitOk;
}

void add_nodes_option(CLI::App* cmd, std::optional<int>& nodes) {
  cmd->add_option("--nodes", nodes,
                  "Nodes of the workload's hardware (its node spec repeated, joined by its network; default: the "
                  "workload's \"nodes\", else the hardware's)");
}

void add_max_stages_option(CLI::App* cmd) {
  cmd->add_option_function<double>(
      "--max-stages",
      [](const double& n) {
        if (!std::isfinite(n) || n < 1) throw InputError("", "--max-stages", fmt::format("{}", n), "expected a stage count of at least 1");
        set_max_stages_default(n);
      },
      fmt::format("Most stages one lowered step graph may have before the command refuses it (default {:.0e}, about {:.0f} "
                  "GB of graph at {:.0f} B a stage)",
                  kDefaultMaxStages, kDefaultMaxStages * kBytesPerStage / 1e9, kBytesPerStage));
}

void apply_nodes_option(Workload& w, const std::optional<int>& nodes) {
  if (!nodes) return;
  if (*nodes < 1) throw InputError("", "--nodes", std::to_string(*nodes), "must be at least 1");
  w.nodes = *nodes;
}

}  // namespace oom::cli
