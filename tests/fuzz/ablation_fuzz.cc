// Ablation study files (experiments/flat-*.json, `oom ablation STUDY.json`) → AblationSpec, and
// each (workload, variant) case's plan: the study's plan with the variant's merge patch, token
// counts resolved, validated against the resolved workload: accepted or one InputError line.
#include "costmodel/json_input.h"
#include "costmodel/workload.h"
#include "experiments/ablation.h"
#include "tests/fuzz/fuzz_support.h"

using namespace oom;

OOM_FUZZ_TARGET(ablation) {
  nlohmann::json j;
  if (!fuzz::accepts([&] { j = parse_json_text(std::string(input), "ablation.json"); })) return;
  AblationSpec s;
  if (!fuzz::accepts([&] { s = ablation_from_json(j, "ablation.json"); })) return;
  OOM_FUZZ_CHECK(s.variants.size() >= 2 && !s.workloads.empty());
  for (std::size_t w = 0; w < s.workloads.size() && w < 2; ++w) {
    WorkloadContext ctx;
    if (!fuzz::accepts([&] { ctx = resolve_workload(s.workloads[w].workload, "ablation.json"); })) continue;
    for (std::size_t v = 0; v < s.variants.size() && v < 4; ++v) {
      Plan p;
      if (!fuzz::accepts([&] { p = ablation_plan(s, s.variants[v], ctx, "ablation.json"); })) continue;
      OOM_FUZZ_CHECK(plan_from_json(plan_to_json(p), "round-trip") == p);
    }
  }
}
