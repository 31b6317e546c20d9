// The vocabulary projection and loss: peak host memory and time of one forward + backward, the
// backend's token-chunked loss (chunked_cross_entropy, backend/model/model.h) against the full-logits
// reference (linear → cross_entropy over a [T, V] FP32 logits tensor), at T = 4096 tokens and a
// 151,936-entry vocabulary (Qwen3's). Each run forks a child process and reports the growth of its
// peak resident set (VmHWM) over its resident set after the inputs exist, so the two variants do
// not share allocator caches. Ends with the ratio chunked ÷ full of that peak.
//
//   loss_bench [--benchmark_filter=...]   (OOM_LOSS_BENCH_HIDDEN=h changes the hidden size, default 512)
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include <benchmark/benchmark.h>
#include <fmt/format.h>
#include <torch/torch.h>

#include "backend/model/model.h"
#include "tests/bench/bench_ratios.h"

namespace {

constexpr std::int64_t kTokens = 4096;
constexpr std::int64_t kVocab = 151936;

std::int64_t hidden() {
  const char* h = std::getenv("OOM_LOSS_BENCH_HIDDEN");
  return h != nullptr ? std::atoll(h) : 512;
}

// A field of /proc/self/status in bytes (VmRSS, VmHWM).
double status_bytes(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field, 0) == 0) return std::atof(line.c_str() + std::string(field).size() + 1) * 1024.0;
  }
  return 0;
}

// In a child process: inputs, then one forward + backward; returns the peak growth in bytes.
double peak_growth(bool chunked, std::int64_t chunk) {
  int fds[2];
  if (pipe(fds) != 0) return -1;
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    at::set_num_threads(2);
    torch::manual_seed(1);
    const auto xn = torch::randn({kTokens, hidden()}).requires_grad_(true);
    const auto head = (torch::randn({kVocab, hidden()}) * 0.02).requires_grad_(true);
    const auto targets = torch::randint(0, kVocab, {kTokens}, torch::kLong);
    const double before = status_bytes("VmRSS:");
    const auto loss = chunked ? oom::backend::chunked_cross_entropy(xn, head, targets, 0.0, chunk)
                              : at::cross_entropy_loss(at::linear(xn, head), targets);
    loss.backward();
    const double growth = status_bytes("VmHWM:") - before;
    [[maybe_unused]] auto n = write(fds[1], &growth, sizeof growth);
    _exit(0);
  }
  close(fds[1]);
  double growth = -1;
  [[maybe_unused]] auto n = read(fds[0], &growth, sizeof growth);
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  return growth;
}

void BM_Loss(benchmark::State& state) {
  const bool chunked = state.range(0) > 0;
  double growth = 0;
  for (auto _ : state) growth = peak_growth(chunked, state.range(0));
  state.counters["peak_bytes"] = growth;
  state.counters["logits_bytes"] = static_cast<double>(kTokens * kVocab * 4);
}
BENCHMARK(BM_Loss)->Arg(0)->Arg(1024)->Arg(256)->Iterations(1)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  oom::bench::RecordingReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  const auto* full = reporter.find("BM_Loss/0/");
  for (const char* name : {"BM_Loss/1024/", "BM_Loss/256/"}) {
    const auto* c = reporter.find(name);
    if (full == nullptr || c == nullptr) continue;
    const double f = full->counters.at("peak_bytes"), g = c->counters.at("peak_bytes");
    std::printf("%s peak %.0f MiB vs full logits %.0f MiB: ratio %.3f (a %.1f%% cut); time ratio %.2f\n", name,
                g / 1048576.0, f / 1048576.0, g / f, 100.0 * (1 - g / f), c->real_time_s / full->real_time_s);
  }
  return 0;
}
