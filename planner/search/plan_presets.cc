#include "planner/search/plan_presets.h"

#include <algorithm>

#include <fmt/format.h>

#include "costmodel/input_error.h"
#include "planner/search/ep_planner.h"
#include "planner/search/plan_pricing.h"

namespace oom {
namespace {

// Runtime settings of the Base plans (OOM §B and Appendix C; the published records' plans).
constexpr std::int64_t kBaseRoutingChunkTokens = 65536;
constexpr std::int64_t kBaseEpTransferChunkMib = 64;
constexpr int kBaseEpCpuGradSlots = 2;
constexpr std::int64_t kBaseLocalTransferChunkMib = 256;
constexpr int kBaseLocalCpuGradSlots = 1;

}  // namespace

std::vector<std::string> plan_preset_names() { return {"base"}; }

std::optional<Plan> preset_plan(const std::string& preset, ExpertPath path, const WorkloadContext& ctx) {
  if (preset != "base") {
    throw InputError("", "--preset", "\"" + preset + "\"", fmt::format("unknown preset (known: {})", fmt::join(plan_preset_names(), ", ")));
  }
  Plan p;
  p.path = path;
  if (path == ExpertPath::kEp) {
    const std::vector<int> groups = ctx.workload.gpus > 0 ? ep_group_candidates(ctx) : std::vector<int>{};
    if (groups.empty()) return std::nullopt;
    p.param_transfer = ParamTransfer::kFull;
    p.routing_chunk_tokens = kBaseRoutingChunkTokens;
    p.transfer_chunk_mib = kBaseEpTransferChunkMib;
    p.cpu_grad_slots = kBaseEpCpuGradSlots;
    p.notes = "Base EP: R0/K0, 64K routing chunk, full delivery";
    if (groups.front() < ctx.workload.gpus) {  // the experts do not split over every GPU
      p.ep_group_gpus = groups.front();
      p.notes += fmt::format(", EP groups of {} GPUs", groups.front());
    }
    if (ctx.workload.gpus_per_seq() > 1) {
      p.context_parallel_gpus = ctx.workload.gpus_per_seq();
      p.notes += fmt::format(", each sequence over {} GPUs", p.context_parallel_gpus);
    }
  } else {
    if (ctx.workload.gpus_per_seq() > 1) return std::nullopt;  // whole sequences per GPU only
    p.param_transfer = ParamTransfer::kShard;
    p.transfer_chunk_mib = kBaseLocalTransferChunkMib;
    p.cpu_grad_slots = kBaseLocalCpuGradSlots;
    p.notes = "Base Local: no operator splits, every boundary on the host, O/LSE recomputed, shard delivery";
  }
  return p;
}

PlanChoice price_fixed_plan(const Plan& plan, const WorkloadContext& ctx, const Calibration& calibration) {
  validate_plan(plan, ctx.model, ctx.workload, "plan");
  const PlanPricer pricer(ctx, calibration);
  const PricedPlan priced = pricer.price(plan);
  const auto shortfall = check_budgets(workload_budgets(ctx), priced.gpu_peak_max(), priced.numa_peak_bytes,
                                       fmt::format("the {} plan's step", path_name(plan.path)), "the plan's host state and pools");
  if (shortfall) throw InfeasibleWorkload(shortfall->message(), shortfall->space());
  return plan_choice_of(priced, pricer);  // with the peak's composition and the peak that binds
}

PlanSearchResult preset_plan_search(const std::string& preset, const WorkloadContext& ctx, const Calibration& calibration,
                                    const std::string& path) {
  if (path != "ep" && path != "local" && path != "auto") {
    throw InputError("", "--path", "\"" + path + "\"", "expected ep, local or auto");
  }
  std::vector<ExpertPath> paths;
  if (path != "local") paths.push_back(ExpertPath::kEp);
  if (path != "ep") paths.push_back(ExpertPath::kLocal);
  std::vector<PlanChoice> fitting;
  std::vector<std::string> reasons, spaces;
  int priced = 0;
  for (const ExpertPath p : paths) {
    const std::optional<Plan> plan = preset_plan(preset, p, ctx);
    if (!plan) {
      reasons.push_back(p == ExpertPath::kEp
                            ? fmt::format("the EP path needs the {} experts of {} to split evenly over {} GPUs",
                                          ctx.model.moe.experts, ctx.model.name, ctx.workload.gpus)
                            : fmt::format("the Local path runs whole sequences per GPU, not one sequence over {} GPUs",
                                          ctx.workload.gpus_per_seq()));
      continue;
    }
    try {
      ++priced;
      fitting.push_back(price_fixed_plan(*plan, ctx, calibration));
    } catch (const InfeasibleWorkload& e) {
      reasons.push_back(fmt::format("{} {}: {}", preset, path_name(p), e.what()));
      spaces.push_back(e.space());
    }
  }
  // The memory that runs out, when every path that applies runs out of the same one.
  const bool one_space = !spaces.empty() && spaces.size() == reasons.size() &&
                         std::all_of(spaces.begin(), spaces.end(), [&](const std::string& x) { return x == spaces.front(); });
  if (fitting.empty()) throw InfeasibleWorkload(fmt::format("{}", fmt::join(reasons, "; ")), one_space ? spaces.front() : "");
  std::sort(fitting.begin(), fitting.end(),
            [](const PlanChoice& a, const PlanChoice& b) { return a.predicted_step_s < b.predicted_step_s; });
  PlanSearchResult r;
  r.chosen = fitting.front();
  r.alternatives.assign(fitting.begin() + 1, fitting.end());
  r.candidates_priced = priced;
  return r;
}

}  // namespace oom
