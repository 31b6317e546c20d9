// planner/lowering/baselines_megatron.h: Megatron-LM's configuration (tensor parallelism raised until the
// weights fit), out-of-memory with where, and a lowering both engines accept.
#include "planner/lowering/baselines_megatron.h"

#include <cstdint>

#include <gtest/gtest.h>

#include "planner/calibration/calibration.h"
#include "planner/engine/baseline_run.h"
#include "planner/engine/analytic_evaluator.h"

namespace oom {
namespace {

WorkloadContext context(const std::string& model, int gpus, std::int64_t batch, std::int64_t seq_len) {
  Workload w;
  w.model = model;
  w.hardware = "h100-sxm-node";
  w.gpus = gpus;
  w.global_batch = batch;
  w.seq_len = seq_len;
  return resolve_workload(w, "test");
}

TEST(Megatron, IsAKnownBaselineByNameButNotADefaultOne) {
  EXPECT_EQ(baseline_system_from_name("megatron-lm"), BaselineSystem::kMegatronLm);
  EXPECT_EQ(baseline_system_name(BaselineSystem::kMegatronLm), "megatron-lm");
  for (const auto s : all_baseline_systems()) EXPECT_NE(s, BaselineSystem::kMegatronLm);
}

TEST(Megatron, EightH100sFitQwen36WithExpertsOverEveryGpu) {
  const WorkloadContext ctx = context("qwen3.6-35b-a3b", 8, 32, 4096);
  const MegatronFit fit = configure_megatron(ctx);
  ASSERT_TRUE(fit.setup.has_value()) << (fit.oom ? fit.oom->message() : "");
  EXPECT_EQ(fit.setup->expert_parallel, 8);
  EXPECT_EQ(fit.setup->tensor_parallel * fit.setup->data_parallel, 8);
  EXPECT_EQ(fit.setup->micro_batch_seqs * fit.setup->accumulation_steps * fit.setup->data_parallel, 32);
  const BaselineMemory mem = megatron_static_memory(*fit.setup, ctx);
  EXPECT_LE(mem.gpu_peak_bytes, ctx.gpu_budget_bytes());
}

TEST(Megatron, OneGpuCannotHoldTheWholeModelAndSaysWhere) {
  const BaselineResult r = run_baseline(BaselineSystem::kMegatronLm, context("qwen3.6-35b-a3b", 1, 1, 4096), StepEngines(), "analytic",
                                        Calibration{});
  ASSERT_FALSE(r.fits());
  EXPECT_EQ(r.oom->space, "gpu");
  EXPECT_GT(r.oom->needed_bytes, 200 * kGiB) << "35B parameters of BF16 weights and FP32 main gradients";
  EXPECT_NE(r.oom->message().find("TP 1"), std::string::npos) << r.oom->message();
}

TEST(Megatron, LoweredStepRunsOnTheAnalyticEngineWithCollectivesAndCpuAdam) {
  const WorkloadContext ctx = context("qwen3.6-35b-a3b", 8, 32, 4096);
  const BaselineResult r = run_baseline(BaselineSystem::kMegatronLm, ctx, StepEngines(), "analytic", load_calibration_for(ctx.hardware));
  ASSERT_TRUE(r.fits()) << r.oom->message();
  EXPECT_GT(r.step_s, 0.5);
  EXPECT_GT(r.tokens_per_s, 0);
  ASSERT_TRUE(r.setup.has_value());
  const MegatronFit fit = configure_megatron(ctx);
  const StepGraph g = lower_megatron(*fit.setup, ctx);
  EXPECT_TRUE(check_step_graph(g).empty());
  int a2a = 0, adam = 0;
  for (const Stage& s : g.stages) {
    a2a += s.op == OpKind::kAllToAll;
    adam += s.op == OpKind::kCpuAdamW;
  }
  EXPECT_EQ(adam, 8) << "one CPU Adam pass per rank (distributed optimizer, CPU offload)";
  EXPECT_GT(a2a, 0);
  // JSON names the system and its micro-batching.
  const auto j = baseline_result_to_json(r);
  EXPECT_EQ(j["system"], "megatron-lm");
  EXPECT_TRUE(j["fits"].get<bool>());
}

// Skewed routing reaches the baseline's expert parallelism too: the most loaded rank's expert
// GEMMs and receive side set the pace and its MoE bytes the peak; the total expert work is the same.
TEST(Megatron, SkewedRoutingSlowsTheExpertParallelStepAndRaisesItsPeak) {
  const WorkloadContext even = context("qwen3.6-35b-a3b", 8, 32, 4096);
  Workload w = even.workload;
  w.routing = routing_from_json({{"kind", "zipf"}, {"skew", 1.2}}, "test", "routing");
  const WorkloadContext skewed = resolve_workload(w, "test");
  const MegatronFit fit = configure_megatron(even);
  ASSERT_TRUE(fit.setup.has_value());
  const StepGraph u = lower_megatron(*fit.setup, even), z = lower_megatron(*fit.setup, skewed);
  // Decoder 0 (each decoder has its own hot experts, so sums over decoders even out).
  double fu = 0, fz = 0, hottest = 0;
  std::vector<double> per_rank(8, 0.0);
  for (const Stage& s : u.stages) fu += s.op == OpKind::kExpertGemm && s.layer == 0 ? s.flops : 0.0;
  for (const Stage& s : z.stages) {
    if (s.op != OpKind::kExpertGemm || s.layer != 0) continue;
    fz += s.flops;
    per_rank[static_cast<std::size_t>(s.gpu)] += s.flops;
  }
  for (double f : per_rank) hottest = std::max(hottest, f);
  EXPECT_NEAR(fz / fu, 1.0, 1e-9);
  EXPECT_GT(hottest, 1.2 * fz / 8);
  const Calibration cal = load_calibration_for(even.hardware);
  const BaselineResult ru = run_baseline(BaselineSystem::kMegatronLm, even, StepEngines(), "analytic", cal);
  const BaselineResult rz = run_baseline(BaselineSystem::kMegatronLm, skewed, StepEngines(), "analytic", cal);
  ASSERT_TRUE(ru.fits() && rz.fits());
  EXPECT_GT(rz.step_s, ru.step_s);
  // Qwen3.6's peak is its loss (248K-entry vocabulary); Mixtral's (32K) is a decoder's MoE.
  const WorkloadContext mixtral = context("mixtral-8x7b", 8, 32, 4096);
  Workload wm = mixtral.workload;
  wm.routing = w.routing;
  const WorkloadContext mixtral_skewed = resolve_workload(wm, "test");
  const MegatronFit mfit = configure_megatron(mixtral);
  ASSERT_TRUE(mfit.setup.has_value());
  const BaselineMemory me = megatron_static_memory(*mfit.setup, mixtral), mz = megatron_static_memory(*mfit.setup, mixtral_skewed);
  EXPECT_NE(me.gpu_peak_at.find("decoder"), std::string::npos) << me.gpu_peak_at;
  EXPECT_GT(mz.gpu_peak_bytes, me.gpu_peak_bytes);
}

// Megatron's unfused vocabulary-parallel cross entropy holds the whole micro-batch's logits, BF16
// and an FP32 copy: on four H100s at 4K the loss, not a decoder, bounds the micro-batch.
TEST(Megatron, TheLossHoldsTheWholeMicroBatchsLogits) {
  const WorkloadContext ctx = context("qwen3.6-35b-a3b", 4, 32, 4096);
  const MegatronFit fit = configure_megatron(ctx);
  ASSERT_TRUE(fit.setup.has_value());
  EXPECT_EQ(fit.setup->tensor_parallel, 1);
  EXPECT_EQ(fit.setup->micro_batch_seqs, 2);
  EXPECT_EQ(fit.setup->accumulation_steps, 4);
  MegatronSetup larger = *fit.setup;
  larger.micro_batch_seqs = 4;
  larger.accumulation_steps = 2;
  const BaselineMemory mem = megatron_static_memory(larger, ctx);
  EXPECT_GT(mem.gpu_peak_bytes, ctx.gpu_budget_bytes());
  EXPECT_NE(mem.gpu_peak_at.find("loss"), std::string::npos) << mem.gpu_peak_at;
  // 4 sequences of 4K tokens × 248,320 logits × 6 B.
  const BaselineMemory at2 = megatron_static_memory(*fit.setup, ctx);
  EXPECT_GT(mem.gpu_peak_bytes - at2.gpu_peak_bytes, std::int64_t{2} * 4096 * ctx.model.vocab * 6 * 9 / 10);
}

// The hybrid device optimizer copies the updated FP32 masters into the BF16 weights with a
// non-blocking copy, which PyTorch converts on the GPU: FP32 crosses PCIe both ways.
TEST(Megatron, TheUpdatedMastersCrossPcieAsFp32) {
  const WorkloadContext ctx = context("qwen3.6-35b-a3b", 4, 32, 4096);
  const MegatronFit fit = configure_megatron(ctx);
  ASSERT_TRUE(fit.setup.has_value());
  LoweringOptions o;
  o.decoder_layers = 1;
  const StepGraph g = lower_megatron(*fit.setup, ctx, o);
  Bytes d2h = 0, h2d = 0;
  for (const Stage& s : g.stages) {
    if (s.gpu != 0 || s.phase != Phase::kOptimizer) continue;
    if (s.op == OpKind::kD2h) d2h += s.bytes;
    if (s.op == OpKind::kH2d) h2d += s.bytes;
  }
  EXPECT_GT(d2h, 0);
  EXPECT_EQ(h2d, d2h) << "4 B per parameter of the rank's shard each way";
}

TEST(Megatron, HostOutOfMemoryNamesTheOffloadedOptimizerState) {
  Workload w;
  w.model = "qwen3.6-35b-a3b";
  w.hardware = "h100-sxm-node";
  w.gpus = 8;
  w.global_batch = 8;
  w.seq_len = 4096;
  w.host_budget_gib = 64;
  const MegatronFit fit = configure_megatron(resolve_workload(w, "test"));
  ASSERT_TRUE(fit.oom.has_value());
  EXPECT_EQ(fit.oom->space, "host");
  EXPECT_NE(fit.oom->where.find("CPU optimizer offload"), std::string::npos) << fit.oom->where;
}

}  // namespace
}  // namespace oom
