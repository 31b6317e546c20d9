// Output files of the `oom` command against the file system (costmodel/output_path.h): a link is
// followed and its target written, the link kept; anything that exists and is not a regular file
// (FIFO, directory, character device, an open file of /proc such as /dev/stdout) is refused; an
// output that is an input, or that cannot be written, is refused before the work starts; two
// studies of one name in `report-paper --studies` are refused. Each refusal: exit 2, one line on
// stderr naming the path, nothing on stdout, nothing written, the file system as it was.
//
// The commands run in-process (cli::run). No test writes to a real device node: a FIFO stands for
// one, and `-o /dev/null` only checks the refusal and that /dev/null is still a character device.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cli/cli.h"

namespace fs = std::filesystem;

namespace {

const std::string kSrc = OOM_SOURCE_DIR;
const std::string kWorkload = kSrc + "/experiments/default/workload.json";
const std::string kPlan = kSrc + "/experiments/default/plan-r23.json";
const std::string kSmallStudy = kSrc + "/tests/study/data/small-study.json";

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void write(const fs::path& p, const std::string& text) { std::ofstream(p, std::ios::binary) << text; }

struct Result {
  int code = 0;
  std::string out, err;
};

Result oom(const std::vector<std::string>& args) {
  std::ostringstream out, err;
  Result r;
  r.code = oom::cli::run(args, {out, err});
  r.out = out.str();
  r.err = err.str();
  return r;
}

// Every entry under `dir`, with its type, so that a refusal can be checked to change nothing.
std::set<std::string> tree(const fs::path& dir) {
  std::set<std::string> names;
  for (auto it = fs::recursive_directory_iterator(dir); it != fs::recursive_directory_iterator(); ++it) {
    names.insert(it->path().lexically_relative(dir).string() + ":" + std::to_string(static_cast<int>(it->symlink_status().type())));
  }
  return names;
}

class OutputPath : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::path(::testing::TempDir()) / "oom-output-path-XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // The command is refused: exit 2, one "error: PATH: ..." line naming `named` (and `word`), no
  // output, the folder as it was.
  void expect_refused(const std::vector<std::string>& args, const std::string& named, const std::string& word) {
    const auto before = tree(dir_);
    const Result r = oom(args);
    EXPECT_EQ(r.code, oom::cli::kExitBadInput) << r.err;
    EXPECT_EQ(r.out, "");
    ASSERT_FALSE(r.err.empty());
    EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << "more than one line (did the work start?): " << r.err;
    EXPECT_EQ(r.err.rfind("error: " + named + ": ", 0), 0u) << r.err;
    EXPECT_NE(r.err.find(word), std::string::npos) << r.err;
    EXPECT_EQ(tree(dir_), before);
  }

  std::vector<std::string> memory_to(const std::string& output) const {
    return {"memory", "--workload", kWorkload, "--plan", kPlan, "-o", output};
  }

  fs::path dir_;
};

TEST_F(OutputPath, ALinkIsFollowedItsTargetWrittenAndTheLinkKept) {
  fs::create_directory(path("real"));
  write(path("real/report.txt"), "old\n");
  fs::create_symlink("real/report.txt", path("link.txt"));
  const Result r = oom(memory_to(path("link.txt")));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(fs::is_symlink(path("link.txt")));
  EXPECT_EQ(fs::read_symlink(path("link.txt")), "real/report.txt");
  EXPECT_NE(read_file(path("real/report.txt")).find("Eq. 2"), std::string::npos) << read_file(path("real/report.txt"));
  // No temporary file left beside the link or the target.
  EXPECT_EQ(tree(dir_), (std::set<std::string>{"link.txt:" + std::to_string(static_cast<int>(fs::file_type::symlink)),
                                               "real:" + std::to_string(static_cast<int>(fs::file_type::directory)),
                                               "real/report.txt:" + std::to_string(static_cast<int>(fs::file_type::regular))}));
}

TEST_F(OutputPath, AChainOfLinksAndADanglingLinkWriteTheirTargets) {
  write(path("target.json"), "old\n");
  fs::create_symlink("target.json", path("b"));
  fs::create_symlink(path("b"), path("a"));
  ASSERT_EQ(oom({"simulate", "--workload", kWorkload, "--plan", kPlan, "--trace", path("a"), "-o", path("report.txt")}).code, 0);
  EXPECT_TRUE(fs::is_symlink(path("a")));
  EXPECT_TRUE(fs::is_symlink(path("b")));
  EXPECT_TRUE(nlohmann::json::parse(read_file(path("target.json"))).contains("traceEvents"));

  // A link whose target does not exist yet: the target is created, the link kept.
  fs::create_symlink("new.txt", path("dangling"));
  ASSERT_EQ(oom(memory_to(path("dangling"))).code, 0);
  EXPECT_TRUE(fs::is_symlink(path("dangling")));
  EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(path("new.txt"))));
  EXPECT_FALSE(read_file(path("new.txt")).empty());
}

