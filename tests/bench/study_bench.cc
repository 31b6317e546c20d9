// Google Benchmark of what a what-if user waits for (issue 71): the default study whole (`oom
// whatif`), one `oom plan` at 4K and at 1M on four H100s, and the slowest case of the FLAT and
// MoP cluster studies (experiments/flat-composed.json: Qwen3.5-122B at 1M on eight H100s, with
// and without FLAT's schedules; experiments/mop-cluster.json: Kimi-K2 at 1M on twelve DGX H200
// nodes). Targets on a quiet 2-core machine: the default study <= 5 s on both cores, `oom plan`
// <= 2 s at 1M and <= 0.3 s at 4K. Each case runs once per repetition (a study is seconds).
// Counters say what the time went to (planner/engine/work_counts.h): lowerings, simulations
// (engine runs and analytic evaluations), priced candidates and the memo's share of them; for a
// study they are the calling thread's (BM_DefaultStudy/1) or none (/2: the workers count theirs).
// Times: tests/bench/README.md.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>

#include "experiments/plan_finder.h"
#include "experiments/study.h"
#include "planner/engine/work_counts.h"
#include "planner/search/plan_search.h"
#ifdef OOM_BENCH_SIMGRID
#include "sim/simgrid_engine.h"
#endif

namespace {

oom::WorkloadContext workload(const std::string& model, const std::string& hardware, int gpus, std::int64_t batch,
                              std::int64_t seq, int gpus_per_seq = 1) {
  oom::Workload w;
  w.model = model;
  w.hardware = hardware;
  w.gpus = gpus;
  w.global_batch = gpus_per_seq > 1 ? gpus / gpus_per_seq : batch;
  w.seq_len = seq;
  // The smallest whole YaRN factor that reaches the context, as a study sets it.
  const double reach = static_cast<double>(seq) / static_cast<double>(oom::load_model_spec(model).max_position);
  w.yarn_factor = std::max(1.0, std::ceil(reach));
  return oom::resolve_workload(w, "bench");
}

void report(benchmark::State& state, const oom::WorkCounts& before, int cases) {
  const oom::WorkCounts d = oom::thread_work_counts() - before;
  const double runs = static_cast<double>(state.iterations()) * std::max(1, cases);
  state.counters["lowerings"] = static_cast<double>(d.lowerings) / runs;
  state.counters["simulations"] = static_cast<double>(d.simulations) / runs;
  state.counters["priced"] = static_cast<double>(d.priced) / runs;
  state.counters["price_hits"] = static_cast<double>(d.price_hits) / runs;
}

oom::StepEngines engines() {
#ifdef OOM_BENCH_SIMGRID
  return oom::simulator_engines();
#else
  return oom::StepEngines();
#endif
}

// `oom plan`: both paths, compared by short executions on the SimGrid engine where it is built
// (as the command does), else the analytic one.
void plan_search(benchmark::State& state, const oom::WorkloadContext& ctx) {
  const oom::Calibration calibration = oom::load_calibration_for(ctx.hardware);
  oom::PlanSearchOptions options;
  options.engines = engines();
  if (options.engines.has("simgrid")) options.compare_engine = "simgrid";
  const oom::WorkCounts before = oom::thread_work_counts();
  oom::PlanSearchResult r;
  for (auto _ : state) {
    r = oom::search_plan(ctx, calibration, options);
    benchmark::DoNotOptimize(r.chosen.predicted_step_s);
  }
  report(state, before, 1);
}

void BM_PlanQwen4K(benchmark::State& state) { plan_search(state, workload("qwen3.6-35b-a3b", "h100-sxm-node", 4, 32, 4096)); }
BENCHMARK(BM_PlanQwen4K)->Unit(benchmark::kMillisecond)->Iterations(1)->Repetitions(3)->ReportAggregatesOnly(false);

void BM_PlanQwen1M(benchmark::State& state) { plan_search(state, workload("qwen3.6-35b-a3b", "h100-sxm-node", 4, 4, 1048576)); }
BENCHMARK(BM_PlanQwen1M)->Unit(benchmark::kMillisecond)->Iterations(1);

// One case of a study as `oom whatif` answers it: the plan search of `system` and the baselines.
void study_case(benchmark::State& state, const std::string& study, const std::string& sweep, std::int64_t seq_len) {
  oom::StudySpec spec = oom::load_study(std::string(OOM_SOURCE_DIR) + "/experiments/" + study);
  std::erase_if(spec.sweeps, [&](const oom::StudySweep& w) { return w.name != sweep; });
  spec.sweeps.at(0).seq_len = {seq_len};
  const int cases = static_cast<int>(oom::expand_study(spec).size());
  const oom::StepEngines e = engines();
  const oom::WorkCounts before = oom::thread_work_counts();
  for (auto _ : state) {
    const oom::StudyResult r = oom::run_study(spec, e, &oom::find_plan_by_search);
    benchmark::DoNotOptimize(r.rows.size());
  }
  report(state, before, cases);
  state.counters["cases"] = cases;
}

void BM_FlatComposed122B1M(benchmark::State& state) { study_case(state, "flat-composed.json", "context-122b", 1048576); }
BENCHMARK(BM_FlatComposed122B1M)->Unit(benchmark::kMillisecond)->Iterations(1);

void BM_MopCluster1M(benchmark::State& state) { study_case(state, "mop-cluster.json", "context", 1048576); }
BENCHMARK(BM_MopCluster1M)->Unit(benchmark::kMillisecond)->Iterations(1);

// The default study (oom whatif with no file) on 1 and 2 threads; counters per case.
void BM_DefaultStudy(benchmark::State& state) {
  const oom::StudySpec spec = oom::default_study();
  const int cases = static_cast<int>(oom::expand_study(spec).size());
  const oom::StepEngines e = engines();
  const oom::WorkCounts before = oom::thread_work_counts();
  for (auto _ : state) {
    const oom::StudyResult r = oom::run_study(spec, e, &oom::find_plan_by_search, {}, static_cast<int>(state.range(0)));
    benchmark::DoNotOptimize(r.rows.size());
  }
  report(state, before, cases);
  state.counters["cases"] = cases;
}
BENCHMARK(BM_DefaultStudy)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->Iterations(1)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
