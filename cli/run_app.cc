// What every `oom` entry point does with a parsed command line: the exit codes of cli/cli.h and
// one line on `err` for whatever went wrong; options several commands share. Shared by the `oom` program and the backend plugin.
#include <cmath>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "cli/cli.h"
#include "costmodel/atomic_file.h"
#include "costmodel/input_error.h"
#include "costmodel/input_limits.h"
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

namespace {

// The deepest command the line chose: `app`, or the subcommand it parsed (and its own, ...).
const CLI::App* chosen_command(const CLI::App& app) {
  const std::vector<CLI::App*> chosen = app.get_subcommands();
  return chosen.empty() ? &app : chosen_command(*chosen.front());
}

// CLI11's message for `e`, or, where the chosen command needs a subcommand and the line gave a
// word that is none of them (`oom frobnicate`: CLI11 says only "A subcommand is required"), a line
// that names the word and the commands there are.
std::string parse_error_text(const CLI::App& app, const CLI::ParseError& e) {
  const CLI::App* command = chosen_command(app);
  const std::vector<std::string> words = command->remaining();
  if (command->get_require_subcommand_min() == 0 || !command->get_subcommands().empty() || words.empty()) {
    return std::string(e.what()) + " (see oom --help)";
  }
  std::vector<std::string> known;
  for (const CLI::App* sub : command->get_subcommands([](const CLI::App* a) { return !a->get_group().empty(); })) {
    known.push_back(sub->get_name());
  }
  const std::string path = command == &app ? "command" : command->get_name() + " command";
  return InputError("", path, "\"" + words.front() + "\"", fmt::format("unknown command (known: {})", fmt::join(known, ", "))).what();
}

}  // namespace

int run_app(CLI::App& app, const std::vector<std::string>& args, Io io) {
  // CLI11 parses argv in reverse order from a vector.
  std::vector<std::string> reversed(args.rbegin(), args.rend());
  set_max_stages_default(kDefaultMaxStages);  // a previous command's --max-stages does not carry over
  try {
    app.parse(reversed);
  } catch (const CLI::CallForHelp&) {
    io.out << app.help();
    return kExitOk;
  } catch (const CLI::CallForVersion& e) {
    io.out << e.what();
    return kExitOk;
  } catch (const CLI::CallForAllHelp&) {
    io.out << app.help("", CLI::AppFormatMode::All);
    return kExitOk;
  } catch (const CLI::ParseError& e) {
    // Subcommand help requests arrive as CallForHelp from the subcommand.
    io.err << "error: " << parse_error_text(app, e) << "\n";
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
  w.nodes = checked_node_count(*nodes, "", "--nodes");
}

}  // namespace oom::cli
