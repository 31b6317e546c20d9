// One training step of the tiny MoE on the CPU: the streamed runtime (layer windows, host
// checkpoints and recomputation, AdamW on a worker thread) against the plain in-memory trainer
// (autograd over the whole model + torch::optim::AdamW). Ends with the time ratio.
#include <thread>

#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <torch/torch.h>

#include "backend/plain_trainer.h"
#include "backend/runtime.h"
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
  for (auto _ : st) benchmark::DoNotOptimize(trainer.step(s.tokens, s.targets).loss);
  st.counters["tokens_per_s"] = benchmark::Counter(static_cast<double>(s.tokens.numel()), benchmark::Counter::kIsIterationInvariantRate);
}

void BM_StreamedStep(benchmark::State& st) {
  Setup s(st.range(0), st.range(1));
  s.cfg.max_grad_norm = static_cast<double>(st.range(2));
  StreamedTrainer trainer(s.state, s.cfg);
  for (auto _ : st) benchmark::DoNotOptimize(trainer.step(s.tokens, s.targets).loss);
  st.counters["tokens_per_s"] = benchmark::Counter(static_cast<double>(s.tokens.numel()), benchmark::Counter::kIsIterationInvariantRate);
}

BENCHMARK(BM_PlainStep)->Args({4, 128})->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_StreamedStep)->Args({4, 128, 0})->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_StreamedStep)->Args({4, 128, 1})->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

int main(int argc, char** argv) {
  at::set_num_threads(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  benchmark::Initialize(&argc, argv);
  oom::bench::RecordingReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  auto& r = reporter.records;
  const std::string plain = "BM_PlainStep/4/128/real_time", streamed = "BM_StreamedStep/4/128/0/real_time",
                    clipped = "BM_StreamedStep/4/128/1/real_time";
  if (r.count(plain) && r.count(streamed)) {
    fmt::print("\nthreads {}: streamed / plain step time {:.2f}x (target ≤ 1.25x)\n", at::get_num_threads(),
               r[streamed].real_time_s / r[plain].real_time_s);
    if (r.count(clipped)) fmt::print("with clipping (updates after backward): {:.2f}x\n", r[clipped].real_time_s / r[plain].real_time_s);
  }
  benchmark::Shutdown();
  return 0;
}
