#include "backend/data/data.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "costmodel/config_paths.h"
#include "costmodel/input_error.h"

namespace oom::backend {

ByteCorpus::ByteCorpus(const std::string& path, std::int64_t seq) : origin_(path), seq_(seq) {
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
    : text_(std::move(text)), origin_(origin), seq_(seq) {
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

void ByteCorpus::check_vocab(std::int64_t vocab) const {
  if (vocab < 256) throw InputError(origin_, "vocab_size", std::to_string(vocab), "byte-level training needs ≥ 256");
}

nlohmann::json ByteCorpus::save_state() const {
  return {{"data_bytes", bytes()}, {"batches_drawn", batches_drawn_}, {"rng", sampler_state()}};
}

namespace {

// The saved run's field `key` must equal `now`: the data the checkpoint was trained on.
void same_data(const nlohmann::json& run, const char* key, const nlohmann::json& now, const std::string& origin) {
  if (!run.contains(key) || run[key] != now) {
    throw InputError(origin, std::string("run.") + key, run.contains(key) ? run[key].dump() : "missing",
                     "differs from this run's " + now.dump());
  }
}

std::int64_t saved_integer(const nlohmann::json& j, const char* key, const std::string& field, const std::string& origin) {
  if (!j.contains(key) || !j[key].is_number_integer() || j[key].get<std::int64_t>() < 0) {
    throw InputError(origin, field, j.contains(key) ? j[key].dump() : "missing", "no data sampler state");
  }
  return j[key].get<std::int64_t>();
}

}  // namespace

void ByteCorpus::restore_state(const nlohmann::json& run, const std::string& origin) {
  same_data(run, "data_bytes", bytes(), origin);
  if (!run.contains("rng") || !run["rng"].is_string()) {
    throw InputError(origin, "run.rng", "missing", "no data sampler state");
  }
  restore_sampler_state(run["rng"].get<std::string>(), saved_integer(run, "batches_drawn", "run.batches_drawn", origin), origin);
}

TokenCorpus::TokenCorpus(io::TokenFile file, std::int64_t seq)
    : file_(std::move(file)), seq_(seq), windows_(seq > 0 && file_.size() > 0 ? (file_.size() - 1) / seq : 0) {
  if (windows_ < 1) {
    throw InputError(file_.origin(), "token count", std::to_string(file_.size()),
                     "shorter than one sequence of " + std::to_string(seq + 1) + " tokens");
  }
  start_epoch(0);
}

void TokenCorpus::start_epoch(std::int64_t epoch) {
  // Fisher–Yates with the generator's raw output (not std::shuffle, whose draws are the standard
  // library's choice): the order is the same with every library, so checkpoints move between builds.
  std::mt19937_64 rng;
  std::seed_seq seq{static_cast<std::uint32_t>(seed_), static_cast<std::uint32_t>(seed_ >> 32),
                    static_cast<std::uint32_t>(epoch), static_cast<std::uint32_t>(static_cast<std::uint64_t>(epoch) >> 32)};
  rng.seed(seq);
  order_.resize(static_cast<std::size_t>(windows_));
  for (std::int64_t i = 0; i < windows_; ++i) order_[static_cast<std::size_t>(i)] = i;
  for (std::int64_t i = windows_ - 1; i > 0; --i) {
    const auto j = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(i + 1));
    std::swap(order_[static_cast<std::size_t>(i)], order_[static_cast<std::size_t>(j)]);
  }
  epoch_ = epoch;
  position_ = 0;
}

void TokenCorpus::seed(std::uint64_t s) {
  seed_ = s;
  batches_drawn_ = 0;
  start_epoch(0);
}

Batch TokenCorpus::next(std::int64_t batch) {
  auto window = at::empty({batch, seq_ + 1}, at::kLong);
  auto* w = window.data_ptr<std::int64_t>();
  for (std::int64_t b = 0; b < batch; ++b) {
    if (position_ == windows_) start_epoch(epoch_ + 1);
    const std::int64_t start = order_[static_cast<std::size_t>(position_++)] * seq_;
    file_.copy(start, seq_ + 1, w + b * (seq_ + 1));
  }
  ++batches_drawn_;
  return {window.narrow(1, 0, seq_).contiguous(), window.narrow(1, 1, seq_).contiguous()};
}

void TokenCorpus::check_vocab(std::int64_t vocab) const {
  const std::int64_t top = file_.max_token();
  if (top >= vocab) {
    throw InputError(file_.origin(), "tokens[" + std::to_string(file_.max_token_position()) + "]", std::to_string(top),
                     "token id ≥ the model's vocab_size " + std::to_string(vocab));
  }
}

nlohmann::json TokenCorpus::save_state() const {
  return {{"data_tokens", file_.size()},
          {"batches_drawn", batches_drawn_},
          {"sampler", {{"seed", seed_}, {"epoch", epoch_}, {"position", position_}}}};
}

void TokenCorpus::restore_state(const nlohmann::json& run, const std::string& origin) {
  same_data(run, "data_tokens", file_.size(), origin);
  const std::int64_t drawn = saved_integer(run, "batches_drawn", "run.batches_drawn", origin);
  if (!run.contains("sampler") || !run["sampler"].is_object()) {
    throw InputError(origin, "run.sampler", run.contains("sampler") ? run["sampler"].dump() : "missing", "no token sampler state");
  }
  const auto& s = run["sampler"];
  if (!s.contains("seed") || !s["seed"].is_number_unsigned()) {
    throw InputError(origin, "run.sampler.seed", s.contains("seed") ? s["seed"].dump() : "missing", "not a seed");
  }
  const std::int64_t epoch = saved_integer(s, "epoch", "run.sampler.epoch", origin);
  const std::int64_t position = saved_integer(s, "position", "run.sampler.position", origin);
  if (position > windows_) {
    throw InputError(origin, "run.sampler.position", std::to_string(position),
                     "beyond the " + std::to_string(windows_) + " windows of an epoch");
  }
  seed_ = s["seed"].get<std::uint64_t>();
  start_epoch(epoch);
  position_ = position;
  batches_drawn_ = drawn;
}

std::unique_ptr<TrainingData> open_training_data(const std::string& path, std::int64_t seq) {
  if (io::looks_like_token_file(path)) return std::make_unique<TokenCorpus>(io::TokenFile(path), seq);
  return std::make_unique<ByteCorpus>(path, seq);
}

std::string default_corpus_path() {
  namespace fs = std::filesystem;
  // The shipped copy (an install's share/oom, the Python package's data, the source tree).
  if (const std::optional<DataLocation> root = shipped_data_root()) {
    const fs::path shipped = fs::path(root->folder) / "backend" / "data" / "corpus.txt";
    if (fs::exists(shipped)) return shipped.string();
  }
  return (fs::path(OOM_SOURCE_DIR_BACKEND) / "data" / "corpus.txt").string();
}

}  // namespace oom::backend
