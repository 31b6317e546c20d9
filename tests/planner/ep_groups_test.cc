// Data parallelism of EP groups (Plan::ep_group_gpus): the plan field, its validation, what the
// lowering makes of it (all-to-alls within a group; each expert shard's weights all-gathered and
// its gradient reduce-scattered over its replicas; each rank's host updating its 1/D slice), the
// static memory and cost reports, and the planner's group sizes and search.
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "costmodel/input_error.h"
#include "costmodel/params.h"
#include "planner/engine/analytic_evaluator.h"
#include "planner/engine/cost_report.h"
#include "planner/engine/duration_model.h"
#include "planner/lowering/memory_report.h"
#include "planner/lowering/step_graph.h"
#include "planner/search/plan_presets.h"
#include "planner/search/ep_planner.h"
#include "planner/search/plan_pricing.h"
#include "tests/common/cluster_workload.h"

namespace oom {
namespace {

using test_support::cluster_workload;

Plan grouped(const ModelSpec& m, int group, bool flat) {
  Plan p = test_support::cluster_ep_plan(m, 0, 2, flat);
  p.ep_group_gpus = group;
  return p;
}

void expect_refused(const Plan& p, const WorkloadContext& ctx, const std::string& field, const std::string& phrase) {
  try {
    validate_plan(p, ctx.model, ctx.workload, "p.json");
    ADD_FAILURE() << "accepted ep_group_gpus " << p.ep_group_gpus << " on " << ctx.workload.gpus << " GPUs";
  } catch (const InputError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("p.json"), std::string::npos) << what;
    EXPECT_NE(what.find(field), std::string::npos) << what;
    EXPECT_NE(what.find(phrase), std::string::npos) << what;
  }
}

std::vector<int> replicas_of(int rank, int group, int gpus) {
  std::vector<int> out;
  for (int q = rank % group; q < gpus; q += group) out.push_back(q);
  return out;
}

TEST(EpGroups, PlanJsonWritesTheGroupOnlyWhenSet) {
  Plan p;
  EXPECT_FALSE(plan_to_json(p).contains("ep_group_gpus"));
  EXPECT_EQ(p.ep_group(16), 16);
  EXPECT_EQ(p.ep_replicas(16), 1);
  p.ep_group_gpus = 8;
  const nlohmann::json j = plan_to_json(p);
  EXPECT_EQ(j.at("ep_group_gpus"), 8);
  EXPECT_EQ(plan_from_json(j, "p.json"), p);
  EXPECT_EQ(p.ep_group(16), 8);
  EXPECT_EQ(p.ep_replicas(16), 2);
  EXPECT_EQ(p.ep_group(8), 8);
  EXPECT_EQ(p.ep_replicas(8), 1);
  nlohmann::json bad = j;
  bad["ep_group_gpus"] = -2;
  EXPECT_THROW(plan_from_json(bad, "p.json"), InputError);
  bad["ep_group_gpus"] = "8";
  EXPECT_THROW(plan_from_json(bad, "p.json"), InputError);
}

TEST(EpGroups, ValidationRefusesGroupsThatDoNotFit) {
  const WorkloadContext two = cluster_workload("qwen3.6-35b-a3b", 2);  // 16 GPUs, 256 experts
  Plan p = grouped(two.model, 8, false);
  EXPECT_NO_THROW(validate_plan(p, two.model, two.workload, "p.json"));
  p.ep_group_gpus = 16;  // one group of every GPU, as 0
  EXPECT_NO_THROW(validate_plan(p, two.model, two.workload, "p.json"));
  p.ep_group_gpus = 6;
  expect_refused(p, two, "ep_group_gpus", "divides the workload's 16 GPUs");
  p.ep_group_gpus = 32;
  expect_refused(p, two, "ep_group_gpus", "divides");
  p = grouped(two.model, 8, false);
  p.resident_layers = {0};  // resident on every replica, each updating its slice
  EXPECT_NO_THROW(validate_plan(p, two.model, two.workload, "p.json"));
  p = Plan{};
  p.path = ExpertPath::kLocal;
  p.ep_group_gpus = 8;
  expect_refused(p, two, "ep_group_gpus", "local path");

  const WorkloadContext three = cluster_workload("qwen3.6-35b-a3b", 3);  // 24 GPUs do not split 256 experts
  expect_refused(grouped(three.model, 0, false), three, "path", "split evenly over 24 GPUs");
  expect_refused(grouped(three.model, 12, false), three, "ep_group_gpus", "split evenly over 12 GPUs");
  EXPECT_NO_THROW(validate_plan(grouped(three.model, 8, false), three.model, three.workload, "p.json"));
}

Seconds step_of(const StepGraph& g, const WorkloadContext& ctx) {
  const CalibratedDurationModel durations(ctx.hardware, load_calibration_for(ctx.hardware), ctx.workload.gpus);
  return analytic_step_times(g, durations).step_s;
}

TEST(EpGroups, OneGroupOfEveryGpuIsTheUngroupedStep) {
  const WorkloadContext ctx = cluster_workload("qwen3.6-35b-a3b", 2);
  LoweringOptions o;
  o.decoder_layers = 4;
  for (const bool flat : {false, true}) {
    const StepGraph a = lower(grouped(ctx.model, 0, flat), ctx, o), b = lower(grouped(ctx.model, 16, flat), ctx, o);
    ASSERT_EQ(a.stages.size(), b.stages.size());
    for (std::size_t i = 0; i < a.stages.size(); ++i) {
      EXPECT_EQ(a.stages[i].name, b.stages[i].name);
      EXPECT_EQ(a.stages[i].bytes, b.stages[i].bytes);
      EXPECT_EQ(a.stages[i].deps, b.stages[i].deps);
    }
    EXPECT_EQ(step_of(a, ctx), step_of(b, ctx));
  }
}

TEST(EpGroups, CollectivesSpanTheGroupOrTheShardsReplicas) {
  const WorkloadContext ctx = cluster_workload("qwen3.6-35b-a3b", 2);  // groups of 8: one per node
  const int P = 16, E = 8, D = 2;
  const ModelParams params = model_params(ctx.model);
  LoweringOptions o;
  o.decoder_layers = 4;
  for (const bool flat : {false, true}) {
    const StepGraph g = lower(grouped(ctx.model, E, flat), ctx, o);
    EXPECT_EQ(check_step_graph(g), "");
    int a2a = 0, gathers = 0, expert_scatters = 0, common_scatters = 0, copies = 0, updates = 0;
    for (const Stage& s : g.stages) {
      if (s.key.join) continue;
      const int l = s.layer;
      const ParamCount bank = l >= 0 ? params.layers[static_cast<std::size_t>(l)].routed_experts : 0;
      const ParamCount common = l >= 0 ? params.layers[static_cast<std::size_t>(l)].common() : 0;
      if (s.op == OpKind::kAllToAll) {
        ++a2a;
        for (const int q : s.peers) EXPECT_EQ(q / E, s.gpu / E) << s.name;  // within the rank's group (its node)
        EXPECT_EQ(s.peers.size(), static_cast<std::size_t>(E)) << s.name;
      } else if (s.key.part == StagePart::kWeights && s.key.op == StageOp::kAllGather) {
        ++gathers;
        EXPECT_EQ(s.peers, replicas_of(s.gpu, E, P)) << s.name;
        EXPECT_EQ(s.bytes, working_weight_bytes(bank / E - bank / E / D)) << s.name;
      } else if (s.key.part == StagePart::kExperts && s.key.op == StageOp::kReduceScatter) {
        ++expert_scatters;
        EXPECT_EQ(s.peers, replicas_of(s.gpu, E, P)) << s.name;
        EXPECT_EQ(s.bytes, gradient_bytes(bank / E) * (D - 1) / D) << s.name;
      } else if (s.key.part == StagePart::kCommon && s.key.op == StageOp::kReduceScatter) {
        ++common_scatters;
        EXPECT_EQ(s.peers.size(), static_cast<std::size_t>(P)) << s.name;
      } else if (s.key.part == StagePart::kWeights && s.key.op == StageOp::kH2d) {
        ++copies;
        EXPECT_EQ(s.bytes, working_weight_bytes(common + bank / E / D)) << s.name;
      } else if (!flat && s.key.part == StagePart::kLayer && s.key.op == StageOp::kCpuAdamW) {
        ++updates;
        EXPECT_EQ(s.params, common / P + bank / E / D) << s.name;
      }
    }
    EXPECT_GT(a2a, 0);
    EXPECT_GT(gathers, 0);
    EXPECT_EQ(expert_scatters, 4 * P);
    EXPECT_EQ(common_scatters, 4 * P);
    EXPECT_GT(copies, 0);
    if (!flat) EXPECT_EQ(updates, 4 * P);
    EXPECT_GT(step_of(g, ctx), 0);
  }
}

TEST(EpGroups, ReplicasKeepEachRanksHostSliceAndHoldTheGroupsShard) {
  // Kimi-K2's expert banks make a decoder's backward the GPU's largest workset.
  const WorkloadContext ctx = cluster_workload("kimi-k2", 2);
  const MemoryReport one = static_memory(ctx, grouped(ctx.model, 0, false), {});
  const MemoryReport two = static_memory(ctx, grouped(ctx.model, 8, false), {});
  const auto item = [](const std::vector<MemoryItem>& items, const std::string& prefix) {
    for (const MemoryItem& i : items) {
      if (i.name.rfind(prefix, 0) == 0) return i.bytes;
    }
    return Bytes{-1};
  };
  ASSERT_EQ(one.host.size(), two.host.size());
  for (std::size_t n = 0; n < one.host.size(); ++n) {
    // A rank's host holds 1/D of a shard twice the size: the same slice of the experts' state.
    EXPECT_EQ(item(two.host[n].items, "canonical state, streamed expert shards"),
              item(one.host[n].items, "canonical state, streamed expert shards"));
  }
  const ModelParams params = model_params(ctx.model);
  const LayerParams& moe = params.layers.back();  // every MoE decoder alike (the first is dense)
  const ParamCount bank = moe.routed_experts;
  // The grouped plan's largest workset is a MoE decoder's backward, with the group's shard (1/8).
  ASSERT_NE(two.gpu.work_peak_at.find("backward"), std::string::npos) << two.gpu.work_peak_at;
  EXPECT_EQ(item(two.gpu.work, "layer gradients"), gradient_bytes(moe.common() + bank / 8));
  EXPECT_GT(two.gpu.eq2.work, one.gpu.eq2.work);
  EXPECT_EQ(item(two.gpu.work, "expert shard slice staging"), working_weight_bytes(bank / 8 / 2));
  EXPECT_EQ(item(one.gpu.work, "expert shard slice staging"), -1);

  const StaticCost c1 = static_cost(ctx, grouped(ctx.model, 0, false)), c2 = static_cost(ctx, grouped(ctx.model, 8, false));
  EXPECT_EQ(c1.allgather_bytes, 0);
  EXPECT_GT(c2.allgather_bytes, 0);
  EXPECT_LT(c2.a2a_bytes, c1.a2a_bytes);  // (E−1)/E of the assignments leave a GPU, not (P−1)/P
  EXPECT_EQ(c2.h2d_bytes, c1.h2d_bytes);  // 1/D of a shard twice the size
  EXPECT_EQ(c1.cpu_updated_params, c2.cpu_updated_params);
}

TEST(EpGroups, AResidentShardIsUpdatedSliceBySliceOverItsReplicas) {
  // Two nodes in groups of 8: decoders 2 and 5 resident on both replicas of each shard.
  const WorkloadContext ctx = cluster_workload("qwen3.6-35b-a3b", 2);
  const int P = 16, E = 8, D = 2;
  const ModelParams params = model_params(ctx.model);
  LoweringOptions o;
  o.decoder_layers = 6;
  for (const bool flat : {false, true}) {
    Plan plan = grouped(ctx.model, E, flat);
    plan.resident_layers = {2, 5};
    validate_plan(plan, ctx.model, ctx.workload, "p.json");
    const StepGraph g = lower(plan, ctx, o);
    EXPECT_EQ(check_step_graph(g), "");
    int scatters = 0, adamw = 0, gathers = 0;
    for (const Stage& s : g.stages) {
      if (s.key.join || (s.layer != 2 && s.layer != 5)) continue;
      const ParamCount bank = params.layers[static_cast<std::size_t>(s.layer)].routed_experts, shard = bank / E;
      const ParamCount common = params.layers[static_cast<std::size_t>(s.layer)].common();
      if (s.key.part == StagePart::kExperts && s.key.op == StageOp::kReduceScatter) {
        ++scatters;
        EXPECT_EQ(s.peers, replicas_of(s.gpu, E, P)) << s.name;
        EXPECT_EQ(s.bytes, gradient_bytes(shard) * (D - 1) / D) << s.name;
      } else if (s.key.part == StagePart::kExperts && s.key.op == StageOp::kGpuAdamW) {
        ++adamw;
        EXPECT_EQ(s.bytes, shard / D * (2 * kCanonicalBytesPerParam + 2 * kBf16Bytes)) << s.name;  // the replica's slice
      } else if (s.key.part == StagePart::kExperts && s.key.op == StageOp::kAllGather) {
        ++gathers;
        EXPECT_EQ(s.phase, Phase::kOptimizer) << s.name;
        EXPECT_EQ(s.peers, replicas_of(s.gpu, E, P)) << s.name;
        EXPECT_EQ(s.bytes, working_weight_bytes(shard - shard / D)) << s.name;
      } else if (s.key.part == StagePart::kWeights && s.key.op == StageOp::kH2d) {
        EXPECT_EQ(s.bytes, working_weight_bytes(common)) << s.name;  // no expert weights over PCIe
      } else if (s.key.part == StagePart::kWeights && s.key.op == StageOp::kAllGather) {
        ADD_FAILURE() << "a resident shard is all-gathered for use: " << s.name;
      } else if (!flat && s.key.part == StagePart::kLayer && s.key.op == StageOp::kCpuAdamW) {
        EXPECT_EQ(s.params, common / P) << s.name;  // the CPU updates no expert slice
      }
    }
    EXPECT_EQ(scatters, 2 * P);
    EXPECT_EQ(adamw, 2 * P);
    EXPECT_EQ(gathers, 2 * P);
    EXPECT_GT(step_of(g, ctx), 0);
  }
  // Each replica holds the shards' BF16 weights and the FP32 state of its slices.
  Plan plan = grouped(ctx.model, E, false);
  plan.resident_layers = {2, 5};
  const MemoryReport m = static_memory(ctx, plan, {});
  const ParamCount shard = params.layers[2].routed_experts / E + params.layers[5].routed_experts / E;
  const ParamCount slices = params.layers[2].routed_experts / E / D + params.layers[5].routed_experts / E / D;
  EXPECT_EQ(m.gpu.eq2.state, canonical_state_bytes(slices) + working_weight_bytes(shard));
  const StaticCost c = static_cost(ctx, plan), c0 = static_cost(ctx, grouped(ctx.model, E, false));
  EXPECT_EQ(c.gpu_updated_params, slices);
  EXPECT_EQ(c.cpu_updated_params, c0.cpu_updated_params - slices);
}

TEST(EpGroups, AResidentDecoderWithoutRoutedExpertsUpdatesNoShard) {
  // Kimi-K2's first decoder is dense: resident or not, it has no expert shard to reduce-scatter,
  // update or all-gather over the replicas; the second decoder's shard is.
  const WorkloadContext ctx = cluster_workload("kimi-k2", 2);
  ASSERT_EQ(ctx.model.first_dense_layers, 1);
  Plan plan = grouped(ctx.model, 8, false);
  plan.resident_layers = {0, 1};
  validate_plan(plan, ctx.model, ctx.workload, "p.json");
  LoweringOptions o;
  o.decoder_layers = 2;
  const StepGraph g = lower(plan, ctx, o);
  EXPECT_EQ(check_step_graph(g), "");
  std::map<int, int> shard_updates;  // per decoder: its shard's reduce-scatters, AdamW and refreshing all-gathers
  for (const Stage& s : g.stages) {
    if (s.key.join || s.key.part != StagePart::kExperts) continue;
    const bool refresh = s.key.op == StageOp::kAllGather && s.phase == Phase::kOptimizer;
    if (s.key.op == StageOp::kReduceScatter || s.key.op == StageOp::kGpuAdamW || refresh) ++shard_updates[s.layer];
  }
  EXPECT_EQ(shard_updates.count(0), 0u);
  EXPECT_EQ(shard_updates[1], 3 * 16);  // reduce-scatter, AdamW and all-gather on each of 16 ranks
}

TEST(EpGroups, CandidatesAreTheLargestGroupAndOneNode) {
  EXPECT_EQ(ep_group_candidates(cluster_workload("kimi-k2", 96)), (std::vector<int>{384, 8}));
  EXPECT_EQ(ep_group_candidates(cluster_workload("kimi-k2", 12)), (std::vector<int>{96, 8}));
  EXPECT_EQ(ep_group_candidates(cluster_workload("qwen3.6-35b-a3b", 3)), (std::vector<int>{8}));
  EXPECT_EQ(ep_group_candidates(cluster_workload("qwen3.6-35b-a3b", 1)), (std::vector<int>{8}));
  EXPECT_EQ(ep_group_candidates(cluster_workload("qwen3.6-35b-a3b", 1, 6)), (std::vector<int>{2}));
  EXPECT_TRUE(ep_group_candidates(cluster_workload("qwen3.6-35b-a3b", 1, 3)).empty());
}

TEST(EpGroups, TheBasePresetTakesTheLargestGroupWhenTheExpertsDoNotSplitOverEveryGpu) {
  const std::optional<Plan> two = preset_plan("base", ExpertPath::kEp, cluster_workload("qwen3.6-35b-a3b", 2));
  ASSERT_TRUE(two.has_value());
  EXPECT_EQ(two->ep_group_gpus, 0);
  const WorkloadContext three = cluster_workload("qwen3.6-35b-a3b", 3);
  const std::optional<Plan> grouped_base = preset_plan("base", ExpertPath::kEp, three);
  ASSERT_TRUE(grouped_base.has_value());
  EXPECT_EQ(grouped_base->ep_group_gpus, 8);
  EXPECT_NO_THROW(validate_plan(*grouped_base, three.model, three.workload, "base"));
  EXPECT_FALSE(preset_plan("base", ExpertPath::kEp, cluster_workload("qwen3.6-35b-a3b", 1, 3)).has_value());
}

TEST(EpGroups, ThePlannerFindsAGroupedPlanWhereNoSingleGroupSplitsTheExperts) {
  const WorkloadContext ctx = cluster_workload("qwen3.6-35b-a3b", 3);
  const PlanPricer pricer(ctx, load_calibration_for(ctx.hardware));
  const EpSearchResult r = plan_ep(pricer);
  ASSERT_TRUE(r.best.has_value());
  EXPECT_EQ(r.best->plan.ep_group_gpus, 8);
  EXPECT_NE(r.best->plan.notes.find("EP groups of 8 GPUs (3 replicas"), std::string::npos) << r.best->plan.notes;
  EXPECT_NO_THROW(validate_plan(r.best->plan, ctx.model, ctx.workload, "planned"));
  EXPECT_GT(r.priced, 0);
}

}  // namespace
}  // namespace oom
