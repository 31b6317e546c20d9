#include "experiments/published.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace oom {
namespace {

bool same_workload(const Workload& a, const Workload& b) {
  return a.model == b.model && a.hardware == b.hardware && a.gpus == b.gpus && a.global_batch == b.global_batch &&
         a.seq_len == b.seq_len && a.gpu_budget_gib == b.gpu_budget_gib && a.host_budget_gib == b.host_budget_gib;
}

bool is_base_plan(const Plan& p) {
  if (p.path == ExpertPath::kEp) return p.resident_layers.empty() && p.moe_retained_layers.empty();
  return p.split == SplitSpec{} && !p.keep_attention_results && p.boundaries.host_kept_all && p.boundaries.gpu_held.empty();
}

// Keeps the fastest measured step of the candidates for one cell.
void keep_fastest(std::optional<PublishedPoint>& cell, const StepRecord& rec) {
  if (!rec.measured.step_s) return;
  if (!cell || !cell->measured.step_s || *rec.measured.step_s < *cell->measured.step_s) cell = PublishedPoint{rec.id, rec.measured};
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

std::optional<double> relative_error(std::optional<double> predicted, std::optional<double> published) {
  if (!predicted || !published || *published == 0) return std::nullopt;
  return *predicted / *published - 1.0;
}

std::string boundary_policy_of(const Plan& p) {
  if (p.path != ExpertPath::kLocal || !p.boundaries.gpu_held.empty()) return "";
  if (p.boundaries.host_kept_all) return p.keep_attention_results ? "B" : "A";
  if (!p.keep_attention_results || p.boundaries.host_kept.empty()) return "";
  const auto& kept = p.boundaries.host_kept;
  const int every = kept.size() > 1 ? kept[1] - kept[0] : 0;
  if (kept[0] != 0 || (every != 2 && every != 4)) return "";
  for (std::size_t i = 1; i < kept.size(); ++i) {
    if (kept[i] - kept[i - 1] != every) return "";
  }
  return every == 2 ? "1+1" : "3+1";
}

bool published_plan_matches(const Plan& plan, const PlanVariant& v) {
  const bool path_ok = v.path == "auto" || v.path == path_name(plan.path);
  switch (v.kind) {
    case PlanVariant::Kind::kSearch:
      return path_ok;
    case PlanVariant::Kind::kBase:
      return path_ok && is_base_plan(plan);
    case PlanVariant::Kind::kEpGrid:
      return plan.path == ExpertPath::kEp && static_cast<int>(plan.resident_layers.size()) == v.resident_layers &&
             static_cast<int>(plan.moe_retained_layers.size()) == v.retained_layers;
    case PlanVariant::Kind::kLocalPolicy:
      return boundary_policy_of(plan) == v.policy;
  }
  return false;
}

void attach_published(StudyResult& r, const RecordSet& records, const std::string& file) {
  // Parse every record's plan once (a bad plan is bad input even when no row would match it).
  std::vector<std::optional<Plan>> plans;
  for (const StepRecord& rec : records.steps) {
    plans.push_back(rec.plan.is_null() ? std::nullopt : std::optional<Plan>(plan_from_json(rec.plan, rec.origin, "plan")));
  }
  for (StudyRow& row : r.rows) {
    row.published.reset();
    row.published_baselines.assign(r.spec.baselines.size(), std::nullopt);
    for (std::size_t i = 0; i < records.steps.size(); ++i) {
      const StepRecord& rec = records.steps[i];
      if (!same_workload(rec.workload, row.study_case.workload)) continue;
      if (plans[i]) {
        if (published_plan_matches(*plans[i], row.study_case.system)) keep_fastest(row.published, rec);
        continue;
      }
      for (std::size_t b = 0; b < r.spec.baselines.size(); ++b) {
        if (baseline_system_name(r.spec.baselines[b]) == rec.system) keep_fastest(row.published_baselines[b], rec);
      }
    }
  }
  r.published_file = file;
}

PublishedErrors published_errors(const StudyResult& r) {
  std::vector<double> plan, base;
  for (const StudyRow& row : r.rows) {
    if (row.published && row.plan) {
      if (const auto e = relative_error(row.plan->step_s, row.published->measured.step_s)) plan.push_back(std::abs(*e));
    }
    for (std::size_t b = 0; b < row.published_baselines.size() && b < row.baselines.size(); ++b) {
      const auto& p = row.published_baselines[b];
      if (!p || !row.baselines[b].fits()) continue;
      if (const auto e = relative_error(row.baselines[b].step_s, p->measured.step_s)) base.push_back(std::abs(*e));
    }
  }
  PublishedErrors e;
  e.plan_count = static_cast<int>(plan.size());
  e.plan_median_abs = median(plan);
  e.plan_max_abs = plan.empty() ? 0 : *std::max_element(plan.begin(), plan.end());
  e.baseline_count = static_cast<int>(base.size());
  e.baseline_median_abs = median(base);
  e.baseline_max_abs = base.empty() ? 0 : *std::max_element(base.begin(), base.end());
  return e;
}

std::string published_errors_text(const StudyResult& r) {
  const PublishedErrors e = published_errors(r);
  auto part = [](int n, double med, double max, const char* what) {
    if (n == 0) return fmt::format("no {} points", what);
    return fmt::format("{} {} point{}, median |error| {:.1f}%, max {:.1f}%", n, what, n == 1 ? "" : "s", 100 * med, 100 * max);
  };
  return fmt::format("published ({}): {}; {}", r.published_file, part(e.plan_count, e.plan_median_abs, e.plan_max_abs, "OOM"),
                     part(e.baseline_count, e.baseline_median_abs, e.baseline_max_abs, "baseline"));
}

nlohmann::json published_errors_to_json(const PublishedErrors& e) {
  return {{"plan_count", e.plan_count},
          {"plan_median_abs_rel_error", e.plan_median_abs},
          {"plan_max_abs_rel_error", e.plan_max_abs},
          {"baseline_count", e.baseline_count},
          {"baseline_median_abs_rel_error", e.baseline_median_abs},
          {"baseline_max_abs_rel_error", e.baseline_max_abs}};
}

}  // namespace oom
