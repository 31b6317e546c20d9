// Analytic evaluator: Eq. 3 over a StepGraph, f_v = d_v + max_{u ∈ P_v} f_u.
//
// P_v holds v's data dependencies and the stage issued before v on the same resource (stream
// order), so waiting emerges from the edges and is never counted twice; there is no contention
// between resources (each runs at its fair-share rate of the DurationModel). The start of v is
// max_u f_u. Memory: every allocation/free event is placed at its stage's start or end; per GPU
// and per NUMA node the bytes held are swept in time order (frees before allocations at equal
// times), starting from the graph's base bytes; GPU peaks add the graph's headroom fraction ε.
// This is the engine the planners call thousands of times: O(V + E) after one sort of the
// memory events. Stateless and thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "planner/duration_model.h"
#include "planner/step_engine.h"
#include "planner/step_graph.h"
#include "traces/trace.h"

namespace oom {

// Start and finish time of every stage (indexed by stage id).
struct StageTimes {
  std::vector<Seconds> start_s;
  std::vector<Seconds> finish_s;
  Seconds step_s = 0;
};

// Eq. 3 with the given per-stage durations (indexed by stage id; size == stages).
StageTimes analytic_times(const StepGraph& g, const std::vector<Seconds>& duration_s);

// Eq. 3 for many duration vectors over one graph (the calibration fit prices each graph thousands
// of times): the predecessors of every stage (data edges and stream order) are gathered once into
// flat arrays. step_s() equals analytic_times(g, d).step_s. Holds no reference to `g`. Thread-safe.
class AnalyticSchedule {
 public:
  explicit AnalyticSchedule(const StepGraph& g);
  // The step time for `duration_s` (one per stage). `finish_s` is scratch space (resized here),
  // so a caller can reuse one buffer across calls.
  Seconds step_s(const std::vector<Seconds>& duration_s, std::vector<Seconds>& finish_s) const;

 private:
  std::vector<std::int32_t> first_;  // predecessors of v: preds_[first_[v] .. first_[v + 1])
  std::vector<std::int32_t> preds_;
};

// Memory timelines and peaks of `g` when its stages run at `times`.
struct MemoryPeaks {
  std::vector<MemoryTimeline> timelines;  // GPUs first ("gpu<i>"), then NUMA nodes ("numa<n>")
  std::vector<Bytes> gpu_peak_bytes;      // headroom included
  std::vector<Bytes> numa_peak_bytes;
};
MemoryPeaks memory_peaks(const StepGraph& g, const StageTimes& times, bool keep_samples = true);

// The Trace of `g` executed at `times` by the engine named `engine`: every stage with its name,
// kind, resource and times, the memory timelines and peaks of memory_peaks(), finalized. Every
// engine builds its Trace this way, so traces of one graph differ only in their times.
Trace trace_of_times(const StepGraph& g, const StageTimes& times, const std::string& engine);

class AnalyticEngine : public StepEngine {
 public:
  std::string name() const override { return "analytic"; }
  Trace execute(const StepGraph& g, const DurationModel& durations) const override;
};

}  // namespace oom