TEST_F(OutputPath, ADanglingLinkIntoAMissingFolderOrALoopIsRefused) {
  fs::create_symlink("missing/new.txt", path("dangling"));
  expect_refused(memory_to(path("dangling")), path("dangling"), "does not exist");
  fs::create_symlink("loop2", path("loop1"));
  fs::create_symlink("loop1", path("loop2"));
  expect_refused(memory_to(path("loop1")), path("loop1"), "symbolic links");
}

TEST_F(OutputPath, AFifoOrADirectoryIsRefusedAndLeftAsItWas) {
  ASSERT_EQ(::mkfifo(path("fifo").c_str(), 0644), 0);
  expect_refused(memory_to(path("fifo")), path("fifo"), "a FIFO");
  EXPECT_TRUE(fs::is_fifo(fs::symlink_status(path("fifo"))));
  // Through a link, and as the trace of `simulate`: refused before the simulation.
  fs::create_symlink("fifo", path("to-fifo"));
  expect_refused({"simulate", "--workload", kWorkload, "--plan", kPlan, "--trace", path("to-fifo")}, path("to-fifo"), "a FIFO");
  EXPECT_TRUE(fs::is_fifo(fs::symlink_status(path("fifo"))));

  fs::create_directory(path("folder"));
  expect_refused(memory_to(path("folder")), path("folder"), "a directory");
  EXPECT_TRUE(fs::is_directory(path("folder")));
}

