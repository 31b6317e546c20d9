// Study files (experiments/*.json, `oom whatif STUDY.json`) → StudySpec, its JSON round trip,
// and the workloads × OOM systems its sweeps expand to (when the sweep product is small enough to list), each
// resolved against its model and hardware: accepted or one InputError line.
#include <cstdint>

#include "costmodel/json_input.h"
#include "costmodel/workload.h"
#include "experiments/study.h"
#include "tests/fuzz/fuzz_support.h"

using namespace oom;

OOM_FUZZ_TARGET(study) {
  nlohmann::json j;
  if (!fuzz::accepts([&] { j = parse_json_text(std::string(input), "study.json"); })) return;
  StudySpec s;
  if (!fuzz::accepts([&] { s = study_from_json(j, "study.json"); })) return;
  const nlohmann::json once = study_to_json(s);
  OOM_FUZZ_CHECK(study_to_json(study_from_json(once, "round-trip")) == once);

  // Expansion is a cartesian product: list it only when it is small.
  std::uint64_t cases = 0;
  for (const StudySweep& w : s.sweeps) {
    std::uint64_t n = w.models.size() * w.hardware.size() * w.gpus.size() *
                      (w.global_batch.empty() ? w.seqs_per_gpu.size() : w.global_batch.size()) * w.seq_len.size() *
                      w.gpu_budget_gib.size() * w.host_budget_gib.size() * w.systems.size();
    cases += n;
    if (cases > 256) return;
  }
  std::vector<StudyCase> expanded;
  if (!fuzz::accepts([&] { expanded = expand_study(s); })) return;
  OOM_FUZZ_CHECK(expanded.size() == cases);
  for (const StudyCase& c : expanded) OOM_FUZZ_CHECK(plan_variant_from_name(plan_variant_name(c.system)) == c.system);
  for (std::size_t i = 0; i < expanded.size() && i < 4; ++i) {
    fuzz::accepts([&] { resolve_workload(expanded[i].workload, "study.json"); });
  }
}
