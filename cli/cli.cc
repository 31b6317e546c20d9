#include "cli/cli.h"

#include <iostream>

#include <CLI/CLI.hpp>

#include "costmodel/atomic_file.h"
#include "costmodel/input_error.h"
#include "planner/plan_search.h"

namespace oom::cli {

// `oom plan` (cmd_plan.cc).
void add_plan_commands(CLI::App& app, Io io);

void emit(const std::string& path, const std::string& content, Io io) {
  if (path.empty() || path == "-") {
    io.out << content;
  } else {
    write_file_atomically(path, content);
  }
}

int run(const std::vector<std::string>& args, Io io) {
  CLI::App app{"oom: offload-optimized full-parameter MoE training: plan, simulate, validate and train", "oom"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "Every command's help");
  add_model_commands(app, io);
  add_memory_commands(app, io);
  add_simulate_commands(app, io);
  add_plan_commands(app, io);
  add_whatif_commands(app, io);
  add_report_paper_commands(app, io);
  add_plot_commands(app, io);
  add_diff_commands(app, io);
#ifdef OOM_HAVE_BACKEND
  add_train_commands(app, io);
  add_rank_worker_command(app, io);
#endif

  // CLI11 parses argv in reverse order from a vector.
  std::vector<std::string> reversed(args.rbegin(), args.rend());
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

}  // namespace oom::cli
