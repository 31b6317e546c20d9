#include "backend/io/token_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <stdexcept>
#include <utility>

#include "costmodel/atomic_file.h"
#include "costmodel/input_error.h"

namespace oom::io {
namespace {

std::int32_t read_i32(const unsigned char* p) {
  const std::uint32_t u = static_cast<std::uint32_t>(p[0]) | static_cast<std::uint32_t>(p[1]) << 8 |
                          static_cast<std::uint32_t>(p[2]) << 16 | static_cast<std::uint32_t>(p[3]) << 24;
  return static_cast<std::int32_t>(u);
}

void put_u32(std::string& s, std::size_t at, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) s[at + static_cast<std::size_t>(i)] = static_cast<char>((v >> (8 * i)) & 0xff);
}

}  // namespace

TokenFile::TokenFile(const std::string& path) : origin_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw InputError(path, std::string("cannot open the token file: ") + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw InputError(path, "not a regular file");
  }
  bytes_ = static_cast<std::size_t>(st.st_size);
  if (bytes_ > 0) {
    void* m = ::mmap(nullptr, bytes_, PROT_READ, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
      ::close(fd);
      throw InputError(path, std::string("cannot map the token file: ") + std::strerror(errno));
    }
    map_ = m;
    map_bytes_ = bytes_;
    data_ = static_cast<const unsigned char*>(m);
  }
  ::close(fd);
  validate();  // the destructor does not run for a throwing constructor: unmap here
}

TokenFile TokenFile::from_bytes(std::string bytes, std::string origin) {
  TokenFile f;
  f.origin_ = std::move(origin);
  f.owned_ = std::move(bytes);
  f.data_ = reinterpret_cast<const unsigned char*>(f.owned_.data());
  f.bytes_ = f.owned_.size();
  f.validate();
  return f;
}

void TokenFile::validate() {
  auto fail = [&](const std::string& field, const std::string& value, const std::string& reason) {
    if (map_ != nullptr) ::munmap(map_, map_bytes_);
    map_ = nullptr;
    throw InputError(origin_, field, value, reason);
  };
  if (bytes_ < kTokenFileHeaderBytes) {
    fail("header", std::to_string(bytes_) + " bytes", "shorter than the 1024-byte token-file header");
  }
  const std::int32_t magic = read_i32(data_);
  if (magic != kTokenFileMagic) fail("magic", std::to_string(magic), "not a token file (expected 20240520)");
  const std::int32_t version = read_i32(data_ + 4);
  if (version != 1 && version != 2) fail("version", std::to_string(version), "must be 1 (uint16 tokens) or 2 (uint32 tokens)");
  const std::int32_t count = read_i32(data_ + 8);
  if (count < 0) fail("token count", std::to_string(count), "must be ≥ 0");
  const std::size_t width = version == 1 ? 2 : 4;
  const std::size_t expected = kTokenFileHeaderBytes + static_cast<std::size_t>(count) * width;
  if (bytes_ != expected) {
    fail("token count", std::to_string(count),
         "the file holds " + std::to_string(bytes_) + " bytes, the header says " + std::to_string(expected));
  }
  version_ = version;
  count_ = count;
}

TokenFile::TokenFile(TokenFile&& o) noexcept { *this = std::move(o); }

TokenFile& TokenFile::operator=(TokenFile&& o) noexcept {
  if (this == &o) return *this;
  if (map_ != nullptr) ::munmap(map_, map_bytes_);
  origin_ = std::move(o.origin_);
  owned_ = std::move(o.owned_);
  map_ = std::exchange(o.map_, nullptr);
  map_bytes_ = std::exchange(o.map_bytes_, 0);
  // Owned bytes may sit in the string's small buffer: point at this object's copy.
  data_ = map_ != nullptr ? static_cast<const unsigned char*>(map_) : reinterpret_cast<const unsigned char*>(owned_.data());
  bytes_ = std::exchange(o.bytes_, 0);
  version_ = o.version_;
  count_ = std::exchange(o.count_, 0);
  max_ = o.max_;
  max_position_ = o.max_position_;
  o.data_ = nullptr;
  return *this;
}

