// LoweringOptions::symmetric_nodes: one node's stages stand for every node's when every node runs
// the same schedule. Checked against the full graph on 2- and 4-node clusters: the same analytic
// step time and the same peak on every GPU and every NUMA node of every node, for plans with and
// without resident and retained layers, PipelinedLLEP, SCO and the streamed optimizer; and the
// cases that are not symmetric (skewed routing, Ring-DTP, one node, a partial node) get every
// rank's stages.
#include <algorithm>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "planner/engine/analytic_evaluator.h"
#include "planner/engine/duration_model.h"
#include "planner/engine/baseline_run.h"
#include "planner/lowering/baselines.h"
#include "planner/lowering/step_graph.h"
#include "planner/search/ep_planner.h"
#include "tests/common/cluster_workload.h"
#include "planner/search/plan_pricing.h"

namespace oom {
namespace {

using test_support::cluster_workload;

Plan ep_plan(const ModelSpec& m, bool flat) { return test_support::cluster_ep_plan(m, 3, 2, flat); }

struct Evaluated {
  StepGraph graph;
  Seconds step_s = 0;
  MemoryPeaks peaks;
};

// Stages that are not a collective's join (a graph has one join per collective across nodes,
// with or without the other nodes' stages).
std::size_t work_stages(const StepGraph& g) {
  return static_cast<std::size_t>(std::count_if(g.stages.begin(), g.stages.end(), [](const Stage& s) { return !s.key.join; }));
}
std::size_t joins(const StepGraph& g) { return g.stages.size() - work_stages(g); }

Evaluated evaluate(const Plan& plan, const WorkloadContext& ctx, bool symmetric, int layers) {
  LoweringOptions o;
  o.symmetric_nodes = symmetric;
  o.decoder_layers = layers;
  Evaluated e;
  e.graph = lower(plan, ctx, o);
  const CalibratedDurationModel durations(ctx.hardware, load_calibration_for(ctx.hardware), ctx.workload.gpus);
  const StageTimes t = analytic_step_times(e.graph, durations);
  e.step_s = t.step_s;
  e.peaks = memory_peaks(e.graph, t, false);
  return e;
}

TEST(SymmetricLowering, OneNodesStagesGiveTheFullGraphsStepAndEveryPeak) {
  for (const int nodes : {2, 4}) {
    const WorkloadContext ctx = cluster_workload("qwen3.6-35b-a3b", nodes, 8 * nodes);
    for (const bool flat : {false, true}) {
      const Plan plan = ep_plan(ctx.model, flat);
      const Evaluated full = evaluate(plan, ctx, false, 6);
      const Evaluated sym = evaluate(plan, ctx, true, 6);
      EXPECT_EQ(full.graph.ranks_emitted, 0);
      EXPECT_EQ(sym.graph.ranks_emitted, 8) << nodes;
      EXPECT_EQ(check_step_graph(sym.graph), "");
      // One node's stages, every rank's memory events.
      EXPECT_EQ(work_stages(sym.graph) * static_cast<std::size_t>(nodes), work_stages(full.graph)) << nodes << " " << flat;
      EXPECT_EQ(joins(sym.graph), joins(full.graph));
      EXPECT_GT(joins(full.graph), 0u);
      for (const Stage& s : sym.graph.stages) EXPECT_LT(s.gpu, 8);
      EXPECT_NEAR(sym.step_s / full.step_s, 1.0, 1e-12) << nodes << " " << flat;
      ASSERT_EQ(sym.peaks.gpu_peak_bytes.size(), full.peaks.gpu_peak_bytes.size());
      for (std::size_t g = 0; g < full.peaks.gpu_peak_bytes.size(); ++g) {
        EXPECT_EQ(sym.peaks.gpu_peak_bytes[g], full.peaks.gpu_peak_bytes[g]) << "GPU " << g << " of " << nodes << " nodes, flat " << flat;
      }
      ASSERT_EQ(sym.peaks.numa_peak_bytes.size(), full.peaks.numa_peak_bytes.size());
      for (std::size_t n = 0; n < full.peaks.numa_peak_bytes.size(); ++n) {
        EXPECT_GT(sym.peaks.numa_peak_bytes[n], full.graph.numa_base_bytes[n]) << "NUMA " << n;
        EXPECT_EQ(sym.peaks.numa_peak_bytes[n], full.peaks.numa_peak_bytes[n]) << "NUMA " << n << " of " << nodes << " nodes, flat " << flat;
      }
    }
  }
}


TEST(SymmetricLowering, EpGroupsOfWholeNodesOrWithinOneStayExact) {
  // Plan::ep_group_gpus: all-to-alls within a group, the shard's all-gather and reduce-scatter
  // over its replicas on the other groups' nodes; a resident decoder's slices updated and
  // all-gathered over them.
  for (const auto& [nodes, group] : {std::pair{2, 8}, std::pair{4, 8}, std::pair{4, 16}, std::pair{2, 4}}) {
    const WorkloadContext ctx = cluster_workload("qwen3.6-35b-a3b", nodes, 8 * nodes);
    for (const bool flat : {false, true}) {
      Plan plan = test_support::cluster_ep_plan(ctx.model, 1, 2, flat);
      plan.ep_group_gpus = group;
      const Evaluated full = evaluate(plan, ctx, false, 4);
      const Evaluated sym = evaluate(plan, ctx, true, 4);
      EXPECT_EQ(sym.graph.ranks_emitted, 8) << nodes << " nodes, groups of " << group;
      EXPECT_EQ(work_stages(sym.graph) * static_cast<std::size_t>(nodes), work_stages(full.graph));
      // A group or replica set of other nodes only is the emitted ones' mirror, its join theirs.
      EXPECT_LE(joins(sym.graph), joins(full.graph));
      EXPECT_GT(joins(sym.graph), 0u);
      EXPECT_NEAR(sym.step_s / full.step_s, 1.0, 1e-12) << nodes << " nodes, groups of " << group << ", flat " << flat;
      EXPECT_EQ(sym.peaks.gpu_peak_bytes, full.peaks.gpu_peak_bytes);
      EXPECT_EQ(sym.peaks.numa_peak_bytes, full.peaks.numa_peak_bytes);
    }
  }
}

TEST(SymmetricLowering, LatentAttentionAndDenseFirstLayersToo) {
  const WorkloadContext ctx = cluster_workload("kimi-k2", 2, 16);
  const Plan plan = ep_plan(ctx.model, true);
  const Evaluated full = evaluate(plan, ctx, false, 3);
  const Evaluated sym = evaluate(plan, ctx, true, 3);
  EXPECT_EQ(sym.graph.ranks_emitted, 8);
  EXPECT_NEAR(sym.step_s / full.step_s, 1.0, 1e-12);
  EXPECT_EQ(sym.peaks.gpu_peak_bytes, full.peaks.gpu_peak_bytes);
  EXPECT_EQ(sym.peaks.numa_peak_bytes, full.peaks.numa_peak_bytes);
}

TEST(SymmetricLowering, RanksThatDoNotRunAlikeGetTheirOwnStages) {
  const nlohmann::json skew = {{"kind", "zipf"}, {"skew", 1.2}};
  const WorkloadContext skewed = cluster_workload("qwen3.6-35b-a3b", 2, 16, skew);
  EXPECT_EQ(evaluate(ep_plan(skewed.model, true), skewed, true, 2).graph.ranks_emitted, 0) << "skewed routing loads ranks unevenly";
  const WorkloadContext two = cluster_workload("qwen3.6-35b-a3b", 2, 16);
  Plan ring = ep_plan(two.model, false);
  ring.flat.vocab_projection = VocabProjection::kRingDtp;
  EXPECT_EQ(evaluate(ring, two, true, 2).graph.ranks_emitted, 0) << "Ring-DTP's ring crosses the nodes one way";
  const WorkloadContext one = cluster_workload("qwen3.6-35b-a3b", 1, 8);
  EXPECT_EQ(evaluate(ep_plan(one.model, false), one, true, 2).graph.ranks_emitted, 0) << "one node";
  const WorkloadContext partial = cluster_workload("qwen3.6-35b-a3b", 2, 16);
  EXPECT_EQ(PlanPricer(partial, load_calibration_for(partial.hardware)).lower_plan(ep_plan(partial.model, false), 2).ranks_emitted, 8)
      << "the plan search prices with one node's stages";
}


// The offload baselines run the same schedule on every rank: one node's stages on whole alike nodes.
TEST(SymmetricLowering, BaselinesToo) {
  for (const int nodes : {2, 4}) {
    const WorkloadContext ctx = cluster_workload("qwen3.6-35b-a3b", nodes, 8 * nodes);
    const CalibratedDurationModel durations(ctx.hardware, load_calibration_for(ctx.hardware), ctx.workload.gpus);
    for (const auto s : all_baseline_systems()) {
      const BaselineSetup setup{s, 2, 1, s == BaselineSystem::kMegaTrain ? 1 : 4};
      LoweringOptions full_options, sym_options;
      full_options.decoder_layers = sym_options.decoder_layers = 4;
      sym_options.symmetric_nodes = true;
      const StepGraph full = lower_baseline(setup, ctx, full_options);
      const StepGraph sym = lower_baseline(setup, ctx, sym_options);
      EXPECT_EQ(full.ranks_emitted, 0);
      EXPECT_EQ(sym.ranks_emitted, 8);
      EXPECT_EQ(check_step_graph(sym), "");
      EXPECT_EQ(work_stages(sym) * static_cast<std::size_t>(nodes), work_stages(full)) << baseline_system_name(s);
      EXPECT_EQ(joins(sym), joins(full)) << baseline_system_name(s);
      const StageTimes tf = analytic_step_times(full, durations), ts = analytic_step_times(sym, durations);
      EXPECT_NEAR(ts.step_s / tf.step_s, 1.0, 1e-12) << baseline_system_name(s) << " on " << nodes << " nodes";
      const MemoryPeaks mf = memory_peaks(full, tf, false), ms = memory_peaks(sym, ts, false);
      EXPECT_EQ(ms.gpu_peak_bytes, mf.gpu_peak_bytes) << baseline_system_name(s);
      EXPECT_EQ(ms.numa_peak_bytes, mf.numa_peak_bytes) << baseline_system_name(s);
    }
  }
  // FSDP2 with each sequence over half a node, a node or both nodes (context parallelism).
  for (const std::int64_t seqs : {4, 2, 1}) {
    const WorkloadContext ctx = test_support::h200_workload("qwen3.6-35b-a3b", 2, 16, seqs, 32768);
    const CalibratedDurationModel durations(ctx.hardware, load_calibration_for(ctx.hardware), ctx.workload.gpus);
    const BaselineSetup setup{BaselineSystem::kFsdp2Offload, 1, 1, 4};
    LoweringOptions full_options, sym_options;
    full_options.decoder_layers = sym_options.decoder_layers = 4;
    sym_options.symmetric_nodes = true;
    const StepGraph full = lower_baseline(setup, ctx, full_options), sym = lower_baseline(setup, ctx, sym_options);
    EXPECT_EQ(sym.ranks_emitted, 8);
    EXPECT_EQ(check_step_graph(sym), "");
    EXPECT_EQ(work_stages(sym) * 2, work_stages(full)) << seqs;
    const StageTimes tf = analytic_step_times(full, durations), ts = analytic_step_times(sym, durations);
    EXPECT_NEAR(ts.step_s / tf.step_s, 1.0, 1e-12) << seqs << " sequences";
    const MemoryPeaks mf = memory_peaks(full, tf, false), ms = memory_peaks(sym, ts, false);
    EXPECT_EQ(ms.gpu_peak_bytes, mf.gpu_peak_bytes) << seqs;
    EXPECT_EQ(ms.numa_peak_bytes, mf.numa_peak_bytes) << seqs;
  }
  // run_baseline() lowers them so for the analytic engine: the same result as a full graph's.
  const WorkloadContext ctx = cluster_workload("qwen3.6-35b-a3b", 2, 16);
  const BaselineGraph sym = baseline_step_graph(BaselineSystem::kFsdp2Offload, ctx, {}, true);
  ASSERT_TRUE(sym.setup);
  EXPECT_EQ(sym.graph.ranks_emitted, 8);
  EXPECT_EQ(baseline_step_graph(BaselineSystem::kFsdp2Offload, ctx).graph.ranks_emitted, 0);
}

// Across nodes a collective's members wait for one join of every member's input (P dependencies
// instead of P²), and no longer than they did without it: each member starts when every member's
// input and its own port's previous stage are done.
void expect_joins_add_no_wait(const StepGraph& g, const DurationModel& durations, const std::string& what) {
  std::vector<StageId> previous(g.stages.size(), -1);
  for (const Resource& r : g.resources) {
    for (std::size_t i = 1; i < r.order.size(); ++i) previous[static_cast<std::size_t>(r.order[i])] = r.order[i - 1];
  }
  const StageTimes t = analytic_step_times(g, durations);
  std::size_t edges = 0, members = 0, joined = 0;
  for (const Stage& s : g.stages) {
    edges += s.deps.size();
    if (s.key.join) {
      ++joined;
      EXPECT_EQ(s.op, OpKind::kSync) << s.name;
      EXPECT_EQ(s.flops + static_cast<double>(s.bytes), 0.0) << s.name;
      continue;
    }
    if (s.peers.empty() || s.deps.empty()) continue;
    ++members;
    ASSERT_LE(s.deps.size(), 2u) << s.name;
    const Stage& join = g.stage(s.deps.front());
    ASSERT_TRUE(join.key.join) << s.name;
    EXPECT_EQ(join.key.op, s.key.op) << s.name;
    Seconds ready = previous[static_cast<std::size_t>(s.id)] >= 0 ? t.finish_s[static_cast<std::size_t>(previous[static_cast<std::size_t>(s.id)])] : 0.0;
    for (const StageId d : join.deps) ready = std::max(ready, t.finish_s[static_cast<std::size_t>(d)]);
    for (const StageId d : s.deps) {
      if (d != join.id) ready = std::max(ready, t.finish_s[static_cast<std::size_t>(d)]);
    }
    EXPECT_NEAR(t.start_s[static_cast<std::size_t>(s.id)], ready, 1e-12 * std::max(1.0, ready)) << what << ": " << s.name;
  }
  EXPECT_GT(members, 0u) << what;
  EXPECT_GT(joined, 0u) << what;
  EXPECT_LE(edges, 3 * g.stages.size()) << what;
}

TEST(CollectiveJoins, AcrossNodesMembersWaitThroughOneJoinAndNoLonger) {
  for (const int nodes : {2, 4}) {
    const WorkloadContext ctx = cluster_workload("qwen3.6-35b-a3b", nodes, 8 * nodes);
    const CalibratedDurationModel durations(ctx.hardware, load_calibration_for(ctx.hardware), ctx.workload.gpus);
    for (const bool flat : {false, true}) {
      LoweringOptions o;
      o.decoder_layers = 4;
      expect_joins_add_no_wait(lower(ep_plan(ctx.model, flat), ctx, o), durations, fmt::format("EP on {} nodes, flat {}", nodes, flat));
    }
    LoweringOptions o;
    o.decoder_layers = 4;
    expect_joins_add_no_wait(lower_baseline(BaselineSetup{BaselineSystem::kFsdp2Offload, 2, 1, 4}, ctx, o), durations,
                             fmt::format("FSDP2 on {} nodes", nodes));
  }
}

TEST(CollectiveJoins, OneNodesCollectivesKeepEveryInput) {
  const WorkloadContext ctx = cluster_workload("qwen3.6-35b-a3b", 1, 8);
  LoweringOptions o;
  o.decoder_layers = 2;
  const StepGraph g = lower(ep_plan(ctx.model, false), ctx, o);
  EXPECT_EQ(joins(g), 0u);
  std::size_t members = 0;
  for (const Stage& s : g.stages) {
    if (s.peers.empty() || s.deps.empty()) continue;
    ++members;
    EXPECT_EQ(s.deps.size(), 8u) << s.name;  // every member's input
  }
  EXPECT_GT(members, 0u);
}

}  // namespace
}  // namespace oom
