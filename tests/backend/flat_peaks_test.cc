// Exploratory: measured vs predicted per-use peaks.
#include <cstdio>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "backend/device_memory.h"
#include "backend/plan_runtime.h"
#include "backend/state.h"
#include "planner/calibration/calibration.h"
#include "planner/engine/analytic_evaluator.h"
#include "planner/engine/peak_composition.h"
#include "planner/plan/plan.h"
#include "planner/search/plan_pricing.h"

namespace oom::backend {
namespace {

double to_mib(Bytes b) { return static_cast<double>(b) / static_cast<double>(kMiB); }

std::array<Bytes, kMemoryUses> measured(const Plan& plan, const ModelSpec& model, std::int64_t batch, std::int64_t seq) {
  device_memory::Emulation on(true);
  std::array<Bytes, kMemoryUses> most{};
  HostState state(model, {WorkingPrecision::kBFloat16, {}});
  state.init_from_seed(6);
  PlanTrainer t(state, TrainerConfig{}, plan);
  torch::manual_seed(10);
  for (int s = 0; s < 2; ++s) {
    const auto tokens = torch::randint(0, 256, {batch, seq}, torch::kLong);
    t.step(tokens, tokens.roll(1, 1));
    const auto u = t.last_use_peaks();
    for (int i = 0; i < kMemoryUses; ++i) most[i] = std::max(most[i], u[i]);
  }
  return most;
}

std::array<Bytes, kMemoryUses> predicted(const Plan& plan, const WorkloadContext& ctx) {
  const PlanPricer pricer(ctx, load_calibration_for(ctx.hardware));
  const StepGraph g = pricer.lower_plan(plan);
  std::vector<Seconds> d(g.stages.size());
  for (const Stage& s : g.stages) d[static_cast<std::size_t>(s.id)] = pricer.durations().duration_s(s, g);
  return use_peaks(g, analytic_times(g, d));
}

TEST(FlatPeaks, Explore) {
  for (const char* model : {"tiny-moe", "tiny-moe-gemma"}) {
    Workload w;
    w.model = model;
    w.hardware = "local-cpu";
    w.global_batch = 8;
    w.seq_len = 64;
    const WorkloadContext ctx = resolve_workload(w, "test");
    for (const std::string& variant : {"local", "local-vocab64", "local-sco", "local-bucket1", "ep", "ep-vocab64", "ep-sco"}) {
      Plan p;
      p.path = variant.rfind("ep", 0) == 0 ? ExpertPath::kEp : ExpertPath::kLocal;
      if (variant.find("vocab64") != std::string::npos) p.flat.vocab_chunk_tokens = 64;
      if (variant.find("sco") != std::string::npos) p.flat.selective_checkpoint_offload = true;
      if (variant.find("bucket1") != std::string::npos) p.flat.optimizer_bucket_mib = 1;
      try {
        validate_plan(p, ctx.model, ctx.workload, "test plan");
      } catch (const std::exception& e) {
        std::printf("%s %s: %s\n", model, variant.c_str(), e.what());
        continue;
      }
      const auto pr = predicted(p, ctx);
      const auto me = measured(p, ctx.model, w.global_batch, w.seq_len);
      std::printf("%-16s %-14s", model, variant.c_str());
      for (int u = 0; u < kMemoryUses; ++u) {
        std::printf(" %s %.3f/%.3f", std::string(memory_use_name(static_cast<MemoryUse>(u))).c_str(), to_mib(me[u]), to_mib(pr[u]));
      }
      std::printf("\n");
    }
  }
}

}  // namespace
}  // namespace oom::backend
