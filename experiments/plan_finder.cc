#include "experiments/plan_finder.h"

#include "planner/calibration.h"
#include "planner/plan_search.h"

namespace oom {

StudyPlan find_plan_by_search(const WorkloadContext& ctx) {
  const PlanSearchResult r = search_plan(ctx, load_calibration_for(ctx.hardware));
  StudyPlan p;
  p.plan = r.chosen.plan;
  p.summary = plan_summary(r.chosen.plan);
  p.step_s = r.chosen.predicted_step_s;
  p.tokens_per_s = r.chosen.tokens_per_s;
  p.gpu_peak_bytes = r.chosen.gpu_peak_bytes;
  p.host_bytes_per_numa = r.chosen.host_bytes_per_numa;
  return p;
}

}  // namespace oom
