// Running the baselines (planner/lowering/baselines.h): each system configured and lowered, its
// step executed with a StepEngine and a DurationModel, the result a step time or out-of-memory.
// Here, above the lowering and beside the engines that execute it, so that the lowering of a
// baseline needs no engine. Units: bytes, seconds. Thread-safe as far as the engine is.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "planner/calibration/calibration.h"
#include "planner/engine/duration_model.h"
#include "planner/engine/step_engine.h"
#include "planner/lowering/baselines.h"
#include "planner/lowering/baselines_ktft.h"
#include "planner/lowering/baselines_megatron.h"
#include "traces/trace.h"

namespace oom {

// A baseline predicted on a workload: a step time, or out-of-memory.
struct BaselineResult {
  BaselineSystem system = BaselineSystem::kFsdp2Offload;
  std::optional<BaselineSetup> setup;
  std::optional<OutOfMemory> oom;      // set exactly when the system does not fit
  // Why the system cannot run the workload at all (it splits no sequence over GPUs, and the
  // workload has fewer sequences than GPUs); empty when it can. Then `oom` is unset.
  std::string not_run;
  Seconds step_s = 0;
  double tokens_per_s = 0;
  Bytes gpu_peak_bytes = 0;            // the largest GPU peak of the executed step
  std::vector<Bytes> host_bytes_per_numa;
  Trace trace;                         // the executed step (empty when out of memory)
  bool fits() const { return !oom.has_value() && not_run.empty(); }
  // Why it does not fit (the out-of-memory's line, or not_run); empty when it fits.
  std::string failure() const { return !not_run.empty() ? not_run : oom ? oom->message() : std::string(); }
  // A table cell for a system that does not fit: "OOM(GPU)", "OOM(host n<k>)" or "n/a".
  std::string failure_cell() const;
};

// Configures, lowers and executes the system with the StepEngine of `engines` named `engine`,
// pricing stages with `calibration`. A step whose executed GPU or host peak exceeds its budget is
// reported as out-of-memory too; a workload with fewer sequences than GPUs as not run, except by
// FSDP2 (context parallelism: ring attention over each sequence's GPUs). Throws InputError when `engines` offers no `engine`.
BaselineResult run_baseline(BaselineSystem s, const WorkloadContext& ctx, const StepEngines& engines, const std::string& engine,
                            const Calibration& calibration, const MemoryConstants& constants = {});

// Executes a configured baseline's step `g` into `r` (trace, step time, throughput, GPU peak, host
// bytes per NUMA node) and sets r.oom when the executed timeline holds more than the GPU budget
// (`gpu_peak_at`: where the static estimate puts the peak). Returns whether the step fits the GPUs.
// run_baseline, run_megatron and run_ktft share it.
bool execute_baseline_step(BaselineResult& r, const StepEngine& engine, const StepGraph& g, const DurationModel& durations,
                           const WorkloadContext& ctx, const std::string& gpu_peak_at);

// {"system", "fits", "step_s" | null, "tokens_per_s", "gpu_peak_gib", "host_gib", "micro_batch_seqs",
//  "accumulation_steps", "oom": {"space", "device", "where", "needed_gib", "available_gib", "message"} | null,
//  "not_run" (only when set)}
nlohmann::json baseline_result_to_json(const BaselineResult& r);

// Prices KT-FT's CPU expert passes (kExpertGemm stages on a CPU update executor: rank 0's, which
// runs every rank's experts) on all the sockets of the node at once: the slower of their FLOPs at
// the node's AMX BF16 peak × the published forward efficiency (× the recompute's or the
// backward's factor above) and the expert weights' DRAM traffic (the stage's `params` × the bytes
// per parameter above) at the node's DRAM bandwidth; a backward pass adds its dW packing and its
// gradient-buffer clear on the cores (ktft_backward_core_s; the stage's shape gives the routes,
// `tokens`, H, `k`, and the experts). One such stage runs at a time, so nothing shares it. Every
// other stage as the calibrated model does (a CalibratedDurationModel, so the SimGrid engine finds
// its hardware). Thread-safe.
class KtFtDurationModel : public CalibratedDurationModel {
 public:
  KtFtDurationModel(HardwareSpec hardware, Calibration calibration, int ranks);
  StageCost cost(const Stage& s, const StepGraph& g) const override;
};

// Configures, lowers and executes KT-FT with the StepEngine of `engines` named `engine`
// (run_baseline() of BaselineSystem::kKtFt comes here). Throws InputError for an engine that
// `engines` does not offer or hardware without AMX throughput (naming numa[n].amx_bf16_flops_per_s).
BaselineResult run_ktft(const WorkloadContext& ctx, const StepEngines& engines, const std::string& engine,
                        const Calibration& calibration, const MemoryConstants& constants = {});

// Configures, lowers and executes Megatron-LM with the StepEngine of `engines` named `engine`
// (run_baseline() of BaselineSystem::kMegatronLm comes here). The result's setup carries the
// micro-batch and the accumulation steps. Throws InputError for an engine that `engines` does not offer.
BaselineResult run_megatron(const WorkloadContext& ctx, const StepEngines& engines, const std::string& engine,
                            const Calibration& calibration, const MemoryConstants& constants = {});

}  // namespace oom
