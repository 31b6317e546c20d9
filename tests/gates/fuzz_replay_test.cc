// Replays every fuzz target's seed corpus and its regression inputs (tests/fuzz/targets.txt,
// tests/fuzz/regressions/NAME/) through the target's entry, so the normal and sanitizer builds
// check in seconds what scripts/fuzz.sh checks for minutes. A crash, an escaping exception other
// than InputError or a broken check in an entry aborts this test.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/fuzz/fuzz_support.h"

namespace fs = std::filesystem;

namespace {

struct TargetLine {
  std::string name;
  std::vector<std::string> seeds;  // relative to the source root
};

std::vector<TargetLine> read_manifest() {
  std::ifstream in(std::string(OOM_SOURCE_DIR) + "/tests/fuzz/targets.txt");
  std::vector<TargetLine> out;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream words(line);
    TargetLine t;
    words >> t.name;
    for (std::string s; words >> s;) t.seeds.push_back(s);
    out.push_back(t);
  }
  return out;
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The inputs of one seed path: each regular file below it, and each line of a .jsonl file.
void collect(const fs::path& path, std::vector<std::pair<std::string, std::string>>& inputs) {
  std::vector<fs::path> files;
  if (fs::is_directory(path)) {
    for (const auto& e : fs::recursive_directory_iterator(path)) {
      if (e.is_regular_file()) files.push_back(e.path());
    }
  } else if (fs::is_regular_file(path)) {
    files.push_back(path);
  }
  std::sort(files.begin(), files.end());
  for (const auto& f : files) {
    const std::string text = read_file(f);
    inputs.emplace_back(f.string(), text);
    if (f.extension() == ".jsonl") {
      std::istringstream lines(text);
      int n = 0;
      for (std::string line; std::getline(lines, line);) inputs.emplace_back(f.string() + ":" + std::to_string(++n), line);
    }
  }
}

void PrintTo(const TargetLine& t, std::ostream* os) { *os << t.name; }

class FuzzReplay : public ::testing::TestWithParam<TargetLine> {};

TEST_P(FuzzReplay, SeedsAndRegressionsRunClean) {
  const TargetLine& t = GetParam();
  const auto it = oom::fuzz::targets().find(t.name);
  ASSERT_NE(it, oom::fuzz::targets().end()) << "tests/fuzz/targets.txt names " << t.name
                                            << " but no OOM_FUZZ_TARGET(" << t.name << ") is linked";
  std::vector<std::pair<std::string, std::string>> inputs;
  for (const auto& s : t.seeds) {
    const fs::path p = fs::path(OOM_SOURCE_DIR) / s;
    ASSERT_TRUE(fs::exists(p)) << "seed path " << s << " of fuzz target " << t.name << " is missing";
    collect(p, inputs);
  }
  const std::size_t seeds = inputs.size();
  collect(fs::path(OOM_SOURCE_DIR) / "tests/fuzz/regressions" / t.name, inputs);
  ASSERT_GT(seeds, 0u) << "no seed inputs for fuzz target " << t.name;
  for (const auto& [origin, text] : inputs) {
    SCOPED_TRACE(origin);
    it->second(text);
  }
  RecordProperty("inputs", static_cast<int>(inputs.size()));
}

INSTANTIATE_TEST_SUITE_P(Targets, FuzzReplay, ::testing::ValuesIn(read_manifest()),
                         [](const ::testing::TestParamInfo<TargetLine>& info) { return info.param.name; });

TEST(FuzzReplayManifest, NamesEveryLinkedTarget) {
  std::set<std::string> listed;
  for (const auto& t : read_manifest()) listed.insert(t.name);
  EXPECT_GE(listed.size(), 5u);
  for (const auto& [name, entry] : oom::fuzz::targets()) EXPECT_TRUE(listed.count(name)) << name << " is not in targets.txt";
}

}  // namespace
