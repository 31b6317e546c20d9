#include "backend/io/temp_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <utility>

namespace oom::io {
namespace {

[[noreturn]] void fail(const std::string& path, const char* what, int err) {
  throw std::runtime_error(path + ": cannot " + what + ": " + std::strerror(err));
}

}  // namespace

TempFile::TempFile(std::string destination) : destination_(std::move(destination)) {
  namespace fs = std::filesystem;
  const fs::path target(destination_);
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  temp_ = (dir / ("." + target.filename().string() + ".tmp-XXXXXX")).string();
  fd_ = ::mkstemp(temp_.data());
  if (fd_ < 0) {
    owned_ = false;
    fail(destination_, "create a temporary file", errno);
  }
}

TempFile::TempFile(TempFile&& other) noexcept
    : destination_(std::move(other.destination_)), temp_(std::move(other.temp_)), fd_(other.fd_), owned_(other.owned_) {
  other.fd_ = -1;
  other.owned_ = false;
}

TempFile::~TempFile() {
  if (fd_ >= 0) ::close(fd_);
  if (owned_) ::unlink(temp_.c_str());
}

void TempFile::write(const void* data, std::size_t bytes) {
  if (fd_ < 0) throw std::logic_error(destination_ + ": write after finish");
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    // Linux writes at most ~2 GiB per call; larger tensors go in several calls.
    const ssize_t n = ::write(fd_, p, std::min<std::size_t>(bytes, std::size_t{1} << 30));
    if (n < 0) {
      if (errno == EINTR) continue;
      fail(destination_, "write", errno);
    }
    p += n;
    bytes -= static_cast<std::size_t>(n);
  }
}

void TempFile::finish() {
  if (fd_ < 0) return;
  if (::fchmod(fd_, 0644) != 0 || ::fsync(fd_) != 0) fail(destination_, "flush", errno);
  const int fd = std::exchange(fd_, -1);
  if (::close(fd) != 0) fail(destination_, "close", errno);
}

void TempFile::commit() {
  finish();
  if (::rename(temp_.c_str(), destination_.c_str()) != 0) fail(destination_, "rename into place", errno);
  owned_ = false;
}

std::string TempFile::release() {
  finish();
  owned_ = false;
  return temp_;
}

void sync_folder(const std::string& folder) {
  const int fd = ::open(folder.empty() ? "." : folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

}  // namespace oom::io
