// A Hugging Face checkpoint folder: config.json plus either one model.safetensors or shards
// (model-00001-of-00003.safetensors, ...) listed by model.safetensors.index.json:
//   {"metadata": {"total_size": BYTES, ...}, "weight_map": {"TENSOR": "SHARD FILE", ...}}
//
// CheckpointFolder opens and maps every shard at construction and checks the index against them;
// afterwards it is immutable and may be read from several threads (once config_json() has been
// called). write_checkpoint_folder() is the writer (what save_pretrained writes, minus the model
// code). Sizes are in bytes.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/io/safetensors_file.h"

namespace oom::io {

inline constexpr const char* kSingleFileName = "model.safetensors";
inline constexpr const char* kShardIndexName = "model.safetensors.index.json";

struct ShardIndex {
  std::map<std::string, std::string> weight_map;        // tensor → shard file name
  std::map<std::string, std::string> metadata_strings;  // the string entries of "metadata"
  std::optional<std::uint64_t> total_size;              // metadata.total_size
};

// Parses model.safetensors.index.json text from `origin`. Shard names must be plain file names
// ending in ".safetensors" (no '/', not hidden, no control characters). Non-string metadata other
// than total_size (e.g. "total_parameters") is ignored. Throws InputError naming `origin`, the
// field (e.g. "weight_map.model.layers.0.mlp.gate.weight") and the value.
ShardIndex parse_shard_index(std::string_view json_text, const std::string& origin);

// The shard file name of shard `k` (1-based) of `n`: "model-00001-of-00002.safetensors".
std::string shard_file_name(int k, int n);

struct TensorLocation {
  const SafetensorsFile* file;
  const TensorInfo* info;
};

// Converts the tensor at `t` to FP32 into `dst` (t.info->numel() floats), straight from the file's
// mapping: the way a trainer loads weights into its host state, with no intermediate copy. Works
// through the tensor in chunks, prefaulting each chunk's pages in one call (MADV_POPULATE_READ)
// and, with `release_pages`, dropping them once converted (MADV_DONTNEED), so the mapping adds at
// most about one chunk to resident memory. Throws std::invalid_argument for a dtype that is not
// F32, F16, BF16 or F64.
void read_tensor_f32(const TensorLocation& t, float* dst, bool release_pages = true);

class CheckpointFolder {
 public:
  // Opens `dir`. With an index, every shard it names is mapped and checked: a tensor listed but
  // absent from its shard, a tensor of a shard listed under another shard or not listed at all,
  // and a tensor in two shards are InputErrors naming the file. Without an index, model.safetensors
  // is mapped. Throws InputError for a missing folder or a folder with neither file.
  explicit CheckpointFolder(const std::string& dir,
                            SafetensorsFile::Access access = SafetensorsFile::Access::Normal);

  const std::string& dir() const { return dir_; }
  // Parsed config.json (read on first call, which is not thread-safe). Throws InputError when
  // missing or not JSON.
  const nlohmann::json& config_json() const;
  std::vector<std::string> tensor_names() const;  // sorted
  const TensorLocation* find(std::string_view name) const;  // nullptr if absent
  const std::vector<std::unique_ptr<SafetensorsFile>>& files() const { return files_; }
  const std::optional<ShardIndex>& index() const { return index_; }
  std::uint64_t total_tensor_bytes() const;  // sum over every tensor of its bytes

 private:
  std::string dir_;
  std::optional<ShardIndex> index_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, TensorLocation, std::less<>> tensors_;
  mutable std::optional<nlohmann::json> config_;
};

// Writes `config` as DIR/config.json and `tensors` (in order) as DIR/model.safetensors when their
// bytes fit in one file of at most `max_shard_bytes` of tensor data, else as shards of at most
// `max_shard_bytes` each (a larger tensor gets a shard of its own) plus model.safetensors.index.json
// (total_size = the sum of tensor bytes). The folder is created if needed. Every new file is
// written completely to a temporary name first; only then are they renamed over existing files,
// and the files of the other layout (a stale index, model.safetensors or shards of another count)
// are removed. On failure throws, removes the temporary files and leaves the folder untouched.
void write_checkpoint_folder(const std::string& dir, const nlohmann::json& config,
                             std::vector<TensorToWrite> tensors, std::uint64_t max_shard_bytes);

}  // namespace oom::io
