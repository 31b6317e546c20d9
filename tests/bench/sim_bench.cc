// Google Benchmark of the SimGrid engine: one training step of the project's default job
// (Qwen3.6-35B-A3B, 40 decoders, 4 H100s, batch 32, 4K context, the published R23 EP plan),
// lowered once and simulated per iteration (each iteration forks one simulation process, as
// every `oom simulate --engine simgrid` run does). Target: ≤ 1 s per step. Real time is what
// counts: the simulation runs in the child, so the parent's CPU time misses most of it.
// BM_ClusterStep: the same model's experts over 1 to 16 DGX H200 nodes (8 to 128 GPUs, two
// sequences of 4K per GPU, the EP plan without residency), through both engines: how the
// simulation's wall time grows with the GPUs (the counters give the ratio to the analytic engine).
// Expert parallelism over all GPUs stops at 32 nodes (256 experts). BM_ClusterFsdp2Step: FSDP2
// with CPU offload of the same workload, which runs at any scale, over 1 to 96 nodes (8 to 768
// GPUs): its stages grow linearly with the GPUs. The second argument 1 lowers one node's stages
// standing for every node's (both engines run them: the same step; the counters say so).
#include <map>
#include <memory>
#include <utility>
#include <stdexcept>

#include <benchmark/benchmark.h>

#include "costmodel/workload.h"
#include "planner/calibration/calibration.h"
#include "planner/engine/cost_report.h"
#include "planner/engine/duration_model.h"
#include "planner/lowering/step_graph.h"
#include "planner/engine/analytic_evaluator.h"
#include "planner/lowering/baselines.h"
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

// Qwen3.6-35B-A3B on `nodes` nodes of h200-sxm-node, lowered once per node count: every rank's
// stages, or (`one_node`) one node's standing for all (LoweringOptions::symmetric_nodes).
const oom::bench::DefaultStep& cluster_step(int nodes, bool one_node) {
  static std::map<std::pair<int, bool>, std::unique_ptr<DefaultStep>> steps;
  auto& step = steps[{nodes, one_node}];
  if (!step) {
    oom::WorkloadContext ctx = oom::bench::cluster_workload(nodes);
    oom::LoweringOptions options;
    options.symmetric_nodes = one_node;
    oom::StepGraph g = oom::lower(oom::Plan{}, ctx, options);
    oom::CalibratedDurationModel d(ctx.hardware, oom::load_calibration_for(ctx.hardware), ctx.workload.gpus);
    step = std::make_unique<DefaultStep>(DefaultStep{std::move(ctx), std::move(g), std::move(d)});
  }
  return *step;
}

void cluster_counters(benchmark::State& state, const DefaultStep& step, double step_s) {
  state.counters["gpus"] = static_cast<double>(step.ctx.workload.gpus);
  state.counters["stages"] = static_cast<double>(step.graph.stages.size());
  state.counters["simulated_step_s"] = step_s;
}

// One cluster step per iteration through each engine, with the counters of cluster_counters().
void simulate_cluster(benchmark::State& state, const DefaultStep& step) {
  const oom::sim::SimGridEngine engine;
  double step_s = 0;
  for (auto _ : state) step_s = engine.simulate_times(step.graph, step.durations).step_s;
  cluster_counters(state, step, step_s);
}
void evaluate_cluster(benchmark::State& state, const DefaultStep& step) {
  double step_s = 0;
  for (auto _ : state) step_s = oom::analytic_step_times(step.graph, step.durations).step_s;
  cluster_counters(state, step, step_s);
}

void BM_ClusterStepSimGrid(benchmark::State& state) {
  simulate_cluster(state, cluster_step(static_cast<int>(state.range(0)), state.range(1) != 0));
}
BENCHMARK(BM_ClusterStepSimGrid)->ArgsProduct({{1, 2, 4, 8, 16, 32}, {0, 1}})->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_ClusterStepAnalytic(benchmark::State& state) {
  evaluate_cluster(state, cluster_step(static_cast<int>(state.range(0)), state.range(1) != 0));
}
BENCHMARK(BM_ClusterStepAnalytic)->ArgsProduct({{1, 2, 4, 8, 16, 32}, {0, 1}})->Unit(benchmark::kMillisecond)->UseRealTime();

// FSDP2 with CPU offload as configure_baseline() sets it up on `nodes` nodes: every rank's stages
// or one node's.
const oom::bench::DefaultStep& fsdp2_step(int nodes, bool one_node) {
  static std::map<std::pair<int, bool>, std::unique_ptr<DefaultStep>> steps;
  auto& step = steps[{nodes, one_node}];
  if (!step) {
    oom::WorkloadContext ctx = oom::bench::cluster_workload(nodes);
    oom::BaselineGraph b = oom::baseline_step_graph(oom::BaselineSystem::kFsdp2Offload, ctx, {}, one_node);
    if (!b.setup) throw std::runtime_error("FSDP2 does not fit the cluster workload");
    oom::CalibratedDurationModel d(ctx.hardware, oom::load_calibration_for(ctx.hardware), ctx.workload.gpus);
    step = std::make_unique<DefaultStep>(DefaultStep{std::move(ctx), std::move(b.graph), std::move(d)});
  }
  return *step;
}

void BM_ClusterFsdp2StepSimGrid(benchmark::State& state) {
  simulate_cluster(state, fsdp2_step(static_cast<int>(state.range(0)), state.range(1) != 0));
}
BENCHMARK(BM_ClusterFsdp2StepSimGrid)->ArgsProduct({{1, 2, 4, 8, 16, 32, 96}, {0, 1}})->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_ClusterFsdp2StepAnalytic(benchmark::State& state) {
  evaluate_cluster(state, fsdp2_step(static_cast<int>(state.range(0)), state.range(1) != 0));
}
BENCHMARK(BM_ClusterFsdp2StepAnalytic)->ArgsProduct({{1, 2, 4, 8, 16, 32, 96}, {0, 1}})->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
