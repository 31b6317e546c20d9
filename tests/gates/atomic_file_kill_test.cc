// Crash-safe output (costmodel/atomic_file.h): a writer killed mid-write leaves the old file.
//
// A forked child writes a large payload with write_file_atomically(); the parent watches the
// folder until the child's temporary file holds part of the payload and SIGKILLs the child.
// Cleanup semantics under test: the destination keeps its old content byte for byte; the only
// thing a killed writer can leave is its own temporary file, which is hidden (".NAME.tmp-XXXXXX"
// in the destination's folder), never matches the destination's name or a glob of visible files,
// and is not swept by later writes (it could belong to a live writer); a writer that fails
// rather than dies removes its temporary file itself; the next write replaces the destination.
#include <sys/resource.h>
#include <sys/wait.h>
#include <signal.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "costmodel/atomic_file.h"

namespace fs = std::filesystem;

namespace {

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

class AtomicFileKill : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::path(::testing::TempDir()) / "oom-atomic-XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    target_ = dir_ / "plan.json";
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Entries of the folder other than the destination.
  std::vector<std::string> others() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(dir_)) {
      if (e.path() != target_) out.push_back(e.path().filename().string());
    }
    return out;
  }

  fs::path dir_;
  fs::path target_;
};

constexpr std::size_t kPayloadBytes = std::size_t{96} << 20;  // 96 MiB: a write that takes a while

TEST_F(AtomicFileKill, KilledWriterLeavesOldFileIntact) {
  const std::string old_content = "{\"version\": 1, \"notes\": \"the old plan\"}\n";
  oom::write_file_atomically(target_.string(), old_content);
  ASSERT_EQ(read_file(target_), old_content);
  const std::regex temp_name("\\.plan\\.json\\.tmp-[A-Za-z0-9]{6}");

  // The kill must land after the child created its temporary file and before its rename; a
  // child that wins the race finishes the write, and the attempt is repeated.
  bool killed_mid_write = false;
  for (int attempt = 0; attempt < 8 && !killed_mid_write; ++attempt) {
    oom::write_file_atomically(target_.string(), old_content);
    for (const auto& f : others()) fs::remove(dir_ / f);
    int ready[2];
    ASSERT_EQ(::pipe(ready), 0);
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::close(ready[0]);
      const std::string payload(kPayloadBytes, 'x');
      (void)!::write(ready[1], "r", 1);  // the payload is built; the write starts now
      oom::write_file_atomically(target_.string(), payload);
      ::_exit(0);
    }
    ::close(ready[1]);
    char byte = 0;
    ASSERT_EQ(::read(ready[0], &byte, 1), 1);
    ::close(ready[0]);
    std::uintmax_t partial = 0;
    // Poll (busy) until a temporary file with part of the payload appears, or the child exits.
    while (true) {
      for (const auto& f : others()) {
        std::error_code ec;
        const auto size = fs::file_size(dir_ / f, ec);
        if (!ec && size > 0 && size < kPayloadBytes) partial = size;
      }
      if (partial > 0) {
        ::kill(pid, SIGKILL);
        break;
      }
      int status = 0;
      if (::waitpid(pid, &status, WNOHANG) == pid) {
        ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        break;  // the writer finished before we saw it; try again
      }
    }
    if (partial == 0) continue;
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "the writer ended before the kill";
    killed_mid_write = true;

    // The destination still holds the old content, byte for byte.
    EXPECT_EQ(read_file(target_), old_content);
    // What the killed writer left: at most its hidden temporary file, holding a partial payload.
    const auto left = others();
    ASSERT_LE(left.size(), 1u);
    for (const auto& f : left) {
      EXPECT_TRUE(std::regex_match(f, temp_name)) << f;
      EXPECT_EQ(f[0], '.') << f;
      EXPECT_LT(fs::file_size(dir_ / f), kPayloadBytes);
    }
    // No visible file but the destination: globs like *.json see only the old plan.
    for (const auto& e : fs::directory_iterator(dir_)) {
      const std::string name = e.path().filename().string();
      if (name[0] != '.') {
        EXPECT_EQ(e.path(), target_);
      }
    }

    // The next write replaces the destination and leaves no temporary file of its own; the
    // killed writer's leftover stays as it was.
    oom::write_file_atomically(target_.string(), "new\n");
    EXPECT_EQ(read_file(target_), "new\n");
    EXPECT_EQ(others(), left);
  }
  EXPECT_TRUE(killed_mid_write) << "no attempt caught the writer between its first byte and its rename";
}

TEST_F(AtomicFileKill, FailingWriterRemovesItsTemporaryFile) {
  const std::string old_content = "old\n";
  oom::write_file_atomically(target_.string(), old_content);
  // A child limited to 1 MiB files fails its write with EFBIG (SIGXFSZ ignored) and must throw,
  // remove its temporary file and leave the destination alone.
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    std::signal(SIGXFSZ, SIG_IGN);
    const rlimit limit{1 << 20, 1 << 20};
    ::setrlimit(RLIMIT_FSIZE, &limit);
    try {
      oom::write_file_atomically(target_.string(), std::string(std::size_t{4} << 20, 'y'));
    } catch (const std::runtime_error&) {
      ::_exit(0);  // failed as it should
    }
    ::_exit(1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "write_file_atomically did not report the failed write";
  EXPECT_EQ(read_file(target_), old_content);
  EXPECT_TRUE(others().empty());
}

TEST_F(AtomicFileKill, FinishedWriterLeavesOnlyTheDestination) {
  oom::write_file_atomically(target_.string(), "a\n");
  oom::write_file_atomically(target_.string(), std::string(std::size_t{1} << 20, 'z'));
  EXPECT_EQ(fs::file_size(target_), std::size_t{1} << 20);
  EXPECT_TRUE(others().empty());
}

}  // namespace
