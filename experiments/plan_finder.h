// The plan search as a study's PlanFinder (experiments/study.h): planner/plan_search.h's
// search_plan() with the workload hardware's calibration, its chosen plan summarized for tables.
#pragma once

#include "experiments/study.h"

namespace oom {

// Searches the best plan of `ctx` (path "auto"). Throws std::runtime_error with the one-line
// reason when no plan fits (InfeasibleWorkload), InputError for bad input.
StudyPlan find_plan_by_search(const WorkloadContext& ctx);

}  // namespace oom
