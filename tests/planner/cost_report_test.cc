// Static cost of a plan: FLOPs, traffic and per-resource time bounds.
#include "planner/engine/cost_report.h"

#include <gtest/gtest.h>

#include "costmodel/flops.h"
#include "costmodel/memory.h"
#include "costmodel/params.h"

namespace oom {
namespace {

TEST(CostReport, DefaultWorkloadAndPlanAreValid) {
  const WorkloadContext ctx = resolve_workload(default_workload(), "default");
  const Plan p = default_plan();
  EXPECT_NO_THROW(validate_plan(p, ctx.model, ctx.workload, "default"));
  EXPECT_EQ(p.resident_layers.size(), 23u);
}

TEST(CostReport, ResidencyRemovesWeightTrafficAndCpuUpdates) {
  const WorkloadContext ctx = resolve_workload(default_workload(), "default");
  Plan r23 = default_plan();
  Plan r0 = r23;
  r0.resident_layers.clear();
  const StaticCost a = static_cost(ctx, r0), b = static_cost(ctx, r23);
  const ModelParams params = model_params(ctx.model);
  const ParamCount shard = params.layers[0].routed_experts / 4;
  // Each resident layer saves its shard's BF16 weights twice (forward, backward) over H2D, its BF16
  // gradients over D2H, and its CPU update.
  EXPECT_EQ(a.h2d_bytes - b.h2d_bytes, 23 * 2 * working_weight_bytes(shard));
  EXPECT_EQ(a.d2h_bytes - b.d2h_bytes, 23 * gradient_bytes(shard));
  EXPECT_EQ(b.gpu_updated_params, 23 * shard);
  EXPECT_LT(b.cpu_update_s, a.cpu_update_s);
  EXPECT_DOUBLE_EQ(a.forward_flops, b.forward_flops);
  EXPECT_GE(a.serial_s(), a.lower_bound_s());
}

TEST(CostReport, AllToAllFollowsEq6PerMoePass) {
  const WorkloadContext ctx = resolve_workload(default_workload(), "default");
  Plan p = default_plan();
  const StaticCost c = static_cost(ctx, p);
  // 40 layers × 3 passes (forward, replay, backward) × Eq. 6.
  EXPECT_EQ(c.a2a_bytes, 40 * 3 * ep_a2a_bytes(8, 32768, 2048, 2, 4));
  p.moe_retained_layers = {36, 37, 38, 39};  // retained layers skip the replay's dispatch
  EXPECT_EQ(static_cost(ctx, p).a2a_bytes, (36 * 3 + 4 * 2) * ep_a2a_bytes(8, 32768, 2048, 2, 4));
}

TEST(CostReport, KeepingOLseRemovesAttentionCoreFromTheReplay) {
  Workload w = default_workload();
  w.global_batch = 4;
  w.seq_len = 131072;
  const WorkloadContext ctx = resolve_workload(w, "w");
  Plan p;
  p.path = ExpertPath::kLocal;
  const StaticCost plain = static_cost(ctx, p);
  p.keep_attention_results = true;
  const StaticCost keep = static_cost(ctx, p);
  Flops core = 0;
  for (int l = 3; l < 40; l += 4) core += layer_flops(ctx.model, l, 1, 131072).mixing_core.total();
  EXPECT_NEAR(plain.recompute_flops - keep.recompute_flops, core, core * 1e-12);
}

}  // namespace
}  // namespace oom
