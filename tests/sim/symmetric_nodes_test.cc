// The SimGrid engine on one node's stages (LoweringOptions::symmetric_nodes): a node's traffic to
// the others crosses only its own NICs, so simulating node 0 alone gives the whole cluster's step.
// Checked against the full simulation on 2 and 4 nodes: the same step time, every stage of node
// 0 at the same times, and every GPU's and NUMA node's peak, for an EP plan with resident and
// retained layers (with and without PipelinedLLEP, SCO and the streamed optimizer) and for FSDP2.
#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <tuple>

#include <gtest/gtest.h>

#include "planner/engine/duration_model.h"
#include "planner/lowering/baselines.h"
#include "planner/lowering/step_graph.h"
#include "sim/simgrid_engine.h"
#include "tests/common/cluster_workload.h"
#include "traces/trace.h"

namespace oom {
namespace {

using test_support::cluster_ep_plan;

WorkloadContext cluster(int nodes) { return test_support::cluster_workload("qwen3.6-35b-a3b", nodes); }

void expect_same_simulation(const StepGraph& full, const StepGraph& sym, const WorkloadContext& ctx, const std::string& what) {
  ASSERT_EQ(full.ranks_emitted, 0) << what;
  ASSERT_EQ(sym.ranks_emitted, 8) << what;
  const CalibratedDurationModel durations(ctx.hardware, load_calibration_for(ctx.hardware), ctx.workload.gpus);
  const sim::SimGridEngine engine;
  const Trace tf = engine.execute(full, durations);
  const Trace ts = engine.execute(sym, durations);
  EXPECT_GT(ts.step_s, 0.0) << what;
  EXPECT_NEAR(ts.step_s / tf.step_s, 1.0, 1e-9) << what;
  // Node 0's stages at the same times in both runs.
  std::map<std::string, const TraceStage*> by_name;
  for (const TraceStage& s : tf.stages) by_name.emplace(s.name, &s);
  std::size_t matched = 0;
  for (const TraceStage& s : ts.stages) {
    const auto it = by_name.find(s.name);
    ASSERT_NE(it, by_name.end()) << what << ": " << s.name;
    EXPECT_NEAR(s.start_s, it->second->start_s, 1e-9 * std::max(1.0, tf.step_s)) << what << ": " << s.name;
    EXPECT_NEAR(s.duration_s(), it->second->duration_s(), 1e-9 * std::max(1.0, tf.step_s)) << what << ": " << s.name;
    ++matched;
  }
  EXPECT_EQ(matched, ts.stages.size());
  ASSERT_EQ(ts.gpu_peak_bytes.size(), tf.gpu_peak_bytes.size()) << what;
  EXPECT_EQ(ts.gpu_peak_bytes, tf.gpu_peak_bytes) << what;
  EXPECT_EQ(ts.numa_peak_bytes, tf.numa_peak_bytes) << what;
}

TEST(SimGridSymmetricNodes, OneNodeSimulatesAsTheWholeClusterEp) {
  for (const int nodes : {2, 4}) {
    const WorkloadContext ctx = cluster(nodes);
    for (const bool flat : {false, true}) {
      LoweringOptions full_options, sym_options;
      full_options.decoder_layers = sym_options.decoder_layers = 4;
      sym_options.symmetric_nodes = true;
      const Plan plan = cluster_ep_plan(ctx.model, 2, 1, flat);
      expect_same_simulation(lower(plan, ctx, full_options), lower(plan, ctx, sym_options), ctx,
                             "EP on " + std::to_string(nodes) + " nodes, flat " + std::to_string(flat));
    }
  }
}

TEST(SimGridSymmetricNodes, OneNodeSimulatesAsTheWholeClusterInEpGroups) {
  // Plan::ep_group_gpus: groups of one node (the replicas' rings across the nodes), of two nodes
  // (the all-to-all across them too), and of half a node.
  for (const auto& [nodes, group] : {std::pair{2, 8}, std::pair{4, 16}, std::pair{2, 4}}) {
    const WorkloadContext ctx = cluster(nodes);
    LoweringOptions full_options, sym_options;
    full_options.decoder_layers = sym_options.decoder_layers = 4;
    sym_options.symmetric_nodes = true;
    Plan plan = cluster_ep_plan(ctx.model, 0, 1, true);
    plan.ep_group_gpus = group;
    expect_same_simulation(lower(plan, ctx, full_options), lower(plan, ctx, sym_options), ctx,
                           "EP groups of " + std::to_string(group) + " on " + std::to_string(nodes) + " nodes");
  }
}

TEST(SimGridSymmetricNodes, OneNodeSimulatesAsTheWholeClusterWithSequencesSplitOverGpus) {
  // Plan::context_parallel_gpus: each sequence over half a node, one node, two nodes; ring
  // attention, and Gated DeltaNet's state chain (Qwen3.6) over one node.
  for (const auto& [nodes, seqs, model] : {std::tuple{2, 4, "qwen3-30b-a3b"}, std::tuple{2, 2, "qwen3-30b-a3b"},
                                           std::tuple{4, 2, "qwen3-30b-a3b"}, std::tuple{2, 2, "qwen3.6-35b-a3b"}}) {
    const WorkloadContext ctx = test_support::h200_workload(model, nodes, 8 * nodes, seqs, 32768);
    LoweringOptions full_options, sym_options;
    full_options.decoder_layers = sym_options.decoder_layers = 3;
    sym_options.symmetric_nodes = true;
    Plan plan = cluster_ep_plan(ctx.model, 0, 1, false);
    plan.context_parallel_gpus = 8 * nodes / seqs;
    expect_same_simulation(lower(plan, ctx, full_options), lower(plan, ctx, sym_options), ctx,
                           "sequences over " + std::to_string(8 * nodes / seqs) + " GPUs on " + std::to_string(nodes) + " nodes");
  }
}

TEST(SimGridSymmetricNodes, OneNodeSimulatesAsTheWholeClusterFsdp2) {
  for (const int nodes : {2, 4}) {
    const WorkloadContext ctx = cluster(nodes);
    LoweringOptions full_options, sym_options;
    full_options.decoder_layers = sym_options.decoder_layers = 4;
    sym_options.symmetric_nodes = true;
    const BaselineSetup setup{BaselineSystem::kFsdp2Offload, 2, 1, 4};
    expect_same_simulation(lower_baseline(setup, ctx, full_options), lower_baseline(setup, ctx, sym_options), ctx,
                           "FSDP2 on " + std::to_string(nodes) + " nodes");
  }
}

}  // namespace
}  // namespace oom
