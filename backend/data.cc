#include "backend/data.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "costmodel/config_paths.h"
#include "costmodel/input_error.h"

namespace oom::backend {

ByteCorpus::ByteCorpus(const std::string& path, std::int64_t seq) : seq_(seq) {
  std::ifstream in(path, std::ios::binary);
  if (!in || std::filesystem::is_directory(path)) throw InputError(path, "cannot read the training data file");
  std::ostringstream buf;
  buf << in.rdbuf();
  text_ = buf.str();
  if (static_cast<std::int64_t>(text_.size()) < seq + 1) {
    throw InputError(path, "data", std::to_string(text_.size()) + " bytes",
                     "shorter than one sequence of " + std::to_string(seq + 1) + " bytes");
  }
}

ByteCorpus::ByteCorpus(std::string text, std::int64_t seq, const std::string& origin)
    : text_(std::move(text)), seq_(seq) {
  if (static_cast<std::int64_t>(text_.size()) < seq + 1) {
    throw InputError(origin, "data", std::to_string(text_.size()) + " bytes",
                     "shorter than one sequence of " + std::to_string(seq + 1) + " bytes");
  }
}

void ByteCorpus::seed(std::uint64_t s) {
  rng_.seed(s);
  batches_drawn_ = 0;
}

Batch ByteCorpus::next(std::int64_t batch) {
  auto window = at::empty({batch, seq_ + 1}, at::kLong);
  auto* w = window.data_ptr<std::int64_t>();
  const auto last_start = static_cast<std::uint64_t>(text_.size()) - static_cast<std::uint64_t>(seq_) - 1;
  for (std::int64_t b = 0; b < batch; ++b) {
    const auto start = static_cast<std::size_t>(rng_() % (last_start + 1));
    for (std::int64_t i = 0; i <= seq_; ++i) {
      w[b * (seq_ + 1) + i] = static_cast<unsigned char>(text_[start + static_cast<std::size_t>(i)]);
    }
  }
  ++batches_drawn_;
  return {window.narrow(1, 0, seq_).contiguous(), window.narrow(1, 1, seq_).contiguous()};
}

std::string ByteCorpus::sampler_state() const {
  std::ostringstream out;
  out << rng_;
  return out.str();
}

void ByteCorpus::restore_sampler_state(const std::string& state, std::int64_t batches_drawn, const std::string& origin) {
  std::istringstream in(state);
  std::mt19937_64 rng;
  in >> rng;
  if (in.fail()) throw InputError(origin, "data.rng", "\"" + state.substr(0, 20) + "...\"", "not a generator state");
  rng_ = rng;
  batches_drawn_ = batches_drawn;
}

std::string default_corpus_path() {
  namespace fs = std::filesystem;
  const fs::path beside_configs = fs::path(config_root()).parent_path() / "backend" / "data" / "corpus.txt";
  if (fs::exists(beside_configs)) return beside_configs.string();
  return (fs::path(OOM_SOURCE_DIR_BACKEND) / "data" / "corpus.txt").string();
}

}  // namespace oom::backend
