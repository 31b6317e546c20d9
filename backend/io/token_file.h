// Token files: pre-tokenized training data in llm.c's layout (karpathy/llm.c, dev/data/data_common.py).
//
// Layout: a header of 256 little-endian int32 — header[0] the magic 20240520, header[1] the
// version (1: tokens are uint16, 2: tokens are uint32, needed for vocabularies above 65,536
// entries), header[2] the token count N ≥ 0, the rest zero — then N little-endian tokens of 2 or
// 4 bytes. The file size is exactly 1024 + N × width bytes. `scripts/tokenize.py` writes such
// files from text with a model's tokenizer.json.
//
// TorchFree: this library (oom_io) never includes LibTorch, so its readers can be fuzzed.
// Thread-safety: a TokenFile is immutable after construction except for the cached max_token(),
// which is computed on the first call; call max_token() once before sharing a TokenFile.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>

namespace oom::io {

inline constexpr std::int32_t kTokenFileMagic = 20240520;
inline constexpr std::size_t kTokenFileHeaderBytes = 256 * 4;

class TokenFile {
 public:
  // Memory-maps `path` read-only and validates it. Throws InputError naming the file and the field
  // (`magic`, `version`, `token count`) and its value when the file is unreadable, shorter than the
  // header, or its size is not 1024 + count × width bytes.
  explicit TokenFile(const std::string& path);
  // The same checks on bytes in memory; `origin` names them in errors (fuzzing, tests).
  static TokenFile from_bytes(std::string bytes, std::string origin);

  TokenFile(TokenFile&& other) noexcept;
  TokenFile& operator=(TokenFile&& other) noexcept;
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;
  ~TokenFile();

  const std::string& origin() const { return origin_; }
  std::int64_t size() const { return count_; }  // tokens
  int version() const { return version_; }
  int token_bytes() const { return version_ == 1 ? 2 : 4; }

  // Token i (0 ≤ i < size(); OOM_ASSERT otherwise).
  std::uint32_t operator[](std::int64_t i) const;
  // Copies tokens [begin, begin + n) into `out`. Throws std::out_of_range when the range leaves
  // the file (begin < 0, n < 0 or begin + n > size()); `out` is untouched then.
  void copy(std::int64_t begin, std::int64_t n, std::int64_t* out) const;
  // The largest token id (0 for an empty file) and its first position; scans the file once, then
  // cached.
  std::uint32_t max_token() const;
  std::int64_t max_token_position() const;

 private:
  TokenFile() = default;
  void validate();  // reads the header of [data_, data_ + bytes_); throws InputError
  void scan_max() const;

  std::string origin_;
  std::string owned_;                 // from_bytes: the bytes themselves
  void* map_ = nullptr;               // the file's mapping, or null
  std::size_t map_bytes_ = 0;
  const unsigned char* data_ = nullptr;
  std::size_t bytes_ = 0;
  int version_ = 0;
  std::int64_t count_ = 0;
  mutable std::optional<std::uint32_t> max_;
  mutable std::int64_t max_position_ = 0;
};

// Writes `tokens` to `path` in the layout above, atomically (write_file_atomically). `version` 1
// stores uint16 tokens and throws InputError naming the first token ≥ 65,536 (nothing written);
// `version` 2 stores uint32. Any other version is an InputError.
void write_token_file(const std::string& path, std::span<const std::uint32_t> tokens, int version);

// Whether the first four bytes of the file at `path` are the token-file magic (false for an
// unreadable or shorter file).
bool looks_like_token_file(const std::string& path);

}  // namespace oom::io
