// backend/dist/launcher.h: rank supervision. A rank that fails or is killed stops the others at once
// with one message naming it; a deadline stops ranks that hang; nothing is left running.
#include "backend/dist/launcher.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>

#include <gtest/gtest.h>

namespace oom::backend::dist {
namespace {

namespace fs = std::filesystem;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::vector<std::string> sh(const std::string& script) { return {"/bin/sh", "-c", script}; }

// Per-rank log files in a folder removed at the end of the test.
struct Logs {
  fs::path dir;
  std::vector<std::string> paths;
  Logs(const std::string& tag, int n)
      : dir(fs::temp_directory_path() / ("oom-launcher-test-" + tag + "-" + std::to_string(getpid()))) {
    fs::create_directories(dir);
    for (int r = 0; r < n; ++r) paths.push_back((dir / ("rank-" + std::to_string(r) + ".log")).string());
  }
  ~Logs() { fs::remove_all(dir); }
};

bool alive(int pid) { return kill(pid, 0) == 0; }

TEST(RunRanks, AllRanksSucceeding) {
  const Logs logs("ok", 2);
  LaunchOptions o;
  o.log_paths = logs.paths;
  int polls = 0;
  o.poll = [&] { ++polls; };
  const auto r = run_ranks({sh("echo hello; exit 0"), sh("exit 0")}, o);
  EXPECT_TRUE(r.ok) << r.message;
  EXPECT_EQ(r.exit_status, (std::vector<int>{0, 0}));
  EXPECT_GE(polls, 1);
  EXPECT_EQ(last_line_of(o.log_paths[0]), "hello");
}

TEST(RunRanks, FailingRankStopsTheOthersWithItsLastOutput) {
  const Logs logs("fail", 3);
  LaunchOptions o;
  o.log_paths = logs.paths;
  const auto t0 = std::chrono::steady_clock::now();
  const auto r = run_ranks({sh("sleep 30"), sh("echo 'error: shard 3 is corrupt' >&2; exit 3"), sh("sleep 30")}, o);
  EXPECT_LT(seconds_since(t0), 10.0);
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.message.find("rank 1 exited with status 3"), std::string::npos) << r.message;
  EXPECT_NE(r.message.find("error: shard 3 is corrupt"), std::string::npos) << r.message;
  EXPECT_NE(r.message.find("the other ranks were stopped"), std::string::npos) << r.message;
  EXPECT_EQ(r.exit_status[1], 3);
  for (int pid : r.pids) EXPECT_FALSE(alive(pid)) << "pid " << pid << " left running";
}

TEST(RunRanks, FailureCausedByAPeerIsNotTheOneReported) {
  const Logs logs("peer", 2);
  LaunchOptions o;
  o.log_paths = logs.paths;
  o.secondary_failure_marker = "peer died";
  // Rank 1 fails first, but only because rank 0 (still tearing down) failed on its own.
  const auto r = run_ranks({sh("echo 'error: disk full' >&2; sleep 0.3; exit 4"),
                            sh("echo 'error: all-reduce failed: peer died' >&2; exit 1")}, o);
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.message.find("rank 0 exited with status 4 (its last output: error: disk full)"), std::string::npos)
      << r.message;
}

TEST(RunRanks, KilledRankIsNamedWithItsSignal) {
  LaunchOptions o;
  const auto r = run_ranks({sh("sleep 30"), sh("kill -9 $$")}, o);
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.message.find("rank 1 was killed by signal 9"), std::string::npos) << r.message;
  EXPECT_EQ(r.exit_status[1], 128 + 9);
}

TEST(RunRanks, DeadlineStopsRanksThatHang) {
  LaunchOptions o;
  o.deadline_s = 0.3;
  o.grace_s = 0.2;
  const auto t0 = std::chrono::steady_clock::now();
  // The second rank ignores SIGTERM: the supervisor must fall back to SIGKILL.
  const auto r = run_ranks({sh("sleep 30"), sh("trap '' TERM; sleep 30")}, o);
  EXPECT_LT(seconds_since(t0), 10.0);
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.message.find("deadline of 0.3 s"), std::string::npos) << r.message;
  for (int pid : r.pids) EXPECT_FALSE(alive(pid));
}

TEST(RunRanks, ProgramThatCannotStartThrows) {
  LaunchOptions o;
  EXPECT_THROW(run_ranks({sh("sleep 30"), {"/nonexistent/oom-worker"}}, o), std::runtime_error);
}

}  // namespace
}  // namespace oom::backend::dist
