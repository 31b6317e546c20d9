#include "sim/isolated_run.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <stdexcept>

#include <fmt/format.h>

namespace oom::sim {
namespace {

// Status byte that precedes the child's payload.
constexpr char kOk = 'K';
constexpr char kFailed = 'F';

bool write_all(int fd, const char* data, std::size_t size) {
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    data += n;
    size -= static_cast<std::size_t>(n);
  }
  return true;
}

[[noreturn]] void child_main(int fd, const std::function<void(std::string&)>& body) {
  // Other threads of the parent may run simulations of their own at once: drop the pipe ends of
  // their children, inherited here, so that each parent sees its pipe close when its child exits.
  if (fd > 3) ::close_range(3, static_cast<unsigned>(fd - 1), 0);
  ::close_range(static_cast<unsigned>(fd + 1), ~0U, 0);
  std::string out;
  char status = kOk;
  try {
    body(out);
  } catch (const std::exception& e) {
    status = kFailed;
    out = e.what();
  } catch (...) {
    status = kFailed;
    out = "unknown exception";
  }
  std::fflush(stdout);
  std::fflush(stderr);
  const bool ok = write_all(fd, &status, 1) && write_all(fd, out.data(), out.size());
  ::close(fd);
  // _exit: the child must not run the parent's atexit handlers or SimGrid's teardown.
  ::_exit(ok ? 0 : 4);
}

}  // namespace

std::string run_isolated(const std::function<void(std::string& out)>& body) {
  int fds[2];
  if (::pipe(fds) != 0) throw std::runtime_error(fmt::format("simulation failed: pipe: {}", std::strerror(errno)));
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    throw std::runtime_error(fmt::format("simulation failed: fork: {}", std::strerror(errno)));
  }
  if (pid == 0) {
    ::close(fds[0]);
    child_main(fds[1], body);
  }
  ::close(fds[1]);
  // Read to the end before waiting: the child blocks when the pipe is full.
  std::string received;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    received.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fds[0]);
  int wstatus = 0;
  while (::waitpid(pid, &wstatus, 0) < 0) {
    if (errno != EINTR) throw std::runtime_error(fmt::format("simulation failed: waitpid: {}", std::strerror(errno)));
  }
  if (WIFSIGNALED(wstatus)) {
    throw std::runtime_error(fmt::format("simulation failed: the simulation process died of signal {}", WTERMSIG(wstatus)));
  }
  if (!WIFEXITED(wstatus) || WEXITSTATUS(wstatus) != 0 || received.empty()) {
    throw std::runtime_error(fmt::format("simulation failed: the simulation process exited with status {}",
                                         WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : -1));
  }
  if (received[0] == kFailed) throw std::runtime_error("simulation failed: " + received.substr(1));
  return received.substr(1);
}

}  // namespace oom::sim
