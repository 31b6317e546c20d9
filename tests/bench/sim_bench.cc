// Google Benchmark of the SimGrid engine: one training step of the project's default job
// (Qwen3.6-35B-A3B, 40 decoders, 4 H100s, batch 32, 4K context, the published R23 EP plan),
// lowered once and simulated per iteration (each iteration forks one simulation process, as
// every `oom simulate --engine simgrid` run does). Target: ≤ 1 s per step. Real time is what
// counts: the simulation runs in the child, so the parent's CPU time misses most of it.
#include <benchmark/benchmark.h>

#include "costmodel/workload.h"
#include "planner/calibration/calibration.h"
#include "planner/engine/cost_report.h"
#include "planner/engine/duration_model.h"
#include "planner/lowering/step_graph.h"
#include "sim/simgrid_engine.h"
#include "tests/bench/default_step.h"

namespace {

using oom::bench::default_step;
using oom::bench::DefaultStep;

void BM_SimGridDefaultStep(benchmark::State& state) {
  const DefaultStep& step = default_step();
  const oom::sim::SimGridEngine engine;
  double step_s = 0;
  for (auto _ : state) {
    const oom::Trace t = engine.execute(step.graph, step.durations);
    // Not DoNotOptimize(double&): with GCC its "+m,r" constraint garbles doubles (benchmark 1.7).
    step_s = t.step_s;
  }
  state.counters["stages"] = static_cast<double>(step.graph.stages.size());
  state.counters["resources"] = static_cast<double>(step.graph.resources.size());
  state.counters["simulated_step_s"] = step_s;
}
BENCHMARK(BM_SimGridDefaultStep)->Unit(benchmark::kMillisecond)->MinTime(2.0)->UseRealTime();

// The simulation alone, without building the Trace and memory timelines.
void BM_SimGridDefaultStepTimesOnly(benchmark::State& state) {
  const DefaultStep& step = default_step();
  const oom::sim::SimGridEngine engine;
  double step_s = 0;
  for (auto _ : state) step_s = engine.simulate_times(step.graph, step.durations).step_s;
  state.counters["simulated_step_s"] = step_s;
}
BENCHMARK(BM_SimGridDefaultStepTimesOnly)->Unit(benchmark::kMillisecond)->MinTime(2.0)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
