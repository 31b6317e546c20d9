#include "backend/io/checkpoint_folder.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <regex>
#include <set>
#include <stdexcept>

#include <fmt/format.h>

#include "backend/io/temp_file.h"
#include "costmodel/input_error.h"
#include "costmodel/json_input.h"

namespace oom::io {
namespace fs = std::filesystem;
namespace {

bool plain_shard_name(const std::string& s) {
  static constexpr std::string_view kExt = ".safetensors";
  if (s.size() <= kExt.size() || s.compare(s.size() - kExt.size(), kExt.size(), kExt) != 0) return false;
  if (s.front() == '.') return false;  // hidden, "..", "."
  for (const char c : s) {
    if (c == '/' || c == '\\' || static_cast<unsigned char>(c) < 0x20 || c == 0x7f) return false;
  }
  return true;
}

}  // namespace

ShardIndex parse_shard_index(std::string_view json_text, const std::string& origin) {
  const nlohmann::json j = parse_json_text(std::string(json_text), origin);
  if (!j.is_object()) throw InputError(origin, "document", json_value_text(j), "the index must be a JSON object");
  ShardIndex index;
  if (const auto m = j.find("metadata"); m != j.end() && !m->is_null()) {
    if (!m->is_object()) throw InputError(origin, "metadata", json_value_text(*m), "metadata must be an object");
    for (const auto& [key, value] : m->items()) {
      if (key == "total_size") {
        // Written as an integer; some tools write an integral float.
        if (value.is_number_unsigned()) {
          index.total_size = value.get<std::uint64_t>();
        } else if (value.is_number_float() && value.get<double>() >= 0 && value.get<double>() <= 0x1p53 &&
                   value.get<double>() == static_cast<double>(static_cast<std::uint64_t>(value.get<double>()))) {
          index.total_size = static_cast<std::uint64_t>(value.get<double>());
        } else {
          throw InputError(origin, "metadata.total_size", json_value_text(value), "must be a non-negative integer (bytes)");
        }
      } else if (value.is_string()) {
        index.metadata_strings.emplace(key, value.get<std::string>());
      }
    }
  }
  const auto w = j.find("weight_map");
  if (w == j.end() || !w->is_object()) {
    throw InputError(origin, "weight_map", w == j.end() ? "(missing)" : json_value_text(*w),
                     "weight_map must be an object of tensor name → shard file");
  }
  for (const auto& [tensor, shard] : w->items()) {
    const std::string field = "weight_map." + tensor;
    if (tensor.empty()) throw InputError(origin, field, "\"\"", "a tensor name must not be empty");
    if (!shard.is_string() || !plain_shard_name(shard.get<std::string>())) {
      throw InputError(origin, field, json_value_text(shard),
                       "a shard must be a plain file name ending in .safetensors (no folders, not hidden)");
    }
    index.weight_map.emplace(tensor, shard.get<std::string>());
  }
  return index;
}

std::string shard_file_name(int k, int n) { return fmt::format("model-{:05d}-of-{:05d}.safetensors", k, n); }

// ---- CheckpointFolder --------------------------------------------------------------------------

CheckpointFolder::CheckpointFolder(const std::string& dir, SafetensorsFile::Access access) : dir_(dir) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) throw InputError(dir, "no such checkpoint folder");
  if (!fs::is_directory(dir, ec)) throw InputError(dir, "is not a folder, expected a checkpoint folder");
  const fs::path index_path = fs::path(dir) / kShardIndexName;
  const fs::path single_path = fs::path(dir) / kSingleFileName;
  if (fs::exists(index_path, ec)) {
    const std::string origin = index_path.string();
    index_ = parse_shard_index(read_input_file(origin, "a shard index JSON file"), origin);
    std::map<std::string, const SafetensorsFile*> by_shard;
    for (const auto& [tensor, shard] : index_->weight_map) {
      if (by_shard.count(shard)) continue;
      files_.push_back(std::make_unique<SafetensorsFile>((fs::path(dir) / shard).string(), access));
      by_shard.emplace(shard, files_.back().get());
    }
    for (const auto& [tensor, shard] : index_->weight_map) {
      const SafetensorsFile* f = by_shard.at(shard);
      const TensorInfo* info = f->find(tensor);
      if (info == nullptr) {
        throw InputError(origin, "weight_map." + tensor, json_value_text(shard), "the shard has no tensor of that name");
      }
      tensors_.emplace(tensor, TensorLocation{f, info});
    }
    for (const auto& f : files_) {
      const std::string shard = fs::path(f->path()).filename().string();
      for (const TensorInfo& t : f->tensors()) {
        const auto it = index_->weight_map.find(t.name);
        if (it == index_->weight_map.end()) {
          throw InputError(f->path(), t.name, "(a tensor of this shard)", std::string("not listed in ") + kShardIndexName);
        }
        if (it->second != shard) {
          throw InputError(f->path(), t.name, json_value_text(it->second),
                           std::string(kShardIndexName) + " lists the tensor under another shard");
        }
      }
    }
  } else if (fs::exists(single_path, ec)) {
    files_.push_back(std::make_unique<SafetensorsFile>(single_path.string(), access));
    for (const TensorInfo& t : files_.back()->tensors()) tensors_.emplace(t.name, TensorLocation{files_.back().get(), &t});
  } else {
    throw InputError(dir, std::string("has neither ") + kSingleFileName + " nor " + kShardIndexName);
  }
}

