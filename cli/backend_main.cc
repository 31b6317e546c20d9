// The entry point of the LibTorch backend plugin, liboom_torch.so (cli/cli.h): `oom train`,
// `oom eval`, `oom rank-worker`, `oom calibrate --backend` and `oom plan --compare-engine torch`,
// parsed and run with the `oom` program's exit codes.
#include <CLI/CLI.hpp>

#include "backend/measure/torch_executor.h"
#include "cli/cli.h"
#include "planner/engine/step_engine.h"

extern "C" __attribute__((visibility("default"))) int oom_backend_main(const std::vector<std::string>* args,
                                                                      std::ostream* out, std::ostream* err) {
  using namespace oom::cli;
  const Io io{*out, *err};
  CLI::App app{"oom: training and measuring with the LibTorch backend", "oom"};
  app.require_subcommand(1);
  add_train_commands(app, io);
  add_rank_worker_command(app, io);
  add_eval_command(app, io);
  add_device_facts_command(app, io);
  // The plugin does not link the simulator: its `oom plan` offers the analytic engine and "torch".
  add_plan_commands(app, io, oom::StepEngines(), [](const std::string& name, bool measure_memory) -> std::unique_ptr<oom::Executor> {
    if (name != "torch") return nullptr;
    oom::backend::TorchExecutorOptions o;
    o.device_memory = measure_memory;
    return std::make_unique<oom::backend::TorchExecutor>(o);
  });
  auto* calibrate = app.add_subcommand("calibrate", "Measure this machine with the LibTorch backend and fit its constants");
  const auto backend = add_backend_calibration_options(*calibrate, io);
  calibrate->callback([backend] { backend(); });
  return run_app(app, *args, io);
}
