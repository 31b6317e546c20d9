// Ablation: a matched component study (`oom ablation`): one plan on the same workloads with and
// without a schedule, each variant's peaks and time beside the reference's (FLAT's component
// studies: PipelinedLLEP, Ring-DTP, SCO, OffloadStreamAdamW; reference §6).
//
// A study file (experiments/flat-*.json):
//   {"name": "flat-dispatch", "description": "...", "engine": "analytic",
//    "schedule": "dispatch",             // the peak the study is about: dispatch | vocabulary |
//                                        // boundaries | optimizer (the optimizer study times the
//                                        // step's tail after the last compute)
//    "paper": {"peak_reduction": 0.593, "step_time_change": 0.0, "tail_speedup": null,
//              "source": "FLAT: ..."},  // the published figure to set beside ours (optional)
//    "plan": {...a Plan JSON...},        // the plan every variant starts from
//    "workloads": [{"name": "...", "workload": {...a Workload JSON...}}],
//    "variants": [{"name": "standard", "plan": {}},   // the first is the reference
//                 {"name": "PipelinedLLEP", "plan": {"flat": {"expert_dispatch": "pipelined_llep"},
//                                                    "routing_chunk_tokens": "tokens_per_gpu/8"}}]}
// A variant's "plan" is a JSON merge patch (RFC 7386) onto the study's plan; a token count may be
// written "tokens_per_gpu" or "tokens_per_gpu/K" (the workload's tokens per GPU, divided by K).
// Every case is validated before any runs (bad input: one InputError naming the file and field).
// Units: seconds, bytes (GiB in text, CSV and JSON). Not thread-safe.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "costmodel/workload.h"
#include "experiments/study.h"
#include "planner/engine/step_engine.h"
#include "planner/lowering/step_graph.h"
#include "planner/plan/plan.h"

namespace oom {

struct AblationWorkload {
  std::string name;
  Workload workload;
};

struct AblationVariant {
  std::string name;
  nlohmann::json plan_patch = nlohmann::json::object();
};

struct PublishedAblation {
  std::optional<double> peak_reduction;    // e.g. 0.593 = the peak cut by 59.3%
  std::optional<double> step_time_change;  // e.g. 0.0 = at equal throughput
  std::optional<double> tail_speedup;      // e.g. 2.05 = the optimizer step 2.05× faster
  std::string source;
};

struct AblationSpec {
  std::string name, description;
  std::string engine = "analytic";
  MemoryUse schedule = MemoryUse::kDispatch;
  PublishedAblation paper;
  nlohmann::json plan;
  std::vector<AblationWorkload> workloads;
  std::vector<AblationVariant> variants;
};

AblationSpec ablation_from_json(const nlohmann::json& j, const std::string& file);
AblationSpec load_ablation(const std::string& path);

// The study cut to its smallest workload (the fewest GPUs, then the fewest tokens per step), with
// every variant (`oom ablation --smallest`: a quick check that every variant runs).
AblationSpec smallest_cases(AblationSpec spec);

struct AblationRow {
  std::string workload, variant;
  Plan plan;
  Seconds step_s = 0;
  Seconds optimizer_tail_s = 0;     // step end − the last compute stage's end, any GPU
  Bytes gpu_peak_bytes = 0;         // the largest GPU peak (headroom included)
  bool fits_gpu = true;             // the GPU peak within the workload's GPU budget (HBM by default)
  Bytes study_peak_bytes = 0;       // the study's use at its own peak (any GPU)
  std::array<Bytes, kMemoryUses> use_peaks{};
  std::string binding_peak;
  // Against the workload's reference variant (the first): relative changes, speedup of the tail.
  double peak_change = 0, step_change = 0, gpu_peak_change = 0, tail_speedup = 1;
};

struct AblationResult {
  AblationSpec spec;
  std::vector<AblationRow> rows;
  // Per workload: among the variants whose GPU peak fits the budget, the one with the largest cut
  // of the study's peak whose step time is at most 2% above the reference's ("at equal
  // throughput"); for the optimizer study the fastest tail.
  struct Best {
    std::string workload, variant;
    double peak_change = 0, step_change = 0, tail_speedup = 1;
  };
  std::vector<Best> best;
};

using AblationProgress = std::function<void(int done, int total, const std::string& label)>;

// The plan of one case (the study's plan with the variant's patch, token counts resolved),
// validated against the workload. Throws InputError naming the file and the variant.
Plan ablation_plan(const AblationSpec& spec, const AblationVariant& v, const WorkloadContext& ctx, const std::string& file);

// The estimate of every case (each workload × variant: its plan's stages, kPricingSecondsPerStage
// each). Throws InputError as run_ablation() would for a workload or variant that does not resolve.
WorkEstimate estimate_ablation(const AblationSpec& spec, const std::string& file);

// Runs every case with the engine of `engines` named spec.engine. Throws InputError naming `file`
// when `engines` does not offer it, and as ablation_plan() for a case that does not validate.
AblationResult run_ablation(const AblationSpec& spec, const StepEngines& engines, const std::string& file,
                            const AblationProgress& progress = {});

std::string ablation_csv(const AblationResult& r);
// Checks an ablation CSV before a reader uses it (`oom plot --kind ablation`): the header has the
// columns the plot reads, every row as many cells as the header, every cell but the workload,
// variant, fits_gpu and binding_peak a finite number. Throws InputError naming `file`:LINE, the
// column and the cell (costmodel/csv_input.h).
void check_ablation_csv(const std::string& text, const std::string& file);
nlohmann::json ablation_result_to_json(const AblationResult& r);
std::string ablation_table_text(const AblationResult& r);

}  // namespace oom
