// `oom eval`: the mean next-token loss of a Hugging Face checkpoint over a token file
// (backend/train/eval.h); part of the backend plugin (cli/backend_main.cc).
#include <memory>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "backend/train/eval.h"
#include "cli/cli.h"

namespace oom::cli {

void add_eval_command(CLI::App& app, Io io) {
  auto opts = std::make_shared<backend::EvalOptions>();
  auto json = std::make_shared<bool>(false);
  auto* cmd = app.add_subcommand("eval", "Mean next-token loss of a checkpoint over a token file (consecutive sequences)");
  cmd->add_option("--weights", opts->weights, "Hugging Face checkpoint folder (config.json, *.safetensors)")->required();
  cmd->add_option("--data", opts->data, "Token file (llm.c layout; scripts/tokenize.py makes one)")->required();
  cmd->add_option("--seq", opts->seq, "Tokens per sequence (each scores seq - 1 predictions)")->capture_default_str();
  cmd->add_option("--batch", opts->batch, "Sequences per forward pass")->capture_default_str();
  cmd->add_option("--max-sequences", opts->max_sequences, "Score at most this many sequences (0 = all)")->capture_default_str();
  cmd->add_option("--device", opts->device, "Compute device: auto, cpu or cuda")
      ->capture_default_str()->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  cmd->add_option("--threads", opts->threads, "LibTorch threads (0 = default)")->capture_default_str();
  cmd->add_flag("--json", *json, "One JSON object: loss, per_sequence, seq, tokens_scored");
  cmd->callback([opts, json, io] {
    const auto r = backend::evaluate(*opts);
    if (*json) {
      nlohmann::json j;
      j["model"] = r.model;
      j["loss"] = r.loss;
      j["per_sequence"] = r.per_sequence;
      j["seq"] = r.seq;
      j["sequences"] = r.per_sequence.size();
      j["tokens_scored"] = r.tokens_scored;
      io.out << j.dump() << "\n";
    } else {
      io.out << fmt::format("{}: {} sequences of {} tokens ({} predictions), mean next-token loss {:.6f} (perplexity {:.3f})\n",
                            r.model, r.per_sequence.size(), r.seq, r.tokens_scored, r.loss, std::exp(r.loss));
    }
  });
}

}  // namespace oom::cli
