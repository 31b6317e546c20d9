// CPU AdamW (backend/optim/adamw.h) against torch::optim::AdamW on the same buffers, and against a
// STREAM-like triad measured in the same run. AdamW moves 28 bytes per parameter per step with
// FP32 gradients (reads p, g, m, v; writes p, m, v), so its bound is DRAM bandwidth:
// params/s ≤ triad_Bps / 28. The program ends with both ratios.
//
// Sized past every cache: OOM_ADAMW_BENCH_PARAMS parameters (default 192 Mi: 2.25 GiB of FP32
// master and moments, 3 GiB with the gradient). tests/bench/adamw_peers.py runs this program's
// kernel and triad beside PyTorch's fused CPU AdamW and DeepSpeed's CPU Adam in one run.
#include <cstdlib>
#include <thread>
#include <vector>

#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <torch/torch.h>

#include "backend/optim/adamw.h"
#include "backend/runtime/threads.h"
#include "tests/bench/bench_ratios.h"

namespace {

using oom::backend::AdamWConfig;

std::int64_t bench_params() {
  const char* env = std::getenv("OOM_ADAMW_BENCH_PARAMS");
  return env != nullptr && *env != '\0' ? std::max<std::int64_t>(1024, std::atoll(env)) : std::int64_t{192} << 20;
}
const std::int64_t kParams = bench_params();

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

// a ← b + s·c over FP32 arrays, split over the same threads. Bytes counted with the write-allocate
// read of a: 16 per element (STREAM counts 12). AdamW's stores to p, m and v are to lines it has
// just read, so its 28 B/param has no such extra traffic.
void triad(float* __restrict a, const float* __restrict b, const float* __restrict c, float s, std::int64_t n) {
#pragma GCC ivdep
  for (std::int64_t i = 0; i < n; ++i) a[i] = b[i] + s * c[i];
}

void BM_Triad(benchmark::State& state) {
  const auto n = state.range(0);
  auto a = torch::zeros({n}), b = torch::randn({n}), c = torch::randn({n});
  float* ap = a.data_ptr<float>();
  const float* bp = b.data_ptr<float>();
  const float* cp = c.data_ptr<float>();
  const float s = 1.0001f;
  for (auto _ : state) {
    // One slice per thread, as cpu_adamw_step splits its work (at::parallel_for would run serially
    // here: PyPI's LibTorch inlines OpenMP pragmas that need -fopenmp).
    const int T = at::get_num_threads();
    const std::int64_t per = (n + T - 1) / T;
    std::vector<std::thread> pool;
    for (int t = 1; t < T; ++t) {
      const auto lo = std::min(n, t * per), hi = std::min(n, (t + 1) * per);
      pool.emplace_back([=] { triad(ap + lo, bp + lo, cp + lo, s, hi - lo); });
    }
    triad(ap, bp, cp, s, std::min(n, per));
    for (auto& th : pool) th.join();
    benchmark::ClobberMemory();
  }
  state.counters["bytes_per_s"] = benchmark::Counter(16.0 * static_cast<double>(n), benchmark::Counter::kIsIterationInvariantRate);
}

BENCHMARK(BM_CpuAdamW)->Arg(kParams)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(1);
BENCHMARK(BM_CpuAdamWBf16Grad)->Arg(kParams)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(1);
BENCHMARK(BM_TorchAdamW)->Arg(kParams)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(1);
BENCHMARK(BM_Triad)->Arg(kParams)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(1);

}  // namespace

int main(int argc, char** argv) {
  oom::backend::set_compute_threads(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  benchmark::Initialize(&argc, argv);
  oom::bench::RecordingReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  const auto* ours = reporter.find("BM_CpuAdamW/");
  const auto* theirs = reporter.find("BM_TorchAdamW/");
  const auto* triad = reporter.find("BM_Triad/");
  if (ours != nullptr && theirs != nullptr && triad != nullptr) {
    const double rate = ours->counters.at("params_per_s"), torch_rate = theirs->counters.at("params_per_s");
    const double triad_Bps = triad->counters.at("bytes_per_s");
    fmt::print("\nthreads {}, kernel {}\n", at::get_num_threads(), oom::backend::cpu_adamw_isa());
    fmt::print("cpu AdamW {:.3g} params/s, torch::optim::AdamW {:.3g} params/s: ratio {:.2f}x\n", rate, torch_rate,
               rate / torch_rate);
    fmt::print("cpu AdamW moves {:.3g} B/s (28 B/param), triad {:.3g} B/s: ratio {:.2f} (1.0 = at the triad bandwidth)\n",
               28 * rate, triad_Bps, 28 * rate / triad_Bps);
  }
  benchmark::Shutdown();
  return 0;
}
