// `oom train`: trains a model on text (bytes) or a token file with the LibTorch backend (backend/train/train.h); part
// of the backend plugin (cli/backend_main.cc).
#include <filesystem>
#include <memory>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "backend/train/train.h"
#include "cli/cli.h"
#include "costmodel/input_error.h"
#include "costmodel/units.h"
#include "planner/lowering/step_graph.h"

namespace oom::cli {
namespace {

std::string progress_bar(int done, int total) {
  constexpr int kWidth = 20;
  const int filled = total > 0 ? done * kWidth / total : kWidth;
  return "[" + std::string(static_cast<std::size_t>(filled), '#') + std::string(static_cast<std::size_t>(kWidth - filled), '.') + "]";
}

std::string format_step_line(const backend::StepReport& r) {
  const std::string mfu = r.mfu >= 0 ? fmt::format("{:.1f}%", 100.0 * r.mfu) : std::string("-");
  return fmt::format("step {:>5}  loss {:.4f}  lr {:.3e}  tokens/s {:>9.0f}  MFU {:>6}  {} {:>3}%  {:.1f} s\n", r.step,
                     r.loss, r.lr, r.tokens_per_s, mfu, progress_bar(r.index + 1, r.steps),
                     (r.index + 1) * 100 / std::max(1, r.steps), r.elapsed_s);
}

}  // namespace

nlohmann::json device_use_peaks_json(const std::vector<std::int64_t>& peaks) {
  nlohmann::json j = nlohmann::json::object();
  for (std::size_t u = 0; u < peaks.size(); ++u) j[std::string(memory_use_name(static_cast<MemoryUse>(u)))] = to_gib(peaks[u]);
  return j;
}

std::string device_use_peaks_line(const std::vector<std::int64_t>& peaks) {
  std::string line = "device peak by use (each its own):";
  for (std::size_t u = 0; u < peaks.size(); ++u) {
    line += fmt::format(" {} {:.3f} MiB{}", memory_use_name(static_cast<MemoryUse>(u)),
                        static_cast<double>(peaks[u]) / static_cast<double>(kMiB), u + 1 < peaks.size() ? "," : "");
  }
  return line;
}

void add_train_commands(CLI::App& app, Io io) {
  auto opts = std::make_shared<backend::TrainOptions>();
  auto json = std::make_shared<bool>(false);
  auto* cmd = app.add_subcommand("train", "Train a model on text (bytes) or a token file (a plan through the graph runner, or --reference)");
  cmd->add_option("--model", opts->model, "Model name (configs/models) or path to a config.json")->capture_default_str();
  cmd->add_option("--data", opts->data, "Text file (trained on its bytes) or token file (llm.c layout, scripts/tokenize.py; recognized by its magic) to train on (default: the shipped corpus)");
  cmd->add_option("--weights", opts->weights,
                  "Initial weights: a Hugging Face checkpoint folder (config.json + *.safetensors; its config is the "
                  "model) or a safetensors file in the backend's names (default: seeded)");
  cmd->add_option("--save-weights", opts->save_weights,
                  "Write the final weights: a Hugging Face checkpoint folder that transformers loads, or a .safetensors "
                  "file in the backend's names");
  cmd->add_flag("--save-bf16", opts->save_bf16, "With --save-weights: BF16 tensors (default FP32)");
  cmd->add_option("--steps", opts->steps, "Steps to run")->capture_default_str();
  cmd->add_option("--seq", opts->seq, "Sequence length in tokens (bytes for a text file)")->capture_default_str();
  cmd->add_option("--batch", opts->batch, "Sequences per micro-batch")->capture_default_str();
  cmd->add_option("--accumulate", opts->accumulate, "Micro-batches per optimizer step (gradients summed, one update, run as the plan's sub-batches; not with --ranks)")->capture_default_str();
  cmd->add_option("--lr", opts->lr, "AdamW (peak) learning rate")->capture_default_str();
  cmd->add_option("--lr-schedule", opts->lr_schedule, "constant or cosine (default: cosine when --warmup or --decay-steps is given, else constant)")
      ->check(CLI::IsMember({"constant", "cosine"}));
  cmd->add_option("--warmup", opts->warmup_steps, "Cosine schedule: steps of linear warm-up from 0");
  cmd->add_option("--decay-steps", opts->decay_steps, "Cosine schedule: the global step at which the lr reaches --min-lr (default: the run's last step; a resumed run keeps its checkpoint's)");
  cmd->add_option("--min-lr", opts->min_lr, "Cosine schedule: the floor (default 0.1 x --lr)");
  cmd->add_option("--weight-decay", opts->weight_decay, "AdamW decoupled weight decay")->capture_default_str();
  cmd->add_option("--clip", opts->max_grad_norm, "Gradient clipping max norm (0 = off)")->capture_default_str();
  cmd->add_option("--seed", opts->seed, "Seed of the weights and of the data sampler")->capture_default_str();
  cmd->add_option("--threads", opts->threads, "LibTorch threads (0 = default)")->capture_default_str();
  cmd->add_option("--gdn-chunk", opts->gdn_chunk_tokens, "Gated DeltaNet sequence chunk in tokens")->capture_default_str();
  cmd->add_option("--plan", opts->plan, "Execute this Plan JSON: local path on one rank (splits, kept O/LSE, boundaries), or EP path with --ranks P or torchrun (resident and retained decoders, routing chunk, delivery, FLAT schedules); default: the Base plan of the path (oom plan --preset base) for this machine");
  cmd->add_option("--trace", opts->trace, "Write the last step's Chrome/Perfetto trace (StepGraph stage names)");
  cmd->add_option("--device", opts->device, "Compute device: auto (a GPU when LibTorch sees one), cpu or cuda; with ranks, cuda means NCCL and one GPU per rank")
      ->capture_default_str()->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  cmd->add_flag("--device-memory", opts->device_memory, "On the CPU: stand the CPU in for a GPU with memory of its own and measure the device side's bytes (the trace's GPU timeline, the device peak reported; with --ranks P every rank's); a GPU always measures its own");
  cmd->add_flag("--reference", opts->reference, "Plain in-memory trainer (autograd + torch::optim::AdamW)");
  cmd->add_flag("--bf16", opts->bf16, "BF16 working weights (FP32 masters and moments); the default on a GPU");
  cmd->add_flag("--fp32", opts->fp32, "FP32 working weights even on a GPU (the default on the CPU)");
  cmd->add_option("--peak-tflops", opts->peak_tflops, "The device's peak TFLOP/s for MFU (default: a GPU's BF16 dense peak from configs/hardware by name; none on the CPU)");
  cmd->add_option("--log", opts->log, "Append one JSON line per step to FILE (step, loss, lr, tokens, tokens_per_s, mfu, grad_norm, elapsed_s)");
  cmd->add_option("--checkpoint", opts->checkpoint_dir, "Write the training state to DIR at the end");
  cmd->add_option("--checkpoint-every", opts->checkpoint_every, "Also checkpoint every N steps");
  cmd->add_option("--resume", opts->resume_dir, "Resume from the checkpoint in DIR");
  cmd->add_flag("--json", *json, "End with one JSON object: losses, tokens_per_s (step lines go to stderr)");
  const auto ranks = add_train_ranks_options(cmd);
  cmd->callback([opts, json, io, ranks, cmd] {
    std::error_code ec;
    if (cmd->count("--model") > 0 && !opts->weights.empty() && std::filesystem::is_directory(opts->weights, ec)) {
      throw InputError("", "--model", opts->model, "the checkpoint folder given as --weights names the model (its config.json)");
    }
    if (run_train_ranks(*opts, *ranks, *json, io)) return;
    std::ostream& lines = *json ? io.err : io.out;
    const auto result = backend::train(*opts, [&](const backend::StepReport& r) {
      lines << format_step_line(r);
      lines.flush();
    });
    if (*json) {
      nlohmann::json j;
      j["losses"] = result.losses;
      j["grad_norms"] = result.grad_norms;
      j["tokens_per_s"] = result.tokens_per_s;
      j["first_step"] = result.first_step;
      j["last_step"] = result.last_step;
      j["trainer"] = result.trainer;
      j["last_step_s"] = result.last_step_s;
      if (result.device_peak_bytes >= 0) j["device_peak_gib"] = to_gib(result.device_peak_bytes);
      if (!result.device_use_peak_bytes.empty()) j["device_use_peaks_gib"] = device_use_peaks_json(result.device_use_peak_bytes);
      io.out << j.dump() << "\n";
    } else {
      io.out << fmt::format("{} trainer: {} steps, {:.0f} tokens/s over all steps (the first, warm-up step included)\n",
                            result.trainer, result.losses.size(),
                            result.tokens_per_s);
      if (result.device_peak_bytes >= 0) {
        io.out << fmt::format("device peak: {:.3f} MiB (the most the device side held in a step)\n",
                              static_cast<double>(result.device_peak_bytes) / static_cast<double>(kMiB));
      }
      if (!result.device_use_peak_bytes.empty()) io.out << device_use_peaks_line(result.device_use_peak_bytes) << "\n";
    }
  });
}

}  // namespace oom::cli
