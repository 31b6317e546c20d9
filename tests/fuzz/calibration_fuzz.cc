// Calibration files (configs/calibration/*.json, `oom calibrate` output) → Calibration, its round
// trip, and the stage durations a CalibratedDurationModel prices with it on a lowered step of a
// small workload: every duration finite and non-negative, whatever constants the file accepts.
#include <cmath>

#include "costmodel/json_input.h"
#include "costmodel/workload.h"
#include "planner/calibration/calibration.h"
#include "planner/engine/duration_model.h"
#include "planner/lowering/step_graph.h"
#include "planner/plan/plan.h"
#include "tests/fuzz/fuzz_support.h"

using namespace oom;

namespace {

struct Fixture {
  WorkloadContext ctx;
  StepGraph graph;
};

const Fixture& fixture() {
  static const Fixture f = [] {
    Workload w;
    w.model = "tiny-moe-qwen";  // GDN + full attention + experts
    w.hardware = "h100-sxm-node";
    w.gpus = 2;
    w.global_batch = 2;
    w.seq_len = 256;
    Fixture out{resolve_workload(w, "fixture"), {}};
    Plan p;
    p.path = ExpertPath::kEp;
    p.resident_layers = {0};
    p.routing_chunk_tokens = 256;
    out.graph = lower(p, out.ctx);
    return out;
  }();
  return f;
}

}  // namespace

OOM_FUZZ_TARGET(calibration) {
  const Fixture& f = fixture();
  nlohmann::json j;
  if (!fuzz::accepts([&] { j = parse_json_text(std::string(input), "calibration.json"); })) return;
  Calibration c;
  if (!fuzz::accepts([&] { c = calibration_from_json(j, "calibration.json"); })) return;
  OOM_FUZZ_CHECK(calibration_from_json(calibration_to_json(c), "round-trip") == c);

  const CalibratedDurationModel model(f.ctx.hardware, c, f.ctx.workload.gpus);
  for (const Stage& s : f.graph.stages) {
    const Seconds d = model.duration_s(s, f.graph);
    OOM_FUZZ_CHECK(std::isfinite(d) && d >= 0);
  }
}
