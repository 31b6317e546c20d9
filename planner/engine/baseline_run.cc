// Running the baselines: configure, lower, execute (planner/engine/baseline_run.h).
#include "planner/engine/baseline_run.h"

#include <algorithm>

#include <fmt/format.h>

#include "costmodel/input_error.h"

namespace oom {

std::string BaselineResult::failure_cell() const {
  if (!not_run.empty()) return "n/a";
  if (!oom) return {};
  return oom->space == "gpu" ? std::string("OOM(GPU)") : fmt::format("OOM(host n{})", oom->device);
}

bool execute_baseline_step(BaselineResult& r, const StepEngine& engine, const StepGraph& g, const DurationModel& durations,
                           const WorkloadContext& ctx, const std::string& gpu_peak_at) {
  r.trace = engine.execute(g, durations);
  r.step_s = r.trace.step_s;
  r.tokens_per_s = r.step_s > 0 ? static_cast<double>(ctx.workload.global_batch * ctx.workload.seq_len) / r.step_s : 0;
  for (const Bytes b : r.trace.gpu_peak_bytes) r.gpu_peak_bytes = std::max(r.gpu_peak_bytes, b);
  r.host_bytes_per_numa = r.trace.numa_peak_bytes;
  for (std::size_t i = 0; i < r.trace.gpu_peak_bytes.size(); ++i) {
    if (r.trace.gpu_peak_bytes[i] > ctx.gpu_budget_bytes()) {
      r.oom = OutOfMemory{"gpu", static_cast<int>(i), gpu_peak_at + " (executed step)", r.trace.gpu_peak_bytes[i],
                          ctx.gpu_budget_bytes(), ""};
      return false;
    }
  }
  return true;
}

BaselineResult run_baseline(BaselineSystem s, const WorkloadContext& ctx, const StepEngines& engines, const std::string& engine,
                            const Calibration& calibration, const MemoryConstants& k) {
  if (std::string why = whole_sequences_only(s, ctx.workload); !why.empty()) {
    BaselineResult r;
    r.system = s;
    r.not_run = std::move(why);
    return r;
  }
  if (s == BaselineSystem::kMegatronLm) return run_megatron(ctx, engines, engine, calibration, k);
  if (s == BaselineSystem::kKtFt) return run_ktft(ctx, engines, engine, calibration, k);
  const auto e = engines.make(engine);
  if (!e) throw InputError("", "--engine", "\"" + engine + "\"", "unknown engine");
  BaselineResult r;
  r.system = s;
  // One node's stages when the nodes are alike: both engines run them (StepGraph::ranks_emitted).
  const BaselineGraph lowered = baseline_step_graph(s, ctx, k, true);
  if (!lowered.setup) {
    r.oom = lowered.oom;
    return r;
  }
  r.setup = lowered.setup;
  const CalibratedDurationModel durations(ctx.hardware, calibration, ctx.workload.gpus);
  // The executed timeline may hold more than the static estimate: check it against the budgets too.
  const BaselineMemory mem = baseline_static_memory(*r.setup, ctx, k);
  if (!execute_baseline_step(r, *e, lowered.graph, durations, ctx, mem.gpu_peak_at)) return r;
  r.oom = host_out_of_memory(ctx, r.host_bytes_per_numa, mem.host_budget_per_numa, "host state, checkpoints and buffers (executed step)");
  return r;
}

nlohmann::json baseline_result_to_json(const BaselineResult& r) {
  nlohmann::json j;
  j["system"] = std::string(baseline_system_name(r.system));
  j["fits"] = r.fits();
  j["step_s"] = r.fits() ? nlohmann::json(r.step_s) : nlohmann::json(nullptr);
  j["tokens_per_s"] = r.fits() ? nlohmann::json(r.tokens_per_s) : nlohmann::json(nullptr);
  j["gpu_peak_gib"] = r.setup && r.gpu_peak_bytes > 0 ? nlohmann::json(to_gib(r.gpu_peak_bytes)) : nlohmann::json(nullptr);
  Bytes host = 0;
  for (const Bytes b : r.host_bytes_per_numa) host += b;
  j["host_gib"] = host > 0 ? nlohmann::json(to_gib(host)) : nlohmann::json(nullptr);
  j["micro_batch_seqs"] = r.setup ? nlohmann::json(r.setup->micro_batch_seqs) : nlohmann::json(nullptr);
  j["accumulation_steps"] = r.setup ? nlohmann::json(r.setup->accumulation_steps) : nlohmann::json(nullptr);
  j["expert_units"] = r.setup ? nlohmann::json(r.setup->expert_units) : nlohmann::json(nullptr);
  if (r.oom) {
    j["oom"] = {{"space", r.oom->space},
                {"device", r.oom->device},
                {"where", r.oom->where},
                {"needed_gib", to_gib(r.oom->needed_bytes)},
                {"available_gib", to_gib(r.oom->available_bytes)},
                {"message", r.oom->message()}};
  } else {
    j["oom"] = nullptr;
  }
  if (!r.not_run.empty()) j["not_run"] = r.not_run;
  return j;
}

KtFtDurationModel::KtFtDurationModel(HardwareSpec hardware, Calibration calibration, int ranks)
    : CalibratedDurationModel(std::move(hardware), std::move(calibration), ranks) {}

StageCost KtFtDurationModel::cost(const Stage& s, const StepGraph& g) const {
  const Resource& r = g.resource(s.resource);
  if (s.op != OpKind::kExpertGemm || r.kind != ResourceKind::kCpuUpdate) return CalibratedDurationModel::cost(s, g);
  const HardwareSpec& hw = hardware();
  double amx = 0, dram = 0;  // the node's sockets together
  for (const NumaSpec& n : hw.numa) {
    amx += n.amx_bf16_flops_per_s;
    dram += n.dram_Bps;
  }
  const bool backward = s.phase == Phase::kBackward;
  const double efficiency = kKtFtAmxForwardEfficiency * (backward                        ? kKtFtBackwardOverForward
                                                         : s.phase == Phase::kRecompute ? kKtFtRecomputeOverForward
                                                                                        : 1.0);
  const double compute_s = static_cast<double>(s.flops) / (amx * efficiency);
  const double dram_s = dram > 0 ? static_cast<double>(s.params * (backward ? kKtFtBackwardDramBytesPerParam : kKtFtForwardDramBytesPerParam)) / dram : 0.0;
  const double core_s = backward ? ktft_backward_core_s(hw, s.shape.tokens, s.shape.k, s.shape.experts, s.params) : 0.0;
  StageCost c;
  c.fixed_s = calibration().cpu_task_overhead_s;
  c.work = static_cast<double>(s.flops);
  c.rate = c.exclusive_rate = c.work / (std::max(compute_s, dram_s) + core_s);
  return c;
}

BaselineResult run_ktft(const WorkloadContext& ctx, const StepEngines& engines, const std::string& engine,
                        const Calibration& calibration, const MemoryConstants& k) {
  const auto e = engines.make(engine);
  if (!e) throw InputError("", "--engine", "\"" + engine + "\"", "unknown engine");
  // Rank 0's experts run on every socket of its node.
  for (std::size_t n = 0; n < ctx.hardware.numa.size(); ++n) {
    if (!(ctx.hardware.numa[n].amx_bf16_flops_per_s > 0)) {
      throw InputError(ctx.hardware.name, fmt::format("numa[{}].amx_bf16_flops_per_s", n), "0",
                       "KT-FT computes the routed experts with AMX BF16 on the CPU; this hardware names no AMX throughput");
    }
  }
  BaselineResult r;
  r.system = BaselineSystem::kKtFt;
  const BaselineFit fit = configure_ktft(ctx, k);
  if (!fit.setup) {
    r.oom = fit.oom;
    return r;
  }
  r.setup = fit.setup;
  LoweringOptions options;
  options.memory = k;
  const KtFtDurationModel durations(ctx.hardware, calibration, ctx.workload.gpus);
  execute_baseline_step(r, *e, lower_ktft(*fit.setup, ctx, options), durations, ctx, ktft_static_memory(*fit.setup, ctx, k).gpu_peak_at);
  return r;
}

BaselineResult run_megatron(const WorkloadContext& ctx, const StepEngines& engines, const std::string& engine,
                            const Calibration& calibration, const MemoryConstants& k) {
  const auto e = engines.make(engine);
  if (!e) throw InputError("", "--engine", "\"" + engine + "\"", "unknown engine");
  BaselineResult r;
  r.system = BaselineSystem::kMegatronLm;
  const MegatronFit fit = configure_megatron(ctx, k);
  if (!fit.setup) {
    r.oom = fit.oom;
    return r;
  }
  r.setup = BaselineSetup{BaselineSystem::kMegatronLm, fit.setup->micro_batch_seqs, fit.setup->accumulation_steps};
  LoweringOptions options;
  options.memory = k;
  const CalibratedDurationModel durations(ctx.hardware, calibration, ctx.workload.gpus);
  execute_baseline_step(r, *e, lower_megatron(*fit.setup, ctx, options), durations, ctx, megatron_static_memory(*fit.setup, ctx, k).gpu_peak_at);
  return r;
}

}  // namespace oom
