#include "backend/train.h"

#include <ATen/Context.h>

#include <chrono>
#include <optional>

#include <ATen/Parallel.h>
#include <nlohmann/json.hpp>

#include "backend/checkpoint.h"
#include "backend/data.h"
#include "backend/plain_trainer.h"
#include "backend/plan_runtime.h"
#include "backend/runtime.h"
#include "backend/state.h"
#include "backend/threads.h"
#include "costmodel/atomic_file.h"
#include "costmodel/input_error.h"
#include "planner/plan.h"
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
  if (o.reference && !o.plan.empty()) throw InputError("", "--plan", o.plan, "the reference trainer runs no plan");
  if (!o.trace.empty() && o.plan.empty()) throw InputError("", "--trace", o.trace, "a trace needs --plan");
}

}  // namespace

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

TrainResult train(const TrainOptions& o, const std::function<void(const StepReport&)>& on_step) {
  check_options(o);
  set_compute_threads(o.threads);
  const ModelSpec spec = load_model_spec(o.model);
  std::optional<Plan> plan;
  if (!o.plan.empty()) {
    plan = load_plan(o.plan);
    check_plan_for_run(*plan, spec, o.batch, o.seq, 1, o.plan);
  }
  ByteCorpus data(o.data.empty() ? default_corpus_path() : o.data, o.seq);
  if (spec.vocab < 256) throw InputError("", "vocab_size", std::to_string(spec.vocab), "byte-level training needs ≥ 256");
  data.seed(o.seed);

  StateOptions so;
  so.precision = o.bf16 ? WorkingPrecision::kBFloat16 : WorkingPrecision::kFloat32;
  HostState state(spec, so);
  if (o.weights.empty()) {
    state.init_from_seed(o.seed);
  } else {
    state.load_safetensors(o.weights);
  }
  if (!o.resume_dir.empty()) resume_training(o, state, data);

  TrainerConfig cfg;
  cfg.adam.lr = o.lr;
  cfg.adam.weight_decay = o.weight_decay;
  cfg.max_grad_norm = o.max_grad_norm;
  cfg.model.gdn_chunk_tokens = o.gdn_chunk_tokens;
  std::optional<StreamedTrainer> streamed;
  std::optional<PlainTrainer> plain;
  std::optional<PlanTrainer> planned;
  const at::Device device(resolve_device(o.device));
  if (o.reference) {
    plain.emplace(state, cfg);
  } else if (plan) {
    planned.emplace(state, cfg, *plan, device);
  } else {
    streamed.emplace(state, cfg, device);
  }

  TrainResult result;
  result.trainer = o.reference ? "reference" : plan ? "plan" : "streamed";
  result.first_step = state.step + 1;
  const auto t0 = std::chrono::steady_clock::now();
  std::int64_t tokens = 0;
  for (int i = 0; i < o.steps; ++i) {
    const auto ts = std::chrono::steady_clock::now();
    const Batch b = data.next(o.batch);
    if (planned && !o.trace.empty() && i + 1 == o.steps) planned->set_tracing(true);
    const StepStats st = o.reference ? plain->step(b.tokens, b.targets)
                         : planned   ? planned->step(b.tokens, b.targets)
                                     : streamed->step(b.tokens, b.targets);
    if (o.reference) ++state.step;  // the plain trainer keeps its own state; count its steps here
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - ts).count();
    tokens += b.tokens.numel();
    result.last_step_s = dt;
    result.losses.push_back(st.loss);
    if (on_step) {
      on_step({state.step, i, o.steps, st.loss, static_cast<double>(b.tokens.numel()) / dt,
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()});
    }
    if (checkpoint_due(o, i)) {
      save_checkpoint(o.checkpoint_dir, state, checkpoint_run(o, data));
    }
  }
  const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  result.tokens_per_s = total > 0 ? static_cast<double>(tokens) / total : 0.0;
  result.last_step = state.step;
  if (o.steps == 0 && !o.checkpoint_dir.empty()) save_checkpoint(o.checkpoint_dir, state, checkpoint_run(o, data));
  if (planned && !o.trace.empty() && o.steps > 0) {
    write_file_atomically(o.trace, trace_to_chrome_json(planned->last_trace()).dump() + "\n");
  }
  return result;
}

}  // namespace oom::backend
