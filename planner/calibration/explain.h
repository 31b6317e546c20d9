// Explaining one record's prediction (`oom validate FILE --explain ID`): where the predicted step
// time goes, beside the breakdown the paper published for that step when there is one.
//
// For one step record (a plan, or a baseline system) the step is predicted with an engine picked
// by name from a StepEngines table and the hardware's calibration, then read from rank 0's point of view:
//   - busy time per resource (the sum of its stages' durations: a resource runs one stage at a time);
//   - compute-stream busy time per operator kind (GEMM, expert GEMM, attention, GDN, element-wise,
//     GPU AdamW);
//   - exposed time per mechanism: each instant of the step is charged to one mechanism in the order
//     compute (by operator kind) > collectives > H2D > D2H > CPU AdamW > host accumulation > host
//     preparation > wait (nothing of rank 0 runs: it waits on another rank or a dependency), so the
//     exposed times add up to the step time;
//   - per-layer forward time by layer kind (the forward stages of rank 0's first decoder of each kind).
// Published breakdowns are data (traces/paper/published-breakdowns.json), each with its source.
// Units: seconds, GiB. Safe to call from several threads as far as the engine is (the SimGrid one
// forks: one thread at a time).
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "planner/calibration/calibration.h"
#include "planner/engine/peak_composition.h"
#include "planner/engine/step_engine.h"
#include "traces/records.h"
#include "traces/trace.h"

namespace oom {

// A published breakdown of one recorded step.
struct PublishedBreakdown {
  std::string record;
  std::string source;
  std::string note;
  std::optional<double> step_s;
  std::map<std::string, double> mechanisms_s;   // "compute_with_replay_s" and/or "non_compute_s"
  std::optional<double> gpu_allocated_gib, host_gib;
  std::map<std::string, double> layer_forward_s;  // by layer kind ("full_attention", "linear_attention", "moe", ...)
};

// Loads a published-breakdowns file. Throws InputError naming the file, the field and the value,
// also for a key no prediction is set beside (a mechanism or layer kind other than those above).
std::vector<PublishedBreakdown> load_published_breakdowns(const std::string& path);

// The published compute time of each breakdown that gives one ("compute_with_replay_s": rank 0's
// compute stream busy, replay included), by record id: the fit's anchors (FitOptions::compute_anchors_s).
std::map<std::string, double> published_compute_times_s(const std::vector<PublishedBreakdown>& breakdowns);

struct ResourceBusy {
  std::string resource;
  int stages = 0;
  Seconds busy_s = 0;
};

struct StepExplanation {
  std::string id;
  std::string engine;
  std::string system;  // baseline system, empty for a plan record
  Seconds step_s = 0;
  std::optional<double> measured_step_s;
  double gpu_allocated_gib = 0;  // the largest GPU's allocated peak (what a measurement reports)
  double gpu_peak_gib = 0;       // the same with Eq. 2's fragmentation headroom ε: what the allocator reserves
  double host_gib = 0;
  // A plan record's GPU peak by memory use, with the stage that reached it (absent for a baseline
  // system, whose lowering is not a plan's).
  std::optional<PeakComposition> peak;
  std::vector<ResourceBusy> resources;               // rank 0's resources, in name order
  std::map<std::string, Seconds> compute_by_kind_s;  // compute-stream busy time per operator kind
  std::vector<std::pair<std::string, Seconds>> exposed_s;  // mechanism → exposed time (sums to step_s)
  std::map<std::string, Seconds> layer_forward_s;    // layer kind → forward time of one decoder of rank 0
  std::optional<PublishedBreakdown> published;
  // A record with a measured compute breakdown (Measured::compute_s): the prediction's rank-0
  // compute stream in the same form (busy_by_direction_and_kind), and the measured one.
  std::map<std::string, Seconds> predicted_compute_s, measured_compute_s;
};

// Exposed time per mechanism and busy times of rank `gpu` in `t` (see above).
StepExplanation explain_trace(const Trace& t, int gpu = 0);

// Predicts record `id` of `records` (read from `records_file`, named in errors) with the engine of
// `engines` named `engine` and explains it. `breakdowns` may be empty. Throws InputError when no
// step record has that id, or the record cannot be predicted (with the reason).
StepExplanation explain_record(const RecordSet& records, const std::string& records_file, const std::string& id,
                               const StepEngines& engines, const std::string& engine,
                               const std::vector<PublishedBreakdown>& breakdowns);

nlohmann::json explanation_to_json(const StepExplanation& e);
std::string explanation_text(const StepExplanation& e);

}  // namespace oom
