// Google Benchmark of the baselines (planner/lowering/baselines.h) on the default workload (Qwen3.6-35B-A3B,
// 4 H100s, batch 32, 4K): a what-if study runs each system once per case, so one baseline should
// cost well under a second (target ≤ 100 ms per system with the analytic engine).
//   BM_ConfigureBaseline: the micro-batch choice from the static memory estimate;
//   BM_RunBaseline/<system>: configure + lower + execute with the analytic engine.
//   BM_RunBaselineGas: FSDP2 at batch 256 on a 24 GiB GPU budget (gradient accumulation: the
//   graph repeats every micro-batch).
#include <benchmark/benchmark.h>

#include "costmodel/workload.h"
#include "planner/calibration/calibration.h"
#include "planner/engine/cost_report.h"
#include "planner/engine/baseline_run.h"
#include "planner/lowering/baselines.h"

namespace {

const oom::WorkloadContext& default_context() {
  static const oom::WorkloadContext ctx = oom::resolve_workload(oom::default_workload(), "default workload");
  return ctx;
}

void BM_ConfigureBaseline(benchmark::State& state) {
  const auto& ctx = default_context();
  for (auto _ : state) {
    benchmark::DoNotOptimize(oom::configure_baseline(oom::BaselineSystem::kFsdp2Offload, ctx));
  }
}
BENCHMARK(BM_ConfigureBaseline)->Unit(benchmark::kMicrosecond);

void BM_RunBaseline(benchmark::State& state) {
  const auto& ctx = default_context();
  const auto system = oom::all_baseline_systems()[static_cast<std::size_t>(state.range(0))];
  const oom::Calibration c = oom::load_calibration_for(ctx.hardware);
  double step_s = 0;
  for (auto _ : state) {
    const oom::BaselineResult r = oom::run_baseline(system, ctx, oom::StepEngines(), "analytic", c);
    benchmark::DoNotOptimize(r.trace.stages.data());
    step_s = r.step_s;
  }
  state.SetLabel(std::string(oom::baseline_system_name(system)));
  state.counters["step_s"] = benchmark::Counter(step_s);
}
BENCHMARK(BM_RunBaseline)->DenseRange(0, 2)->Unit(benchmark::kMillisecond);

void BM_RunBaselineGas(benchmark::State& state) {
  oom::Workload w = default_context().workload;
  w.global_batch = 256;
  w.gpu_budget_gib = 24;
  const oom::WorkloadContext ctx = oom::resolve_workload(w, "bench");
  const oom::Calibration c = oom::load_calibration_for(ctx.hardware);
  int gas = 0;
  for (auto _ : state) {
    const oom::BaselineResult r = oom::run_baseline(oom::BaselineSystem::kFsdp2Offload, ctx, oom::StepEngines(), "analytic", c);
    benchmark::DoNotOptimize(r.trace.stages.data());
    gas = r.setup ? r.setup->accumulation_steps : 0;
  }
  state.counters["accumulation_steps"] = benchmark::Counter(static_cast<double>(gas));
}
BENCHMARK(BM_RunBaselineGas)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
