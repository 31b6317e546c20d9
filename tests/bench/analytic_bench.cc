// Google Benchmark of the analytic evaluator (planner/engine/analytic_evaluator.h): one training step of
// the project's default job (Qwen3.6-35B-A3B, 40 decoders, 4 H100s, batch 32, 4K context, the
// published R23 EP plan). Planners price thousands of candidates: target ≤ 1 ms per step.
//   BM_AnalyticStepTimes: durations + Eq. 3 with host sharing settled, over a graph lowered once
//     (what a planner re-prices: analytic_step_times);
//   BM_AnalyticPlainEq3: durations + one Eq. 3 pass without host sharing (the peer: the ratio of
//     the two is what settling costs, about five Eq. 3 passes and four sweeps of the host stages);
//   BM_AnalyticStepTimesAndPeaks: settled step times plus memory peaks per GPU and NUMA node;
//   BM_AnalyticStepTrace: the full engine (durations, Eq. 3, memory timelines, the Trace);
//   BM_LowerDefaultStep: lowering the plan to its StepGraph.
#include <benchmark/benchmark.h>

#include "costmodel/workload.h"
#include "planner/calibration/calibration.h"
#include "planner/engine/analytic_evaluator.h"
#include "planner/engine/cost_report.h"
#include "planner/engine/duration_model.h"
#include "planner/lowering/step_graph.h"
#include "tests/bench/default_step.h"

namespace {

using oom::bench::default_step;
using oom::bench::DefaultStep;

void BM_AnalyticStepTimes(benchmark::State& state) {
  const DefaultStep& step = default_step();
  double step_s = 0;
  for (auto _ : state) {
    oom::StageTimes t = oom::analytic_step_times(step.graph, step.durations);
    benchmark::DoNotOptimize(t.finish_s.data());
    step_s = t.step_s;
  }
  state.counters["stages"] = static_cast<double>(step.graph.stages.size());
  state.counters["predicted_step_s"] = benchmark::Counter(step_s);
}
BENCHMARK(BM_AnalyticStepTimes)->Unit(benchmark::kMicrosecond);

void BM_AnalyticPlainEq3(benchmark::State& state) {
  const DefaultStep& step = default_step();
  std::vector<oom::Seconds> d(step.graph.stages.size());
  double step_s = 0;
  for (auto _ : state) {
    for (const oom::Stage& s : step.graph.stages) d[static_cast<std::size_t>(s.id)] = step.durations.duration_s(s, step.graph);
    oom::StageTimes t = oom::analytic_times(step.graph, d);
    benchmark::DoNotOptimize(t.finish_s.data());
    step_s = t.step_s;
  }
  state.counters["predicted_step_s"] = benchmark::Counter(step_s);
}
BENCHMARK(BM_AnalyticPlainEq3)->Unit(benchmark::kMicrosecond);

// What a planner needs per candidate: step time and the per-GPU / per-NUMA peaks, no Trace.
void BM_AnalyticStepTimesAndPeaks(benchmark::State& state) {
  const DefaultStep& step = default_step();
  double gpu_peak_gib = 0;
  for (auto _ : state) {
    const oom::StageTimes t = oom::analytic_step_times(step.graph, step.durations);
    oom::MemoryPeaks peaks = oom::memory_peaks(step.graph, t, /*keep_samples=*/false);
    benchmark::DoNotOptimize(peaks.gpu_peak_bytes.data());
    gpu_peak_gib = oom::to_gib(peaks.gpu_peak_bytes.at(0));
  }
  state.counters["gpu_peak_gib"] = gpu_peak_gib;
}
BENCHMARK(BM_AnalyticStepTimesAndPeaks)->Unit(benchmark::kMicrosecond);

void BM_AnalyticStepTrace(benchmark::State& state) {
  const DefaultStep& step = default_step();
  const oom::AnalyticEngine engine;
  for (auto _ : state) {
    const oom::Trace t = engine.execute(step.graph, step.durations);
    benchmark::DoNotOptimize(t.step_s);
  }
  state.counters["stages"] = static_cast<double>(step.graph.stages.size());
}
BENCHMARK(BM_AnalyticStepTrace)->Unit(benchmark::kMicrosecond);

void BM_LowerDefaultStep(benchmark::State& state) {
  const DefaultStep& step = default_step();
  const oom::Plan plan = oom::default_plan();
  for (auto _ : state) {
    const oom::StepGraph g = oom::lower(plan, step.ctx);
    benchmark::DoNotOptimize(g.stages.size());
  }
}
BENCHMARK(BM_LowerDefaultStep)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
