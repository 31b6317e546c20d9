// Byte-level language-model batches from a text file.
//
// Tokens are the file's bytes (vocabulary 256). Each batch holds B windows of S + 1 bytes at
// offsets drawn uniformly from the file by a seeded 64-bit Mersenne Twister; tokens are the first
// S bytes, targets the next-byte shift. The sampler's whole state (the generator and the number
// of batches drawn) is saved in checkpoints, so a resumed run draws the same batches. Not
// thread-safe.
#pragma once

#include <cstdint>
#include <random>
#include <string>

#include <ATen/ATen.h>

namespace oom::backend {

struct Batch {
  at::Tensor tokens;   // int64 [B, S]
  at::Tensor targets;  // int64 [B, S]
};

class ByteCorpus {
 public:
  // Reads `path`. Throws InputError when it is missing or shorter than seq + 1 bytes.
  ByteCorpus(const std::string& path, std::int64_t seq);
  ByteCorpus(std::string text, std::int64_t seq, const std::string& origin);

  void seed(std::uint64_t seed);
  Batch next(std::int64_t batch);

  std::int64_t batches_drawn() const { return batches_drawn_; }
  std::int64_t bytes() const { return static_cast<std::int64_t>(text_.size()); }
  // The sampler state as text, and back (InputError naming `origin` on bad text).
  std::string sampler_state() const;
  void restore_sampler_state(const std::string& state, std::int64_t batches_drawn, const std::string& origin);

 private:
  std::string text_;
  std::int64_t seq_;
  std::mt19937_64 rng_;
  std::int64_t batches_drawn_ = 0;
};

// The corpus shipped with the sources (backend/data/corpus.txt), found through OOM_CONFIG_DIR's
// sibling or the source tree recorded at build time.
std::string default_corpus_path();

}  // namespace oom::backend
