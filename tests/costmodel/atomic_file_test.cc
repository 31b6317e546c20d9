// write_file_atomically: content lands whole, replaces the old file, leaves no temporary files.
#include "costmodel/atomic_file.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace oom
