// `oom plan --workload W.json [--path ep|local|auto] [--preset base] [--gpu-budget-gib X]
//  [--host-budget-gib Y] [--compare-engine analytic|simgrid|torch] [-o plan.json] [--json]`: the plan
// search of planner/search/plan_search.h (Configure-then-Compare by short executions of the named
// StepEngine, or with "torch" by real one- and two-unit runs of the LibTorch backend on this
// machine: the backend plugin runs that form of the command, cli/backend_main.cc), or with --preset a named configuration priced as it is
// (planner/search/plan_presets.h: "base", the paper's Base plans). Prints the chosen plan with its
// prediction and the best plan of the other
// path; `-o` writes the chosen plan (Plan JSON) atomically. An infeasible workload exits 3 with one
// line naming the budget that fails, by how much and where.
#include <algorithm>
#include <memory>
#include <optional>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "cli/cli.h"
#include "costmodel/input_error.h"
#include "costmodel/input_limits.h"
#include "costmodel/output_path.h"
#include "costmodel/version.h"
#include "planner/engine/step_engine.h"
#include "planner/search/plan_presets.h"
#include "planner/search/plan_search.h"

namespace oom::cli {
namespace {

struct PlanArgs {
  std::string workload_path, path = "auto", compare_engine = "analytic", output, preset;
  std::optional<double> gpu_budget_gib, host_budget_gib;
  std::optional<int> nodes;
  bool json = false, no_flat = false, measure_memory = false;
};

}  // namespace

void add_plan_commands(CLI::App& app, Io io, const StepEngines& engines, CompareExecutorFactory compare_executor) {
  auto a = std::make_shared<PlanArgs>();
  // The short executions run on the engine that models contention where it is offered.
  if (engines.has("simgrid")) a->compare_engine = "simgrid";
  auto* c = app.add_subcommand("plan", "Search the fastest plan that fits the GPU and host budgets (EP, Local, or both compared)");
  add_max_stages_option(c);
  c->add_option("--workload", a->workload_path, "Workload JSON")->required();
  c->add_option("--path", a->path, "Expert path: ep | local | auto (configure both, compare by short executions)");
  c->add_option("--preset", a->preset,
                fmt::format("Price a named configuration instead of searching: {} (the paper's Base plans; with --path auto the faster that fits)",
                            fmt::join(plan_preset_names(), " | ")));
  c->add_option("--gpu-budget-gib", a->gpu_budget_gib, "GPU memory budget per GPU in GiB (default: the workload's, else HBM)");
  c->add_option("--host-budget-gib", a->host_budget_gib, "Host memory budget per node in GiB (default: the workload's, else DRAM)");
  add_nodes_option(c, a->nodes);
  c->add_option("--compare-engine", a->compare_engine,
                fmt::format("Engine of the short executions: {} | torch (real runs with the LibTorch backend, one rank); "
                            "default simgrid where built in, else analytic",
                            fmt::join(engines.names(), " | ")));
  c->add_flag("--measure-memory", a->measure_memory,
              "With --compare-engine torch: hold each configured plan's GPU peak, as its short executions measure it, to the GPU "
              "budget, and configure again under a tighter model budget when every plan measures over it (on a CPU the device "
              "side is emulated with BF16 weights, M_0 = epsilon = 0)");
  c->add_option("-o,--output", a->output, "Write the chosen plan (Plan JSON) to this file (atomically)");
  c->add_flag("--json", a->json, "Print one JSON object");
  c->add_flag("--no-flat", a->no_flat,
              "Plan without FLAT's schedules (PipelinedLLEP, Ring-DTP, SCO, OffloadStreamAdamW)");
  c->callback([=, compare_executor = std::move(compare_executor)] {
    check_output_files({a->output}, {a->workload_path});
    if (a->path != "ep" && a->path != "local" && a->path != "auto") {
      throw InputError("", "--path", "\"" + a->path + "\"", "expected ep, local or auto");
    }
    if (!a->preset.empty()) {
      const auto names = plan_preset_names();
      if (std::find(names.begin(), names.end(), a->preset) == names.end()) {
        throw InputError("", "--preset", "\"" + a->preset + "\"", fmt::format("unknown preset (known: {})", fmt::join(names, ", ")));
      }
    }
    std::unique_ptr<Executor> executor = compare_executor ? compare_executor(a->compare_engine, a->measure_memory) : nullptr;
    if (!executor && !engines.has(a->compare_engine)) {
      throw InputError("", "--compare-engine", "\"" + a->compare_engine + "\"", "unknown engine");
    }
    if (a->measure_memory && !executor) {
      throw InputError("", "--measure-memory", "true", "needs an executor that measures: --compare-engine torch");
    }
    if (a->measure_memory && !a->preset.empty()) {
      throw InputError("", "--measure-memory", "true", "a --preset is priced as it is, not searched");
    }
    Workload w = load_workload(a->workload_path);
    apply_nodes_option(w, a->nodes);
    WorkloadContext ctx = resolve_workload(w, a->workload_path);
    // The options replace the workload's budgets and are checked as its budgets are, naming the option.
    if (a->gpu_budget_gib) ctx.workload.gpu_budget_gib = a->gpu_budget_gib;
    if (a->host_budget_gib) ctx.workload.host_budget_gib = a->host_budget_gib;
    check_budgets(ctx, "", "--gpu-budget-gib", "--host-budget-gib");
    PlanSearchOptions options;
    options.path = a->path;
    options.compare_engine = a->compare_engine;
    options.engines = engines;
    options.compare_executor = executor.get();
    options.flat = !a->no_flat;
    options.hold_measured_gpu_peak = a->measure_memory;
    if (executor) {
      if (const auto m = executor->device_memory_constants()) options.memory = *m;
    }
    const PlanSearchResult r = a->preset.empty() ? search_plan(ctx, load_calibration_for(ctx.hardware), options)
                                                 : preset_plan_search(a->preset, ctx, load_calibration_for(ctx.hardware), a->path);
    if (!a->output.empty()) emit(a->output, with_oom_version(plan_to_json(r.chosen.plan)).dump(2) + "\n", io);
    if (a->json) {
      nlohmann::json j = plan_search_to_json(r);
      j["workload"] = workload_to_json(ctx.workload);
      if (!a->preset.empty()) j["preset"] = a->preset;
      io.out << with_oom_version(j).dump(2) << "\n";
    } else {
      io.out << fmt::format("{} on {} × {}, global batch {}, {} tokens per sequence\n", ctx.model.name, w.gpus,
                            ctx.hardware.gpu.name, w.global_batch, w.seq_len)
             << (a->preset.empty() ? "" : fmt::format("preset {} (priced as it is, not searched)\n", a->preset))
             << plan_search_text(r);
    }
  });
}

}  // namespace oom::cli
