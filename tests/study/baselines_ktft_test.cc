// planner/lowering/baselines_ktft.h: KT-FT's CPU experts priced at the socket's AMX throughput, its
// out-of-memory with where, and hardware without AMX as bad input.
#include "planner/lowering/baselines_ktft.h"

#include <gtest/gtest.h>

#include "costmodel/input_error.h"
#include "planner/calibration/calibration.h"

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

TEST(KtFt, EightH100sRunWithTheExpertsOnTheCpuAtTheAmxRate) {
  const WorkloadContext ctx = context("h100-sxm-node", 8, 32);
  const BaselineResult r = run_baseline(BaselineSystem::kKtFt, ctx, StepEngines(), "analytic", load_calibration_for(ctx.hardware));
  ASSERT_TRUE(r.fits()) << r.oom->message();
  ASSERT_TRUE(r.setup.has_value());
  const StepGraph g = lower_ktft(*r.setup, ctx);
  EXPECT_TRUE(check_step_graph(g).empty());
  const KtFtDurationModel durations(ctx.hardware, load_calibration_for(ctx.hardware), 8);
  int cpu_experts = 0;
  for (const Stage& s : g.stages) {
    if (s.op != OpKind::kExpertGemm) continue;
    ASSERT_EQ(g.resource(s.resource).kind, ResourceKind::kCpuUpdate) << s.name << ": every routed expert runs on the CPU";
    ++cpu_experts;
    const StageCost c = durations.cost(s, g);
    EXPECT_DOUBLE_EQ(c.exclusive_rate, 103.2e12 * kKtFtAmxEfficiency);
    EXPECT_DOUBLE_EQ(c.rate, c.exclusive_rate / 4) << "four ranks share each socket";
  }
  EXPECT_EQ(cpu_experts, 8 * 40 * 3) << "forward, recompute and backward of 40 decoders on 8 ranks";
  // CPU-bound: a step takes at least the expert FLOPs over both sockets' AMX throughput.
  EXPECT_GT(r.step_s, 10.0);
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
