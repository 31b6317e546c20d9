// DeepSeek-V3 style decoders in the lowerings: latent attention layers are attention layers with
// their own widths, and a dense first layer runs its MLP where a MoE layer runs router and shared
// expert, with no experts, all-to-all or expert stream of its own.
#include <gtest/gtest.h>

#include "costmodel/memory.h"
#include "costmodel/params.h"
#include "planner/lowering/baselines.h"
#include "planner/lowering/step_graph.h"
#include "planner/search/plan_pricing.h"

namespace oom {
namespace {

// Kimi-K2 (one dense layer, 384 experts) over `gpus` H200s of two DGX H200 nodes, 4K context.
WorkloadContext kimi_on_h200(int gpus) {
  Workload w;
  w.model = "kimi-k2";
  w.hardware = "h200-sxm-node";
  w.nodes = 2;
  w.gpus = gpus;
  w.global_batch = gpus;
  w.seq_len = 4096;
  return resolve_workload(w, "w.json");
}

struct LayerOps {
  int all_to_all = 0, expert_gemm = 0, attention = 0;
  Bytes h2d = 0;
};

LayerOps ops_of(const StepGraph& g, int layer, int rank) {
  LayerOps o;
  for (const Stage& s : g.stages) {
    if (s.layer != layer || s.gpu != rank) continue;
    o.all_to_all += s.op == OpKind::kAllToAll ? 1 : 0;
    o.expert_gemm += s.op == OpKind::kExpertGemm ? 1 : 0;
    o.attention += s.op == OpKind::kAttention ? 1 : 0;
    o.h2d += s.op == OpKind::kH2d ? s.bytes : 0;
  }
  return o;
}

TEST(LatentModel, ADenseFirstLayerHasNoExpertsAllToAllOrExpertStream) {
  const WorkloadContext ctx = kimi_on_h200(16);
  const StepGraph g = lower(Plan{}, ctx);
  ASSERT_EQ(check_step_graph(g), "");
  const LayerOps dense = ops_of(g, 0, 5), moe = ops_of(g, 1, 5);
  EXPECT_EQ(dense.all_to_all, 0);
  EXPECT_EQ(dense.expert_gemm, 0);
  EXPECT_GT(dense.attention, 0);
  EXPECT_GT(moe.all_to_all, 0);
  EXPECT_GT(moe.expert_gemm, 0);
  // Layer 0 streams its common weights (attention and the 18432-wide MLP) only; layer 1 adds its
  // 24 experts, so its weight traffic exceeds layer 0's by more than their BF16 bytes less the MLP's.
  const ModelParams p = model_params(ctx.model);
  EXPECT_GT(dense.h2d, 0);
  EXPECT_GT(moe.h2d - dense.h2d, working_weight_bytes(p.layers[1].routed_experts / 16 - p.layers[0].dense_mlp));
}

TEST(LatentModel, Fsdp2LowersTheDenseLayerWithoutAnExpertGemm) {
  const WorkloadContext ctx = kimi_on_h200(16);
  BaselineSetup setup;
  setup.system = BaselineSystem::kFsdp2Offload;
  setup.micro_batch_seqs = 1;
  setup.accumulation_steps = 1;
  const StepGraph g = lower_baseline(setup, ctx);
  ASSERT_EQ(check_step_graph(g), "");
  EXPECT_EQ(ops_of(g, 0, 3).expert_gemm, 0);
  EXPECT_GT(ops_of(g, 1, 3).expert_gemm, 0);
}

TEST(LatentModel, ThePlanPricesOnBothNodesWithLatentAttentionCores) {
  const WorkloadContext ctx = kimi_on_h200(16);
  const PlanPricer pricer(ctx, load_calibration_for(ctx.hardware));
  const PricedPlan priced = pricer.price(Plan{}, 4);
  EXPECT_GT(priced.step_s, 0);
  EXPECT_EQ(priced.numa_peak_bytes.size(), 4u);  // two sockets on each of two nodes
}

}  // namespace
}  // namespace oom
