// Simulation reports and validation against recorded measurements (`oom simulate`, `oom validate`).
//
// simulate_plan() lowers a plan, executes it with a StepEngine picked by name from a StepEngines
// table and a hardware's calibration, and summarizes the step: time, per-GPU peak, per-NUMA host bytes and a breakdown
// of rank 0's timeline into compute, exposed all-to-all/collectives, exposed PCIe transfer,
// exposed CPU update and idle time (each instant of the step counted once, in that priority).
// validate_records() predicts every step record (a plan, or a baseline system of
// planner/lowering/baselines.h) and compares with what was measured.
// Relative error = (predicted − measured) / measured. Safe to call from several threads as far as
// the engine is: the analytic one is; the SimGrid one forks, so one thread at a time
// (sim/simgrid_engine.h).
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "costmodel/workload.h"
#include "planner/calibration/calibration.h"
#include "planner/engine/peak_composition.h"
#include "planner/engine/step_engine.h"
#include "planner/plan/plan.h"
#include "traces/records.h"
#include "traces/trace.h"

namespace oom {

// The median of `values` (the mean of the middle two for an even count; 0 for none).
double median(std::vector<double> values);

// Threads for `jobs` independent predictions or fits: one per core, at most four and no more than
// the jobs. `waits_on_processes`: each job waits on simulations in processes of their own (the
// SimGrid engine, sim/isolated_run.h), so one thread more keeps the cores busy meanwhile.
int worker_threads(std::size_t jobs, bool waits_on_processes);
// Threads for `jobs` independent runs of `engine` (as its StepEngine::concurrency() allows: one
// at a time for an exclusive engine or one `engines` does not offer).
int engine_workers(const StepEngines& engines, const std::string& engine, std::size_t jobs);
// Calls job(i) once for each i in [0, jobs) on `threads` threads (the caller's among them), each
// taking the next index as it finishes one. `job` must not throw.
void run_jobs(std::size_t jobs, int threads, const std::function<void(std::size_t)>& job);

struct StepBreakdown {
  Seconds compute_s = 0;               // the compute stream is busy
  Seconds exposed_collective_s = 0;    // only the fabric (A2A, all-gather, reduce-scatter) is busy
  Seconds exposed_transfer_s = 0;      // only PCIe copies are busy
  Seconds exposed_cpu_update_s = 0;    // only the host (CPU AdamW, accumulation, publication) is busy
  Seconds idle_s = 0;
};
// Breakdown of rank `gpu`'s stages in `t` (stage names start with "g<gpu>.").
StepBreakdown step_breakdown(const Trace& t, int gpu = 0);

struct SimulationResult {
  Trace trace;
  StepBreakdown breakdown;
  std::size_t stages = 0;
  int ranks_emitted = 0;                      // StepGraph::ranks_emitted: one node's ranks stand for every node's (0: all ranks)
  PeakComposition peak;                       // the GPU with the largest peak, by memory use
  BindingPeak binding;                        // which of FLAT's four peaks binds, and what bounds it
  std::array<Bytes, kMemoryUses> use_peaks{};  // each use's own peak over the step
};

// Lowers one node's stages when every node runs the same schedule (LoweringOptions::
// symmetric_nodes: the same step time and peaks) unless `every_rank`, which a trace of every
// rank's stages needs. Throws InputError when `engines` offers no `engine` (naming the engines it offers).
SimulationResult simulate_plan(const Plan& plan, const WorkloadContext& ctx, const StepEngines& engines, const std::string& engine,
                               const Calibration& calibration, bool every_rank = false);
nlohmann::json simulation_to_json(const SimulationResult& r);
std::string simulation_text(const SimulationResult& r);

struct RecordPrediction {
  std::string id;
  std::string status;  // "ok", "oom" (a baseline system predicted out of memory: `reason`), "failed" (cannot run: `reason`)
  std::string reason;
  std::string system;  // the baseline system of a "system" record, empty for a plan record
  std::optional<double> measured_step_s, predicted_step_s, rel_error;
  std::optional<double> measured_gpu_peak_gib, predicted_gpu_peak_gib, gpu_peak_rel_error;
  std::optional<double> measured_host_gib, predicted_host_gib, host_rel_error;
};

// The summary errors are over plan records (the fidelity target of OOM's own plans); baseline
// systems, coarser models of other software, have their own summary.
struct ValidationReport {
  std::vector<RecordPrediction> records;
  int count = 0;     // plan records predicted with a measured step time
  int failures = 0;  // records that could not run
  int out_of_memory = 0;  // baseline-system records predicted not to fit
  double median_abs_rel_error = 0;
  double max_abs_rel_error = 0;
  int baseline_count = 0;  // baseline-system records predicted with a measured step time
  double baseline_median_abs_rel_error = 0;
  double baseline_max_abs_rel_error = 0;
};

// Predicts every step record with the engine of `engines` named `engine`. A hardware's
// calibration is the one in `calibrations` fitted for it, else load_calibration_for(hardware,
// engine) (the engine's own fit when there is one). Never throws for a bad record or an engine
// that `engines` does not offer: the record is reported as failed, with the reason.
ValidationReport validate_records(const RecordSet& records, const StepEngines& engines, const std::string& engine,
                                  const std::vector<Calibration>& calibrations = {});
nlohmann::json validation_to_json(const ValidationReport& r);
std::string validation_text(const ValidationReport& r);

}  // namespace oom
