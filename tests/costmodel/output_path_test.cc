// output_target, check_output_files and check_output_folder (costmodel/output_path.h): links
// followed, non-regular files refused, outputs that are inputs refused, unwritable folders found,
// and the checks themselves leave nothing behind.
#include "costmodel/output_path.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "costmodel/input_error.h"

namespace oom {
namespace {

namespace fs = std::filesystem;

class OutputPathCheck : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "oom-output-check-XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  void touch(const std::string& name) const { std::ofstream(dir_ / name) << "x"; }
  int entries() const {
    int n = 0;
    for ([[maybe_unused]] const auto& e : fs::recursive_directory_iterator(dir_)) ++n;
    return n;
  }
  // The InputError message of `f`, or "(accepted)".
  static std::string error_of(const std::function<void()>& f) {
    try {
      f();
    } catch (const InputError& e) {
      return e.what();
    }
    return "(accepted)";
  }
  fs::path dir_;
};

TEST_F(OutputPathCheck, OutputTargetFollowsLinksToTheirEnd) {
  EXPECT_EQ(output_target(path("plain.json")), path("plain.json"));
  touch("real.json");
  fs::create_symlink("real.json", path("one"));
  fs::create_symlink(path("one"), path("two"));
  EXPECT_EQ(fs::path(output_target(path("two"))).lexically_normal(), fs::path(path("real.json")));
  fs::create_symlink("not-yet.json", path("dangling"));
  EXPECT_EQ(output_target(path("dangling")), path("not-yet.json"));
  fs::create_symlink("loop-b", path("loop-a"));
  fs::create_symlink("loop-a", path("loop-b"));
  EXPECT_NE(error_of([&] { output_target(path("loop-a")); }).find("more than 40 symbolic links"), std::string::npos);
}

TEST_F(OutputPathCheck, OutputTargetRefusesDevicesFifosFoldersAndOpenFiles) {
  EXPECT_EQ(error_of([] { output_target("/dev/null"); }),
            "/dev/null: the output is a character device, not a regular file: refusing to replace it (standard output is -)");
  EXPECT_NE(error_of([] { output_target("/dev/stdout"); }).find("/dev/stdout: the output (a link to /proc/self/fd/1) names an open file"),
            std::string::npos);
  ASSERT_EQ(::mkfifo(path("fifo").c_str(), 0644), 0);
  EXPECT_NE(error_of([&] { output_target(path("fifo")); }).find("is a FIFO"), std::string::npos);
  EXPECT_NE(error_of([&] { output_target(dir_.string()); }).find("is a directory"), std::string::npos);
  // "-" is standard output: never checked.
  EXPECT_EQ(error_of([] { check_output_files({"-", ""}, {"-"}); }), "(accepted)");
}

TEST_F(OutputPathCheck, AnOutputThatIsAnInputOrAnotherOutputIsRefused) {
  touch("in.json");
  fs::create_symlink("in.json", path("link.json"));
  fs::create_hard_link(path("in.json"), path("hard.json"));
  fs::create_directory(path("sub"));
  for (const auto& out : {path("in.json"), path("link.json"), path("hard.json"), path("sub/../in.json")}) {
    EXPECT_NE(error_of([&] { check_output_files({out}, {"", path("in.json")}); }).find("is also an input of this command"),
              std::string::npos)
        << out;
  }
  // An input named by a relative path, and one that does not exist yet: the same path.
  const fs::path cwd = fs::current_path();
  fs::current_path(dir_);
  EXPECT_NE(error_of([&] { check_output_files({path("in.json")}, {"in.json"}); }).find("input"), std::string::npos);
  EXPECT_NE(error_of([&] { check_output_files({path("none.json")}, {"./sub/../none.json"}); }).find("input"), std::string::npos);
  fs::current_path(cwd);
  EXPECT_NE(error_of([&] { check_output_files({path("a.json"), path("sub/../a.json")}, {}); }).find("another output"),
            std::string::npos);
  EXPECT_EQ(error_of([&] { check_output_files({path("a.json"), path("b.json")}, {path("in.json")}); }), "(accepted)");
  EXPECT_EQ(entries(), 4);  // in.json, link.json, hard.json, sub: the checks write nothing
}

TEST_F(OutputPathCheck, AnUnwritableFolderIsFound) {
  touch("file");
  EXPECT_EQ(error_of([&] { check_output_files({path("file/out.json")}, {}); }),
            path("file/out.json") + ": cannot write the output: " + path("file") + " is a regular file, not a folder");
  EXPECT_EQ(error_of([&] { check_output_files({path("missing/out.json")}, {}); }),
            path("missing/out.json") + ": cannot write the output: folder " + path("missing") + " does not exist");
  // procfs takes no new file, even from root.
  EXPECT_NE(error_of([] { check_output_files({"/proc/oom-output-check"}, {}); }).find("cannot write the output in folder /proc"),
            std::string::npos);
  EXPECT_EQ(entries(), 1);
}

TEST_F(OutputPathCheck, AnOutputFolderMayBeMadeButNotHoldOrBeAnInput) {
  // A folder not there yet: its nearest existing ancestor takes files; nothing is created now.
  EXPECT_EQ(error_of([&] { check_output_folder(path("a/b/out"), {"study.csv", "fig/study.json"}, {}); }), "(accepted)");
  EXPECT_FALSE(fs::exists(path("a")));
  touch("study.json");
  EXPECT_NE(error_of([&] { check_output_folder(dir_.string(), {"study.csv"}, {path("study.json")}); }).find("holds"), std::string::npos);
  // An input inside a sub-folder the command writes into.
  fs::create_directory(path("fig"));
  touch("fig/s.json");
  EXPECT_NE(error_of([&] { check_output_folder(dir_.string(), {"fig/study.csv"}, {path("fig/s.json")}); }).find("holds"),
            std::string::npos);
  EXPECT_NE(error_of([&] { check_output_folder(path("fig"), {"x.csv"}, {path("fig")}); }).find("is also an input"), std::string::npos);
  // An input elsewhere is fine.
  EXPECT_EQ(error_of([&] { check_output_folder(path("out"), {"study.csv"}, {path("study.json"), path("fig/s.json")}); }), "(accepted)");
  // A file where the folder or one of its parents should be.
  EXPECT_NE(error_of([&] { check_output_folder(path("study.json"), {"x.csv"}, {}); }).find("not a folder"), std::string::npos);
  EXPECT_EQ(error_of([&] { check_output_folder(path("study.json/out/more"), {"x.csv"}, {}); }),
            path("study.json/out/more") + ": cannot write the output: " + path("study.json") + " is a regular file, not a folder");
  // A written file that is a FIFO.
  ASSERT_EQ(::mkfifo(path("fig/study.csv").c_str(), 0644), 0);
  EXPECT_NE(error_of([&] { check_output_folder(path("fig"), {"study.csv"}, {}); }).find("a FIFO"), std::string::npos);
  EXPECT_EQ(entries(), 4);  // study.json, fig, fig/s.json, fig/study.csv
}

}  // namespace
}  // namespace oom
