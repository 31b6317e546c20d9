// The size of the StepGraph a lowering would build, counted without building it, and the limit a
// command checks it against before it lowers (README "Bounded work").
//
// A plan's graph grows with the product of the loops its lowering runs: decoders × sub-batches ×
// MoE chunks (routing_chunk_tokens, split.moe_chunk_tokens) × attention head groups × GDN pieces ×
// optimizer buckets × emitted ranks (every rank, or one node's under
// LoweringOptions::symmetric_nodes), plus the joins of the collectives across nodes and the
// decoders a boundary policy regenerates. estimate_step_graph() runs those loops on counts alone
// (the lowering's structure, planner/lowering/lowering.cc and lowering_layers.cc, in miniature):
// its work grows with decoders × their phases, never with the chunks, so `routing_chunk_tokens`
// 1 on 262,144 tokens per GPU answers in microseconds. The baseline systems' lowerings have their
// own counts (estimate_baseline_graph, estimate_ktft_graph, estimate_megatron_graph).
//
// Contract, checked by tests/planner/graph_size_estimate_test.cc over EP and Local plans (split
// and unsplit, with and without symmetric nodes, streamed optimizer, regeneration, LLEP, Ring-DTP,
// context parallelism) and every baseline: `stages` equals the built graph's stage count;
// `deps` lies within kDepsEstimateFactor of the built graph's dependency count. The SimGrid
// engine (sim/simgrid_engine.cc) makes one activity and one completion event per stage, so its
// events are `stages`; the analytic engine's work is stages + deps.
//
// Memory: a built stage holds its Stage (key, name, shape, peers, memory events, deps) and the
// builder's index entries; kBytesPerStage is the measured resident memory per stage of a built
// graph (how: the constant's comment), so the default limit bounds a graph at
// kDefaultMaxStages × kBytesPerStage. Pure functions; thread-safe, except set_max_stages_default().
#pragma once

#include <cstdint>
#include <string>

#include "planner/lowering/baselines.h"
#include "planner/lowering/baselines_megatron.h"
#include "planner/lowering/step_graph.h"

namespace oom {

// What a lowering would build.
struct GraphSize {
  double stages = 0;  // stages of the graph (doubles: a hostile plan's count overflows no integer)
  double deps = 0;    // dependencies over all stages (within kDepsEstimateFactor of the built graph's)
  // The input that multiplies the count most: a plan field ("routing_chunk_tokens",
  // "split.moe_chunk_tokens", "split.sub_batch_seqs", "split.attention_head_group",
  // "split.gdn_chunk_tokens", "flat.optimizer_bucket_mib", "boundaries", "flat.vocab_projection")
  // with its value, or, when no plan field does (the step's own decoders and ranks), the
  // workload's "gpus" (plan_field false).
  std::string field = "gpus";
  std::string value;
  bool plan_field = false;
};

// The built graph's dependencies lie within this factor of GraphSize::deps either way.
inline constexpr double kDepsEstimateFactor = 1.5;

// Resident bytes per stage of `oom simulate` (the graph, its names and the analytic engine's
// times): the growth of its maximum resident set (/usr/bin/time, RelWithDebInfo) from the default
// plan (experiments/default, 5,336 stages, 41 MB) to the same plan at routing_chunk_tokens 256
// (289,816 stages, 285 MB), over the stages added: 876 B. Rounded up.
inline constexpr double kBytesPerStage = 900;

// The default stage limit. The largest graph a shipped study, ablation or cluster benchmark makes
// with every rank's stages is 1.96 million stages (experiments/mop-scaling.json: Kimi-K2 on 768
// GPUs, FSDP2's); tests/study/study_test.cc WorkEstimate.EveryShippedStudyWithEveryRankFitsThe-
// DefaultLimitTenTimesOver holds every one at least ten times under this limit. At kBytesPerStage
// the limit bounds a command's graph at about 18 GB.
inline constexpr double kDefaultMaxStages = 2e7;

GraphSize estimate_step_graph(const Plan& plan, const WorkloadContext& ctx, const LoweringOptions& options = {});
GraphSize estimate_baseline_graph(const BaselineSetup& setup, const WorkloadContext& ctx, const LoweringOptions& options = {});
GraphSize estimate_ktft_graph(const BaselineSetup& setup, const WorkloadContext& ctx, const LoweringOptions& options = {});
GraphSize estimate_megatron_graph(const MegatronSetup& setup, const WorkloadContext& ctx, const LoweringOptions& options = {});

// The one line refusing a graph over `max_stages`: "would lower to 1.2e+09 stages (limit 2e+07;
// --max-stages raises it)".
std::string graph_size_refusal(const GraphSize& size, double max_stages);

// Throws InputError naming `plan_file` (or `workload_file` when the workload's size is the cause;
// either may be empty) and GraphSize::field when `size` is over options.max_stages.
void check_graph_size(const GraphSize& size, const LoweringOptions& options, const std::string& plan_file,
                      const std::string& workload_file = "");
// The same for a plan: estimate_step_graph(), then check_graph_size().
void check_step_graph_size(const Plan& plan, const WorkloadContext& ctx, const LoweringOptions& options,
                           const std::string& plan_file, const std::string& workload_file = "");

}  // namespace oom
