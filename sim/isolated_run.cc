#include "sim/isolated_run.h"

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <mutex>
#include <stdexcept>

#include <fmt/format.h>

namespace oom::sim {
namespace {

// Status byte that precedes the child's payload.
constexpr char kOk = 'K';
constexpr char kFailed = 'F';

// Writes all of `data` to `fd`; to a socket (`socket`) without SIGPIPE once its peer is gone.
bool write_all(int fd, const char* data, std::size_t size, bool socket = false) {
  while (size > 0) {
    const ssize_t n = socket ? ::send(fd, data, size, MSG_NOSIGNAL) : ::write(fd, data, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
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


// Reads the child's status byte and output from `fd` to its end and closes it.
std::string read_to_end(int fd) {
  std::string received;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    received.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fd);
  return received;
}

// The payload of a complete result, or the child's error as a std::runtime_error.
std::string result_of(const std::string& received) {
  if (received[0] == kFailed) throw std::runtime_error("simulation failed: " + received.substr(1));
  return received.substr(1);
}

bool read_all(int fd, char* data, std::size_t size) {
  while (size > 0) {
    const ssize_t n = ::read(fd, data, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data += n;
    size -= static_cast<std::size_t>(n);
  }
  return true;
}

// The server's end of a request: its size, and the descriptor its output goes to (passed along
// with the size's first byte). False once the caller is gone.
bool receive_header(int sock, std::uint64_t& size, int& fd) {
  fd = -1;
  char* data = reinterpret_cast<char*>(&size);
  std::size_t got = 0;
  while (got < sizeof size) {
    iovec iov{data + got, sizeof size - got};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    const ssize_t n = ::recvmsg(sock, &msg, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) std::memcpy(&fd, CMSG_DATA(c), sizeof fd);
    }
    got += static_cast<std::size_t>(n);
  }
  return fd >= 0;
}

// The server: one request at a time, each run by a child of its own, which answers the caller
// directly; the kernel reaps the children. Ends when the caller's socket closes.
[[noreturn]] void server_main(int sock, IsolatedHandler handler, pid_t caller) {
  if (sock > 3) ::close_range(3, static_cast<unsigned>(sock - 1), 0);
  ::close_range(static_cast<unsigned>(sock + 1), ~0U, 0);
  ::signal(SIGCHLD, SIG_IGN);
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != caller) ::_exit(0);  // the caller ended before the line above
  std::string request;
  for (;;) {
    std::uint64_t size = 0;
    int fd = -1;
    if (!receive_header(sock, size, fd)) ::_exit(0);
    request.resize(size);
    if (!read_all(sock, request.data(), request.size())) ::_exit(0);
    const pid_t pid = ::fork();
    if (pid == 0) child_main(fd, [&](std::string& out) { handler(request, out); });
    ::close(fd);  // a failed fork closes the caller's pipe without a result: reported there
  }
}

struct Server {
  std::mutex sending;  // one request on the socket at a time
  int sock = -1;
  IsolatedHandler handler = nullptr;
};

Server& server() {
  static Server s;
  return s;
}

// Sends the request's size with `fd` attached, then the request.
bool send_request(int sock, const std::string& request, int fd) {
  const std::uint64_t size = request.size();
  iovec iov{const_cast<std::uint64_t*>(&size), sizeof size};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &fd, sizeof fd);
  ssize_t n = -1;
  do {
    n = ::sendmsg(sock, &msg, MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  if (n <= 0) return false;
  const auto sent = static_cast<std::size_t>(n);
  return write_all(sock, reinterpret_cast<const char*>(&size) + sent, sizeof size - sent, true) &&
         write_all(sock, request.data(), request.size(), true);
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
  const std::string received = read_to_end(fds[0]);
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
  return result_of(received);
}

bool start_isolated_server(IsolatedHandler handler) {
  Server& s = server();
  std::lock_guard<std::mutex> lock(s.sending);
  if (s.sock >= 0) return s.handler == handler;
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return false;
  const pid_t caller = ::getpid();
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(sv[0]);
    ::close(sv[1]);
    return false;
  }
  if (pid == 0) server_main(sv[1], handler, caller);
  ::close(sv[1]);
  s.sock = sv[0];
  s.handler = handler;
  return true;
}

bool isolated_server_running(IsolatedHandler handler) {
  Server& s = server();
  std::lock_guard<std::mutex> lock(s.sending);
  return s.sock >= 0 && s.handler == handler;
}

std::string run_isolated_request(IsolatedHandler handler, const std::string& request) {
  if (!isolated_server_running(handler)) return run_isolated([&](std::string& out) { handler(request, out); });
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error(fmt::format("simulation failed: pipe: {}", std::strerror(errno)));
  bool sent = false;
  {
    Server& s = server();
    std::lock_guard<std::mutex> lock(s.sending);
    sent = send_request(s.sock, request, fds[1]);
  }
  ::close(fds[1]);
  if (!sent) {
    ::close(fds[0]);
    throw std::runtime_error(fmt::format("simulation failed: the simulation server is gone: {}", std::strerror(errno)));
  }
  const std::string received = read_to_end(fds[0]);
  if (received.empty()) throw std::runtime_error("simulation failed: the simulation process ended without a result");
  return result_of(received);
}

}  // namespace oom::sim
