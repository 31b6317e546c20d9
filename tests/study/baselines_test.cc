// planner/lowering/baselines.h: the baseline systems lowered to StepGraphs, their memory and out-of-memory.
#include "planner/engine/baseline_run.h"
#include "planner/lowering/baselines.h"

#include <gtest/gtest.h>

#include <algorithm>

#include <fmt/format.h>

#include "costmodel/input_error.h"
#include "costmodel/params.h"
#include "planner/calibration/calibration.h"
#include "planner/engine/analytic_evaluator.h"
#include "planner/engine/duration_model.h"

namespace oom {
namespace {

WorkloadContext context(const std::string& model, int gpus, std::int64_t batch, std::int64_t seq_len) {
  Workload w;
  w.model = model;
  w.hardware = "h100-sxm-node";
  w.gpus = gpus;
  w.global_batch = batch;
  w.seq_len = seq_len;
  w.yarn_factor = 4;
  return resolve_workload(w, "test");
}

int count_kind(const StepGraph& g, OpKind op) {
  return static_cast<int>(std::count_if(g.stages.begin(), g.stages.end(), [&](const Stage& s) { return s.op == op; }));
}

Flops total_flops(const StepGraph& g) {
  Flops f = 0;
  for (const auto& s : g.stages) f += s.flops;
  return f;
}

TEST(BaselineSystems, NamesRoundTripAndUnknownNamesAreRejected) {
  for (const auto s : all_baseline_systems()) EXPECT_EQ(baseline_system_from_name(baseline_system_name(s)), s);
  EXPECT_EQ(baseline_system_from_name("fsdp2-offload"), BaselineSystem::kFsdp2Offload);
  EXPECT_FALSE(baseline_system_from_name("deepspeed").has_value());
}

TEST(BaselineTraits, FollowThePublishedDesigns) {
  const BaselineTraits fsdp = baseline_traits(BaselineSystem::kFsdp2Offload, 4);
  EXPECT_GE(fsdp.host_bytes_per_param, 16);
  EXPECT_EQ(fsdp.grad_bytes_per_param, kFp32Bytes);  // FP32 reduce-scatter
  EXPECT_TRUE(fsdp.accumulates_gradients);
  const BaselineTraits zero = baseline_traits(BaselineSystem::kZeroOffload, 4);
  EXPECT_EQ(zero.grad_bytes_per_param, kBf16Bytes);  // BF16 gradient communication
  EXPECT_TRUE(zero.sharded_params);
  EXPECT_FALSE(baseline_traits(BaselineSystem::kMegaTrain, 4).accumulates_gradients);
  EXPECT_TRUE(baseline_traits(BaselineSystem::kMegaTrain, 1).accumulates_gradients);
}

TEST(LowerBaseline, GraphsAreWellFormedWithEachSystemsCommunication) {
  const WorkloadContext ctx = context("tiny-moe", 2, 4, 256);
  for (const auto s : all_baseline_systems()) {
    const StepGraph g = lower_baseline({s, 2, 1}, ctx);
    EXPECT_EQ(check_step_graph(g), "") << baseline_system_name(s);
    const bool sharded = s != BaselineSystem::kMegaTrain;
    EXPECT_EQ(count_kind(g, OpKind::kAllGather) > 0, sharded) << baseline_system_name(s);
    EXPECT_EQ(count_kind(g, OpKind::kReduceScatter) > 0, sharded) << baseline_system_name(s);
    EXPECT_EQ(count_kind(g, OpKind::kAllToAll), 0) << "no expert parallelism in " << baseline_system_name(s);
    EXPECT_EQ(count_kind(g, OpKind::kHostAccumulate) > 0, !sharded) << "MegaTrain sums the ranks' partials on the host";
    // FSDP2 steps torch.optim.AdamW over its CPU shards; ZeRO-Offload and MegaTrain run fused CPU Adam kernels.
    const bool torch = s == BaselineSystem::kFsdp2Offload;
    EXPECT_EQ(count_kind(g, OpKind::kTorchCpuAdamW) > 0, torch) << baseline_system_name(s);
    EXPECT_EQ(count_kind(g, OpKind::kCpuAdamW) > 0, !torch) << baseline_system_name(s);
  }
}

TEST(LowerBaseline, AccumulationSplitsTheSameWorkIntoMicroBatches) {
  // Gradient accumulation changes order and granularity only: the FLOPs of the step are those of
  // the plain single-batch step, and each further micro-batch streams the weights again.
  const WorkloadContext ctx = context("tiny-moe", 2, 8, 256);
  const StepGraph whole = lower_baseline({BaselineSystem::kFsdp2Offload, 4, 1}, ctx);
  const StepGraph split = lower_baseline({BaselineSystem::kFsdp2Offload, 1, 4}, ctx);
  EXPECT_NEAR(total_flops(split) / total_flops(whole), 1.0, 1e-9);
  EXPECT_EQ(count_kind(split, OpKind::kAllGather), 4 * count_kind(whole, OpKind::kAllGather));
  EXPECT_EQ(count_kind(split, OpKind::kTorchCpuAdamW), count_kind(whole, OpKind::kTorchCpuAdamW)) << "one optimizer step per step";
  EXPECT_GT(count_kind(split, OpKind::kHostAccumulate), 0);
  EXPECT_EQ(count_kind(whole, OpKind::kHostAccumulate), 0);
}

TEST(LowerBaseline, ExecutedPeaksStayWithinTheStaticEstimate) {
  const WorkloadContext ctx = context("qwen3.6-35b-a3b", 4, 32, 4096);
  const CalibratedDurationModel durations(ctx.hardware, load_calibration_for(ctx.hardware), 4);
  for (const auto s : all_baseline_systems()) {
    const BaselineSetup setup{s, 8, 1};
    const Trace t = AnalyticEngine().execute(lower_baseline(setup, ctx), durations);
    const BaselineMemory mem = baseline_static_memory(setup, ctx);
    const Bytes peak = *std::max_element(t.gpu_peak_bytes.begin(), t.gpu_peak_bytes.end());
    EXPECT_LE(peak, mem.gpu_peak_bytes) << baseline_system_name(s);
    EXPECT_GE(peak, mem.gpu_peak_bytes * 7 / 10) << baseline_system_name(s);
    for (std::size_t n = 0; n < t.numa_peak_bytes.size(); ++n) {
      EXPECT_LE(t.numa_peak_bytes[n], mem.host_bytes_per_numa[n]) << baseline_system_name(s);
      EXPECT_GE(t.numa_peak_bytes[n], mem.host_bytes_per_numa[n] * 9 / 10) << baseline_system_name(s);
    }
  }
}

// Each parameter's gradient leaves the GPUs once and is updated once: a tied LM head is the
// embedding table, whose one gradient the head's backward starts and the embeddings' completes; the
// executed peak stays within the static estimate, which holds that gradient through the backward.
TEST(LowerBaseline, EveryParameterIsUpdatedOnceTiedOrNot) {
  for (const char* model : {"tiny-moe", "tiny-moe-gemma"}) {
    const WorkloadContext ctx = context(model, 2, 4, 256);
    const CalibratedDurationModel durations(ctx.hardware, load_calibration_for(ctx.hardware), 2);
    const ModelParams params = model_params(ctx.model);
    const auto groups = static_cast<ParamCount>(ctx.model.layers + 2);  // integer shares: each group loses < P
    for (const auto s : {BaselineSystem::kFsdp2Offload, BaselineSystem::kZeroOffload, BaselineSystem::kMegaTrain}) {
      const BaselineSetup setup{s, 2, 1};
      const StepGraph g = lower_baseline(setup, ctx);
      ParamCount updated = 0;
      for (const Stage& st : g.stages) {
        if (st.op == OpKind::kCpuAdamW || st.op == OpKind::kTorchCpuAdamW) updated += st.params;
      }
      EXPECT_LE(updated, params.total()) << model << " " << baseline_system_name(s);
      EXPECT_GT(updated, params.total() - groups * ctx.workload.gpus) << model << " " << baseline_system_name(s);
      const Trace t = AnalyticEngine().execute(g, durations);
      EXPECT_LE(*std::max_element(t.gpu_peak_bytes.begin(), t.gpu_peak_bytes.end()), baseline_static_memory(setup, ctx).gpu_peak_bytes)
          << model << " " << baseline_system_name(s);
    }
  }
}

TEST(BaselineStaticMemory, Fsdp2HoldsAtLeastSixteenBytesPerParameterOnTheHost) {
  const WorkloadContext ctx = context("qwen3.6-35b-a3b", 4, 16, 4096);
  const BaselineMemory mem = baseline_static_memory({BaselineSystem::kFsdp2Offload, 4, 1}, ctx);
  Bytes host = 0;
  for (const Bytes b : mem.host_bytes_per_numa) host += b;
  EXPECT_GE(host, 16 * model_params(ctx.model).total());
}

// FSDP2's pinned FP32 shards round up to powers of two (fsdp2_pinned_rounding_bytes): per rank,
// 48 MoE decoders × 256 experts × 3 projections of a [1024, 3072] expert, each shard 3 MiB pinned
// as 4 MiB, parameter and gradient: 72 GiB. Qwen3.6's [512, 2048] experts shard to 1 MiB exactly.
TEST(BaselineStaticMemory, Fsdp2PinsEachExpertShardAtThePowerOfTwoAbove) {
  EXPECT_EQ(pinned_host_block_bytes(3 * kMiB), 4 * kMiB);
  EXPECT_EQ(pinned_host_block_bytes(4 * kMiB), 4 * kMiB);
  EXPECT_EQ(pinned_host_block_bytes(0), 0);
  const WorkloadContext q122 = context("qwen3.5-122b-a10b", 4, 64, 4096);
  EXPECT_EQ(fsdp2_pinned_rounding_bytes(q122.model, 4), 72 * kGiB);
  EXPECT_EQ(fsdp2_pinned_rounding_bytes(context("qwen3.6-35b-a3b", 4, 16, 4096).model, 4), 0);
  // The paper: FSDP2 runs out of host memory on Qwen3.5-122B at 4K, batch 64 (2 x 1008 GiB).
  const BaselineFit fit = configure_baseline(BaselineSystem::kFsdp2Offload, q122);
  ASSERT_TRUE(fit.oom.has_value());
  EXPECT_EQ(fit.oom->space, "host") << fit.oom->message();
  // Without the rounding it would fit: 16 B/param of 122B is 910 GiB per NUMA node.
  EXPECT_GT(fit.oom->needed_bytes - 2 * fsdp2_pinned_rounding_bytes(q122.model, 4), 0);
  EXPECT_LT(fit.oom->needed_bytes - 2 * fsdp2_pinned_rounding_bytes(q122.model, 4), fit.oom->available_bytes);
}

// MegaTrain's host (its public code): 18 B/param (FP32 master and moments, BF16 layer copies, an
// FP32 gradient of every parameter) and per rank 12 pinned BF16 gradient slabs of the largest
// decoder, 4.7 GiB held as 8 GiB on Qwen3.5-122B, and the head's and the embedding's, 1.4 GiB as 2.
TEST(BaselineStaticMemory, MegaTrainHoldsEighteenBytesPerParameterAndPinnedGradientSlabs) {
  EXPECT_EQ(baseline_traits(BaselineSystem::kMegaTrain, 4).host_bytes_per_param, 18);
  const WorkloadContext q122 = context("qwen3.5-122b-a10b", 4, 64, 4096);
  const ModelParams params = model_params(q122.model);
  EXPECT_EQ(megatrain_pinned_buffer_bytes(params, 4), (12 * 8 + 2 + 2) * kGiB);
  // One GPU adds two pinned staging buffers and each layer's own pinned copy, rounded alike.
  EXPECT_GT(megatrain_pinned_buffer_bytes(params, 1), megatrain_pinned_buffer_bytes(params, 4) + 2 * 8 * kGiB);
  // The paper: MegaTrain runs out of host memory on Qwen3.5-122B at 4K, batch 64.
  const BaselineFit fit = configure_baseline(BaselineSystem::kMegaTrain, q122);
  ASSERT_TRUE(fit.oom.has_value());
  EXPECT_EQ(fit.oom->space, "host") << fit.oom->message();
}

TEST(ConfigureBaseline, AccumulatesWhenTheWholeBatchDoesNotFitAndMegaTrainCannot) {
  Workload w = context("qwen3.6-35b-a3b", 4, 256, 4096).workload;
  w.gpu_budget_gib = 24;  // 64 sequences of 4K per GPU on a 24 GiB budget
  const WorkloadContext ctx = resolve_workload(w, "test");
  const BaselineFit fsdp = configure_baseline(BaselineSystem::kFsdp2Offload, ctx);
  ASSERT_TRUE(fsdp.setup.has_value()) << (fsdp.oom ? fsdp.oom->message() : "");
  EXPECT_GT(fsdp.setup->accumulation_steps, 1);
  EXPECT_EQ(fsdp.setup->micro_batch_seqs * fsdp.setup->accumulation_steps, 64);
  const BaselineFit mega = configure_baseline(BaselineSystem::kMegaTrain, ctx);
  ASSERT_FALSE(mega.setup.has_value());
  ASSERT_TRUE(mega.oom.has_value());
  EXPECT_EQ(mega.oom->space, "gpu");
  EXPECT_GT(mega.oom->needed_bytes, mega.oom->available_bytes);
  EXPECT_NE(mega.oom->message().find("GPU 0 out of memory"), std::string::npos) << mega.oom->message();
  EXPECT_NE(mega.oom->message().find("backward"), std::string::npos) << mega.oom->message();
}

TEST(ConfigureBaseline, ATightHostBudgetIsHostOutOfMemoryNamingTheNumaNode) {
  Workload w = context("qwen3.6-35b-a3b", 4, 16, 4096).workload;
  w.host_budget_gib = 256;  // FSDP2 needs ≥ 16 B/param ≈ 520 GiB
  const WorkloadContext ctx = resolve_workload(w, "test");
  const BaselineFit fit = configure_baseline(BaselineSystem::kFsdp2Offload, ctx);
  ASSERT_TRUE(fit.oom.has_value());
  EXPECT_EQ(fit.oom->space, "host");
  EXPECT_NE(fit.oom->message().find("host NUMA node"), std::string::npos);
}

TEST(RunBaseline, MillionTokenContextIsOutOfMemoryForEveryBaseline) {
  const WorkloadContext ctx = context("qwen3.6-35b-a3b", 4, 4, 1048576);
  for (const auto s : all_baseline_systems()) {
    const BaselineResult r = run_baseline(s, ctx, StepEngines(), "analytic", load_calibration_for(ctx.hardware));
    EXPECT_FALSE(r.fits()) << baseline_system_name(s);
    EXPECT_EQ(r.step_s, 0);
    const nlohmann::json j = baseline_result_to_json(r);
    EXPECT_TRUE(j["step_s"].is_null());
    EXPECT_EQ(j["oom"]["space"], "gpu");
  }
}

TEST(RunBaseline, FitsAtFourKWithAStepTimeAndThroughput) {
  const WorkloadContext ctx = context("qwen3.6-35b-a3b", 4, 32, 4096);
  for (const auto s : all_baseline_systems()) {
    const BaselineResult r = run_baseline(s, ctx, StepEngines(), "analytic", load_calibration_for(ctx.hardware));
    ASSERT_TRUE(r.fits()) << r.oom->message();
    EXPECT_GT(r.step_s, 0);
    EXPECT_NEAR(r.tokens_per_s * r.step_s, 32.0 * 4096, 1e-6 * 32 * 4096);
    EXPECT_LE(r.gpu_peak_bytes, ctx.gpu_budget_bytes());
  }
}

TEST(RunBaseline, UnknownEngineIsBadInput) {
  const WorkloadContext ctx = context("tiny-moe", 2, 4, 256);
  EXPECT_THROW(run_baseline(BaselineSystem::kZeroOffload, ctx, StepEngines(), "warp-drive", default_calibration(ctx.hardware)), InputError);
}


// Expert units change the granularity of delivery and gradient exchange only: the FLOPs, the bytes
// reduce-scattered and the parameters updated are those of the whole-decoder wrapping, the
// units' windows and gradient buffers are smaller, and the executed peak stays within the estimate.
TEST(LowerBaseline, ExpertUnitsSplitTheSameWorkAndShrinkTheWindow) {
  const WorkloadContext ctx = context("tiny-moe", 2, 4, 256);
  const CalibratedDurationModel durations(ctx.hardware, load_calibration_for(ctx.hardware), 2);
  auto bytes_of = [](const StepGraph& g, OpKind op) {
    Bytes b = 0;
    for (const auto& s : g.stages) b += s.op == op ? s.bytes : 0;
    return b;
  };
  auto updated = [](const StepGraph& g) {
    ParamCount p = 0;
    for (const auto& s : g.stages) p += s.op == OpKind::kTorchCpuAdamW ? s.params : 0;
    return p;
  };
  const BaselineSetup whole{BaselineSystem::kFsdp2Offload, 4, 1, 1};
  const StepGraph g1 = lower_baseline(whole, ctx);
  const BaselineMemory m1 = baseline_static_memory(whole, ctx);
  for (const int units : {2, 4, 8}) {
    const BaselineSetup setup{BaselineSystem::kFsdp2Offload, 4, 1, units};
    const StepGraph g = lower_baseline(setup, ctx);
    EXPECT_EQ(check_step_graph(g), "") << units;
    EXPECT_NEAR(total_flops(g) / total_flops(g1), 1.0, 1e-9) << units;
    // Three passes (forward, recompute, backward) per unit instead of per decoder.
    const int moe_layers = ctx.model.moe_layers();
    EXPECT_EQ(count_kind(g, OpKind::kAllGather), count_kind(g1, OpKind::kAllGather) + 3 * moe_layers * units * ctx.workload.gpus) << units;
    // The whole decoder is gathered once for its recompute and backward; an expert unit, resharded
    // after its recomputed forward, once more: one more pass over the experts.
    Bytes expert_pass = 0;
    for (const auto& l : model_params(ctx.model).layers) expert_pass += working_weight_bytes(l.routed_experts - l.routed_experts / ctx.workload.gpus);
    EXPECT_NEAR(static_cast<double>(bytes_of(g, OpKind::kAllGather)) / (bytes_of(g1, OpKind::kAllGather) + ctx.workload.gpus * expert_pass), 1.0, 0.01)
        << units;
    EXPECT_NEAR(static_cast<double>(bytes_of(g, OpKind::kReduceScatter)) / bytes_of(g1, OpKind::kReduceScatter), 1.0, 0.01) << units;
    EXPECT_NEAR(static_cast<double>(updated(g)) / updated(g1), 1.0, 0.01) << units;
    EXPECT_EQ(count_kind(g, OpKind::kTorchCpuAdamW), count_kind(g1, OpKind::kTorchCpuAdamW) + moe_layers * units * ctx.workload.gpus);
    const BaselineMemory m = baseline_static_memory(setup, ctx);
    EXPECT_LT(m.window_bytes, m1.window_bytes) << units;
    EXPECT_LT(m.gpu_peak_bytes, m1.gpu_peak_bytes) << units;
    EXPECT_NE(m.gpu_peak_at.find(fmt::format("experts in {} units", units)), std::string::npos) << m.gpu_peak_at;
    const Trace t = AnalyticEngine().execute(g, durations);
    const Bytes peak = *std::max_element(t.gpu_peak_bytes.begin(), t.gpu_peak_bytes.end());
    EXPECT_LE(peak, m.gpu_peak_bytes) << units;
    EXPECT_GE(peak, m.gpu_peak_bytes * 7 / 10) << units;
  }
}

TEST(ConfigureBaseline, ExpertUnitsOnlyWhenTheWholeDecoderDoesNotFit) {
  // The recorded scale: one unit per decoder fits, the wrapping the records ran with.
  const WorkloadContext small = context("qwen3.6-35b-a3b", 4, 32, 4096);
  for (const auto s : all_baseline_systems()) {
    const BaselineFit fit = configure_baseline(s, small);
    ASSERT_TRUE(fit.setup) << fit.oom->message();
    EXPECT_EQ(fit.setup->expert_units, 1) << baseline_system_name(s);
  }
  EXPECT_EQ(expert_unit_options(BaselineSystem::kMegaTrain, small.model, 4), std::vector<int>{1});
  const std::vector<int> fsdp = expert_unit_options(BaselineSystem::kFsdp2Offload, small.model, 4);
  EXPECT_EQ(fsdp.front(), 1);
  for (const int u : fsdp) EXPECT_EQ(small.model.moe.experts % u, 0);
  // Kimi-K2 over twelve nodes: one 17B-parameter decoder's BF16 window and FP32 gradients do not
  // fit a 141 GB GPU; the fewest expert units that do.
  Workload w;
  w.model = "kimi-k2";
  w.hardware = "h200-sxm-12node";
  w.gpus = 96;
  w.global_batch = 96;
  w.seq_len = 4096;
  const WorkloadContext big = resolve_workload(w, "test");
  const BaselineFit fit = configure_baseline(BaselineSystem::kFsdp2Offload, big);
  ASSERT_TRUE(fit.setup) << fit.oom->message();
  const int u = fit.setup->expert_units;
  EXPECT_GT(u, 1);
  EXPECT_GT(baseline_static_memory({BaselineSystem::kFsdp2Offload, 1, 1, 1}, big).gpu_peak_bytes, big.gpu_budget_bytes());
  const std::vector<int> options = expert_unit_options(BaselineSystem::kFsdp2Offload, big.model, 96);
  const auto at = std::find(options.begin(), options.end(), u);
  ASSERT_NE(at, options.end());
  ASSERT_NE(at, options.begin());
  EXPECT_GT(baseline_static_memory({BaselineSystem::kFsdp2Offload, 1, 1, *(at - 1)}, big).gpu_peak_bytes, big.gpu_budget_bytes());
  EXPECT_LE(baseline_static_memory(*fit.setup, big).gpu_peak_bytes, big.gpu_budget_bytes());
}

}  // namespace
}  // namespace oom
