#include "backend/train/train.h"

#include <ATen/Context.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <optional>

#include <ATen/Parallel.h>
#ifdef OOM_BACKEND_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif
#include <nlohmann/json.hpp>

#include "backend/data/data.h"
#include "backend/io/hf_checkpoint.h"
#include "backend/runtime/device_memory.h"
#include "backend/runtime/state.h"
#include "backend/runtime/threads.h"
#include "backend/train/checkpoint.h"
#include "backend/train/plain_trainer.h"
#include "backend/train/plan_runtime.h"
#include "costmodel/atomic_file.h"
#include "costmodel/config_paths.h"
#include "costmodel/flops.h"
#include "costmodel/hardware_spec.h"
#include "costmodel/input_error.h"
#include "costmodel/version.h"
#include "planner/plan/plan.h"
#include "traces/trace.h"

namespace oom::backend {
namespace {

void check_options(const TrainOptions& o) {
  if (o.steps < 0) throw InputError("", "--steps", std::to_string(o.steps), "must be ≥ 0");
  if (o.seq < 2) throw InputError("", "--seq", std::to_string(o.seq), "must be ≥ 2");
  if (o.batch < 1) throw InputError("", "--batch", std::to_string(o.batch), "must be ≥ 1");
  if (!(o.lr > 0)) throw InputError("", "--lr", std::to_string(o.lr), "must be > 0");
  if (o.reference && (!o.checkpoint_dir.empty() || !o.resume_dir.empty())) {
    throw InputError("", "--reference", "true", "the reference trainer does not write or resume checkpoints");
  }
  if (o.reference && o.bf16) throw InputError("", "--reference", "true", "the reference trainer is FP32 only");
  if (o.accumulate < 1) throw InputError("", "--accumulate", std::to_string(o.accumulate), "must be ≥ 1");
  if (o.peak_tflops < 0) throw InputError("", "--peak-tflops", std::to_string(o.peak_tflops), "must be ≥ 0");
  if (o.reference && !o.plan.empty()) throw InputError("", "--plan", o.plan, "the reference trainer runs no plan");
  if (o.reference && !o.trace.empty()) throw InputError("", "--trace", o.trace, "the reference trainer records no stages");
  if (o.reference && o.device_memory) throw InputError("", "--device-memory", "true", "the reference trainer has no device side");
  // The schedule's options, before any work (the run's last step is known only after a resume).
  resolve_lr_schedule(o.lr_schedule, o.lr, o.min_lr, o.warmup_steps, o.decay_steps,
                      std::max<std::int64_t>(o.steps, o.warmup_steps));
}

// Appends one line per step to the --log file, flushed at once (a killed run keeps its lines).
class StepLog {
 public:
  explicit StepLog(const std::string& path) : path_(path) {
    if (path.empty()) return;
    out_.open(path, std::ios::app);
    if (!out_) throw InputError(path, "--log", path, "cannot open the log file for appending");
  }
  void write(const StepReport& r) {
    if (!out_.is_open()) return;
    nlohmann::json j = {{"step", r.step}, {"loss", r.loss}, {"lr", r.lr}, {"tokens", r.tokens},
                        {"tokens_per_s", r.tokens_per_s}, {"grad_norm", r.grad_norm}, {"elapsed_s", r.elapsed_s}};
    j["mfu"] = r.mfu >= 0 ? nlohmann::json(r.mfu) : nlohmann::json(nullptr);
    stamp_oom_version(j);
    out_ << j.dump() << "\n";
    out_.flush();
    if (!out_) throw std::runtime_error(path_ + ": cannot write the step log");
  }

