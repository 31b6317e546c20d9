#include "costmodel/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <stdexcept>

#include "costmodel/output_path.h"

namespace oom {
namespace {

[[noreturn]] void fail(const std::string& path, const char* what, int err) {
  throw std::runtime_error(path + ": cannot " + what + ": " + std::strerror(err));
}

}  // namespace

void write_file_atomically(const std::string& path, std::string_view content) {
  namespace fs = std::filesystem;
  // A link is followed: its target is replaced, beside it, and the link stays (output_path.h).
  const fs::path target(output_target(path));
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  std::string tmpl = (dir / ("." + target.filename().string() + ".tmp-XXXXXX")).string();
  const int fd = ::mkstemp(tmpl.data());
  if (fd < 0) fail(path, "create a temporary file", errno);
  const char* data = content.data();
  std::size_t left = content.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, data, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      ::unlink(tmpl.c_str());
      fail(path, "write", err);
    }
    data += n;
    left -= static_cast<std::size_t>(n);
  }
  if (::fchmod(fd, 0644) != 0 || ::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    ::unlink(tmpl.c_str());
    fail(path, "flush", err);
  }
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmpl.c_str());
    fail(path, "close", err);
  }
  if (::rename(tmpl.c_str(), target.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmpl.c_str());
    fail(path, "rename into place", err);
  }
}

}  // namespace oom
