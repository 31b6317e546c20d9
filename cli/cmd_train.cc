// `oom train`: trains a model on byte-level text with the LibTorch backend (backend/train.h); part
// of the backend plugin (cli/backend_main.cc).
#include <memory>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "backend/train.h"
#include "cli/cli.h"

namespace oom::cli {
namespace {

std::string progress_bar(int done, int total) {
  constexpr int kWidth = 20;
  const int filled = total > 0 ? done * kWidth / total : kWidth;
  return "[" + std::string(static_cast<std::size_t>(filled), '#') + std::string(static_cast<std::size_t>(kWidth - filled), '.') + "]";
}

}  // namespace

void add_train_commands(CLI::App& app, Io io) {
  auto opts = std::make_shared<backend::TrainOptions>();
  auto json = std::make_shared<bool>(false);
  auto* cmd = app.add_subcommand("train", "Train a model on byte-level text (streamed trainer, or --reference)");
  cmd->add_option("--model", opts->model, "Model name (configs/models) or path to a config.json")->capture_default_str();
  cmd->add_option("--data", opts->data, "Text file to train on (default: the shipped corpus)");
  cmd->add_option("--weights", opts->weights, "Initial weights from a safetensors file (default: seeded)");
  cmd->add_option("--steps", opts->steps, "Steps to run")->capture_default_str();
  cmd->add_option("--seq", opts->seq, "Sequence length in bytes")->capture_default_str();
  cmd->add_option("--batch", opts->batch, "Sequences per step")->capture_default_str();
  cmd->add_option("--lr", opts->lr, "AdamW learning rate")->capture_default_str();
  cmd->add_option("--weight-decay", opts->weight_decay, "AdamW decoupled weight decay")->capture_default_str();
  cmd->add_option("--clip", opts->max_grad_norm, "Gradient clipping max norm (0 = off)")->capture_default_str();
  cmd->add_option("--seed", opts->seed, "Seed of the weights and of the data sampler")->capture_default_str();
  cmd->add_option("--threads", opts->threads, "LibTorch threads (0 = default)")->capture_default_str();
  cmd->add_option("--gdn-chunk", opts->gdn_chunk_tokens, "Gated DeltaNet sequence chunk in tokens")->capture_default_str();
  cmd->add_option("--plan", opts->plan, "Execute this Plan JSON: local path on one rank (splits, kept O/LSE, boundaries), or EP path with --ranks P (resident and retained decoders, routing chunk, delivery)");
  cmd->add_option("--trace", opts->trace, "With --plan: write the last step's Chrome/Perfetto trace (StepGraph stage names)");
  cmd->add_option("--device", opts->device, "Compute device: auto (a GPU when LibTorch sees one), cpu or cuda; with ranks, cuda means NCCL and one GPU per rank")
      ->capture_default_str()->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  cmd->add_flag("--reference", opts->reference, "Plain in-memory trainer (autograd + torch::optim::AdamW)");
  cmd->add_flag("--bf16", opts->bf16, "BF16 working weights (FP32 masters and moments)");
  cmd->add_option("--checkpoint", opts->checkpoint_dir, "Write the training state to DIR at the end");
  cmd->add_option("--checkpoint-every", opts->checkpoint_every, "Also checkpoint every N steps");
  cmd->add_option("--resume", opts->resume_dir, "Resume from the checkpoint in DIR");
  cmd->add_flag("--json", *json, "End with one JSON object: losses, tokens_per_s (step lines go to stderr)");
  const auto ranks = add_train_ranks_options(cmd);
  cmd->callback([opts, json, io, ranks] {
    if (run_train_ranks(*opts, *ranks, *json, io)) return;
    std::ostream& lines = *json ? io.err : io.out;
    const auto result = backend::train(*opts, [&](const backend::StepReport& r) {
      lines << fmt::format("step {:>5}  loss {:.4f}  tokens/s {:>9.0f}  {} {:>3}%  {:.1f} s\n", r.step, r.loss,
                           r.tokens_per_s, progress_bar(r.index + 1, r.steps), (r.index + 1) * 100 / std::max(1, r.steps),
                           r.elapsed_s);
      lines.flush();
    });
    if (*json) {
      nlohmann::json j;
      j["losses"] = result.losses;
      j["tokens_per_s"] = result.tokens_per_s;
      j["first_step"] = result.first_step;
      j["last_step"] = result.last_step;
      j["trainer"] = result.trainer;
      j["last_step_s"] = result.last_step_s;
      io.out << j.dump() << "\n";
    } else {
      io.out << fmt::format("{} trainer: {} steps, {:.0f} tokens/s over all steps (the first, warm-up step included)\n",
                            result.trainer, result.losses.size(),
                            result.tokens_per_s);
    }
  });
}

}  // namespace oom::cli
