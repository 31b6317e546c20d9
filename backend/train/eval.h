// `oom eval`: the mean next-token loss of a model over a token file, for checking a checkpoint
// against another implementation (transformers) or tracking a run.
//
// The file's tokens are cut into consecutive, non-overlapping sequences of `seq` tokens (the tail
// shorter than `seq` is left out; no sampling, no shuffling). Each sequence's loss is the mean
// cross-entropy of its seq − 1 next-token predictions, as transformers' causal-LM loss with
// labels = input_ids; the reported loss is the mean over sequences. Decoder weights are streamed
// to the device one layer at a time (the host state stays in host memory); the vocabulary
// projection runs in token chunks. No LibTorch types in this header: the `oom` command includes it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace oom::backend {

struct EvalOptions {
  std::string weights;        // Hugging Face checkpoint folder
  std::string data;           // token file (llm.c layout)
  std::int64_t seq = 1024;    // tokens per sequence (≥ 2)
  std::int64_t batch = 4;     // sequences per forward pass
  std::int64_t max_sequences = 0;  // 0 = every whole sequence of the file
  std::string device = "auto";
  int threads = 0;
};

struct EvalResult {
  double loss = 0.0;                  // mean over sequences
  std::vector<double> per_sequence;   // in file order
  std::int64_t seq = 0;
  std::int64_t tokens_scored = 0;     // sequences × (seq − 1)
  std::string model;                  // the checkpoint's model name
};

// Throws InputError for a bad checkpoint or token file, a sequence length the file cannot fill
// (naming --seq), or a token id outside the model's vocabulary (naming the file, position, value).
EvalResult evaluate(const EvalOptions& options);

}  // namespace oom::backend
