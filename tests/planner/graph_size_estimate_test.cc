// planner/lowering/graph_size_estimate.h against the graphs the lowerings build: the estimated
// stages equal the built graph's and the dependencies lie within kDepsEstimateFactor, over EP
// plans (one node and two, with and without symmetric nodes, EP groups, context parallelism,
// PipelinedLLEP with spills, SCO, a streamed optimizer, Ring-DTP, split attention, kept O/LSE,
// resident and retained decoders), Local plans (split and unsplit, sub-batches, shard and full
// delivery, regenerated boundaries, a streamed optimizer) and every baseline system. A change to
// a lowering's loops that the estimate does not follow fails here.
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "costmodel/input_error.h"
#include "planner/lowering/baselines.h"
#include "planner/lowering/baselines_ktft.h"
#include "planner/lowering/baselines_megatron.h"
#include "planner/lowering/graph_size_estimate.h"
#include "planner/lowering/step_graph.h"
#include "tests/common/cluster_workload.h"

namespace oom {
namespace {

using test_support::cluster_ep_plan;
using test_support::cluster_workload;
using test_support::h200_workload;

double deps_of(const StepGraph& g) {
  double n = 0;
  for (const Stage& s : g.stages) n += static_cast<double>(s.deps.size());
  return n;
}

void expect_matches(const GraphSize& estimate, const StepGraph& g, const std::string& what) {
  EXPECT_EQ(estimate.stages, static_cast<double>(g.stages.size())) << what;
  const double deps = deps_of(g);
  EXPECT_LE(deps, estimate.deps * kDepsEstimateFactor) << what;
  EXPECT_GE(deps, estimate.deps / kDepsEstimateFactor) << what;
}

void expect_plan_matches(const Plan& plan, const WorkloadContext& ctx, bool symmetric, int layers, const std::string& what) {
  validate_plan(plan, ctx.model, ctx.workload, what);
  LoweringOptions o;
  o.symmetric_nodes = symmetric;
  o.decoder_layers = layers;
  expect_matches(estimate_step_graph(plan, ctx, o), lower(plan, ctx, o), fmt::format("{} (symmetric {})", what, symmetric));
}

// `model` on one H100 node (its CPUs have AMX, which KT-FT needs).
WorkloadContext h100(const std::string& model, int gpus, std::int64_t batch, std::int64_t seq_len) {
  return test_support::node_workload("h100-sxm-node", model, 1, gpus, batch, seq_len);
}

TEST(GraphSizeEstimate, MatchesTheEpLoweringOnOneNodeAndAcrossNodes) {
  for (const int nodes : {1, 2}) {
    const WorkloadContext ctx = cluster_workload("qwen3.6-35b-a3b", nodes);
    for (const bool flat : {false, true}) {
      Plan plan = cluster_ep_plan(ctx.model, 3, 2, flat);
      for (const bool symmetric : {false, true}) {
        expect_plan_matches(plan, ctx, symmetric, 8, fmt::format("EP {} nodes flat {}", nodes, flat));
      }
      plan.routing_chunk_tokens = 1024;  // more chunks than the tokens split evenly into: the last one short
      plan.split.attention_head_group = 2;
      plan.keep_attention_results = !flat;
      expect_plan_matches(plan, ctx, true, 4, fmt::format("EP chunked, split heads, {} nodes flat {}", nodes, flat));
    }
  }
}

TEST(GraphSizeEstimate, MatchesEpGroupsContextParallelismSpillsAndRingDtp) {
  const WorkloadContext two = cluster_workload("qwen3.6-35b-a3b", 2);
  Plan grouped = cluster_ep_plan(two.model, 4, 1, true);
  grouped.ep_group_gpus = 8;
  expect_plan_matches(grouped, two, false, 6, "EP groups of 8");
  expect_plan_matches(grouped, two, true, 6, "EP groups of 8");

  const WorkloadContext cp = h200_workload("qwen3.6-35b-a3b", 1, 8, 4, 16384);
  Plan ring = cluster_ep_plan(cp.model, 0, 0, false);
  ring.context_parallel_gpus = 2;
  expect_plan_matches(ring, cp, false, 4, "context parallelism");

  const WorkloadContext skewed = cluster_workload("qwen3.6-35b-a3b", 2, 0, {{"kind", "zipf"}, {"skew", 1.2}});
  Plan llep = cluster_ep_plan(skewed.model, 0, 0, true);
  llep.flat.vocab_projection = VocabProjection::kRingDtp;
  expect_plan_matches(llep, skewed, true, 4, "LLEP spills and Ring-DTP");
}

TEST(GraphSizeEstimate, MatchesTheLocalLoweringSplitAndUnsplit) {
  const WorkloadContext ctx = h100("qwen3.6-35b-a3b", 4, 32, 8192);
  Plan plan;
  plan.path = ExpertPath::kLocal;
  plan.routing_chunk_tokens = Plan{}.routing_chunk_tokens;
  expect_plan_matches(plan, ctx, false, 0, "Local unsplit");
  plan.split.sub_batch_seqs = 4;  // 8 sequences per GPU: two sub-batches
  plan.split.moe_chunk_tokens = 5000;
  plan.split.gdn_chunk_tokens = 2048;
  plan.split.attention_head_group = 2;
  plan.param_transfer = ParamTransfer::kShard;
  expect_plan_matches(plan, ctx, false, 0, "Local split, shard delivery");
  plan.param_transfer = ParamTransfer::kFull;
  plan.split.sub_batch_seqs = 2;
  plan.boundaries.host_kept_all = false;
  plan.boundaries.host_kept = {0, 4, 9};
  plan.boundaries.gpu_held = {12};
  plan.boundaries.regenerate_cap = 2;
  plan.keep_attention_results = true;
  plan.flat.optimizer_bucket_mib = 16;
  expect_plan_matches(plan, ctx, false, 16, "Local regenerated boundaries, streamed optimizer");
}

TEST(GraphSizeEstimate, MatchesEveryBaselineSystem) {
  const WorkloadContext ctx = h100("qwen3.6-35b-a3b", 4, 32, 4096);
  for (const BaselineSystem s : known_baseline_systems()) {
    const std::string name(baseline_system_name(s));
    LoweringOptions o;
    o.decoder_layers = 8;
    if (s == BaselineSystem::kMegatronLm) {
      const MegatronFit fit = configure_megatron(ctx);
      ASSERT_TRUE(fit.setup) << name;
      expect_matches(estimate_megatron_graph(*fit.setup, ctx, o), lower_megatron(*fit.setup, ctx, o), name);
      continue;
    }
    const BaselineFit fit = configure_baseline(s, ctx);
    ASSERT_TRUE(fit.setup) << name << ": " << (fit.oom ? fit.oom->message() : "");
    if (s == BaselineSystem::kKtFt) {
      expect_matches(estimate_ktft_graph(*fit.setup, ctx, o), lower_ktft(*fit.setup, ctx, o), name);
      continue;
    }
    expect_matches(estimate_baseline_graph(*fit.setup, ctx, o), lower_baseline(*fit.setup, ctx, o), name);
    // Across nodes, with one node's stages and with every rank's.
    const WorkloadContext two = cluster_workload("qwen3.6-35b-a3b", 2);
    BaselineSetup setup = *fit.setup;
    setup.accumulation_steps = 2;
    for (const bool symmetric : {false, true}) {
      o.symmetric_nodes = symmetric;
      expect_matches(estimate_baseline_graph(setup, two, o), lower_baseline(setup, two, o), name + " on two nodes");
    }
  }
}

TEST(GraphSizeEstimate, ARoutingChunkOfOneTokenIsCountedNotBuiltAndNamed) {
  const WorkloadContext ctx = h100("qwen3.6-35b-a3b", 4, 4, 262144);
  Plan plan = cluster_ep_plan(ctx.model, 0, 0, false);
  plan.routing_chunk_tokens = 1;
  const GraphSize size = estimate_step_graph(plan, ctx);
  // 40 decoders × 262,144 one-token chunks × (forward, replay, backward) × 4 ranks × ~4 stages.
  EXPECT_GT(size.stages, 40.0 * 262144 * 3 * 4 * 4);
  EXPECT_EQ(size.field, "routing_chunk_tokens");
  EXPECT_EQ(size.value, "1");
  LoweringOptions o;
  try {
    lower(plan, ctx, o);
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_EQ(e.field(), "routing_chunk_tokens");
    EXPECT_NE(std::string(e.what()).find("--max-stages"), std::string::npos) << e.what();
  }
}

TEST(GraphSizeEstimate, TheLimitIsTheOptionsAndItsDefaultIsSettable) {
  const WorkloadContext ctx = h100("qwen3.6-35b-a3b", 4, 16, 4096);
  const Plan plan = cluster_ep_plan(ctx.model, 0, 0, false);
  LoweringOptions o;
  o.decoder_layers = 2;
  const double stages = estimate_step_graph(plan, ctx, o).stages;
  o.max_stages = stages - 1;
  EXPECT_THROW(lower(plan, ctx, o), InputError);
  o.max_stages = stages;
  EXPECT_EQ(static_cast<double>(lower(plan, ctx, o).stages.size()), stages);
  const double before = max_stages_default();
  set_max_stages_default(stages - 1);
  LoweringOptions lowered;
  EXPECT_EQ(lowered.max_stages, stages - 1);
  set_max_stages_default(before);
}

}  // namespace
}  // namespace oom
