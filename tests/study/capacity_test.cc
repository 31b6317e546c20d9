// experiments/paper/capacity.json: every capacity verdict the paper published (what fits, and
// which memory runs out) comes out of the memory model as published.
//
// The study's cases run through run_study() as `oom whatif` runs them, with one reduction: an OOM
// system "search" whose Local path alone finds a plan fits (the search configures the same Local
// plan and installs a path only when one fits), so the test asks the Local path first and runs the
// whole search (EP included, the costly part at long context) only where Local finds nothing. The
// baselines run as in the study. Under AddressSanitizer the cases are resolved and sized only, as
// tests/study/shipped_inputs_test.cc does for every shipped study.
#include <gtest/gtest.h>

#include "tests/common/sanitized.h"

#include <fmt/format.h>

#include <iostream>

#include "costmodel/input_error.h"
#include "experiments/plan_finder.h"
#include "experiments/study.h"
#include "planner/search/plan_search.h"

namespace oom {
namespace {

using test_support::kSanitized;

StudySpec capacity_study() { return load_study(std::string(OOM_SOURCE_DIR) + "/experiments/paper/capacity.json"); }

// The plan search's verdict at a fraction of its cost: the Local path first (see above).
StudyPlan local_first(const WorkloadContext& ctx, const PlanVariant& system) {
  if (system.kind == PlanVariant::Kind::kSearch && system.path == "auto" && system.flat) {
    PlanVariant local = system;
    local.path = "local";
    try {
      return find_plan_by_search(ctx, local);
    } catch (const InfeasibleWorkload&) {
    } catch (const InputError&) {  // a model the Local planner does not take
    }
  }
  return find_plan_by_search(ctx, system);
}

TEST(CapacityStudy, EverySweepStatesThePublishedVerdictsOfItsSystems) {
  const StudySpec spec = capacity_study();
  ASSERT_TRUE(states_verdicts(spec));
  int stated = 0;
  for (const StudySweep& w : spec.sweeps) {
    EXPECT_FALSE(w.verdicts.empty()) << w.name;
    ASSERT_TRUE(w.baselines.has_value()) << w.name << ": a capacity sweep runs the baselines it states verdicts on";
    for (const BaselineSystem b : *w.baselines) {
      const std::string name(baseline_system_name(b));
      EXPECT_TRUE(std::any_of(w.verdicts.begin(), w.verdicts.end(), [&](const PublishedVerdict& v) { return v.system == name; }))
          << w.name << " runs " << name << " without a verdict on it";
    }
    stated += static_cast<int>(w.verdicts.size() * expand_study(StudySpec{spec.name, "", "", spec.engine, spec.baselines, {w}}).size());
  }
  EXPECT_EQ(stated, 15);
}

TEST(CapacityStudy, EveryPublishedVerdictComesOutAsPublished) {
  const StudySpec spec = capacity_study();
  if (kSanitized) {
    for (const auto& c : expand_study(spec)) resolve_workload(c.workload, fmt::format("capacity.json (sweep {})", c.sweep));
    std::cout << "capacity.json: resolved and sized under the sanitizer (" << estimate_study(spec).text() << "); the normal build runs it\n";
    return;
  }
  const StudyResult r = run_study(spec, StepEngines(), &local_first);
  std::cout << study_table_text(r);
  int checked = 0;
  for (const StudyRow& row : r.rows) {
    for (const VerdictCheck& c : verdict_checks(r, row)) {
      ++checked;
      EXPECT_TRUE(c.matches()) << row.label() << ": " << c.system << " published " << capacity_name(c.published) << ", predicted "
                               << c.predicted << " (" << c.detail << ")";
    }
  }
  EXPECT_EQ(checked, 15);
}

}  // namespace
}  // namespace oom
