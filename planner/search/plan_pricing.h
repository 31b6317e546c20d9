// Plan pricing for the planners: a plan's predicted step time and memory peaks, and its fit
// against the workload's budgets (reference §5, Eq. 5 constraints).
//
// A PlanPricer lowers a plan (planner/lowering/step_graph.h) and runs the analytic evaluator (Eq. 3 and
// the memory timelines, planner/engine/analytic_evaluator.h) without building a Trace: this is what the
// planners call for every candidate they rank. Budgets: each GPU's HBM (or the workload's
// gpu_budget_gib) against the Eq. 2 peak, which already contains the fixed occupancy M_0 and the
// headroom ε; each NUMA node's share of the host budget (the node's DRAM, or the workload's
// host_budget_gib split over the NUMA nodes by capacity) against the host footprint of the ranks
// on that node (canonical state, pinned pools, kept boundaries, O/LSE, process memory).
// Units: seconds, bytes. PlanPricer::price is const and thread-safe.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "costmodel/memory.h"
#include "costmodel/workload.h"
#include "planner/calibration/calibration.h"
#include "planner/engine/duration_model.h"
#include "planner/lowering/step_graph.h"
#include "planner/plan/plan.h"

namespace oom {

// What a plan may use: bytes per GPU and per host NUMA node of the nodes its ranks occupy
// (HardwareSpec::ranks_per_numa's numbering), each with its name for a shortfall's message.
struct Budgets {
  Bytes gpu_bytes = 0;
  std::vector<Bytes> numa_bytes;
  std::vector<std::string> numa_names;  // "host NUMA node 1", "host node 3 NUMA node 1"
  std::string numa_name(std::size_t n) const;
  // Sockets per node, whose DRAM a node's host memory fills together (costmodel/host_placement.h),
  // and each node's name ("host NUMA nodes 0-1").
  int numa_per_node = 1;
  std::vector<std::string> node_names;
  std::string node_name(std::size_t node) const;
};
Budgets workload_budgets(const WorkloadContext& ctx);

// A plan with its prediction.
struct PricedPlan {
  Plan plan;
  Seconds step_s = 0;
  std::vector<Bytes> gpu_peak_bytes;   // per GPU, headroom included
  std::vector<Bytes> numa_peak_bytes;  // per NUMA node
  Bytes gpu_peak_max() const;
  Bytes host_total() const;
};

// One budget a plan exceeds, with the numbers: "GPU budget 24.0 GiB < 31.2 GiB needed by decoder
// 17 backward".
struct BudgetShortfall {
  std::string budget;    // "GPU", "host NUMA node 1" or "host node 3 NUMA node 1"
  Bytes budget_bytes = 0;
  Bytes needed_bytes = 0;
  std::string where;     // what needs the memory
  std::string message() const;  // one line
  // The memory that runs out: "gpu" or "host" (as OutOfMemory::space of the baselines).
  std::string space() const { return budget == "GPU" ? "gpu" : "host"; }
};

// The first budget `needed` exceeds (GPU peak first, then each NUMA node), or nothing when the
// plan fits. `gpu_where` names the GPU peak's place for the message.
std::optional<BudgetShortfall> check_budgets(const Budgets& b, Bytes gpu_peak_bytes,
                                             const std::vector<Bytes>& numa_peak_bytes, const std::string& gpu_where,
                                             const std::string& host_where);

class PlanPricer {
 public:
  // `flat`: FLAT schedules the planners put into every plan they build, where they apply
  // (applicable_flat); default: none.
  PlanPricer(const WorkloadContext& ctx, const Calibration& calibration, MemoryConstants constants = {},
             FlatSchedules flat = {});
  // A pricer of `same`'s workload, calibration and constants that offers `flat` instead and shares
  // `same`'s memo of priced plans (a plan one of them priced, the other answers without lowering
  // it again); refusals are counted apart. `same` must outlive nothing: the memo is shared.
  PlanPricer(const PlanPricer& same, FlatSchedules flat);
  // Lowers `plan` (the first `decoder_layers` decoders; 0 = all) and evaluates it analytically.
  // Precondition: validate_plan() accepts the plan for the workload. A plan whose graph would be
  // over the stage limit (refuses()) is not lowered: its step is infinite and its peaks the
  // largest Bytes, so it fits no budget and a search skips it. A plan priced before at the same
  // depth (its notes aside) is answered from the memo: the same figures, the caller's plan.
  PricedPlan price(const Plan& plan, int decoder_layers = 0) const;
  // Whether the graph of `plan` (its first `decoder_layers` decoders) would be over the stage
  // limit (LoweringOptions::max_stages, planner/lowering/graph_size_estimate.h); counts the plans
  // refused. Thread-safe.
  bool refuses(const Plan& plan, int decoder_layers = 0) const;
  // The plans refused so far, and the first one's reason ("field 'routing_chunk_tokens': value 1:
  // would lower to 2.5e+07 stages (limit 2e+07; --max-stages raises it)"); empty when none.
  int refused() const;
  std::string first_refusal() const;
  // The lowered graph and the stage prices price() uses, for planners that read stage detail.
  // When every node runs the same schedule it holds one node's stages (StepGraph::ranks_emitted,
  // LoweringOptions::symmetric_nodes), which both engines run.
  StepGraph lower_plan(const Plan& plan, int decoder_layers = 0) const;
  const DurationModel& durations() const { return durations_; }
  const WorkloadContext& context() const { return ctx_; }
  const MemoryConstants& constants() const { return constants_; }
  const Calibration& calibration() const { return durations_.calibration(); }
  const FlatSchedules& flat() const { return flat_; }
  // `plan` with the pricer's FLAT schedules that apply to it.
  Plan with_flat(Plan plan) const;

 private:
  const WorkloadContext& ctx_;
  CalibratedDurationModel durations_;
  MemoryConstants constants_;
  FlatSchedules flat_;
  struct Refusals {
    std::mutex mutex;
    int count = 0;
    std::string first;
  };
  std::shared_ptr<Refusals> refusals_ = std::make_shared<Refusals>();
  // Priced plans by (the plan's JSON without its notes, decoder layers).
  struct Memo {
    std::mutex mutex;
    std::map<std::pair<std::string, int>, PricedPlan> priced;
  };
  std::shared_ptr<Memo> memo_ = std::make_shared<Memo>();
  LoweringOptions lowering_options(int decoder_layers) const;
};

// The largest repeating unit of decoder kinds: the smallest p with kinds[i] == kinds[i mod p]
// for every layer (4 for a 3 GDN + 1 attention model, 6 for 5 sliding + 1 global, 1 for a
// uniform stack). Returns the layer count when the stack does not repeat.
int repeating_unit_layers(const ModelSpec& m);

}  // namespace oom
