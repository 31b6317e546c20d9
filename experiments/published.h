// Published points of a study: recorded step measurements (traces/records.h) matched to the rows
// of a study result, for `oom whatif --published` and `oom report-paper`.
//
// A step record matches a row when its workload names the same model, hardware, GPU count, global
// batch, sequence length and budgets, and
//   - a record with a "system" matches that baseline's column of the row;
//   - a record with a plan matches the row's OOM system (PlanVariant) when the plan is of that
//     kind: "search" any plan, "search:ep"/"search:local" a plan of that path, "base…" a Base plan
//     (EP with R = K = ∅; Local with no splits, every boundary on the host, O/LSE recomputed),
//     "ep:Rr/Kk" an EP plan with r resident and k retained decoders, "local:P" a Local plan whose
//     boundary policy is P.
// When several records match one cell, the fastest measured step is taken (the published
// system's configured plan rather than its ablations). Records no row covers are ignored;
// operator records are never matched. Errors are predicted / published − 1. Pure functions.
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "experiments/study.h"
#include "traces/records.h"

namespace oom {

// The Local boundary policy of a plan ("A", "B", "1+1", "3+1"), or "" when it is none of them.
std::string boundary_policy_of(const Plan& p);

// Does a record's plan count as the row system `v`'s plan?
bool published_plan_matches(const Plan& plan, const PlanVariant& v);

// Sets each row's published points from `records` (replacing earlier ones) and names `file` in
// the result. A record's plan that does not parse throws InputError naming its origin.
void attach_published(StudyResult& r, const RecordSet& records, const std::string& file);

// Step-time errors of the matched points: count, median and max |error|, the OOM plans and the
// baselines apart.
struct PublishedErrors {
  int plan_count = 0;
  double plan_median_abs = 0, plan_max_abs = 0;
  int baseline_count = 0;
  double baseline_median_abs = 0, baseline_max_abs = 0;
};
PublishedErrors published_errors(const StudyResult& r);
// "published (FILE): 6 OOM points, median |error| 2.0%, max 4.9%; 3 baseline points, ..."
std::string published_errors_text(const StudyResult& r);
nlohmann::json published_errors_to_json(const PublishedErrors& e);

// predicted / published − 1, or nullopt when either is missing or the published value is 0.
std::optional<double> relative_error(std::optional<double> predicted, std::optional<double> published);

}  // namespace oom
