// Launching and supervising rank processes.
//
// run_ranks starts one child process per rank (posix_spawn of a given argv, in a process group of
// its own; the environment is inherited), sends each child's stdout and stderr to its own log file, and waits for all of them
// while polling. A rank that exits with a non-zero status or dies of a signal makes the supervisor
// stop the others (after a short settle time: SIGTERM, then SIGKILL after a grace period) and report
// one message that names the rank that failed first on its own, its status and the last line of
// its log. An overall deadline does the same for a
// run that takes too long, so the caller never hangs. No LibTorch here: the `oom` command and the
// tests use it directly. Not thread-safe (reaps its own children with waitpid); POSIX only.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace oom::backend::dist {

struct LaunchOptions {
  double deadline_s = 0.0;           // 0 = no overall deadline
  double grace_s = 2.0;              // SIGTERM → SIGKILL
  double poll_interval_s = 0.02;
  std::vector<std::string> log_paths;  // per rank; empty = the child inherits stdout/stderr
  std::function<void()> poll;        // called on every poll tick (e.g. to forward progress)
  // After the first failure, how long the other ranks may take to exit by themselves before they
  // are stopped; ranks whose peer died usually fail within it too.
  double settle_s = 1.0;
  // A failure whose last log line contains this text is a consequence of another rank's failure
  // (e.g. "a peer rank died"): the message names the first failure without it when there is one.
  std::string secondary_failure_marker;
};

struct LaunchResult {
  bool ok = false;
  std::string message;            // empty when ok; otherwise why the run was stopped
  std::vector<int> exit_status;   // per rank: exit code, or 128 + signal, or -1 when it was stopped
  std::vector<int> pids;
};

// Runs argv[r] as rank r for every r and supervises them as above. Throws std::runtime_error only
// when a process cannot be started (the ones already started are stopped first).
LaunchResult run_ranks(const std::vector<std::vector<std::string>>& argv, const LaunchOptions& options);

// The last non-empty line of a text file ("" when unreadable), at most `max_chars` long.
std::string last_line_of(const std::string& path, std::size_t max_chars = 300);

// Path of the running executable (/proc/self/exe).
std::string self_executable();

}  // namespace oom::backend::dist