TEST_F(OutputPath, DevNullAndDevStdoutAreRefusedStandardOutputIsDash) {
  expect_refused(memory_to("/dev/null"), "/dev/null", "a character device");
  struct stat st{};
  ASSERT_EQ(::stat("/dev/null", &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode)) << "/dev/null is no longer a character device";

  expect_refused({"simulate", "--workload", kWorkload, "--plan", kPlan, "--trace", "/dev/stdout"}, "/dev/stdout", "standard output as -");
  EXPECT_TRUE(fs::is_symlink("/dev/stdout") || fs::is_character_file("/dev/stdout"));
  // A link of our own to this process's standard output, as /dev/stdout is.
  fs::create_symlink("/proc/self/fd/1", path("stdout"));
  expect_refused(memory_to(path("stdout")), path("stdout"), "open file");
  EXPECT_TRUE(fs::is_symlink(path("stdout")));

  const Result r = oom({"memory", "--workload", kWorkload, "--plan", kPlan, "-o", "-"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("Eq. 2"), std::string::npos);
}

TEST_F(OutputPath, AnOutputThatIsAnInputIsRefusedBeforeAnyWork) {
  const std::string workload = read_file(kWorkload), plan = read_file(kPlan);
  write(path("w.json"), workload);
  write(path("p.json"), plan);
  expect_refused({"memory", "--workload", path("w.json"), "--plan", path("p.json"), "-o", path("w.json")}, path("w.json"), "input");
  expect_refused({"plan", "--workload", path("w.json"), "-o", path("w.json")}, path("w.json"), "input");
  // The same file under another name: through a link, a hard link, a path with "..".
  fs::create_symlink("p.json", path("plan-link.json"));
  expect_refused({"simulate", "--workload", path("w.json"), "--plan", path("p.json"), "--trace", path("plan-link.json")},
                 path("plan-link.json"), "input");
  fs::create_hard_link(path("w.json"), path("hard.json"));
  expect_refused({"report", "--workload", path("w.json"), "-o", path("hard.json")}, path("hard.json"), "input");
  fs::create_directory(path("sub"));
  expect_refused({"memory", "--workload", path("w.json"), "--plan", path("p.json"), "-o", path("sub/../p.json")}, path("sub/../p.json"),
                 "input");
  // Two outputs of one command that are one file.
  expect_refused({"simulate", "--workload", kWorkload, "--plan", kPlan, "--trace", path("x.json"), "-o", path("x.json")},
                 path("x.json"), "another output");
  EXPECT_EQ(read_file(path("w.json")), workload);
  EXPECT_EQ(read_file(path("p.json")), plan);

  // The recorded measurements of `calibrate` and `validate` stay as they were.
  const std::string records = read_file(kSrc + "/traces/paper/paper-calibration.jsonl");
  write(path("r.jsonl"), records);
  expect_refused({"calibrate", "--records", path("r.jsonl"), "--hardware", "h100-sxm-node", "-o", path("r.jsonl")}, path("r.jsonl"),
                 "input");
  expect_refused({"validate", path("r.jsonl"), "-o", path("r.jsonl")}, path("r.jsonl"), "input");
  EXPECT_EQ(read_file(path("r.jsonl")), records);
  // The hardware file a calibration is fitted to, named by its name in the configs folder.
  fs::create_directories(path("configs/hardware"));
  fs::copy_file(kSrc + "/configs/hardware/h100-sxm-node.json", path("configs/hardware/h100-sxm-node.json"));
  const std::string config_dir = std::getenv("OOM_CONFIG_DIR") != nullptr ? std::getenv("OOM_CONFIG_DIR") : "";
  ::setenv("OOM_CONFIG_DIR", path("configs").c_str(), 1);
  expect_refused({"calibrate", "--records", path("r.jsonl"), "--hardware", "h100-sxm-node", "-o", path("configs/hardware/h100-sxm-node.json")},
                 path("configs/hardware/h100-sxm-node.json"), "input");
  if (config_dir.empty()) {
    ::unsetenv("OOM_CONFIG_DIR");
  } else {
    ::setenv("OOM_CONFIG_DIR", config_dir.c_str(), 1);
  }

  // Traces compared by `diff`, and the CSV a plot is drawn from.
  write(path("trace.json"), R"({"traceEvents": []})");
  expect_refused({"diff", path("trace.json"), path("trace.json"), "-o", path("trace.json")}, path("trace.json"), "input");
  write(path("study.csv"), "sweep,x\n1,2\n");
  expect_refused({"plot", path("study.csv"), "--kind", "memory", "-o", path("study.csv")}, path("study.csv"), "input");
}

TEST_F(OutputPath, AnOutputFolderThatHoldsOrIsAnInputIsRefused) {
  write(path("study.json"), read_file(kSmallStudy));
  // The study would be overwritten by the study.json the command writes.
  expect_refused({"whatif", path("study.json"), "-o", dir_.string(), "--no-plots"}, dir_.string(), "holds");
  write(path("flat.json"), read_file(kSrc + "/experiments/flat-optimizer.json"));
  expect_refused({"ablation", path("flat.json"), "-o", dir_.string(), "--no-plots"}, dir_.string(), "holds");
  fs::create_directory(path("studies"));
  write(path("studies/s.json"), read_file(kSmallStudy));
  expect_refused({"report-paper", "--studies", path("studies"), "-o", path("studies"), "--no-plots"}, path("studies"), "input");
  expect_refused({"report-paper", "--studies", path("studies"), "-o", dir_.string(), "--no-plots"}, dir_.string(), "holds");
}

TEST_F(OutputPath, AnUnwritableOutputIsFoundBeforeTheWork) {
  write(path("file.txt"), "a file, not a folder\n");
  // A path under a regular file, a missing folder (files are written into existing folders).
  expect_refused(memory_to(path("file.txt/report.txt")), path("file.txt/report.txt"), "file.txt");
  expect_refused(memory_to(path("missing/report.txt")), path("missing/report.txt"), "does not exist");
  // A study writes its folder, creating it: a file in its way, or /proc, stops it before the first case.
  expect_refused({"whatif", kSmallStudy, "-o", path("file.txt/out"), "--no-plots"}, path("file.txt/out"), "file.txt");
  expect_refused({"whatif", kSmallStudy, "-o", "/proc/oom-output-path-test", "--no-plots"}, "/proc/oom-output-path-test",
                 "cannot write");
  expect_refused({"ablation", kSrc + "/experiments/flat-optimizer.json", "-o", path("file.txt"), "--no-plots"}, path("file.txt"),
                 "not a folder");
  // A missing output folder of a study is created: its parent only must take a new file.
  const Result r = oom({"whatif", kSmallStudy, "-o", path("new/deeper/out"), "--no-plots", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(fs::is_regular_file(path("new/deeper/out/study.csv")));
}

TEST_F(OutputPath, TwoStudiesOfOneNameAreRefusedNamingBothFiles) {
  fs::create_directory(path("studies"));
  write(path("studies/a.json"), read_file(kSmallStudy));
  write(path("studies/b.json"), read_file(kSmallStudy));
  expect_refused({"report-paper", "--studies", path("studies"), "-o", path("out"), "--no-plots"}, path("studies/b.json"),
                 path("studies/a.json"));
  const Result r = oom({"report-paper", "--studies", path("studies"), "-o", path("out"), "--no-plots"});
  EXPECT_NE(r.err.find("\"small\""), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(path("out")));
}

}  // namespace
