// `oom memory --workload W.json --plan P.json [--json] [-o FILE]` and
// `oom report [--workload W.json] [--plan P.json] [--json] [-o FILE]`.
#include <memory>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "cli/cli.h"
#include "costmodel/output_path.h"
#include "costmodel/params.h"
#include "costmodel/version.h"
#include "planner/engine/cost_report.h"
#include "planner/lowering/memory_report.h"

namespace oom::cli {
namespace {

struct PlanInputs {
  std::string workload_path;
  std::string plan_path;
  std::optional<int> nodes;
  bool json = false;
  std::string output;
};

// Checks the output, then loads and cross-checks the workload and plan; a missing path takes the
// default.
struct Loaded {
  WorkloadContext ctx;
  Plan plan;
};

Loaded load_inputs(const PlanInputs& in) {
  check_output_files({in.output}, {in.workload_path, in.plan_path});
  Workload w = in.workload_path.empty() ? default_workload() : load_workload(in.workload_path);
  apply_nodes_option(w, in.nodes);
  const std::string wfile = in.workload_path.empty() ? "(default workload)" : in.workload_path;
  Loaded l{resolve_workload(w, wfile), in.plan_path.empty() ? default_plan() : load_plan(in.plan_path)};
  validate_plan(l.plan, l.ctx.model, l.ctx.workload, in.plan_path.empty() ? "(default plan)" : in.plan_path);
  // What the lowering refuses (oom simulate), the static report refuses alike.
  if (l.plan.path == ExpertPath::kLocal) check_local_applies(l.ctx);
  return l;
}

std::string workload_line(const WorkloadContext& c, const Plan& p) {
  const Workload& w = c.workload;
  const ParamCount total = model_params(c.model).total();
  return fmt::format("{} ({:.2f}B params) on {} × {} ({}), global batch {}, {} tokens per sequence, plan: {} path, "
                     "{} resident, {} MoE-retained, routing chunk {}{}{}{}\n",
                     c.model.name, total / 1e9, w.gpus, c.hardware.gpu.name, c.hardware.name, w.global_batch, w.seq_len,
                     path_name(p.path), p.resident_layers.size(), p.moe_retained_layers.size(), p.routing_chunk_tokens,
                     p.ep_replicas(w.gpus) > 1 ? fmt::format(", EP groups of {} GPUs ({} replicas of each expert shard)",
                                                             p.ep_group(w.gpus), p.ep_replicas(w.gpus))
                                               : std::string(),
                     p.context_parallel() > 1 ? fmt::format(", each sequence over {} GPUs (ring attention)", p.context_parallel())
                                              : std::string(),
                     p.keep_attention_results ? ", O/LSE kept on host" : "");
}

void add_inputs(CLI::App* cmd, PlanInputs& in, bool required) {
  auto* w = cmd->add_option("--workload", in.workload_path, "Workload JSON (model, hardware, gpus, batch, context, budgets)");
  auto* p = cmd->add_option("--plan", in.plan_path, "Plan JSON (DESIGN.md format)");
  if (required) {
    w->required();
    p->required();
  }
  cmd->add_flag("--json", in.json, "Print one JSON object");
  cmd->add_option("-o,--output", in.output, "Write the output to this file (atomically) instead of stdout");
  add_nodes_option(cmd, in.nodes);
}

}  // namespace

void add_memory_commands(CLI::App& app, Io io) {
  auto mem_in = std::make_shared<PlanInputs>();
  auto* mem = app.add_subcommand("memory", "Static GPU and host memory of a plan: Eq. 2 terms and host per NUMA node");
  add_inputs(mem, *mem_in, true);
  mem->callback([=] {
    const Loaded l = load_inputs(*mem_in);
    const MemoryReport r = static_memory(l.ctx, l.plan);
    if (mem_in->json) {
      nlohmann::json j = memory_report_to_json(r);
      j["workload"] = workload_to_json(l.ctx.workload);
      j["plan"] = plan_to_json(l.plan);
      emit(mem_in->output, with_oom_version(j).dump(2) + "\n", io);
    } else {
      emit(mem_in->output, workload_line(l.ctx, l.plan) + memory_report_text(r), io);
    }
  });

  auto rep_in = std::make_shared<PlanInputs>();
  auto* rep = app.add_subcommand(
      "report", "Static cost and memory report of a workload and plan (default: Qwen3.6-35B-A3B, 4× H100, batch 32, 4K, R23)");
  add_inputs(rep, *rep_in, false);
  rep->callback([=] {
    const Loaded l = load_inputs(*rep_in);
    const StaticCost c = static_cost(l.ctx, l.plan);
    const MemoryReport r = static_memory(l.ctx, l.plan);
    if (rep_in->json) {
      nlohmann::json j;
      j["workload"] = workload_to_json(l.ctx.workload);
      j["plan"] = plan_to_json(l.plan);
      j["cost"] = static_cost_to_json(c);
      j["memory"] = memory_report_to_json(r);
      emit(rep_in->output, with_oom_version(j).dump(2) + "\n", io);
    } else {
      emit(rep_in->output, workload_line(l.ctx, l.plan) + static_cost_text(c, l.ctx) + memory_report_text(r), io);
    }
  });
}

}  // namespace oom::cli
