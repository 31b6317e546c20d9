// The plan search as a study's PlanFinder (experiments/study.h): each OOM system of a sweep
// (PlanVariant) answered with the workload hardware's calibration, its plan summarized for tables.
#pragma once

#include "experiments/study.h"

namespace oom {

// The plan of `system` for `ctx`: the plan search (planner/search/plan_search.h) over its path(s), a
// Base preset (planner/search/plan_presets.h), an EP plan of the R/K grid, or the Local search's
// operator splits with a named boundary policy; fixed plans are priced as they are and checked
// against the budgets. Throws std::runtime_error with the one-line reason when no plan fits
// (InfeasibleWorkload), InputError for bad input. Thread-safe (the Local split cache is locked).
StudyPlan find_plan_by_search(const WorkloadContext& ctx, const PlanVariant& system);

}  // namespace oom
