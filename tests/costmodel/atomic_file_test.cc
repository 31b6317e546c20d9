// write_file_atomically: content lands whole, replaces the old file, leaves no temporary files;
// follows a link to write its target beside it, refuses what is not a regular file.
#include "costmodel/atomic_file.h"

#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "costmodel/input_error.h"

namespace oom {
namespace {

std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(AtomicFile, WritesReplacesAndLeavesNoTemporaries) {
  const auto dir = std::filesystem::temp_directory_path() / "oom_atomic_file_test";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const auto target = dir / "out.json";
  write_file_atomically(target.string(), "first");
  EXPECT_EQ(slurp(target), "first");
  write_file_atomically(target.string(), std::string(1 << 20, 'x'));
  EXPECT_EQ(slurp(target).size(), 1u << 20);
  int entries = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir)) ++entries;
  EXPECT_EQ(entries, 1);
  std::filesystem::remove_all(dir);
}

TEST(AtomicFile, FailureNamesThePathAndCreatesNothing) {
  const std::string target = "/nonexistent-dir-oom/x.json";
  try {
    write_file_atomically(target, "data");
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(target), std::string::npos);
  }
  EXPECT_FALSE(std::filesystem::exists(target));
}

int entries(const std::filesystem::path& dir) {
  int n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir)) ++n;
  return n;
}

class AtomicFileLinks : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (std::filesystem::temp_directory_path() / "oom-atomic-links-XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    std::filesystem::create_directories(dir_ / "links");
    std::filesystem::create_directories(dir_ / "data");
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
};

// The target of a link in another folder is replaced, its temporary file beside it (same file
// system as the target, so the rename is atomic), and the link stays a link.
TEST_F(AtomicFileLinks, WritesTheTargetBesideItAndKeepsTheLink) {
  std::ofstream(dir_ / "data/out.json") << "old";
  std::filesystem::create_symlink("../data/out.json", dir_ / "links/out.json");
  write_file_atomically((dir_ / "links/out.json").string(), "new");
  EXPECT_TRUE(std::filesystem::is_symlink(dir_ / "links/out.json"));
  EXPECT_EQ(std::filesystem::read_symlink(dir_ / "links/out.json"), "../data/out.json");
  EXPECT_EQ(slurp(dir_ / "data/out.json"), "new");
  EXPECT_EQ(entries(dir_ / "links"), 1);
  EXPECT_EQ(entries(dir_ / "data"), 1);
}

TEST_F(AtomicFileLinks, AChainOfLinksAndADanglingLinkWriteTheirTarget) {
  std::filesystem::create_symlink(dir_ / "data/new.json", dir_ / "links/b");
  std::filesystem::create_symlink("b", dir_ / "links/a");
  write_file_atomically((dir_ / "links/a").string(), "created");
  EXPECT_TRUE(std::filesystem::is_symlink(dir_ / "links/a"));
  EXPECT_TRUE(std::filesystem::is_symlink(dir_ / "links/b"));
  EXPECT_EQ(slurp(dir_ / "data/new.json"), "created");
  EXPECT_EQ(entries(dir_ / "data"), 1);
}

TEST_F(AtomicFileLinks, RefusesAFifoADirectoryAndALinkIntoProc) {
  const auto fifo = dir_ / "data/fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  std::filesystem::create_symlink(fifo, dir_ / "links/to-fifo");
  for (const auto& p : {fifo, dir_ / "links/to-fifo", dir_ / "links"}) {
    try {
      write_file_atomically(p.string(), "x");
      ADD_FAILURE() << p << " was replaced";
    } catch (const InputError& e) {
      EXPECT_EQ(std::string(e.what()).rfind(p.string() + ": ", 0), 0u) << e.what();
      EXPECT_NE(std::string(e.what()).find("not a regular file"), std::string::npos) << e.what();
    }
  }
  EXPECT_TRUE(std::filesystem::is_fifo(std::filesystem::symlink_status(fifo)));
  EXPECT_TRUE(std::filesystem::is_symlink(dir_ / "links/to-fifo"));
  EXPECT_TRUE(std::filesystem::is_directory(dir_ / "links"));
  // A link to this process's standard output, as /dev/stdout is.
  std::filesystem::create_symlink("/proc/self/fd/1", dir_ / "links/stdout");
  EXPECT_THROW(write_file_atomically((dir_ / "links/stdout").string(), "x"), InputError);
  EXPECT_TRUE(std::filesystem::is_symlink(dir_ / "links/stdout"));
  EXPECT_EQ(entries(dir_ / "data"), 1);
}

}  // namespace
}  // namespace oom
