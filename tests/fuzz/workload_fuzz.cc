// Workload JSON → Workload (workload_from_json), its round trip, resolve_workload against the
// project's configs (model and hardware by name or path), and the static cost and memory of
// three plans (the default R23 EP plan, EP with no resident layers, the Local path) where they
// fit the workload.
#include <cmath>

#include "costmodel/json_input.h"
#include "costmodel/workload.h"
#include "planner/engine/cost_report.h"
#include "planner/lowering/memory_report.h"
#include "planner/plan/plan.h"
#include "tests/fuzz/fuzz_support.h"

using namespace oom;

OOM_FUZZ_TARGET(workload) {
  nlohmann::json j;
  if (!fuzz::accepts([&] { j = parse_json_text(std::string(input), "workload.json"); })) return;
  Workload w;
  if (!fuzz::accepts([&] { w = workload_from_json(j, "workload.json"); })) return;
  OOM_FUZZ_CHECK(w.gpus > 0 && (w.global_batch % w.gpus == 0 || w.gpus % w.global_batch == 0));
  OOM_FUZZ_CHECK(w.seq_len % w.gpus_per_seq() == 0 && w.tokens_per_gpu() * w.gpus == w.global_batch * w.seq_len);
  OOM_FUZZ_CHECK(workload_from_json(workload_to_json(w), "round-trip") == w);

  WorkloadContext ctx;
  if (!fuzz::accepts([&] { ctx = resolve_workload(w, "workload.json"); })) return;
  OOM_FUZZ_CHECK(ctx.workload.gpus <= ctx.hardware.total_gpus());
  OOM_FUZZ_CHECK(ctx.gpu_budget_bytes() > 0 && ctx.host_budget_bytes() > 0);

  static const std::vector<Plan> plans = [] {
    Plan r23 = default_plan();
    Plan ep = r23;
    ep.resident_layers.clear();
    Plan local = ep;
    local.path = ExpertPath::kLocal;
    local.param_transfer = ParamTransfer::kShard;
    return std::vector<Plan>{r23, ep, local};
  }();
  for (Plan plan : plans) {
    // A workload with fewer sequences than GPUs: the EP plans split each sequence over its GPUs.
    if (plan.path == ExpertPath::kEp && ctx.workload.gpus_per_seq() > 1) plan.context_parallel_gpus = ctx.workload.gpus_per_seq();
    if (!fuzz::accepts([&] { validate_plan(plan, ctx.model, ctx.workload, "plan.json"); })) continue;
    const StaticCost c = static_cost(ctx, plan);
    OOM_FUZZ_CHECK(std::isfinite(c.serial_s()) && c.lower_bound_s() >= 0 && c.lower_bound_s() <= c.serial_s());
    const MemoryReport r = static_memory(ctx, plan);
    OOM_FUZZ_CHECK(r.gpu.eq2.total() > 0 && r.host_total() > 0);
    // A line per host NUMA node of every node the ranks occupy.
    OOM_FUZZ_CHECK(static_cast<int>(r.host.size()) == ctx.hardware.host_numa_count(ctx.workload.gpus));
  }
}
