// planner/lowering/baselines_ktft.h: KT-FT's experts on rank 0's CPU, priced at the published AMX
// efficiency or the DRAM rate, rank 0's expert update, its out-of-memory with where, and hardware
// without AMX as bad input.
#include "planner/lowering/baselines_ktft.h"

#include <gtest/gtest.h>

#include "costmodel/flops.h"
#include "costmodel/input_error.h"
#include "planner/calibration/calibration.h"
#include "planner/engine/baseline_run.h"
#include "planner/lowering/lowering.h"

namespace oom {
namespace {

WorkloadContext context(const std::string& hardware, int gpus, std::int64_t batch, std::optional<double> host_gib = std::nullopt) {
  Workload w;
  w.model = "qwen3.6-35b-a3b";
  w.hardware = hardware;
  w.gpus = gpus;
  w.global_batch = batch;
  w.seq_len = 4096;
  w.host_budget_gib = host_gib;
  return resolve_workload(w, "test");
}

TEST(KtFt, IsAKnownBaselineByName) {
  EXPECT_EQ(baseline_system_from_name("kt-ft"), BaselineSystem::kKtFt);
  EXPECT_EQ(baseline_system_name(BaselineSystem::kKtFt), "kt-ft");
}

TEST(KtFt, TheH100NodeNamesItsAmxThroughputWithASource) {
  const HardwareSpec h = load_hardware_spec("h100-sxm-node");
  for (const auto& n : h.numa) EXPECT_NEAR(n.amx_bf16_flops_per_s, 103.2e12, 1e9);
  EXPECT_TRUE(h.sources.contains("numa.amx_bf16_flops_per_s"));
  EXPECT_EQ(load_hardware_spec("rtx4090-node").numa[0].amx_bf16_flops_per_s, 0.0) << "Xeon Gold 6338N has no AMX";
}

// Rank 0 owns the experts (kt-kernel/python/sft: the rank-0-only expert pattern): each MoE pass
// is one CPU stage of rank 0 over every rank's tokens, between a gather to rank 0 and a scatter
// back, and rank 0 alone copies all the ranks' hidden states to the host and back.
TEST(KtFt, RankZeroRunsEveryRanksExpertsOnTheCpu) {
  const WorkloadContext ctx = context("h100-sxm-node", 8, 32);
  const BaselineResult r = run_baseline(BaselineSystem::kKtFt, ctx, StepEngines(), "analytic", load_calibration_for(ctx.hardware));
  ASSERT_TRUE(r.fits()) << r.oom->message();
  ASSERT_TRUE(r.setup.has_value());
  const StepGraph g = lower_ktft(*r.setup, ctx);
  EXPECT_TRUE(check_step_graph(g).empty());
  const std::int64_t tokens = r.setup->micro_batch_seqs * 4096;  // per rank and micro-batch
  const Bytes boundary = tokens * ctx.model.hidden * kBf16Bytes;
  const Flops per_rank = layer_flops(ctx.model, 0, r.setup->micro_batch_seqs, 4096).moe.routed_experts;
  int cpu_experts = 0, gathers = 0, input_copies = 0;
  for (const Stage& s : g.stages) {
    if (s.op == OpKind::kExpertGemm) {
      ASSERT_EQ(g.resource(s.resource).kind, ResourceKind::kCpuUpdate) << s.name << ": every routed expert runs on the CPU";
      EXPECT_EQ(s.gpu, 0) << s.name;
      if (s.layer == 0 && s.phase == Phase::kForward) EXPECT_DOUBLE_EQ(s.flops, 8.0 * per_rank) << "all eight ranks' tokens";
      ++cpu_experts;
    }
    if (s.layer == 0 && s.phase == Phase::kForward && s.op == OpKind::kAllGather && s.key.part == StagePart::kExperts && s.key.micro_batch == 0) ++gathers;
    if (s.layer == 0 && s.phase == Phase::kForward && s.key.part == StagePart::kExperts && s.key.micro_batch == 0 && s.op == OpKind::kD2h) {
      EXPECT_EQ(s.gpu, 0);
      EXPECT_EQ(s.bytes, 8 * boundary);
      ++input_copies;
    }
  }
  EXPECT_EQ(cpu_experts, 40 * 3 * r.setup->accumulation_steps) << "forward, recompute and backward of 40 decoders, on rank 0 only";
  EXPECT_EQ(gathers, 2 * 8) << "a gather to rank 0 and a scatter back, a member per rank";
  EXPECT_EQ(input_copies, 1);
  // CPU-bound and the node's CPU does every rank's experts: more GPUs do not make it faster.
  const BaselineResult four = run_baseline(BaselineSystem::kKtFt, context("h100-sxm-node", 4, 32), StepEngines(), "analytic",
                                           load_calibration_for(ctx.hardware));
  ASSERT_TRUE(four.fits());
  EXPECT_NEAR(r.step_s / four.step_s, 1.0, 0.1);
}

// The CPU pass runs on both sockets at the published KT-FT forward throughput (17.55 TFLOP/s on a
// two-socket Xeon 8488C node) as a fraction of its AMX peak, the recompute at its published ratio
// to it, or at the DRAM rate of the expert weights when that is slower; the backward's matmuls at
// their published ratio, plus its dW packing and gradient-buffer clear on the cores.
TEST(KtFt, CpuExpertsRunAtThePublishedAmxEfficiencyOrTheDramRate) {
  EXPECT_NEAR(kKtFtAmxForwardEfficiency, 0.0744, 1e-4);
  EXPECT_NEAR(kKtFtRecomputeOverForward, 0.681, 1e-3);
  EXPECT_NEAR(kKtFtBackwardOverForward, 2.018, 1e-3);
  const HardwareSpec h = load_hardware_spec("h100-sxm-node");
  const KtFtDurationModel durations(h, load_calibration_for(h), 4);
  StepGraphBuilder b(4, h.host_numa_count(4));
  const lowering::RankResources rr = lowering::add_rank_resources(b, h, 0, 4, false);
  Stage fwd;
  fwd.op = OpKind::kExpertGemm;
  fwd.phase = Phase::kForward;
  fwd.resource = rr.cpu;
  fwd.flops = 1e15;
  fwd.params = 1;
  Stage bwd = fwd;
  bwd.phase = Phase::kBackward;
  Stage again = fwd;
  again.phase = Phase::kRecompute;
  Stage thin = fwd;  // one FLOP per weight byte: the weights' DRAM traffic sets the pace
  thin.params = 1'000'000'000'000;
  thin.flops = 1e12;
  b.add(fwd);
  const StepGraph g = b.take();
  const double amx = 2 * 103.2e12;
  EXPECT_NEAR(durations.cost(fwd, g).alone_s(), 1e15 / (amx * kKtFtAmxForwardEfficiency), 1e-6);
  EXPECT_NEAR(durations.cost(bwd, g).alone_s(), 1e15 / (amx * kKtFtAmxForwardEfficiency * kKtFtBackwardOverForward), 1e-6)
      << "a stage without a shape packs nothing";
  EXPECT_NEAR(durations.cost(again, g).alone_s(), 1e15 / (amx * kKtFtAmxForwardEfficiency * kKtFtRecomputeOverForward), 1e-6);
  EXPECT_NEAR(durations.cost(thin, g).alone_s(), 2e12 / (2 * 245e9), 1e-6);
  EXPECT_DOUBLE_EQ(durations.cost(fwd, g).rate, durations.cost(fwd, g).exclusive_rate) << "one such stage at a time";
}

// KT-FT's full fine-tuning profile (Qwen3-30B-A3B, 1,024 tokens, two EPYC 9355 sockets): dW packing
// 0.754 s and the gradient-buffer clear 0.352 s. The constants give them back on that machine, and
// on the H100 node's Xeon 8468 sockets (48 cores at 2.1 GHz: 100.8 G core cycles a second against
// 113.6 G) the same work takes 113.6 / 100.8 times as long; the backward stage adds it to its matmuls.
TEST(KtFt, BackwardPacksItsWeightGradientPanelsOnTheCores) {
  EXPECT_NEAR(kKtFtDwPackSeconds, 0.754, 1e-3);
  EXPECT_NEAR(kKtFtDwPackCyclesPerElement, 41.5, 0.05);
  EXPECT_NEAR(kKtFtGradClearCyclesPerParam, 2.76, 0.01);
  HardwareSpec epyc = load_hardware_spec("h100-sxm-node");
  for (NumaSpec& n : epyc.numa) n.amx_bf16_flops_per_s = kKtFtReferenceSocketCyclesPerS * kAmxBf16FlopsPerCoreCycle;
  const std::int64_t routes = 1024 * 8, hidden = 2048, experts = 128;
  const ParamCount params = experts * 3 * hidden * 768;  // one decoder of Qwen3-30B-A3B
  EXPECT_NEAR(48 * ktft_backward_core_s(epyc, routes, hidden, experts, params), 0.754 + 0.352, 1e-3);
  const HardwareSpec h = load_hardware_spec("h100-sxm-node");
  const double cycles = h.numa[0].amx_bf16_flops_per_s / kAmxBf16FlopsPerCoreCycle;  // a socket's, cores × base clock
  EXPECT_NEAR(cycles, 48 * 2.1e9, 1e8);
  EXPECT_NEAR(ktft_backward_core_s(h, routes, hidden, experts, params) / ktft_backward_core_s(epyc, routes, hidden, experts, params),
              kKtFtReferenceSocketCyclesPerS / cycles, 1e-9);
  EXPECT_EQ(ktft_backward_core_s(h, 0, hidden, experts, params), 0.0) << "no routes, no pass";
  // Packing grows with the routes, the clear does not.
  const double one = ktft_backward_core_s(h, routes, hidden, experts, params), two = ktft_backward_core_s(h, 2 * routes, hidden, experts, params);
  const double clear = params / 2.0 * kKtFtGradClearCyclesPerParam / cycles;
  EXPECT_NEAR(two - clear, 2 * (one - clear), 1e-9);

  const KtFtDurationModel durations(h, load_calibration_for(h), 4);
  StepGraphBuilder b(4, h.host_numa_count(4));
  const lowering::RankResources rr = lowering::add_rank_resources(b, h, 0, 4, false);
  Stage bwd;
  bwd.op = OpKind::kExpertGemm;
  bwd.phase = Phase::kBackward;
  bwd.resource = rr.cpu;
  bwd.params = params;
  bwd.shape.tokens = routes;
  bwd.shape.k = hidden;
  bwd.shape.experts = experts;
  bwd.flops = 2.0 * 2 * routes * 3 * hidden * 768;  // input and weight gradients
  Stage fwd = bwd;
  fwd.phase = Phase::kForward;
  fwd.flops = bwd.flops / 2;
  b.add(bwd);
  const StepGraph g = b.take();
  const double amx = 2 * 103.2e12;
  EXPECT_NEAR(durations.cost(bwd, g).alone_s(), bwd.flops / (amx * kKtFtAmxForwardEfficiency * kKtFtBackwardOverForward) + one, 1e-9);
  EXPECT_NEAR(durations.cost(fwd, g).alone_s(), fwd.flops / (amx * kKtFtAmxForwardEfficiency), 1e-9) << "the forward packs no dW panel";
}

// Rank 0 updates every expert; each rank its 1/P of the dense part.
TEST(KtFt, RankZeroUpdatesTheExperts) {
  const WorkloadContext ctx = context("h100-sxm-node", 4, 32);
  const BaselineFit fit = configure_ktft(ctx);
  ASSERT_TRUE(fit.setup.has_value());
  LoweringOptions o;
  o.decoder_layers = 2;
  const StepGraph g = lower_ktft(*fit.setup, ctx, o);
  const ModelParams p = model_params(ctx.model);
  const ParamCount experts = p.layer_sum().routed_experts, dense = p.total() - experts;
  int updates = 0;
  for (const Stage& s : g.stages) {
    if (s.op != OpKind::kTorchCpuAdamW) continue;
    ++updates;
    EXPECT_EQ(s.params, dense / 4 + (s.gpu == 0 ? experts : 0)) << s.name;
  }
  EXPECT_EQ(updates, 4);
}

TEST(KtFt, HardwareWithoutAmxIsBadInputNamingTheField) {
  try {
    run_baseline(BaselineSystem::kKtFt, context("rtx4090-node", 4, 64), StepEngines(), "analytic", Calibration{});
    ADD_FAILURE() << "KT-FT ran without AMX";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("amx_bf16_flops_per_s"), std::string::npos) << e.what();
  }
}

TEST(KtFt, HostOutOfMemoryNamesTheExpertBanks) {
  const BaselineFit fit = configure_ktft(context("h100-sxm-node", 8, 8, 256.0));
  ASSERT_TRUE(fit.oom.has_value());
  EXPECT_EQ(fit.oom->space, "host");
  EXPECT_NE(fit.oom->where.find("CPU expert banks"), std::string::npos) << fit.oom->where;
}

}  // namespace
}  // namespace oom
