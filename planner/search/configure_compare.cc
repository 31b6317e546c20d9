#include "planner/search/configure_compare.h"

#include <algorithm>
#include <cmath>

#include "costmodel/input_error.h"
#include "planner/search/ep_planner.h"
#include "planner/search/plan_pricing.h"

namespace oom {
namespace {

Bytes max_of(const std::vector<Bytes>& v) { return v.empty() ? 0 : *std::max_element(v.begin(), v.end()); }

}  // namespace

ShortExecutionEstimate estimate_by_short_executions(Executor& executor, const Plan& plan, const WorkloadContext& ctx) {
  const int L = ctx.model.layers;
  const int u = repeating_unit_layers(ctx.model);
  ShortExecutionEstimate e;
  e.unit_layers = u;
  auto run = [&](const Plan& p, int layers) {
    const Measurement m = executor.run(p, ctx, {layers});
    ++e.executions;
    e.gpu_peak_bytes = std::max(e.gpu_peak_bytes, max_of(m.gpu_peak_bytes));
    return m.step_s;
  };
  if (2 * u >= L) {
    e.full_depth = true;
    e.step_s = run(plan, 0);
    return e;
  }
  const bool ep = plan.path == ExpertPath::kEp;
  // EP: the streamed baseline of the unit runs; residency and retention come from their own runs.
  Plan base = plan;
  if (ep) {
    base.resident_layers.clear();
    base.moe_retained_layers.clear();
  }
  e.one_unit_s = run(base, u);
  e.two_units_s = run(base, 2 * u);
  const Seconds per_unit = e.two_units_s - e.one_unit_s;
  const Seconds fixed = e.one_unit_s - per_unit;
  e.step_s = fixed + static_cast<double>(L) / u * per_unit;
  if (ep && (!plan.resident_layers.empty() || !plan.moe_retained_layers.empty())) {
    // The plan's resident/retained share over two units, once more: residency pays off through
    // what it overlaps (CPU updates of streamed layers under resident layers' GPU work), so the
    // share runs interleaved as in the plan rather than as a unit of only resident layers.
    const int n = 2 * u;
    const auto share = [&](std::size_t count) {
      if (count == 0) return 0;
      return std::clamp(static_cast<int>(std::lround(static_cast<double>(count) * n / L)), 1, n);
    };
    const int r = share(plan.resident_layers.size()), k = share(plan.moe_retained_layers.size());
    Plan s = base;
    s.resident_layers = interleaved_resident_set(n, r);
    s.moe_retained_layers = retained_set(n, k);
    e.share_units_s = run(s, n);
    const double scale = static_cast<double>(plan.resident_layers.size() + plan.moe_retained_layers.size()) / (r + k);
    e.step_s += scale * (e.share_units_s - e.two_units_s);
  }
  return e;
}

CompareResult configure_then_compare(Executor& executor, const std::vector<Plan>& configured, const WorkloadContext& ctx) {
  OOM_ASSERT(!configured.empty(), "Configure-then-Compare needs a configured plan");
  CompareResult r;
  for (const Plan& p : configured) r.estimates.push_back(estimate_by_short_executions(executor, p, ctx));
  for (std::size_t i = 1; i < r.estimates.size(); ++i) {
    if (r.estimates[i].step_s < r.estimates[r.winner].step_s) r.winner = i;
  }
  return r;
}

}  // namespace oom