TokenFile::~TokenFile() {
  if (map_ != nullptr) ::munmap(map_, map_bytes_);
}

std::uint32_t TokenFile::operator[](std::int64_t i) const {
  OOM_ASSERT(i >= 0 && i < count_, "token index out of range");
  const unsigned char* p = data_ + kTokenFileHeaderBytes + static_cast<std::size_t>(i) * static_cast<std::size_t>(token_bytes());
  if (version_ == 1) return static_cast<std::uint32_t>(p[0]) | static_cast<std::uint32_t>(p[1]) << 8;
  return static_cast<std::uint32_t>(read_i32(p));
}

void TokenFile::copy(std::int64_t begin, std::int64_t n, std::int64_t* out) const {
  if (begin < 0 || n < 0 || begin > count_ || n > count_ - begin) {
    throw std::out_of_range(origin_ + ": tokens [" + std::to_string(begin) + ", " + std::to_string(begin) + "+" +
                            std::to_string(n) + ") outside the file's " + std::to_string(count_));
  }
  const unsigned char* p = data_ + kTokenFileHeaderBytes + static_cast<std::size_t>(begin) * static_cast<std::size_t>(token_bytes());
  if (version_ == 1) {
    for (std::int64_t i = 0; i < n; ++i, p += 2) out[i] = static_cast<std::int64_t>(p[0]) | static_cast<std::int64_t>(p[1]) << 8;
  } else {
    for (std::int64_t i = 0; i < n; ++i, p += 4) out[i] = static_cast<std::uint32_t>(read_i32(p));
  }
}

void TokenFile::scan_max() const {
  std::uint32_t best = 0;
  std::int64_t at = 0;
  for (std::int64_t i = 0; i < count_; ++i) {
    const std::uint32_t t = (*this)[i];
    if (t > best) {
      best = t;
      at = i;
    }
  }
  max_ = best;
  max_position_ = at;
}

std::uint32_t TokenFile::max_token() const {
  if (!max_) scan_max();
  return *max_;
}

std::int64_t TokenFile::max_token_position() const {
  if (!max_) scan_max();
  return max_position_;
}

void write_token_file(const std::string& path, std::span<const std::uint32_t> tokens, int version) {
  if (version != 1 && version != 2) throw InputError(path, "version", std::to_string(version), "must be 1 or 2");
  if (tokens.size() > static_cast<std::size_t>(INT32_MAX)) {
    throw InputError(path, "token count", std::to_string(tokens.size()), "above the format's 2^31 − 1 tokens");
  }
  const std::size_t width = version == 1 ? 2 : 4;
  std::string out(kTokenFileHeaderBytes + tokens.size() * width, '\0');
  put_u32(out, 0, static_cast<std::uint32_t>(kTokenFileMagic));
  put_u32(out, 4, static_cast<std::uint32_t>(version));
  put_u32(out, 8, static_cast<std::uint32_t>(tokens.size()));
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    const std::uint32_t t = tokens[i];
    const std::size_t at = kTokenFileHeaderBytes + i * width;
    if (version == 1) {
      if (t > 0xffff) {
        throw InputError(path, "tokens[" + std::to_string(i) + "]", std::to_string(t),
                         "version 1 stores uint16 tokens: ids ≥ 65536 need version 2");
      }
      out[at] = static_cast<char>(t & 0xff);
      out[at + 1] = static_cast<char>(t >> 8);
    } else {
      put_u32(out, at, t);
    }
  }
  write_file_atomically(path, out);
}

bool looks_like_token_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  unsigned char head[4];
  if (!in.read(reinterpret_cast<char*>(head), 4)) return false;
  return read_i32(head) == kTokenFileMagic;
}

}  // namespace oom::io
