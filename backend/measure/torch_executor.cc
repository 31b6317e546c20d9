#include "backend/measure/torch_executor.h"

#include <algorithm>
#include <chrono>
#include <ctime>
#include <optional>

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include "backend/runtime/device_memory.h"
#include "backend/runtime/state.h"
#include "backend/runtime/threads.h"
#include "backend/train/plan_runtime.h"

namespace oom::backend {
namespace {

double process_cpu_s() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

}  // namespace

ModelSpec truncated_model(const ModelSpec& m, int layers) {
  ModelSpec t = m;
  if (layers > 0 && layers < m.layers) {
    t.layers = layers;
    t.layer_kinds.resize(static_cast<std::size_t>(layers));
  }
  return t;
}

Plan truncated_plan(const Plan& plan, int layers) {
  Plan p = plan;
  auto keep = [layers](std::vector<int>& v) { std::erase_if(v, [layers](int l) { return l >= layers; }); };
  keep(p.resident_layers);
  keep(p.moe_retained_layers);
  keep(p.boundaries.host_kept);
  keep(p.boundaries.gpu_held);
  return p;
}

TorchExecutor::TorchExecutor(TorchExecutorOptions options) : options_(options) {}

std::optional<MemoryConstants> TorchExecutor::device_memory_constants() const {
  if (!options_.device_memory || (options_.use_cuda && at::hasCUDA())) return std::nullopt;
  MemoryConstants m;
  m.gpu_fixed_bytes = 0;
  m.gpu_headroom_fraction = 0;
  return m;
}

Measurement TorchExecutor::run(const Plan& plan_in, const WorkloadContext& ctx, const ExecutionUnits& units) {
  set_compute_threads(options_.threads);
  const ModelSpec spec = truncated_model(ctx.model, units.decoder_layers);
  const Plan plan = truncated_plan(plan_in, spec.layers);
  const std::int64_t batch = ctx.workload.global_batch, seq = ctx.workload.seq_len;
  check_plan_for_run(plan, spec, batch, seq, ctx.workload.gpus, "plan");

  const bool cuda = options_.use_cuda && at::hasCUDA();
  // Declared before the state and the trainer, so that the device's allocations are metered until
  // they are freed.
  std::optional<device_memory::Emulation> emulation;
  StateOptions state_options;
  if (options_.device_memory && !cuda) {
    emulation.emplace(true);
    state_options.precision = WorkingPrecision::kBFloat16;
  }
  HostState state(spec, state_options);
  state.init_from_seed(options_.seed);
  TrainerConfig cfg;
  cfg.max_grad_norm = 0.0;
  PlanTrainer trainer(state, cfg, plan, cuda ? at::Device(at::kCUDA, 0) : at::Device(at::kCPU));
  auto gen = at::make_generator<at::CPUGeneratorImpl>(options_.seed + 1);
  const auto vocab = std::min<std::int64_t>(spec.vocab, 256);
  const auto tokens = at::randint(0, vocab, {batch, seq}, gen, at::TensorOptions().dtype(at::kLong));
  const auto targets = at::randint(0, vocab, {batch, seq}, gen, at::TensorOptions().dtype(at::kLong));

  for (int i = 0; i < options_.warmup_steps; ++i) trainer.step(tokens, targets);
  // Timed steps run untraced (recording samples memory at every stage); one traced step follows.
  std::vector<double> times;
  Bytes untraced_peak = 0;  // the emulated device's, over the timed steps
  for (int i = 0; i < std::max(1, options_.measured_steps); ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = process_cpu_s();
    trainer.step(tokens, targets);
    times.push_back(options_.clock == TorchExecutorOptions::Clock::kProcessCpu
                        ? process_cpu_s() - c0
                        : std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    if (emulation) untraced_peak = std::max(untraced_peak, trainer.last_device_peak());
  }
  std::sort(times.begin(), times.end());
  trainer.set_tracing(true);
  trainer.step(tokens, targets);
  Measurement m;
  m.step_s = times[times.size() / 2];
  m.trace = trainer.last_trace();
  m.gpu_peak_bytes = m.trace.gpu_peak_bytes;
  if (emulation) {
    if (m.gpu_peak_bytes.empty()) m.gpu_peak_bytes.push_back(0);
    m.gpu_peak_bytes[0] = std::max(m.gpu_peak_bytes[0], untraced_peak);
  }
  m.numa_peak_bytes = m.trace.numa_peak_bytes;
  return m;
}

}  // namespace oom::backend
