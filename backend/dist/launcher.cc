#include "backend/dist/launcher.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits.h>
#include <stdexcept>
#include <thread>

extern char** environ;

namespace oom::backend::dist {
namespace {

using Clock = std::chrono::steady_clock;

pid_t spawn(const std::vector<std::string>& argv, const std::string& log) {
  if (argv.empty()) throw std::runtime_error("empty command line for a rank");
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (!log.empty()) {
    posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
  }
  // Each rank leads its own process group, so stopping it also stops any process it started.
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attr, 0);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, args[0], &actions, &attr, args.data(), environ);
  posix_spawnattr_destroy(&attr);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) throw std::runtime_error("cannot start " + argv[0] + ": " + std::strerror(rc));
  return pid;
}

std::string describe(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    const char* name = strsignal(sig);
    return "was killed by signal " + std::to_string(sig) + (name ? std::string(" (") + name + ")" : "");
  }
  return "stopped with wait status " + std::to_string(status);
}

int code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

// Stops every child still running with its process group: SIGTERM, then SIGKILL after `grace_s`;
// reaps them all.
void stop_all(std::vector<pid_t>& pids, std::vector<bool>& running, double grace_s) {
  for (std::size_t r = 0; r < pids.size(); ++r) {
    if (running[r]) kill(-pids[r], SIGTERM);
  }
  const auto until = Clock::now() + std::chrono::duration<double>(grace_s);
  for (;;) {
    bool any = false;
    for (std::size_t r = 0; r < pids.size(); ++r) {
      if (!running[r]) continue;
      int status = 0;
      if (waitpid(pids[r], &status, WNOHANG) == pids[r]) {
        running[r] = false;
      } else {
        any = true;
      }
    }
    if (!any) return;
    if (Clock::now() >= until) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (std::size_t r = 0; r < pids.size(); ++r) {
    if (!running[r]) continue;
    kill(-pids[r], SIGKILL);
    int status = 0;
    waitpid(pids[r], &status, 0);
    running[r] = false;
  }
}

}  // namespace

std::string last_line_of(const std::string& path, std::size_t max_chars) {
  std::ifstream in(path);
  std::string line, last;
  while (std::getline(in, line)) {
    if (line.find_first_not_of(" \t\r") != std::string::npos) last = line;
  }
  if (last.size() > max_chars) last = "…" + last.substr(last.size() - max_chars);
  return last;
}

std::string self_executable() {
  char buf[PATH_MAX];
  const auto n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) throw std::runtime_error("cannot read /proc/self/exe");
  return std::string(buf, static_cast<std::size_t>(n));
}

LaunchResult run_ranks(const std::vector<std::vector<std::string>>& argv, const LaunchOptions& o) {
  const std::size_t P = argv.size();
  LaunchResult result;
  result.exit_status.assign(P, -1);
  std::vector<pid_t> pids;
  std::vector<bool> running;
  for (std::size_t r = 0; r < P; ++r) {
    try {
      pids.push_back(spawn(argv[r], r < o.log_paths.size() ? o.log_paths[r] : std::string()));
      running.push_back(true);
    } catch (...) {
      stop_all(pids, running, o.grace_s);
      throw;
    }
  }
  result.pids.assign(pids.begin(), pids.end());
  const auto start = Clock::now();
  std::size_t left = P;
  struct Failure {
    std::size_t rank;
    int status;
  };
  std::vector<Failure> failures;
  auto reap = [&] {
    for (std::size_t r = 0; r < P; ++r) {
      if (!running[r]) continue;
      int status = 0;
      if (waitpid(pids[r], &status, WNOHANG) != pids[r]) continue;
      running[r] = false;
      --left;
      result.exit_status[r] = code_of(status);
      if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0)) failures.push_back({r, status});
    }
  };
  while (left > 0) {
    reap();
    if (!failures.empty()) {
      const auto settle_until = Clock::now() + std::chrono::duration<double>(o.settle_s);
      while (left > 0 && Clock::now() < settle_until) {
        std::this_thread::sleep_for(std::chrono::duration<double>(o.poll_interval_s));
        reap();
      }
      const bool others = left > 0;
      stop_all(pids, running, o.grace_s);
      auto last_of = [&](std::size_t r) { return r < o.log_paths.size() ? last_line_of(o.log_paths[r]) : std::string(); };
      Failure first = failures.front();
      if (!o.secondary_failure_marker.empty()) {
        for (const auto& f : failures) {
          if (last_of(f.rank).find(o.secondary_failure_marker) == std::string::npos) {
            first = f;
            break;
          }
        }
      }
      std::string msg = "rank " + std::to_string(first.rank) + " " + describe(first.status);
      const auto last = last_of(first.rank);
      if (!last.empty()) msg += " (its last output: " + last + ")";
      result.message = msg + (others || failures.size() > 1 ? "; the other ranks were stopped" : "");
      return result;
    }
    if (left == 0) break;
    if (o.poll) o.poll();
    if (o.deadline_s > 0 && std::chrono::duration<double>(Clock::now() - start).count() > o.deadline_s) {
      stop_all(pids, running, o.grace_s);
      char buf[64];
      std::snprintf(buf, sizeof(buf), "%g", o.deadline_s);
      result.message = "the ranks did not finish within the deadline of " + std::string(buf) + " s; they were stopped";
      return result;
    }
    std::this_thread::sleep_for(std::chrono::duration<double>(o.poll_interval_s));
  }
  if (o.poll) o.poll();
  result.ok = true;
  return result;
}

}  // namespace oom::backend::dist
