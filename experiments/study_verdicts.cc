// Capacity verdicts of a study (experiments/study.h): the published ones a sweep states beside
// the ones its rows predict.
#include <algorithm>

#include <fmt/format.h>

#include "experiments/study.h"

namespace oom {
namespace {

const StudySweep* sweep_of(const StudySpec& s, const std::string& name) {
  for (const auto& w : s.sweeps) {
    if (w.name == name) return &w;
  }
  return nullptr;
}

std::string peaks_text(Bytes gpu, Bytes host) { return fmt::format("GPU {:.1f} GiB, host {:.1f} GiB", to_gib(gpu), to_gib(host)); }

}  // namespace

std::string capacity_name(Capacity c) {
  switch (c) {
    case Capacity::kFits:
      return "fits";
    case Capacity::kGpu:
      return "gpu";
    case Capacity::kHost:
      return "host";
  }
  return "fits";
}

std::optional<Capacity> capacity_from_name(const std::string& name) {
  for (const Capacity c : {Capacity::kFits, Capacity::kGpu, Capacity::kHost}) {
    if (capacity_name(c) == name) return c;
  }
  return std::nullopt;
}

bool states_verdicts(const StudySpec& s) {
  return std::any_of(s.sweeps.begin(), s.sweeps.end(), [](const StudySweep& w) { return !w.verdicts.empty(); });
}

std::vector<VerdictCheck> verdict_checks(const StudyResult& r, const StudyRow& row) {
  std::vector<VerdictCheck> out;
  const StudySweep* sweep = sweep_of(r.spec, row.study_case.sweep);
  if (sweep == nullptr) return out;
  const std::string system = plan_variant_name(row.study_case.system);
  const bool first_system = !sweep->systems.empty() && sweep->systems.front() == row.study_case.system;
  for (const PublishedVerdict& v : sweep->verdicts) {
    VerdictCheck c{v.system, v.verdict, "n/a", ""};
    if (v.system == system) {
      if (row.plan) {
        c.predicted = capacity_name(Capacity::kFits);
        c.detail = peaks_text(row.plan->gpu_peak_bytes, row.plan->host_bytes());
      } else {
        if (!row.infeasible_space.empty()) c.predicted = row.infeasible_space;
        c.detail = row.infeasible;
      }
      out.push_back(std::move(c));
      continue;
    }
    if (!first_system) continue;
    for (const BaselineResult& b : row.baselines) {
      if (baseline_system_name(b.system) != v.system) continue;
      if (b.fits()) {
        c.predicted = capacity_name(Capacity::kFits);
        Bytes host = 0;
        for (const Bytes x : b.host_bytes_per_numa) host += x;
        c.detail = peaks_text(b.gpu_peak_bytes, host);
      } else {
        if (b.oom) c.predicted = b.oom->space;
        c.detail = b.failure();
      }
      out.push_back(std::move(c));
    }
  }
  return out;
}

std::string verdict_summary_text(const StudyResult& r) {
  int stated = 0, matching = 0;
  for (const auto& row : r.rows) {
    for (const auto& c : verdict_checks(r, row)) {
      ++stated;
      matching += c.matches() ? 1 : 0;
    }
  }
  std::string out = fmt::format("capacity verdicts: {} stated, {} match", stated, matching);
  if (matching < stated) out += fmt::format(", {} MISMATCH", stated - matching);
  return out;
}

}  // namespace oom
