// The training loop behind `oom train`: model, data, trainer, checkpoints and resume.
//
// Builds a HostState for the model (seeded, from a Hugging Face checkpoint folder, or from a
// safetensors file of the backend), draws batches from a text file (bytes) or a token file
// (backend/data/data.h), and runs a plan through the graph runner (backend/train/plan_runtime.h): the `plan`
// file, else the default plan for this machine (default_run_plan: Base Local on the hardware
// run_hardware() names); with `reference`, the plain in-memory trainer. Each optimizer step
// runs `accumulate` micro-batches of `batch` sequences (gradients summed, the loss their mean) at
// the learning rate of the schedule (backend/optim/lr_schedule.h) for its global step. With a checkpoint directory the whole training state (masters, moments, step, data
// sampler state) is saved atomically at the end (and every `checkpoint_every` steps); `resume_dir`
// restores it so that the run continues bit-exactly — the same losses as an uninterrupted run.
// No LibTorch types in this header: the `oom` command includes it.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "backend/optim/lr_schedule.h"

namespace oom::backend {

struct TrainOptions {
  std::string model = "tiny-moe";  // name, or path to a config.json
  std::string data;                // text file or token file (by its magic); empty = the shipped corpus
  std::string weights;             // Hugging Face checkpoint folder (its config.json is the model), or a
                                   // safetensors file in the backend's names; empty = seeded
  std::string save_weights;        // write the final weights here as a Hugging Face checkpoint folder
  bool save_bf16 = false;          // ... with BF16 tensors (else FP32)
  int steps = 20;                  // steps to run in this invocation
  int seq = 64;
  int batch = 4;                   // sequences per micro-batch
  int accumulate = 1;              // micro-batches per optimizer step (gradient accumulation)
  double lr = 1e-3;                // peak learning rate
  std::string lr_schedule;         // "constant", "cosine", or "" = cosine when warmup/decay_steps is set
  std::int64_t warmup_steps = 0;   // linear warm-up from 0 (cosine schedule)
  std::int64_t decay_steps = 0;    // cosine reaches min_lr at this global step; 0 = the run's last step
  double min_lr = -1;              // cosine floor; < 0 = 0.1 × lr
  double weight_decay = 0.01;
  double max_grad_norm = 1.0;     // 0 = no clipping
  std::uint64_t seed = 0;
  bool reference = false;          // plain in-memory trainer instead of the graph runner
  bool bf16 = false;               // BF16 working weights (also the default on a GPU: see bf16_working_weights)
  bool fp32 = false;               // FP32 working weights even on a GPU
  std::string checkpoint_dir;      // empty = no checkpoints
  int checkpoint_every = 0;        // 0 = only at the end
  std::string resume_dir;          // empty = fresh start
  int threads = 0;                 // LibTorch intra-op threads; 0 = leave as is
  std::int64_t gdn_chunk_tokens = 32;
  std::string plan;                // Plan JSON to run; empty = the default plan (default_run_plan)
  std::string trace;               // Chrome trace of the last step, written atomically
  // On the CPU: the CPU stands in for a GPU with memory of its own (copies where a GPU
  // copies; backend/runtime/device_memory.h), so the device side's bytes are measured: the trace's GPU
  // timeline and TrainResult::device_peak_bytes. A CUDA device always measures its own.
  bool device_memory = false;
  // Compute device: "cpu", "cuda" (GPU 0; with ranks each rank's own GPU and NCCL), or "auto"
  // (cuda when LibTorch sees a GPU, else cpu). The host state stays in host memory either way.
  std::string device = "auto";
  double peak_tflops = 0;          // the device's peak for MFU; 0 = from configs/hardware by GPU name
  std::string log;                 // JSONL file: one line per step, appended and flushed each step
};

// Whether a run keeps BF16 working weights: with `bf16`; else on a CUDA device unless `fp32` or the
// reference trainer (FP32 only); never on the CPU by default. `device` is resolve_device()'s answer.
// Throws InputError when both `bf16` and `fp32` are set.
bool bf16_working_weights(const TrainOptions& options, const std::string& device);

// Model FLOPs of training per token: 3 × the forward FLOPs of one sequence of `seq` tokens
// (costmodel model_forward_flops: decoders + LM head, attention's quadratic part included) ÷ seq.
// The runner's recomputation is not counted (MFU, not hardware FLOPs utilization).
double training_flops_per_token(const std::string& model, std::int64_t seq);

// The device's peak FLOP/s for MFU: `peak_tflops` × 10^12 when > 0; else, for a GPU named
// `gpu_name` (LibTorch's device name), the BF16 dense peak of the configs/hardware file whose GPU has
// that name; 0 when unknown (the CPU without --peak-tflops).
double device_peak_flops(double peak_tflops, const std::string& gpu_name);

// The configs/hardware file a run on `device` (resolve_device()'s answer) stands for, whose plan it
// lowers: on a GPU the first file whose GPU has LibTorch's name of that device; "local-cpu" on the
// CPU or for a GPU no file names.
std::string run_hardware(const std::string& device);

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
  double lr = 0.0;           // the step's learning rate
  std::int64_t tokens = 0;   // tokens of this step (all micro-batches)
  double mfu = -1.0;         // model FLOPs utilization, 0..1; < 0 = unknown (no peak)
  double grad_norm = 0.0;    // before clipping (0 when clipping is off)
};

struct TrainResult {
  std::vector<double> losses;
  std::vector<double> grad_norms;  // per step: the global gradient norm before clipping (0 when clipping is off)
  double tokens_per_s = 0.0;  // over the whole run
  std::int64_t first_step = 1;
  std::int64_t last_step = 0;
  std::string trainer;        // "plan" (the graph runner) or "reference"
  double last_step_s = 0.0;   // wall time of the last step
  std::int64_t device_peak_bytes = -1;  // the most the device side held in any step (-1: not measured)
  // With device_peak_bytes on a CPU standing in for a GPU: each memory use's own peak (MemoryUse
  // order: other, activations, dispatch, vocabulary, boundaries, optimizer), the most in any step
  // and over ranks on any rank; empty when not measured.
  std::vector<std::int64_t> device_use_peak_bytes;
};

// Runs the training. Throws InputError for bad options, model, data, weights or checkpoints
// (before anything is written; a plan that does not fit the model or run is rejected before the
// state is built); calls `on_step` after every step.
TrainResult train(const TrainOptions& options, const std::function<void(const StepReport&)>& on_step = {});

}  // namespace oom::backend
