// Language-model batches from a text file (bytes) or a token file (backend/io/token_file.h).
//
// TrainingData is what the training loop draws batches from and saves in checkpoints; two kinds:
//
//   ByteCorpus   tokens are the file's bytes (vocabulary 256). Each batch holds B windows of S + 1
//                bytes at offsets drawn uniformly from the file by a seeded 64-bit Mersenne
//                Twister; tokens are the first S bytes, targets the next-byte shift.
//   TokenCorpus  tokens come from a pre-tokenized file (llm.c layout, e.g. from
//                scripts/tokenize.py), packed across document boundaries (documents are separated
//                by the EOS id inside the stream). The stream of N tokens is cut into W = ⌊(N − 1) / S⌋
//                non-overlapping windows: window w holds tokens [w·S, w·S + S] (S + 1 tokens; the last
//                token of a window is the first of the next, as in llm.c's loader), inputs its
//                first S tokens, targets the last S. Each epoch visits every window once, in the order
//                of a Fisher–Yates permutation drawn from a 64-bit Mersenne Twister seeded with
//                (seed, epoch); a batch takes the next B windows, running on into the next epoch.
//                The sampler state is (seed, epoch, position in the epoch): a resumed run rebuilds
//                the epoch's permutation and draws exactly the batches an uninterrupted run draws.
//
// The sampler's whole state goes into training checkpoints (save_state / restore_state), so a
// resumed run draws the same batches. Not thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "backend/io/token_file.h"

namespace oom::backend {

struct Batch {
  at::Tensor tokens;   // int64 [B, S]
  at::Tensor targets;  // int64 [B, S]
};

class TrainingData {
 public:
  virtual ~TrainingData() = default;
  // Restarts the sampler from `seed` (no batches drawn).
  virtual void seed(std::uint64_t seed) = 0;
  virtual Batch next(std::int64_t batch) = 0;
  virtual std::int64_t batches_drawn() const = 0;
  // "bytes" or "tokens".
  virtual std::string kind() const = 0;
  // Throws InputError naming the data file when a token id is ≥ `vocab` (the model's vocab_size).
  virtual void check_vocab(std::int64_t vocab) const = 0;
  // The checkpoint's record of the data (its size) and the sampler's position, merged into the
  // checkpoint's run object; restore_state() reads them back and throws InputError naming `origin`
  // and the field (run.FIELD) when the saved data differs from this data or the state is bad.
  virtual nlohmann::json save_state() const = 0;
  virtual void restore_state(const nlohmann::json& run, const std::string& origin) = 0;
};

class ByteCorpus : public TrainingData {
 public:
  // Reads `path`. Throws InputError when it is missing or shorter than seq + 1 bytes.
  ByteCorpus(const std::string& path, std::int64_t seq);
  ByteCorpus(std::string text, std::int64_t seq, const std::string& origin);

  void seed(std::uint64_t seed) override;
  Batch next(std::int64_t batch) override;

  std::int64_t batches_drawn() const override { return batches_drawn_; }
  std::string kind() const override { return "bytes"; }
  void check_vocab(std::int64_t vocab) const override;
  std::int64_t bytes() const { return static_cast<std::int64_t>(text_.size()); }
  // The sampler state as text, and back (InputError naming `origin` on bad text).
  std::string sampler_state() const;
  void restore_sampler_state(const std::string& state, std::int64_t batches_drawn, const std::string& origin);
  // {"data_bytes", "batches_drawn", "rng"}.
  nlohmann::json save_state() const override;
  void restore_state(const nlohmann::json& run, const std::string& origin) override;

 private:
  std::string text_;
  std::string origin_;
  std::int64_t seq_;
  std::mt19937_64 rng_;
  std::int64_t batches_drawn_ = 0;
};

class TokenCorpus : public TrainingData {
 public:
  // Throws InputError (from TokenFile) for a bad file, and naming `token count` when it holds fewer
  // than seq + 1 tokens.
  TokenCorpus(io::TokenFile file, std::int64_t seq);

  void seed(std::uint64_t seed) override;
  Batch next(std::int64_t batch) override;
  std::int64_t batches_drawn() const override { return batches_drawn_; }
  std::string kind() const override { return "tokens"; }
  // InputError naming the file, the position of the largest id (tokens[i]) and its value.
  void check_vocab(std::int64_t vocab) const override;
  std::int64_t windows() const { return windows_; }
  std::int64_t epoch() const { return epoch_; }
  // {"data_tokens", "batches_drawn", "sampler": {"seed", "epoch", "position"}}.
  nlohmann::json save_state() const override;
  void restore_state(const nlohmann::json& run, const std::string& origin) override;

 private:
  void start_epoch(std::int64_t epoch);

  io::TokenFile file_;
  std::int64_t seq_;
  std::int64_t windows_;
  std::uint64_t seed_ = 0;
  std::int64_t epoch_ = 0;
  std::int64_t position_ = 0;  // windows drawn in this epoch
  std::vector<std::int64_t> order_;
  std::int64_t batches_drawn_ = 0;
};

// The data `path` names: a token file when it starts with the token-file magic, else text read as
// bytes. Throws InputError for a missing or bad file.
std::unique_ptr<TrainingData> open_training_data(const std::string& path, std::int64_t seq);

// The corpus shipped with the sources (backend/data/corpus.txt), found through OOM_CONFIG_DIR's
// sibling or the source tree recorded at build time.
std::string default_corpus_path();

}  // namespace oom::backend
