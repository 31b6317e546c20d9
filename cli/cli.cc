#include "cli/cli.h"

#include <CLI/CLI.hpp>

#include "planner/engine/step_engine.h"

#if defined(OOM_HAVE_SIMGRID_ENGINE) && __has_include("sim/simgrid_engine.h")
#include "sim/simgrid_engine.h"
#define OOM_CLI_SIMGRID 1
#endif

namespace oom::cli {
namespace {

// The engines of the `oom` command: the simulator's where it is built in.
StepEngines command_engines() {
#ifdef OOM_CLI_SIMGRID
  return simulator_engines();
#else
  return StepEngines();
#endif
}

}  // namespace

void start_process_services(const std::vector<std::string>& args) {
  if (is_backend_command(args)) return;
#ifdef OOM_CLI_SIMGRID
  sim::start_simulation_server();
#endif
}

int run(const std::vector<std::string>& args, Io io) {
  // Training and measuring commands belong to the LibTorch backend, loaded only for them.
  if (is_backend_command(args)) return run_backend(args, io);
  const StepEngines engines = command_engines();
  CLI::App app{"oom: offload-optimized full-parameter MoE training: plan, simulate, validate and train", "oom"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "Every command's help");
  app.set_version_flag("--version", [] { return version_text(); },
                       "The version, commit, compiler, backend, SimGrid, and the configs folder used");
  add_model_commands(app, io);
  add_memory_commands(app, io);
  add_simulate_commands(app, io, engines);
  add_plan_commands(app, io, engines);
  add_whatif_commands(app, io, engines);
  add_ablation_commands(app, io, engines);
  add_report_paper_commands(app, io, engines);
  add_plot_commands(app, io);
  add_diff_commands(app, io);
  add_hardware_commands(app, io);
  add_backend_command_stubs(app);
  return run_app(app, args, io);
}

}  // namespace oom::cli