const nlohmann::json& CheckpointFolder::config_json() const {
  if (!config_) config_ = read_json_file((fs::path(dir_) / "config.json").string());
  return *config_;
}

std::vector<std::string> CheckpointFolder::tensor_names() const {
  std::vector<std::string> names;
  names.reserve(tensors_.size());
  for (const auto& [name, loc] : tensors_) names.push_back(name);
  return names;
}

const TensorLocation* CheckpointFolder::find(std::string_view name) const {
  const auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

std::uint64_t CheckpointFolder::total_tensor_bytes() const {
  std::uint64_t total = 0;
  for (const auto& [name, loc] : tensors_) total += loc.info->size_bytes();
  return total;
}

void read_tensor_f32(const TensorLocation& t, float* dst, bool release_pages) {
  // 8 MiB of file per chunk: large enough that the per-call costs vanish, small enough to stay
  // near the caches and to bound the mapping's share of resident memory.
  constexpr std::uint64_t kChunkBytes = 8ull << 20;
  const std::uint64_t elem = dtype_size(t.info->dtype);
  const std::uint64_t chunk_elems = kChunkBytes / elem;
  const std::span<const std::byte> all = t.file->bytes(*t.info);
  const std::uint64_t n = static_cast<std::uint64_t>(t.info->numel());
  for (std::uint64_t first = 0; first < n; first += chunk_elems) {
    const std::uint64_t count = std::min(chunk_elems, n - first);
    const std::span<const std::byte> part = all.subspan(first * elem, count * elem);
    t.file->prefault(t.info->begin + first * elem, t.info->begin + (first + count) * elem);
    convert_to_f32(part, t.info->dtype, dst + first, static_cast<std::int64_t>(count));
    if (release_pages) t.file->release(t.info->begin + first * elem, t.info->begin + (first + count) * elem);
  }
}

// ---- writer -----------------------------------------------------------------------------------

namespace {

// Temporary files not yet renamed into place; removed unless committed.
struct PendingFiles {
  std::vector<std::pair<std::string, std::string>> files;  // temp → destination
  bool committed = false;
  ~PendingFiles() {
    if (committed) return;
    for (const auto& [temp, dest] : files) ::unlink(temp.c_str());
  }
};

void stage_text(PendingFiles& pending, const std::string& dest, const std::string& text) {
  TempFile f(dest);
  f.write(text.data(), text.size());
  const std::string temp = f.release();
  pending.files.emplace_back(temp, dest);
}

}  // namespace

void write_checkpoint_folder(const std::string& dir, const nlohmann::json& config,
                             std::vector<TensorToWrite> tensors, std::uint64_t max_shard_bytes) {
  if (max_shard_bytes == 0) throw std::invalid_argument("write_checkpoint_folder: max_shard_bytes must be positive");
  fs::create_directories(dir);

  std::set<std::string_view> names;
  for (const TensorToWrite& t : tensors) {
    if (!names.insert(t.name).second) throw std::invalid_argument(dir + ": duplicate tensor name '" + t.name + "'");
  }

  // Greedy packing in the given order: a shard closes when the next tensor would overflow it.
  std::vector<std::vector<TensorToWrite>> shards;
  std::uint64_t in_shard = 0, total = 0;
  for (TensorToWrite& t : tensors) {
    const std::uint64_t bytes = t.size_bytes();
    if (shards.empty() || (in_shard > 0 && in_shard + bytes > max_shard_bytes)) {
      shards.emplace_back();
      in_shard = 0;
    }
    in_shard += bytes;
    total += bytes;
    shards.back().push_back(std::move(t));
  }
  if (shards.empty()) shards.emplace_back();

  PendingFiles pending;
  stage_text(pending, (fs::path(dir) / "config.json").string(), config.dump(2) + "\n");
  std::set<std::string> written;
  if (shards.size() == 1) {
    const std::string dest = (fs::path(dir) / kSingleFileName).string();
    pending.files.emplace_back(write_safetensors_to_temp(dest, shards[0], {{"format", "pt"}}), dest);
    written.insert(kSingleFileName);
  } else {
    nlohmann::ordered_json index;
    index["metadata"] = {{"total_size", total}};
    nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
    const int n = static_cast<int>(shards.size());
    for (int k = 0; k < n; ++k) {
      const std::string name = shard_file_name(k + 1, n);
      const std::string dest = (fs::path(dir) / name).string();
      pending.files.emplace_back(write_safetensors_to_temp(dest, shards[k], {{"format", "pt"}}), dest);
      written.insert(name);
      for (const TensorToWrite& t : shards[k]) weight_map[t.name] = name;
    }
    index["weight_map"] = weight_map;
    stage_text(pending, (fs::path(dir) / kShardIndexName).string(), index.dump(2) + "\n");
    written.insert(kShardIndexName);
  }

  for (const auto& [temp, dest] : pending.files) {
    if (::rename(temp.c_str(), dest.c_str()) != 0) {
      throw std::runtime_error(dest + ": cannot rename into place: " + std::strerror(errno));
    }
  }
  pending.committed = true;

  // The other layout's files would shadow or confuse the new one (a reader prefers the index).
  static const std::regex shard_pattern(R"(model-\d{5}-of-\d{5}\.safetensors)");
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    const bool ours = name == kSingleFileName || name == kShardIndexName || std::regex_match(name, shard_pattern);
    if (ours && !written.count(name)) fs::remove(e.path());
  }
  sync_folder(dir);
}

}  // namespace oom::io