 private:
  std::string path_;
  std::ofstream out_;
};

double flops_per_token(const ModelSpec& spec, std::int64_t seq) {
  return 3.0 * static_cast<double>(model_forward_flops(spec, 1, seq).total()) / static_cast<double>(seq);
}

std::string gpu_name(const at::Device& device) {
#ifdef OOM_BACKEND_CUDA
  if (device.is_cuda()) return at::cuda::getDeviceProperties(device.index())->name;
#endif
  return "";
}

}  // namespace

bool bf16_working_weights(const TrainOptions& o, const std::string& device) {
  if (o.bf16 && o.fp32) throw InputError("", "--fp32", "true", "contradicts --bf16");
  if (o.bf16) return true;
  if (o.fp32 || o.reference) return false;
  return device.rfind("cuda", 0) == 0;
}

double training_flops_per_token(const std::string& model, std::int64_t seq) {
  return flops_per_token(load_model_spec(model), seq);
}

double device_peak_flops(double peak_tflops, const std::string& gpu) {
  if (peak_tflops > 0) return peak_tflops * 1e12;
  if (gpu.empty()) return 0.0;
  for (const std::string& name : config_names("hardware")) {
    try {
      const HardwareSpec hw = load_hardware_spec(name);
      if (hw.gpu.name == gpu && hw.gpu.bf16_flops_per_s > 0) return hw.gpu.bf16_flops_per_s;
    } catch (const InputError&) {
      // A broken hardware file says nothing about this GPU.
    }
  }
  return 0.0;
}

std::string run_hardware(const std::string& device) {
  const std::string gpu = gpu_name(at::Device(device));
  if (gpu.empty()) return "local-cpu";
  for (const std::string& name : config_names("hardware")) {
    try {
      if (load_hardware_spec(name).gpu.name == gpu) return name;
    } catch (const InputError&) {
      // A broken hardware file says nothing about this GPU.
    }
  }
  return "local-cpu";
}

std::string resolve_device(const std::string& device, int local_rank) {
  if (device != "auto" && device != "cpu" && device != "cuda") {
    throw InputError("", "--device", device, "must be auto, cpu or cuda");
  }
  const int n = at::hasCUDA() ? static_cast<int>(at::getNumGPUs()) : 0;
  const bool have_cuda = n > 0;
  if (device == "cpu" || (device == "auto" && !have_cuda)) return "cpu";
  if (!have_cuda) {
#ifdef OOM_BACKEND_CUDA
    throw InputError("", "--device", "cuda", "no CUDA device is visible to LibTorch");
#else
    throw InputError("", "--device", "cuda", "this backend was built without CUDA");
#endif
  }
  if (local_rank < 0) throw InputError("", "LOCAL_RANK", std::to_string(local_rank), "must be ≥ 0");
  return "cuda:" + std::to_string(local_rank % n);
}

TrainResult train(const TrainOptions& options, const std::function<void(const StepReport&)>& on_step) {
  check_options(options);
  set_compute_threads(options.threads);
  // A Hugging Face checkpoint folder brings its own model (config.json).
  const ModelSpec spec = run_model_spec(options.model, options.weights);
  check_final_weights(spec, options.save_weights);
  const at::Device device(resolve_device(options.device));
  // Every run but the reference executes a plan: the given one, else the default for this machine.
  std::optional<Plan> plan;
  const std::int64_t step_seqs = static_cast<std::int64_t>(options.batch) * options.accumulate;
  if (options.plan.empty() && !options.reference) {
    plan = default_run_plan(spec, step_seqs, options.seq, 1, run_hardware(device.str()));
    if (options.accumulate > 1) plan->split.sub_batch_seqs = options.batch;
  } else if (!options.plan.empty()) {
    plan = load_plan(options.plan);
    // Accumulation with a plan: one plan step over the K·B sequences, in sub-batches of at most B
    // (the plan's own split.sub_batch_seqs, or B when it runs whole batches). Sub-batches sum their
    // weight gradients and the loss is the mean over all sequences: K micro-batches exactly.
    if (options.accumulate > 1 && plan->path == ExpertPath::kEp) {
      throw InputError("", "--accumulate", std::to_string(options.accumulate),
                       "an EP plan runs its whole batch per step (use --batch for the K·B sequences)");
    }
    if (options.accumulate > 1 && plan->split.sub_batch_seqs == 0) plan->split.sub_batch_seqs = options.batch;
    check_plan_for_run(*plan, spec, step_seqs, options.seq, 1, options.plan);
  }
  // `o` is the run as resolved: its precision is the one the checkpoint records.
  TrainOptions o = options;
  o.bf16 = bf16_working_weights(options, device.str());
  o.fp32 = !o.bf16;
  const auto data = open_training_data(o.data.empty() ? default_corpus_path() : o.data, o.seq);
  data->check_vocab(spec.vocab);
  data->seed(o.seed);

  StateOptions so;
  so.precision = o.bf16 ? WorkingPrecision::kBFloat16 : WorkingPrecision::kFloat32;
  HostState state(spec, so);
  load_initial_weights(state, o.weights, o.seed);
  std::optional<nlohmann::json> saved_run;
  if (!o.resume_dir.empty()) saved_run = resume_training(o, state, *data);
  const LrSchedule schedule = run_lr_schedule(o, state.step, saved_run ? &*saved_run : nullptr, checkpoint_file(o.resume_dir));
  const nlohmann::json schedule_json = lr_schedule_to_json(schedule);
  const auto run_record = [&] {
    nlohmann::json run = checkpoint_run(o, *data);
    run["lr_schedule"] = schedule_json;
    return run;
  };
  StepLog log(o.log);

  TrainerConfig cfg;
  cfg.adam.lr = o.lr;
  cfg.adam.weight_decay = o.weight_decay;
  cfg.max_grad_norm = o.max_grad_norm;
  cfg.model.gdn_chunk_tokens = o.gdn_chunk_tokens;
  cfg.accumulate = plan ? 1 : o.accumulate;  // a plan runs the K·B sequences as its sub-batches
  std::optional<PlainTrainer> plain;
  std::optional<device_memory::Emulation> emulation;  // declared before the trainer, so it ends after it
  std::optional<PlanTrainer> planned;
  if (o.reference) {
    plain.emplace(state, cfg);
  } else {
    // Before the runner exists: its weight window allocates the device's slots.
    emulation.emplace(o.device_memory && device.is_cpu());
    planned.emplace(state, cfg, *plan, device);
  }
  const double peak_flops = device_peak_flops(o.peak_tflops, gpu_name(device));
  const double model_flops_per_token = flops_per_token(spec, o.seq);

  TrainResult result;
  result.trainer = o.reference ? "reference" : "plan";
  result.first_step = state.step + 1;
  const auto t0 = std::chrono::steady_clock::now();
  std::int64_t tokens = 0;
  for (int i = 0; i < o.steps; ++i) {
    const auto ts = std::chrono::steady_clock::now();
    const double lr = lr_at(schedule, state.step + 1);
    const Batch b = data->next(static_cast<std::int64_t>(o.batch) * o.accumulate);
    if (planned && !o.trace.empty() && i + 1 == o.steps) planned->set_tracing(true);
    StepStats st;
    if (o.reference) {
      plain->set_lr(lr);
      st = plain->step(b.tokens, b.targets);
      ++state.step;  // the plain trainer keeps its own state; count its steps here
    } else {
      planned->set_lr(lr);
      st = planned->step(b.tokens, b.targets);
    }
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - ts).count();
    if (planned && device_memory::emulated()) {
      result.device_peak_bytes = std::max<std::int64_t>(result.device_peak_bytes, planned->last_device_peak());
      const auto uses = planned->last_use_peaks();
      result.device_use_peak_bytes.resize(uses.size(), 0);
      for (std::size_t u = 0; u < uses.size(); ++u) {
        result.device_use_peak_bytes[u] = std::max<std::int64_t>(result.device_use_peak_bytes[u], uses[u]);
      }
    }
    tokens += b.tokens.numel();
    result.last_step_s = dt;
    result.losses.push_back(st.loss);
    result.grad_norms.push_back(st.grad_norm);
    StepReport report;
    report.step = state.step;
    report.index = i;
    report.steps = o.steps;
    report.loss = st.loss;
    report.tokens = b.tokens.numel();
    report.tokens_per_s = static_cast<double>(b.tokens.numel()) / dt;
    report.elapsed_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    report.lr = lr;
    report.grad_norm = st.grad_norm;
    report.mfu = peak_flops > 0 ? model_flops_per_token * report.tokens_per_s / peak_flops : -1.0;
    log.write(report);
    if (on_step) on_step(report);
    if (checkpoint_due(o, i)) save_checkpoint(o.checkpoint_dir, state, run_record());
  }
  const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  result.tokens_per_s = total > 0 ? static_cast<double>(tokens) / total : 0.0;
  result.last_step = state.step;
  if (o.steps == 0 && !o.checkpoint_dir.empty()) save_checkpoint(o.checkpoint_dir, state, run_record());
  if (planned && !o.trace.empty() && o.steps > 0) {
    write_file_atomically(o.trace, with_oom_version(trace_to_chrome_json(planned->last_trace())).dump() + "\n");
  }
  if (!o.save_weights.empty()) {
    if (plain) {  // the reference trainer keeps its own weights
      const auto params = plain->flat_params();
      for (int b = 0; b < state.blocks(); ++b) state.master(b).copy_(params[static_cast<std::size_t>(b)]);
    }
    save_final_weights(state, o.save_weights, o.model, o.weights, o.save_bf16);
  }
  return result;
}

}  // namespace oom::backend
