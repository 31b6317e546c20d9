// CPU AdamW (backend/adamw.h) against torch::optim::AdamW on the same buffers, and against a
// STREAM-like triad measured in the same run. AdamW moves 28 bytes per parameter per step with
// FP32 gradients (reads p, g, m, v; writes p, m, v), so its bound is DRAM bandwidth:
// params/s ≤ triad_Bps / 28. The program ends with both ratios.
#include <thread>

#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <torch/torch.h>

#include "backend/adamw.h"
#include "tests/bench/bench_ratios.h"

namespace {

using oom::backend::AdamWConfig;

constexpr std::int64_t kParams = std::int64_t{1} << 23;  // 8 Mi parameters: 128 MiB of state, past every cache

void BM_CpuAdamW(benchmark::State& state) {
  const auto n = state.range(0);
  auto p = torch::randn({n}), g = torch::randn({n}) * 1e-2, m = torch::zeros({n}), v = torch::zeros({n});
  AdamWConfig cfg;
  std::int64_t step = 0;
  for (auto _ : state) {
    oom::backend::cpu_adamw_step(p, g, m, v, cfg, ++step);
    benchmark::ClobberMemory();
  }
  state.counters["params_per_s"] = benchmark::Counter(static_cast<double>(n), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["bytes_per_s"] = benchmark::Counter(28.0 * static_cast<double>(n), benchmark::Counter::kIsIterationInvariantRate);
}

void BM_CpuAdamWBf16Grad(benchmark::State& state) {
  const auto n = state.range(0);
  auto p = torch::randn({n}), g = (torch::randn({n}) * 1e-2).to(torch::kBFloat16), m = torch::zeros({n}), v = torch::zeros({n});
  AdamWConfig cfg;
  std::int64_t step = 0;
  for (auto _ : state) {
    oom::backend::cpu_adamw_step(p, g, m, v, cfg, ++step);
    benchmark::ClobberMemory();
  }
  state.counters["params_per_s"] = benchmark::Counter(static_cast<double>(n), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["bytes_per_s"] = benchmark::Counter(26.0 * static_cast<double>(n), benchmark::Counter::kIsIterationInvariantRate);
}

void BM_TorchAdamW(benchmark::State& state) {
  const auto n = state.range(0);
  auto p = torch::randn({n}).set_requires_grad(true);
  p.mutable_grad() = torch::randn({n}) * 1e-2;
  torch::optim::AdamW opt({p}, torch::optim::AdamWOptions(1e-3).weight_decay(0.01));
  for (auto _ : state) {
    opt.step();
    benchmark::ClobberMemory();
  }
  state.counters["params_per_s"] = benchmark::Counter(static_cast<double>(n), benchmark::Counter::kIsIterationInvariantRate);
}

// a ← b + s·c over FP32 arrays, split over the same threads: 12 bytes per element.
void BM_Triad(benchmark::State& state) {
  const auto n = state.range(0);
  auto a = torch::zeros({n}), b = torch::randn({n}), c = torch::randn({n});
  float* ap = a.data_ptr<float>();
  const float* bp = b.data_ptr<float>();
  const float* cp = c.data_ptr<float>();
  const float s = 1.0001f;
  for (auto _ : state) {
    at::parallel_for(0, n, 1 << 15, [&](std::int64_t lo, std::int64_t hi) {
      for (std::int64_t i = lo; i < hi; ++i) ap[i] = bp[i] + s * cp[i];
    });
    benchmark::ClobberMemory();
  }
  state.counters["bytes_per_s"] = benchmark::Counter(12.0 * static_cast<double>(n), benchmark::Counter::kIsIterationInvariantRate);
}

BENCHMARK(BM_CpuAdamW)->Arg(kParams)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_CpuAdamWBf16Grad)->Arg(kParams)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_TorchAdamW)->Arg(kParams)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Triad)->Arg(kParams)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

int main(int argc, char** argv) {
  at::set_num_threads(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  benchmark::Initialize(&argc, argv);
  oom::bench::RecordingReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  auto& r = reporter.records;
  const auto key = [](const char* name) { return fmt::format("{}/{}/real_time", name, kParams); };
  if (r.count(key("BM_CpuAdamW")) && r.count(key("BM_TorchAdamW")) && r.count(key("BM_Triad"))) {
    const double ours = r[key("BM_CpuAdamW")].counters["params_per_s"];
    const double torch_rate = r[key("BM_TorchAdamW")].counters["params_per_s"];
    const double triad = r[key("BM_Triad")].counters["bytes_per_s"];
    fmt::print("\nthreads {}, kernel {}\n", at::get_num_threads(), oom::backend::cpu_adamw_isa());
    fmt::print("cpu AdamW {:.3g} params/s, torch::optim::AdamW {:.3g} params/s: ratio {:.2f}x\n", ours, torch_rate, ours / torch_rate);
    fmt::print("cpu AdamW moves {:.3g} B/s (28 B/param), triad {:.3g} B/s: {:.0f}% of triad bandwidth\n", 28 * ours, triad,
               100 * 28 * ours / triad);
  }
  benchmark::Shutdown();
  return 0;
}
