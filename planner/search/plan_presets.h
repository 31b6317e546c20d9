// Plan presets: named configurations priced as they are, without the planners' search.
//
// "base" is the paper's Base configuration of each expert path (OOM Appendix C): what a path runs
// before Configure-then-Compare configures it, so that "Base vs Configured" (OOM Figure 4) shows
// what configuration buys.
//   - EP Base: no resident expert layers, no MoE-retained layers, the runtime's 64K-token routing
//     chunk, full delivery in 64 MiB transfer chunks, two CPU gradient slots (§B runtime settings;
//     the published record t4-b32-r0 is this plan: "same plan with no resident layers").
//   - Local Base: shard delivery in 256 MiB chunks, one CPU gradient slot, no operator splits,
//     every checkpoint boundary kept on the host, O/LSE recomputed (the published records
//     long-64k, long-128k and long-256k-default: "default operators").
// Pricing a fixed plan (price_fixed_plan) lowers it, runs the analytic evaluator and checks the
// workload's GPU and NUMA budgets against the simulated peaks. Units: seconds, bytes. Stateless;
// thread-safe.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "costmodel/workload.h"
#include "planner/calibration/calibration.h"
#include "planner/plan/plan.h"
#include "planner/search/plan_search.h"

namespace oom {

// The preset names `oom plan --preset` accepts: {"base"}.
std::vector<std::string> plan_preset_names();

// The preset's plan of `path` for the workload, or nullopt when the path does not apply (EP needs
// the experts to split evenly over the GPUs or, in EP groups, over the largest group of them that
// ep_group_candidates() names). Throws InputError naming "--preset" for an unknown preset.
std::optional<Plan> preset_plan(const std::string& preset, ExpertPath path, const WorkloadContext& ctx);

// Validates and prices `plan` on the workload as it is. Returns its choice (prediction, peaks), or
// throws InfeasibleWorkload with the one-line shortfall when a GPU or NUMA budget is exceeded,
// InputError when the plan does not fit the model or workload (validate_plan()).
PlanChoice price_fixed_plan(const Plan& plan, const WorkloadContext& ctx, const Calibration& calibration);

// The preset's plan of each requested path ("ep", "local" or "auto" = both), priced; the faster
// one that fits is chosen, the other is the alternative (no short executions: compare_engine "").
// Throws InfeasibleWorkload when no requested path's preset fits (the closest shortfall) or none
// applies, InputError for an unknown preset or path.
PlanSearchResult preset_plan_search(const std::string& preset, const WorkloadContext& ctx, const Calibration& calibration,
                                    const std::string& path = "auto");

}  // namespace oom
