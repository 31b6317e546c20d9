#include "backend/io/safetensors_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <set>
#include <stdexcept>
#include <utility>

#include <nlohmann/json.hpp>

#include "backend/io/temp_file.h"
#include "costmodel/input_error.h"
#include "costmodel/json_input.h"

namespace oom::io {
namespace {

constexpr const char* kMetadataKey = "__metadata__";

struct DTypeName {
  DType dtype;
  const char* name;
  std::size_t size;
};
constexpr DTypeName kDTypes[] = {
    {DType::F64, "F64", 8}, {DType::F32, "F32", 4}, {DType::F16, "F16", 2}, {DType::BF16, "BF16", 2},
    {DType::I64, "I64", 8}, {DType::I32, "I32", 4}, {DType::I16, "I16", 2}, {DType::I8, "I8", 1},
    {DType::U8, "U8", 1},   {DType::BOOL, "BOOL", 1},
};

const DTypeName& entry(DType d) {
  for (const auto& e : kDTypes) {
    if (e.dtype == d) return e;
  }
  throw std::invalid_argument("unknown DType");
}

std::uint64_t read_le_u64(const char* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

// a * b, or nullopt on overflow of 64 bits.
std::optional<std::uint64_t> checked_mul(std::uint64_t a, std::uint64_t b) {
  std::uint64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}

// A tensor name as a field of an error message: names come from the file, so at most 200 bytes.
std::string field_name(const std::string& name) { return name.size() <= 200 ? name : name.substr(0, 200) + "..."; }

// One tensor entry of the header; offsets relative to the data section.
TensorInfo parse_entry(const std::string& full_name, const nlohmann::json& e, std::uint64_t data_len,
                       const std::string& origin) {
  TensorInfo t;
  t.name = full_name;
  const std::string name = field_name(full_name);
  if (!e.is_object()) throw InputError(origin, name, json_value_text(e), "a tensor entry must be an object");

  const auto dt = e.find("dtype");
  if (dt == e.end()) throw InputError(origin, name + ".dtype", "(missing)", "every tensor needs a dtype");
  const std::optional<DType> dtype = dt->is_string() ? parse_dtype(dt->get_ref<const std::string&>()) : std::nullopt;
  if (!dtype) {
    throw InputError(origin, name + ".dtype", json_value_text(*dt),
                     "unknown dtype (known: F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL)");
  }
  t.dtype = *dtype;

  const auto sh = e.find("shape");
  if (sh == e.end() || !sh->is_array()) {
    throw InputError(origin, name + ".shape", sh == e.end() ? "(missing)" : json_value_text(*sh),
                     "shape must be an array of non-negative integers");
  }
  std::uint64_t numel = 1;
  bool numel_overflow = false;
  for (std::size_t i = 0; i < sh->size(); ++i) {
    const nlohmann::json& d = (*sh)[i];
    if (!d.is_number_unsigned() || d.get<std::uint64_t>() > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
      throw InputError(origin, name + ".shape[" + std::to_string(i) + "]", json_value_text(d),
                       "a dimension must be a non-negative integer");
    }
    const auto prod = checked_mul(numel, d.get<std::uint64_t>());
    if (!prod) numel_overflow = true;
    else numel = *prod;
  }

  const auto off = e.find("data_offsets");
  const std::string off_field = name + ".data_offsets";
  if (off == e.end() || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
      !(*off)[1].is_number_unsigned()) {
    throw InputError(origin, off_field, off == e.end() ? "(missing)" : json_value_text(*off),
                     "data_offsets must be [begin, end], two non-negative integers");
  }
  const std::uint64_t begin = (*off)[0].get<std::uint64_t>(), end = (*off)[1].get<std::uint64_t>();
  if (begin > end) throw InputError(origin, off_field, json_value_text(*off), "begin is after end");
  if (end > data_len) {
    throw InputError(origin, off_field, json_value_text(*off),
                     "end lies past the data section (" + std::to_string(data_len) + " bytes)");
  }
  // Zero elements make every shape fit in zero bytes, whatever the other dimensions' product.
  std::optional<std::uint64_t> bytes;
  if (!numel_overflow) bytes = checked_mul(numel, dtype_size(t.dtype));
  for (const auto& d : *sh) {
    if (d.get<std::uint64_t>() == 0) bytes = 0;
  }
  if (!bytes || *bytes != end - begin) {
    throw InputError(origin, off_field, json_value_text(*off),
                     "holds " + std::to_string(end - begin) + " bytes but shape " + json_value_text(*sh) + " of " +
                         dtype_name(t.dtype) + " needs " + (bytes ? std::to_string(*bytes) : std::string("more than 2^64")));
  }
  for (const auto& d : *sh) t.shape.push_back(static_cast<std::int64_t>(d.get<std::uint64_t>()));
  t.begin = begin;
  t.end = end;
  return t;
}

}  // namespace

std::size_t dtype_size(DType dtype) { return entry(dtype).size; }
const char* dtype_name(DType dtype) { return entry(dtype).name; }

std::optional<DType> parse_dtype(std::string_view name) {
  for (const auto& e : kDTypes) {
    if (name == e.name) return e.dtype;
  }
  return std::nullopt;
}

std::int64_t TensorInfo::numel() const {
  std::int64_t n = 1;
  for (const std::int64_t d : shape) n *= d;
  return n;
}

SafetensorsHeader parse_safetensors_header(std::string_view file_prefix, std::uint64_t file_size,
                                           const std::string& origin) {
  if (file_size < 8) {
    throw InputError(origin, "header length", std::to_string(file_size) + " bytes of file",
                     "a safetensors file starts with an 8-byte header length");
  }
  if (file_prefix.size() < 8) throw std::invalid_argument(origin + ": parse_safetensors_header needs the first 8 bytes");
  const std::uint64_t n = read_le_u64(file_prefix.data());
  if (n > file_size - 8) {
    throw InputError(origin, "header length", std::to_string(n),
                     "larger than the " + std::to_string(file_size - 8) + " bytes after it in the file");
  }
  if (n > kMaxSafetensorsHeaderBytes) {
    throw InputError(origin, "header length", std::to_string(n), "larger than the 100 MiB limit");
  }
  if (file_prefix.size() < 8 + n) {
    throw std::invalid_argument(origin + ": parse_safetensors_header needs the first " + std::to_string(8 + n) + " bytes");
  }
  const std::string_view text = file_prefix.substr(8, n);
  if (text.empty() || text.front() != '{') {
    throw InputError(origin, "header", text.empty() ? "(empty)" : json_value_text(std::string(text.substr(0, 40))),
                     "the JSON header must start with '{'");
  }
  // The one JSON parser of every input: a syntax error names the field it stopped in, a tensor
  // named twice is refused instead of the later entry silently replacing the earlier.
  const nlohmann::json j = parse_json_text(std::string(text), origin);
  if (!j.is_object()) throw InputError(origin, "header", json_value_text(j), "the header must be a JSON object");

  const std::uint64_t data_len = file_size - 8 - n;
  SafetensorsHeader h;
  h.data_start = 8 + n;
  for (const auto& [key, value] : j.items()) {
    if (key == kMetadataKey) {
      if (!value.is_object()) throw InputError(origin, key, json_value_text(value), "__metadata__ must be an object of strings");
      for (const auto& [mk, mv] : value.items()) {
        if (!mv.is_string()) {
          throw InputError(origin, std::string(kMetadataKey) + "." + mk, json_value_text(mv), "metadata values must be strings");
        }
        h.metadata.emplace(mk, mv.get<std::string>());
      }
      continue;
    }
    h.tensors.push_back(parse_entry(key, value, data_len, origin));
  }

  // The ranges must tile the data section: sorted by begin (empty tensors first), each starts
  // where the previous ended, the last ends at the end of the file.
  std::sort(h.tensors.begin(), h.tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : (a.end != b.end ? a.end < b.end : a.name < b.name);
  });
  std::uint64_t covered = 0;
  const TensorInfo* previous = nullptr;
  for (const TensorInfo& t : h.tensors) {
    const std::string value = "[" + std::to_string(t.begin) + ", " + std::to_string(t.end) + "]";
    if (t.begin < covered) {
      throw InputError(origin, field_name(t.name) + ".data_offsets", value,
                       "overlaps tensor '" + (previous ? field_name(previous->name) : std::string()) + "' (which ends at " +
                           std::to_string(covered) + ")");
    }
    if (t.begin > covered) {
      throw InputError(origin, field_name(t.name) + ".data_offsets", value,
                       "leaves bytes " + std::to_string(covered) + ".." + std::to_string(t.begin) +
                           " of the data section unused (the tensors must cover it without holes)");
    }
    covered = t.end;
    if (t.end > t.begin) previous = &t;
  }
  if (covered != data_len) {
    throw InputError(origin, "data_offsets", "end " + std::to_string(covered),
                     "the tensors cover " + std::to_string(covered) + " bytes of the " + std::to_string(data_len) +
                         "-byte data section (they must cover all of it)");
  }
  for (TensorInfo& t : h.tensors) {
    t.begin += h.data_start;
    t.end += h.data_start;
  }
  return h;
}

// ---- SafetensorsFile --------------------------------------------------------------------------

SafetensorsFile::SafetensorsFile(const std::string& path, Access access) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    throw InputError(path, err == ENOENT ? std::string("no such file") : std::string("cannot open: ") + std::strerror(err));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    throw InputError(path, std::string("cannot stat: ") + std::strerror(err));
  }
  if (S_ISDIR(st.st_mode)) {
    ::close(fd);
    throw InputError(path, "is a folder, expected a safetensors file");
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw InputError(path, "is not a regular file, expected a safetensors file");
  }
  size_ = static_cast<std::uint64_t>(st.st_size);
  if (size_ == 0) {
    ::close(fd);
    throw InputError(path, "is empty, expected a safetensors file");
  }
  void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
  const int err = errno;
  ::close(fd);
  if (p == MAP_FAILED) throw std::runtime_error(path + ": cannot map: " + std::strerror(err));
  data_ = static_cast<const std::byte*>(p);
  if (access == Access::Sequential) ::madvise(p, size_, MADV_SEQUENTIAL);
  try {
    header_ = parse_safetensors_header(std::string_view(reinterpret_cast<const char*>(data_), size_), size_, path);
  } catch (...) {
    unmap();
    throw;
  }
  for (std::size_t i = 0; i < header_.tensors.size(); ++i) index_.emplace(header_.tensors[i].name, i);
}

