#include "experiments/plan_finder.h"

#include <map>
#include <mutex>

#include <fmt/format.h>

#include "planner/calibration/calibration.h"
#include "planner/search/plan_presets.h"
#include "planner/search/ep_planner.h"
#include "planner/search/plan_search.h"

namespace oom {
namespace {

StudyPlan study_plan_of(const PlanChoice& c) {
  StudyPlan p;
  p.plan = c.plan;
  p.summary = plan_summary(c.plan);
  p.step_s = c.predicted_step_s;
  p.tokens_per_s = c.tokens_per_s;
  p.gpu_peak_bytes = c.gpu_peak_bytes;
  p.host_bytes_per_numa = c.host_bytes_per_numa;
  return p;
}

// The Local search's plan of a workload, searched once for all boundary policies of a sweep.
Plan local_search_plan(const WorkloadContext& ctx, const Calibration& calibration) {
  static std::mutex mutex;
  static std::map<std::string, Plan> cache;
  const std::string key = workload_to_json(ctx.workload).dump();
  {
    const std::lock_guard<std::mutex> lock(mutex);
    if (const auto it = cache.find(key); it != cache.end()) return it->second;
  }
  PlanSearchOptions options;
  options.path = "local";
  const Plan plan = search_plan(ctx, calibration, options).chosen.plan;
  const std::lock_guard<std::mutex> lock(mutex);
  cache.emplace(key, plan);
  return plan;
}

}  // namespace

StudyPlan find_plan_by_search(const WorkloadContext& ctx, const PlanVariant& system) {
  const Calibration calibration = load_calibration_for(ctx.hardware);
  const int layers = ctx.model.layers;
  switch (system.kind) {
    case PlanVariant::Kind::kSearch: {
      PlanSearchOptions options;
      options.path = system.path;
      options.flat = system.flat;
      return study_plan_of(search_plan(ctx, calibration, options).chosen);
    }
    case PlanVariant::Kind::kBase:
      return study_plan_of(preset_plan_search("base", ctx, calibration, system.path).chosen);
    case PlanVariant::Kind::kEpGrid: {
      if (system.resident_layers > layers || system.retained_layers > layers) {
        throw InfeasibleWorkload(fmt::format("{} has {} decoders, fewer than R{}/K{}", ctx.model.name, layers,
                                             system.resident_layers, system.retained_layers));
      }
      std::optional<Plan> plan = preset_plan("base", ExpertPath::kEp, ctx);
      if (!plan) {
        throw InfeasibleWorkload(fmt::format("the EP path needs the {} experts of {} to split evenly over the {} GPUs or an EP group of them",
                                             ctx.model.moe.experts, ctx.model.name, ctx.workload.gpus));
      }
      plan->resident_layers = interleaved_resident_set(layers, system.resident_layers);
      plan->moe_retained_layers = retained_set(layers, system.retained_layers);
      plan->notes = fmt::format("R{}/K{} (interleaved resident set, last decoders retained)", system.resident_layers,
                                system.retained_layers);
      return study_plan_of(price_fixed_plan(*plan, ctx, calibration));
    }
    case PlanVariant::Kind::kLocalPolicy: {
      Plan plan = with_boundary_policy(local_search_plan(ctx, calibration), system.policy, layers);
      plan.notes = fmt::format("the Local search's operator splits with boundary policy {}", system.policy);
      return study_plan_of(price_fixed_plan(plan, ctx, calibration));
    }
  }
  throw InfeasibleWorkload("unknown OOM system");
}

}  // namespace oom
