// EP planner: state–activation budgeting of the expert-parallel path (reference §3, OOM §4).
//
// Enumerates resident expert sets R (contiguous: the first r decoders; interleaved: decoders 0
// and 1, which finish backward last and are needed first by the next forward, then the rest
// spaced evenly), MoE-retained sets K (the last k decoders, whose backward comes first), routing
// chunks c and CPU gradient slots, for every count r, k = 0..layers. Eq. 2 (the static GPU peak
// of planner/lowering/memory_report.h) and each NUMA node's host footprint filter the space: GPU memory
// grows with r and k and host memory shrinks with r, so for each (shape, k, c, slots) a binary
// search finds the largest feasible r — the frontier where state and activations share the
// budget. Frontier plans are ranked by the analytic evaluator as whole plans (residency changes
// what host service is exposed, so gains do not add); the best few are refined over c, slots and
// r − 1, r − 2. Among priced plans within `tie_fraction` of the fastest, the one with the most
// GPU headroom wins. Every priced plan is also checked against the budgets with its simulated
// memory timeline. With EP groups that replicate each shard (Plan::ep_group_gpus) a resident layer
// keeps its shard's BF16 weights and 1/replicas of its FP32 state on each replica. Where no plan
// fits with the mixing sublayers unsplit (a long sequence's attention backward or GDN saved
// tensors binding), the search runs again under each partition of ep_mixing_splits and keeps the
// fastest plan: a finer partition costs calls but frees memory for resident layers.
// Units: seconds, bytes. Stateless; thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "planner/search/plan_pricing.h"

namespace oom {

enum class ResidentShape { kContiguous, kInterleaved };

// The first `count` decoders of `layers`.
std::vector<int> contiguous_resident_set(int layers, int count);
// Decoders 0 and 1, then count − 2 more spaced evenly over 2..layers−1 (the i-th at
// 2 + ⌊(i + ½)·(layers − 2)/(count − 2)⌋): for 12 of 40, 0,1,3,7,11,15,19,22,26,30,34,38.
std::vector<int> interleaved_resident_set(int layers, int count);
// The last `count` decoders.
std::vector<int> retained_set(int layers, int count);

// The mixing sublayers' partitions the EP planner tries, coarsest first: unsplit, then attention
// head groups (attention_head_group_levels, largest first) and GDN pieces (gdn_piece_levels of
// `gdn_pieces_tokens`, longest first: whole sequences, then pieces of one) refined together, a
// dimension that runs out keeping its finest. Only the unsplit one when sequences are split over
// GPUs.
std::vector<SplitSpec> ep_mixing_splits(const WorkloadContext& ctx, const std::vector<std::int64_t>& gdn_pieces_tokens);

struct EpPlannerOptions {
  std::vector<std::int64_t> routing_chunks_tokens = {16384, 32768, 65536, 131072, 262144};
  std::vector<int> cpu_grad_slots = {1, 2};
  std::int64_t first_chunk_tokens = 65536;  // chunk of the first ranking pass (the runtime default)
  int first_slots = 2;                      // CPU gradient slots of the first ranking pass (§B)
  int refine_top = 3;                       // frontier plans refined over chunks, slots and r
  double tie_fraction = 0.005;              // "within 0.5% of the best"
  // GPUs per EP group (Plan::ep_group_gpus); 0 = the candidates of ep_group_candidates(), each
  // searched on its own, the fastest chosen.
  int ep_group_gpus = 0;
  // GDN pieces the mixing partitions may use (ep_mixing_splits): the Local planner's and two
  // shorter ones. The EP path has no sub-batches: a GDN backward call over many sequences (its
  // workspace: gdn_backward_bytes) is cut by whole sequences at a time, then by pieces of one.
  std::vector<std::int64_t> gdn_pieces_tokens = {4096, 8192, 16384, 32768, 65536, 131072, 262144};
};

// The EP group sizes the planner searches for a workload: the largest that divides both the GPUs
// and the experts (all GPUs when it can; across nodes, whole nodes when one does), and one node's
// GPUs when the workload spans nodes and they split the experts (the all-to-all on NVLink, the
// replicas' all-gather and reduce-scatter across nodes). Empty when no group of 2+ GPUs, or all
// of them, splits the experts.
std::vector<int> ep_group_candidates(const WorkloadContext& ctx);

struct EpSearchResult {
  std::optional<PricedPlan> best;
  std::int64_t enumerated = 0;       // (shape, r, k, c, slots) combinations considered
  std::int64_t memory_feasible = 0;  // of those, within Eq. 2 and the host budgets
  int priced = 0;                    // analytic evaluations
  // When nothing fits: the budget the least demanding plan (r = k = 0, smallest chunk) exceeds.
  std::optional<BudgetShortfall> shortfall;
};

// Configures the EP path for the pricer's workload. Returns no plan (and a shortfall, or none
// when EP is not applicable: no EP group whose GPUs split the experts evenly) when nothing fits.
// Over several group sizes the counts add up and the fastest chosen plan wins; the shortfall is
// that of the largest group.
EpSearchResult plan_ep(const PlanPricer& pricer, const EpPlannerOptions& options = {});
// The search plan_ep runs for one EP group size (`group` GPUs per group; the workload's GPUs for
// one group of all) under one partition of the mixing sublayers (an entry of ep_mixing_splits).
EpSearchResult plan_ep_under(const PlanPricer& pricer, const EpPlannerOptions& options, int group, const SplitSpec& split);

}  // namespace oom
