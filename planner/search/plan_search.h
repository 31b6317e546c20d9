// Plan search: the plan `oom plan` installs for a workload (reference §3–§5, Eq. 5).
//
// search_plan() configures each eligible expert path within the budgets — the EP planner
// (planner/search/ep_planner.h: resident and retained sets, routing chunk, CPU gradient slots) and the
// Local planner (planner/search/local_planner.h: operator partitions, boundary policy, O/LSE) — then,
// for path "auto", compares the configured plans by short executions (planner/search/configure_compare.h)
// and installs the faster. Each path's best plan is reported with its full-depth analytic
// prediction: step time, tokens/s, the largest GPU peak and the host bytes per NUMA node.
// When no plan of any requested path fits, InfeasibleWorkload says which budget fails, by how
// much and where. Units: seconds, bytes. Stateless; safe to call from several threads.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "costmodel/units.h"
#include "costmodel/workload.h"
#include "planner/calibration/calibration.h"
#include "planner/engine/executor.h"
#include "planner/engine/peak_composition.h"
#include "planner/engine/step_engine.h"
#include "planner/plan/plan.h"
#include "planner/search/configure_compare.h"
#include "planner/search/plan_pricing.h"

namespace oom {

struct PlanSearchOptions {
  std::string path = "auto";                // "ep" | "local" | "auto"
  std::string compare_engine = "analytic";  // StepEngine for Configure-then-Compare short executions
  StepEngines engines;                      // where compare_engine is found (default: "analytic" only)
  // Runs the short executions instead of a GraphExecutor of compare_engine when set: real ones
  // with the LibTorch backend (backend/measure/torch_executor.h). Not owned; used from the calling thread.
  Executor* compare_executor = nullptr;
  // With compare_executor: hold each configured plan's GPU peak as that executor measures it to
  // the GPU budget, not only the memory model's prediction (measured_gpu_peak() below). A plan that
  // measures over the budget is not chosen; when every configured plan does, the paths are
  // configured again under a tighter model budget (cut by budget / measured peak of the fastest,
  // then bisected once the model fits no plan), up to kMeasuredPeakAttempts configurations. Real executors hold more than the model's fused kernels (the
  // LibTorch backend's autograd intermediates and backward workspaces): this is how a plan chosen
  // for a budget stays within it when it runs.
  bool hold_measured_gpu_peak = false;
  bool flat = true;                         // offer FLAT's schedules (false: plans without them)
  // M_0, ε and the rest of the memory model's runtime constants: the CUDA defaults; a CPU standing
  // in for a GPU (backend/runtime/device_memory.h) has no CUDA context and no caching allocator.
  MemoryConstants memory;
};

struct PlanChoice {
  Plan plan;
  Seconds predicted_step_s = 0;            // full-depth analytic prediction
  double tokens_per_s = 0;                 // global batch · seq_len / predicted_step_s
  Bytes gpu_peak_bytes = 0;                // max over GPUs, headroom included
  std::vector<Bytes> host_bytes_per_numa;  // peak host bytes per NUMA node
  Seconds compared_step_s = 0;             // Configure-then-Compare extrapolation (0 when not compared)
  Bytes measured_gpu_peak_bytes = 0;       // Eq. 2 of the executor's measured peak (0 when not measured)
  PeakComposition peak;                    // the largest GPU peak by memory use (analytic)
  BindingPeak binding;                     // which part binds (FLAT's four peaks, activations), what bounds it
};

struct PlanSearchResult {
  PlanChoice chosen;
  std::vector<PlanChoice> alternatives;  // the best plan of each other configured path
  std::string compare_engine;            // engine of the short executions: a StepEngine's name, or the
                                         // executor's ("torch"); "" when one path only
  int candidates_priced = 0;             // full-depth analytic evaluations, all paths
  // The GPU budget the paths were configured under: the workload's, or a tighter one after plans
  // measured over it (PlanSearchOptions::hold_measured_gpu_peak).
  Bytes model_gpu_budget_bytes = 0;
  int measured_attempts = 0;             // configurations held to measured peaks (0: none)
};

inline constexpr int kMeasuredPeakAttempts = 8;

// The GPU peak of `plan` at full depth as `executor` measures it, in Eq. 2's terms (M_0 and ε of
// `memory` around the executor's allocated peak): the largest allocated peak of its short
// executions (configure_compare.h; the whole model when it has at most two repeating units) plus
// what the memory model adds from their depth to the full one (`model`'s peak at full depth minus
// its peak over the same short executions: resident state and GPU-held boundaries of the deeper
// decoders, exact byte counts). What the executor holds beyond the model lives in the decoder
// worksets and the loss, which the short executions contain.
Bytes measured_gpu_peak(const ShortExecutionEstimate& measured, Executor& model, const Plan& plan, const WorkloadContext& ctx,
                        const MemoryConstants& memory);

// A priced plan as a choice: its prediction, tokens/s over the workload, the largest GPU peak.
PlanChoice plan_choice_of(const PricedPlan& p, const WorkloadContext& ctx);
// The same with the peak's composition and binding peak (one more lowering and evaluation).
PlanChoice plan_choice_of(const PricedPlan& p, const PlanPricer& pricer);

// FLAT's schedules with every peak bounded: PipelinedLLEP, Ring-DTP in 1024-token blocks, SCO and
// OffloadStreamAdamW in 64 MiB buckets. search_plan configures each path without and with them.
FlatSchedules bounded_flat_schedules();
// Switches each of the plan's four FLAT schedules on or off in turn (where it applies), then
// tries 16, 64 and 256 MiB update buckets when the update is streamed, and keeps a change when
// the plan still fits the budgets and is faster; returns the result.
PricedPlan refine_flat_schedules(const PlanPricer& pricer, PricedPlan plan);
// A short description of the plan's FLAT schedules ("PipelinedLLEP, SCO"), or "" for none.
std::string flat_schedules_text(const FlatSchedules& f);

// No plan of the requested path(s) fits the budgets. what() is one line naming the budget that
// fails, by how much and where: "GPU budget 24.0 GiB < 31.2 GiB needed by decoder 17 backward
// with the smallest partitions". space() is the memory that runs out, "gpu" or "host" (the
// closest miss's budget), or "" when no budget was the reason (no path applies, every candidate
// over the stage limit, a fixed plan that does not apply to the workload).
class InfeasibleWorkload : public std::runtime_error {
 public:
  explicit InfeasibleWorkload(const std::string& what, std::string space = "") : std::runtime_error(what), space_(std::move(space)) {}
  const std::string& space() const { return space_; }

 private:
  std::string space_;
};

// Configures the requested path(s) for `ctx` and returns the chosen plan and the best plan of
// each other path. Throws InfeasibleWorkload when nothing fits, InputError for an unknown path or
// an engine name that options.engines does not offer. `calibration` prices the stages (load_calibration_for(ctx.hardware) normally).
PlanSearchResult search_plan(const WorkloadContext& ctx, const Calibration& calibration,
                             const PlanSearchOptions& options = {});

// {"path", "plan", "predicted_step_s", "tokens_per_s", "gpu_peak_gib", "host_gib" (total),
//  "host_gib_per_numa", "alternatives": [{"path", "plan", "predicted_step_s", ...}], ...}
nlohmann::json plan_choice_to_json(const PlanChoice& c);
nlohmann::json plan_search_to_json(const PlanSearchResult& r);
// A human-readable summary: chosen plan and the alternatives.
std::string plan_search_text(const PlanSearchResult& r);

}  // namespace oom
