// Analytic evaluator: Eq. 3 over a StepGraph, f_v = d_v + max_{u ∈ P_v} f_u.
//
// P_v holds v's data dependencies and the stage issued before v on the same resource (stream
// order), so waiting emerges from the edges and is never counted twice. The start of v is
// max_u f_u. GPU resources do not contend with each other. The host does (HostSharing): the CPU
// workers of the ranks on one socket share its cores, and they share the NUMA node's DRAM
// bandwidth with the DMA copies whose host buffers lie there; durations are settled against the
// overlaps Eq. 3 itself produces. Memory: every allocation/free event is placed at its stage's start or end; per GPU
// and per NUMA node the bytes held are swept in time order (frees before allocations at equal
// times), starting from the graph's base bytes; GPU peaks add the graph's headroom fraction ε.
// This is the engine the planners call thousands of times: O(V + E) after one sort of the
// memory events. Stateless and thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "planner/engine/duration_model.h"
#include "planner/engine/step_engine.h"
#include "planner/lowering/step_graph.h"
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
  // The same step time when `finish_s` already holds the finish times of stages [0, from) for
  // these durations (an earlier call's, whose durations differ from `duration_s` at `from` or
  // later only): Eq. 3 runs from stage `from` on. Stage ids are a topological order, so the result
  // is the one step_s() gives, bit for bit.
  Seconds step_s_from(const std::vector<Seconds>& duration_s, std::vector<Seconds>& finish_s, std::size_t from) const;

 private:
  std::vector<std::int32_t> first_;  // predecessors of v: preds_[first_[v] .. first_[v + 1])
  std::vector<std::int32_t> preds_;
};

// Host sharing, the analytic counterpart of what the SimGrid platform models with shared hosts and
// links. Participants: every stage with work on a CPU worker (cores of NUMA node n's socket) and
// every H2D/D2H copy (its host buffer in NUMA node n's DRAM, its bytes over a PCIe channel: the
// GPU's link, or the uplink of the switch several GPUs share, one per direction). Within each
// interval where the set of running participants of node n is constant:
//   - the k CPU stages running split the socket's cores evenly (each progresses at 1/k);
//   - the k copies running on one PCIe channel split it evenly (each at 1/k);
//   - the DRAM bandwidth B_n is split max-min fairly among the running stages, each asking what
//     it draws alone (its host DRAM bytes / alone time) times its core or channel share;
//   - a stage progresses at the smaller of that share and allocation / demand.
// A stage's work part then takes its alone time divided by its mean progress rate over the
// interval it ran in. Settling starts from the fair-share durations (StageCost::duration_s) and
// repeats Eq. 3 with the stretched durations until no stage's work time moves by more than
// `kHostSharingTolerance` of itself (at most `kHostSharingPasses` passes): a fixed-point
// iteration, since stretching moves the overlaps. Each stage takes the whole of its correction
// while its corrections keep one direction; each time one turns back, the fraction it takes
// halves (and doubles again, up to the whole, while the direction holds).
// Settled, the step agrees with the SimGrid engine's, which shares the same hosts and links
// event by event (within 0.03 % on every published record). Four passes that each went half way
// had stopped short: with two ranks' update and publication lanes on one socket, the CPU stages
// came out up to a quarter shorter than shared, the step up to 5 % shorter than SimGrid's.
// B_n = DurationModel::host_dram_Bps(n) (0: DRAM not shared), the channels from
// DurationModel::pcie_link_of_rank() and each stage's DRAM bytes from host_dram_bytes(stage): all
// hardware facts, read once per graph; settling depends on the calibration's costs only. Thread-safe.
inline constexpr int kHostSharingPasses = 64;
inline constexpr double kHostSharingTolerance = 3e-3;
class HostSharing {
 public:
  // The hardware facts come from `durations` (any calibration of the same hardware).
  HostSharing(const StepGraph& g, const DurationModel& durations);
  bool empty() const { return stages_.empty(); }
  // The stages that share host resources, in the order settle() wants their costs.
  const std::vector<std::int32_t>& stages() const { return stages_; }
  // Settles `duration_s` (in: fair-share durations, indexed by stage id; out: the shared ones)
  // and leaves the final Eq. 3 finish times in `finish_s`. Returns the step time. `lane_costs[i]`
  // is the cost of stages()[i]: only those stages' costs matter.
  Seconds settle(const AnalyticSchedule& schedule, const std::vector<StageCost>& lane_costs, std::vector<Seconds>& duration_s,
                 std::vector<Seconds>& finish_s) const;

 private:
  // One CPU worker or copy engine of a NUMA node: its stages, in issue order (they run one after
  // another), are stages_[first .. last); a copy engine's PCIe channel (−1 for CPU workers).
  struct Lane {
    std::int32_t first = 0, last = 0;
    bool cpu = false;
    std::int32_t channel = -1;
  };
  std::vector<std::int32_t> stages_;      // participating stage ids, lane by lane
  std::vector<double> dram_bytes_;        // per participant: host_dram_bytes() of its stage
  std::vector<Lane> lanes_;               // grouped by NUMA node
  std::vector<std::int32_t> node_first_;  // lanes of node n: lanes_[node_first_[n] .. node_first_[n + 1])
  std::vector<std::int32_t> channel_first_;  // channels of node n: [channel_first_[n], channel_first_[n + 1])
  std::int32_t channels_ = 0;
  std::vector<double> dram_Bps_;  // per NUMA node: B_n
};

// Eq. 3 of `g` priced by `durations`, with host sharing settled: what the analytic engine, the
// planners and the pricer all run. `duration_s`, when given, receives the settled durations.
StageTimes analytic_step_times(const StepGraph& g, const DurationModel& durations, std::vector<Seconds>* duration_s = nullptr);

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
  Seconds step_s(const StepGraph& g, const DurationModel& durations) const override { return analytic_step_times(g, durations).step_s; }
  EngineConcurrency concurrency() const override { return EngineConcurrency::kInThread; }
};

}  // namespace oom
