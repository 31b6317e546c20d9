// One training step of the tiny MoE on the CPU: the graph runner executing the default plan of
// `oom train` (Base Local: layer windows, host checkpoints and recomputation, AdamW on a worker
// thread), with and without clipping, and a plan keeping O/LSE, against the plain in-memory
// trainer (autograd over the whole model + torch::optim::AdamW). Ends with the wall-time ratio and
// the process-CPU-time ratio (the latter is robust to other load sharing the machine).
#include <thread>

#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <torch/torch.h>

#include "backend/runtime/runtime.h"
#include "backend/runtime/threads.h"
#include "backend/train/plain_trainer.h"
#include "backend/train/plan_runtime.h"
#include "tests/bench/bench_ratios.h"

namespace {

using namespace oom::backend;

struct Setup {
  oom::ModelSpec spec = oom::load_model_spec("tiny-moe");
  HostState state{spec};
  TrainerConfig cfg;
  torch::Tensor tokens, targets;
  Setup(std::int64_t batch, std::int64_t seq) {
    state.init_from_seed(1);
    cfg.max_grad_norm = 0.0;
    tokens = torch::randint(0, 256, {batch, seq}, torch::kLong);
    targets = torch::randint(0, 256, {batch, seq}, torch::kLong);
  }
};

void BM_PlainStep(benchmark::State& st) {
  Setup s(st.range(0), st.range(1));
  PlainTrainer trainer(s.state, s.cfg);
  trainer.step(s.tokens, s.targets);  // warm-up: first-touch allocations and kernel set-up
  for (auto _ : st) benchmark::DoNotOptimize(trainer.step(s.tokens, s.targets).loss);
  st.counters["tokens_per_s"] = benchmark::Counter(static_cast<double>(s.tokens.numel()), benchmark::Counter::kIsIterationInvariantRate);
}

// The graph runner: range(2) selects the plan. 0: the default plan (default_run_plan, Base Local:
// every boundary kept on the host, O/LSE recomputed); 1: the same with O/LSE kept on the host, so
// backward differentiates the attention cores from them instead of recomputing them. range(3):
// clipping (1: the updates wait for the whole backward).
void BM_PlanStep(benchmark::State& st) {
  Setup s(st.range(0), st.range(1));
  s.cfg.max_grad_norm = static_cast<double>(st.range(3));
  oom::Plan plan = default_run_plan(s.spec, st.range(0), st.range(1), 1, "local-cpu");
  plan.keep_attention_results = st.range(2) == 1;
  PlanTrainer trainer(s.state, s.cfg, plan);
  trainer.step(s.tokens, s.targets);  // warm-up
  for (auto _ : st) benchmark::DoNotOptimize(trainer.step(s.tokens, s.targets).loss);
  st.counters["tokens_per_s"] = benchmark::Counter(static_cast<double>(s.tokens.numel()), benchmark::Counter::kIsIterationInvariantRate);
}

BENCHMARK(BM_PlainStep)->Args({4, 128})->Unit(benchmark::kMillisecond)->MeasureProcessCPUTime()->UseRealTime()->MinTime(3);
BENCHMARK(BM_PlanStep)->Args({4, 128, 0, 0})->Unit(benchmark::kMillisecond)->MeasureProcessCPUTime()->UseRealTime()->MinTime(3);
BENCHMARK(BM_PlanStep)->Args({4, 128, 0, 1})->Unit(benchmark::kMillisecond)->MeasureProcessCPUTime()->UseRealTime()->MinTime(3);
BENCHMARK(BM_PlanStep)->Args({4, 128, 1, 0})->Unit(benchmark::kMillisecond)->MeasureProcessCPUTime()->UseRealTime()->MinTime(3);

}  // namespace

int main(int argc, char** argv) {
  oom::backend::set_compute_threads(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  benchmark::Initialize(&argc, argv);
  oom::bench::RecordingReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  const auto* plain = reporter.find("BM_PlainStep/4/128/");
  const struct {
    const char* name;
    const char* what;
  } runs[] = {{"BM_PlanStep/4/128/0/0/", "default plan"},
              {"BM_PlanStep/4/128/0/1/", "default plan with clipping (updates after backward)"},
              {"BM_PlanStep/4/128/1/0/", "default plan with O/LSE kept"}};
  for (const auto& run : runs) {
    const auto* p = reporter.find(run.name);
    if (plain != nullptr && p != nullptr) {
      fmt::print("threads {}: {} / plain: wall {:.2f}x, process CPU time (all threads) {:.2f}x\n", at::get_num_threads(), run.what,
                 p->real_time_s / plain->real_time_s, p->cpu_time_s / plain->cpu_time_s);
    }
  }
  benchmark::Shutdown();
  return 0;
}
