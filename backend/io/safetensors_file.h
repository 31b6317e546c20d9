// Safetensors files without LibTorch: header parsing that treats the file as hostile, read-only
// memory-mapped access to tensor bytes, dtype conversion to and from FP32, and a streaming atomic
// writer.
//
// The format (https://github.com/huggingface/safetensors): an 8-byte little-endian header length
// N, N bytes of JSON (starting with '{', possibly padded with trailing spaces) mapping each tensor
// name to {"dtype", "shape", "data_offsets": [begin, end]} with offsets relative to the data
// section that follows the header, plus an optional "__metadata__" object of strings. Tensor
// bytes are little-endian, C order. As in the reference implementation, the tensors' byte ranges
// must tile the data section exactly (no holes, no overlaps, ending at the end of the file) and N
// is at most 100 MiB.
//
// Units: every offset and size here is in bytes; TensorInfo's begin/end are absolute offsets in
// the file (data_start + the header's data_offsets). Thread-safety: functions are stateless; a
// SafetensorsFile is immutable after construction and may be read from several threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace oom::io {

// Element types, spelled as safetensors spells them ("F32", "BF16", ...).
enum class DType { F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL };

std::size_t dtype_size(DType dtype);        // bytes per element
const char* dtype_name(DType dtype);        // "F32", "BF16", ...
std::optional<DType> parse_dtype(std::string_view name);  // nullopt for an unknown name

struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0;  // absolute byte offset of the first byte in the file
  std::uint64_t end = 0;    // absolute byte offset one past the last byte
  std::int64_t numel() const;  // product of shape (1 for a scalar)
  std::uint64_t size_bytes() const { return end - begin; }
};

struct SafetensorsHeader {
  std::vector<TensorInfo> tensors;  // sorted by begin (the data section's order)
  std::map<std::string, std::string> metadata;  // "__metadata__"
  std::uint64_t data_start = 0;  // 8 + N
};

// The largest header accepted (the reference implementation's limit).
inline constexpr std::uint64_t kMaxSafetensorsHeaderBytes = 100ull << 20;

// Parses and checks the header of a safetensors file of `file_size` bytes whose first bytes are
// `file_prefix` (at least 8 + N of them; the whole file is fine). On success every tensor's
// [begin, end) lies in the data section, matches its dtype and shape, and the ranges tile the data
// section. On failure throws InputError naming `origin`, the field (e.g.
// "model.norm.weight.data_offsets") and the value. Never allocates from a claimed size before
// checking it against `file_size`.
SafetensorsHeader parse_safetensors_header(std::string_view file_prefix, std::uint64_t file_size,
                                           const std::string& origin);

// A safetensors file mapped read-only into memory (MAP_PRIVATE, PROT_READ). Movable, not copyable;
// the mapping lives until destruction, so spans from bytes() are valid as long as the object.
class SafetensorsFile {
 public:
  enum class Access { Normal, Sequential };  // Sequential: madvise(MADV_SEQUENTIAL)

  // Opens, maps and parses `path`. Throws InputError naming the file for a missing file, a
  // directory, an empty or short file, or a bad header; std::runtime_error for a failed mmap.
  explicit SafetensorsFile(const std::string& path, Access access = Access::Normal);
  ~SafetensorsFile();
  SafetensorsFile(SafetensorsFile&& other) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& other) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::vector<TensorInfo>& tensors() const { return header_.tensors; }
  const TensorInfo* find(std::string_view name) const;  // nullptr if absent
  std::span<const std::byte> bytes(const TensorInfo& t) const;  // t must come from this file
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }
  const std::string& path() const { return path_; }
  std::uint64_t file_size() const { return size_; }

  // Tells the kernel the pages of [begin, end) (absolute offsets, widened to whole pages inside
  // the range) are no longer needed (MADV_DONTNEED): a loader that has converted a tensor drops
  // its pages so the mapping does not hold the file a second time. Later reads fault them back in.
  void release(std::uint64_t begin, std::uint64_t end) const;
  // Maps the pages of [begin, end) in one call (MADV_POPULATE_READ; a no-op where the kernel lacks
  // it) instead of one page fault per page.
  void prefault(std::uint64_t begin, std::uint64_t end) const;

 private:
  void unmap() noexcept;

  std::string path_;
  const std::byte* data_ = nullptr;
  std::uint64_t size_ = 0;
  SafetensorsHeader header_;
  std::map<std::string, std::size_t, std::less<>> index_;  // name → position in header_.tensors
};

// Converts `n` elements of `src` (little-endian `dtype`: F32, F16, BF16 or F64) to FP32 in `dst`.
// BF16 is exact (a 16-bit shift); F16 converts exactly (subnormals, infinities, NaN); F64 rounds
// to nearest. Throws std::invalid_argument for another dtype or when src holds fewer than
// n * dtype_size(dtype) bytes.
void convert_to_f32(std::span<const std::byte> src, DType dtype, float* dst, std::int64_t n);

// Converts `n` FP32 values to `dtype` (F32, BF16 or F16) into `dst` (n * dtype_size bytes),
// rounding to nearest even; NaN stays NaN (quiet), overflow of F16 gives infinity. Throws
// std::invalid_argument for another dtype.
void convert_from_f32(const float* src, std::int64_t n, DType dtype, std::byte* dst);

// One tensor for write_safetensors(): either `data` (size_bytes() bytes, read during the call) or
// `fill`, called once with a buffer of size_bytes() bytes to fill (at most one tensor's bytes are
// held at a time).
struct TensorToWrite {
  std::string name;
  DType dtype = DType::F32;
  std::vector<std::int64_t> shape;
  std::function<void(std::byte* dst)> fill;
  const void* data = nullptr;
  std::uint64_t size_bytes() const;  // numel * dtype_size; throws std::invalid_argument on overflow
};

// Writes `tensors` (in the given order) and `metadata` to `path` as a safetensors file: the header
// padded with spaces to a multiple of 8 bytes, then the data, streamed to a temporary file in the
// same folder, fsync'ed and renamed over `path`. On failure (a bad name or shape, a duplicate name,
// a fill that throws, an I/O error) throws, removes the temporary file and leaves `path` untouched.
void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata);

// The same, leaving the complete, fsync'ed file at a temporary path in the destination's folder
// and returning that path: the caller renames it into place (or removes it). Used to replace
// several files only once every new one is complete.
std::string write_safetensors_to_temp(const std::string& path, const std::vector<TensorToWrite>& tensors,
                                      const std::map<std::string, std::string>& metadata);

}  // namespace oom::io