SafetensorsFile::~SafetensorsFile() { unmap(); }

SafetensorsFile::SafetensorsFile(SafetensorsFile&& other) noexcept
    : path_(std::move(other.path_)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      header_(std::move(other.header_)),
      index_(std::move(other.index_)) {}

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& other) noexcept {
  if (this != &other) {
    unmap();
    path_ = std::move(other.path_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    header_ = std::move(other.header_);
    index_ = std::move(other.index_);
  }
  return *this;
}

void SafetensorsFile::unmap() noexcept {
  if (data_ != nullptr) ::munmap(const_cast<std::byte*>(data_), size_);
  data_ = nullptr;
  size_ = 0;
}

const TensorInfo* SafetensorsFile::find(std::string_view name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &header_.tensors[it->second];
}

std::span<const std::byte> SafetensorsFile::bytes(const TensorInfo& t) const {
  if (t.begin > t.end || t.end > size_) throw std::out_of_range(path_ + ": tensor '" + t.name + "' is not in this file");
  return {data_ + t.begin, static_cast<std::size_t>(t.end - t.begin)};
}

void SafetensorsFile::release(std::uint64_t begin, std::uint64_t end) const {
  if (data_ == nullptr) return;
  const std::uint64_t page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  end = std::min(end, size_);
  const std::uint64_t first = (begin + page - 1) / page * page, last = end / page * page;
  if (first < last) ::madvise(const_cast<std::byte*>(data_) + first, last - first, MADV_DONTNEED);
}

void SafetensorsFile::prefault(std::uint64_t begin, std::uint64_t end) const {
#ifdef MADV_POPULATE_READ
  if (data_ == nullptr) return;
  const std::uint64_t page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  end = std::min(end, size_);
  const std::uint64_t first = begin / page * page;
  if (first < end) ::madvise(const_cast<std::byte*>(data_) + first, end - first, MADV_POPULATE_READ);
#endif
}

// ---- writer -----------------------------------------------------------------------------------

std::uint64_t TensorToWrite::size_bytes() const {
  std::uint64_t n = dtype_size(dtype);
  for (const std::int64_t d : shape) {
    if (d < 0) throw std::invalid_argument("tensor '" + name + "': negative dimension " + std::to_string(d));
    const auto p = checked_mul(n, static_cast<std::uint64_t>(d));
    if (!p) throw std::invalid_argument("tensor '" + name + "': size overflows 64 bits");
    n = *p;
  }
  return n;
}

std::string write_safetensors_to_temp(const std::string& path, const std::vector<TensorToWrite>& tensors,
                                      const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header[kMetadataKey] = metadata;
  std::set<std::string_view> names;
  std::uint64_t offset = 0;
  for (const TensorToWrite& t : tensors) {
    if (t.name.empty() || t.name == kMetadataKey) throw std::invalid_argument(path + ": bad tensor name '" + t.name + "'");
    if (!names.insert(t.name).second) throw std::invalid_argument(path + ": duplicate tensor name '" + t.name + "'");
    const std::uint64_t bytes = t.size_bytes();
    if (bytes > 0 && !t.fill && t.data == nullptr) {
      throw std::invalid_argument(path + ": tensor '" + t.name + "' has neither data nor fill");
    }
    header[t.name] = {{"dtype", dtype_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  // Pad with spaces so the data section starts 8-byte aligned, as the reference writer does.
  text.append((8 - text.size() % 8) % 8, ' ');
  char length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<char>((static_cast<std::uint64_t>(text.size()) >> (8 * i)) & 0xff);

  TempFile out(path);
  out.write(length, 8);
  out.write(text.data(), text.size());
  std::vector<std::byte> buffer;  // one tensor at a time
  for (const TensorToWrite& t : tensors) {
    const std::uint64_t bytes = t.size_bytes();
    if (bytes == 0) continue;
    if (t.data != nullptr) {
      out.write(t.data, bytes);
    } else {
      if (buffer.size() < bytes) {
        buffer.clear();
        buffer.shrink_to_fit();
        buffer.resize(bytes);
      }
      t.fill(buffer.data());
      out.write(buffer.data(), bytes);
    }
  }
  return out.release();
}

void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  const std::string temp = write_safetensors_to_temp(path, tensors, metadata);
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(temp.c_str());
    throw std::runtime_error(path + ": cannot rename into place: " + std::strerror(err));
  }
}

}  // namespace oom::io
