// Google Benchmark of the planners (planner/search/ep_planner.h, planner/search/local_planner.h,
// planner/search/plan_search.h) on Qwen3.6-35B-A3B and four H100s. Targets (one core):
//   BM_EpSearch/32: a complete EP search at global batch 32, 4K context — ≤ 0.5 s;
//   BM_LocalPriceCandidate: the boundary DP of one partition candidate at 512K — ≤ 20 µs;
//   BM_LocalMenu512K: the whole Local partition menu at 512K — ≤ 30 s (aim: a few seconds);
//   BM_SearchPlanAuto: EP + Local + Configure-then-Compare at batch 32, 4K (a what-if point);
//   BM_PriceClusterPlan/nodes/symmetric: one plan search candidate on 2 to 12 DGX H200 nodes
//     (lowering and analytic evaluation, every rank's stages or one node's: the ratio is what
//     LoweringOptions::symmetric_nodes saves the plan search).
// Counters report the search sizes (enumerated, memory-feasible, priced plans, DP labels).
#include <benchmark/benchmark.h>

#include "planner/engine/analytic_evaluator.h"
#include "planner/search/ep_planner.h"
#include "planner/search/local_planner.h"
#include "planner/search/plan_search.h"
#include "tests/bench/default_step.h"

namespace {

oom::WorkloadContext qwen(std::int64_t batch, std::int64_t seq) {
  oom::Workload w;
  w.model = "qwen3.6-35b-a3b";
  w.hardware = "h100-sxm-node";
  w.gpus = 4;
  w.global_batch = batch;
  w.seq_len = seq;
  w.yarn_factor = seq > 262144 ? 4 : 1;
  return oom::resolve_workload(w, "bench");
}

void BM_EpSearch(benchmark::State& state) {
  const oom::WorkloadContext ctx = qwen(state.range(0), 4096);
  const oom::PlanPricer pricer(ctx, oom::load_calibration_for(ctx.hardware));
  oom::EpSearchResult r;
  for (auto _ : state) {
    r = oom::plan_ep(pricer);
    benchmark::DoNotOptimize(r.best);
  }
  state.counters["enumerated"] = static_cast<double>(r.enumerated);
  state.counters["memory_feasible"] = static_cast<double>(r.memory_feasible);
  state.counters["priced"] = r.priced;
  state.counters["resident"] = r.best ? static_cast<double>(r.best->plan.resident_layers.size()) : -1;
  state.counters["retained"] = r.best ? static_cast<double>(r.best->plan.moe_retained_layers.size()) : -1;
  state.counters["step_s"] = r.best ? r.best->step_s : 0;
}
BENCHMARK(BM_EpSearch)->Arg(16)->Arg(32)->Arg(64)->Unit(benchmark::kMillisecond);

void BM_LocalPriceCandidate(benchmark::State& state) {
  const oom::WorkloadContext ctx = qwen(4, 524288);
  const oom::PlanPricer pricer(ctx, oom::load_calibration_for(ctx.hardware));
  oom::SplitSpec split;
  split.attention_head_group = 8;
  split.gdn_chunk_tokens = 131072;
  split.moe_chunk_tokens = 262144;
  const oom::LayerTable table = oom::local_layer_table(pricer, split, true);
  oom::BoundaryDpOptions o;
  o.gpu_limit_bytes = oom::from_gib(78);
  o.host_limit_bytes = oom::from_gib(state.range(0)) / 4;  // per rank: the node's room over four ranks
  std::size_t labels = 0;
  for (auto _ : state) {
    const auto l = oom::boundary_dp(table, o);
    labels = l.size();
    benchmark::DoNotOptimize(l.data());
  }
  state.counters["labels"] = static_cast<double>(labels);
}
// Host room per node for boundaries and O/LSE: loose (the DP keeps one label) and tight.
BENCHMARK(BM_LocalPriceCandidate)->Arg(2000)->Arg(300)->Unit(benchmark::kMicrosecond);

void BM_LocalTable512K(benchmark::State& state) {
  const oom::WorkloadContext ctx = qwen(4, 524288);
  const oom::PlanPricer pricer(ctx, oom::load_calibration_for(ctx.hardware));
  oom::SplitSpec split;
  split.attention_head_group = 8;
  split.gdn_chunk_tokens = 131072;
  split.moe_chunk_tokens = 262144;
  for (auto _ : state) benchmark::DoNotOptimize(oom::local_layer_table(pricer, split, true).base_step_s);
}
BENCHMARK(BM_LocalTable512K)->Unit(benchmark::kMillisecond);

void BM_LocalMenu512K(benchmark::State& state) {
  oom::Workload w = qwen(4, 524288).workload;
  if (state.range(0) > 0) w.host_budget_gib = static_cast<double>(state.range(0));
  const oom::WorkloadContext ctx = oom::resolve_workload(w, "bench");
  const oom::PlanPricer pricer(ctx, oom::load_calibration_for(ctx.hardware));
  oom::LocalSearchResult r;
  for (auto _ : state) {
    r = oom::plan_local(pricer);
    benchmark::DoNotOptimize(r.best);
  }
  state.counters["menu"] = r.menu;
  state.counters["configured"] = r.configured;
  state.counters["labels"] = static_cast<double>(r.labels);
  state.counters["priced"] = r.priced;
  state.counters["step_s"] = r.best ? r.best->step_s : 0;
  state.counters["host_gib"] = r.best ? oom::to_gib(r.best->host_total()) : 0;
}
// 0: the node's DRAM as host budget; 750: the published 750 GiB budget.
BENCHMARK(BM_LocalMenu512K)->Arg(0)->Arg(750)->Unit(benchmark::kMillisecond);

void BM_SearchPlanAuto(benchmark::State& state) {
  const oom::WorkloadContext ctx = qwen(state.range(0), 4096);
  const oom::Calibration cal = oom::load_calibration_for(ctx.hardware);
  oom::PlanSearchResult r;
  for (auto _ : state) {
    r = oom::search_plan(ctx, cal);
    // An integer member: DoNotOptimize's register constraint on a double lvalue clobbers it here.
    benchmark::DoNotOptimize(r.candidates_priced);
  }
  state.counters["priced"] = r.candidates_priced;
  state.counters["step_s"] = r.chosen.predicted_step_s;
}
BENCHMARK(BM_SearchPlanAuto)->Arg(32)->Arg(128)->Unit(benchmark::kMillisecond);


// One EP candidate of Qwen3.6-35B-A3B on `nodes` DGX H200 nodes (two 4K sequences per GPU, three
// resident layers), lowered and evaluated as PlanPricer::price does, with every rank's stages
// (symmetric 0) or one node's (1).
void BM_PriceClusterPlan(benchmark::State& state) {
  const oom::WorkloadContext ctx = oom::bench::cluster_workload(static_cast<int>(state.range(0)));
  oom::Plan plan;
  plan.resident_layers = oom::contiguous_resident_set(ctx.model.layers, 3);
  oom::LoweringOptions o;
  o.symmetric_nodes = state.range(1) != 0;
  const oom::CalibratedDurationModel durations(ctx.hardware, oom::load_calibration_for(ctx.hardware), ctx.workload.gpus);
  double step_s = 0;
  std::size_t stages = 0;
  for (auto _ : state) {
    const oom::StepGraph g = oom::lower(plan, ctx, o);
    const oom::StageTimes t = oom::analytic_step_times(g, durations);
    const oom::MemoryPeaks m = oom::memory_peaks(g, t, false);
    benchmark::DoNotOptimize(m.gpu_peak_bytes.data());
    step_s = t.step_s;
    stages = g.stages.size();
  }
  state.counters["gpus"] = static_cast<double>(ctx.workload.gpus);
  state.counters["stages"] = static_cast<double>(stages);
  state.counters["step_s"] = step_s;
}
BENCHMARK(BM_PriceClusterPlan)->ArgsProduct({{2, 4, 12}, {0, 1}})->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
