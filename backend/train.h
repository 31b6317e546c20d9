// The training loop behind `oom train`: model, data, trainer, checkpoints and resume.
//
// Builds a HostState for the model (seeded, or from safetensors weights), draws byte-level batches
// from a text file, and runs the streamed trainer (or, with `reference`, the plain in-memory
// trainer). With a checkpoint directory the whole training state (masters, moments, step, data
// sampler state) is saved atomically at the end (and every `checkpoint_every` steps); `resume_dir`
// restores it so that the run continues bit-exactly — the same losses as an uninterrupted run.
// No LibTorch types in this header: the `oom` command includes it.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace oom::backend {

struct TrainOptions {
  std::string model = "tiny-moe";  // name, or path to a config.json
  std::string data;                // text file; empty = the shipped corpus
  std::string weights;             // safetensors file; empty = seeded initialization
  int steps = 20;                  // steps to run in this invocation
  int seq = 64;
  int batch = 4;
  double lr = 1e-3;
  double weight_decay = 0.01;
  double max_grad_norm = 1.0;     // 0 = no clipping
  std::uint64_t seed = 0;
  bool reference = false;          // plain in-memory trainer instead of the streamed runtime
  bool bf16 = false;               // BF16 working weights (streamed trainer only)
  std::string checkpoint_dir;      // empty = no checkpoints
  int checkpoint_every = 0;        // 0 = only at the end
  std::string resume_dir;          // empty = fresh start
  int threads = 0;                 // LibTorch intra-op threads; 0 = leave as is
  std::int64_t gdn_chunk_tokens = 32;
  std::string plan;                // Plan JSON: run the plan-driven runtime (backend/plan_runtime.h)
  std::string trace;               // with a plan: Chrome trace of the last step, written atomically
  // Compute device: "cpu", "cuda" (GPU 0; with ranks each rank's own GPU and NCCL), or "auto"
  // (cuda when LibTorch sees a GPU, else cpu). The host state stays in host memory either way.
  std::string device = "auto";
};

// The device `options.device` names, checked: "cuda" without a visible GPU (or in a build without
// CUDA) is an InputError naming --device. `local_rank` picks the GPU of a rank on its node.
std::string resolve_device(const std::string& device, int local_rank = 0);

struct StepReport {
  std::int64_t step = 0;  // 1-based global step
  int index = 0;          // 0-based within this run
  int steps = 0;          // steps in this run
  double loss = 0.0;
  double tokens_per_s = 0.0;
  double elapsed_s = 0.0;
};

struct TrainResult {
  std::vector<double> losses;
  double tokens_per_s = 0.0;  // over the whole run
  std::int64_t first_step = 1;
  std::int64_t last_step = 0;
  std::string trainer;        // "streamed", "plan" or "reference"
  double last_step_s = 0.0;   // wall time of the last step
};

// Runs the training. Throws InputError for bad options, model, data, weights or checkpoints
// (before anything is written; a plan that does not fit the model or run is rejected before the
// state is built); calls `on_step` after every step.
TrainResult train(const TrainOptions& options, const std::function<void(const StepReport&)>& on_step = {});

}  // namespace oom::backend
