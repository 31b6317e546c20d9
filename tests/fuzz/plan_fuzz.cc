// Plan JSON → Plan (plan_from_json), its round trip, validate_plan against four workloads of
// the project's configs (every layer kind, one to four GPUs), and the static cost and memory of
// each plan a workload accepts.
#include <cmath>

#include "costmodel/json_input.h"
#include "costmodel/workload.h"
#include "planner/engine/cost_report.h"
#include "planner/lowering/memory_report.h"
#include "planner/plan/plan.h"
#include "tests/fuzz/fuzz_support.h"

using namespace oom;

namespace {

const std::vector<WorkloadContext>& contexts() {
  static const std::vector<WorkloadContext> c = [] {
    std::vector<WorkloadContext> out;
    out.push_back(resolve_workload(default_workload(), "default"));  // Qwen3.6: GDN + full, 4× H100
    Workload w;
    w.model = "mixtral-8x7b";  // sliding window on every layer, 4× RTX 4090
    w.hardware = "rtx4090-node";
    w.gpus = 4;
    w.global_batch = 8;
    w.seq_len = 2048;
    out.push_back(resolve_workload(w, "mixtral"));
    w.model = "tiny-moe-gemma";  // sliding + global layers with their own KV heads, 1× H200
    w.hardware = "h200-node";
    w.gpus = 1;
    w.global_batch = 6;
    w.seq_len = 256;
    out.push_back(resolve_workload(w, "tiny-gemma"));
    w.model = "tiny-moe-qwen";
    w.global_batch = 4;
    w.seq_len = 512;
    out.push_back(resolve_workload(w, "tiny-qwen"));
    return out;
  }();
  return c;
}

}  // namespace

OOM_FUZZ_TARGET(plan) {
  const auto& ctxs = contexts();
  nlohmann::json j;
  if (!fuzz::accepts([&] { j = parse_json_text(std::string(input), "plan.json"); })) return;
  Plan p;
  if (!fuzz::accepts([&] { p = plan_from_json(j, "plan.json"); })) return;
  OOM_FUZZ_CHECK(plan_from_json(plan_to_json(p), "round-trip") == p);

  for (const WorkloadContext& ctx : ctxs) {
    if (!fuzz::accepts([&] { validate_plan(p, ctx.model, ctx.workload, "plan.json"); })) continue;
    for (int l : p.resident_layers) OOM_FUZZ_CHECK(l >= 0 && l < ctx.model.layers);
    const StaticCost c = static_cost(ctx, p);
    OOM_FUZZ_CHECK(std::isfinite(c.serial_s()) && c.lower_bound_s() >= 0 && c.lower_bound_s() <= c.serial_s());
    const MemoryReport r = static_memory(ctx, p);
    OOM_FUZZ_CHECK(r.gpu.eq2.total() > 0 && r.host_total() > 0);
  }
}
