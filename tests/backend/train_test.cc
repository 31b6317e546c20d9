// backend/train.h and `oom train`: bit-exact resume, --json output, the reference trainer,
// learning on the shipped corpus, and clear errors for bad checkpoints with nothing overwritten.
#include "backend/train.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <nlohmann/json.hpp>

#include "backend/checkpoint.h"
#include "backend/threads.h"
#include "cli/cli.h"
#include "costmodel/input_error.h"

namespace oom::backend {
namespace {

namespace fs = std::filesystem;

fs::path temp_dir(const std::string& name) {
  auto d = fs::temp_directory_path() / ("oom_train_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  return d;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

TrainOptions small(int steps) {
  TrainOptions o;
  o.steps = steps;
  o.seq = 24;
  o.batch = 2;
  o.lr = 3e-3;
  o.seed = 9;
  o.gdn_chunk_tokens = 8;
  return o;
}

// The BLAS pool follows the thread count: a one-thread run keeps its GEMMs on one thread.
TEST(ComputeThreads, SizeLibTorchAndTheBlasPoolTogether) {
  const int torch_before = at::get_num_threads();
  const int blas_before = blas_threads();
  set_compute_threads(2);
  EXPECT_EQ(at::get_num_threads(), 2);
  EXPECT_TRUE(blas_threads() == 0 || blas_threads() == 2) << blas_threads();
  set_compute_threads(1);
  EXPECT_EQ(at::get_num_threads(), 1);
  EXPECT_TRUE(blas_threads() == 0 || blas_threads() == 1) << blas_threads();
  set_compute_threads(0);  // leaves both as they are
  EXPECT_EQ(at::get_num_threads(), 1);
  if (blas_before > 0) set_compute_threads(blas_before);
  at::set_num_threads(torch_before);
}

TEST(Train, ResumedRunRepeatsTheUninterruptedLossesBitForBit) {
  const auto dir = temp_dir("resume");
  const auto whole = train(small(6));
  ASSERT_EQ(whole.losses.size(), 6u);

  TrainOptions first = small(3);
  first.checkpoint_dir = dir.string();
  const auto a = train(first);
  TrainOptions second = small(3);
  second.resume_dir = dir.string();
  const auto b = train(second);
  EXPECT_EQ(b.first_step, 4);
  EXPECT_EQ(b.last_step, 6);
  std::vector<double> joined = a.losses;
  joined.insert(joined.end(), b.losses.begin(), b.losses.end());
  for (std::size_t i = 0; i < 6; ++i) EXPECT_EQ(joined[i], whole.losses[i]) << "step " << i + 1;
}

TEST(Train, LossFallsOnTheShippedCorpus) {
  TrainOptions o = small(24);
  o.lr = 1e-2;
  const auto r = train(o);
  const double head = (r.losses[0] + r.losses[1] + r.losses[2]) / 3;
  const double tail = (r.losses[21] + r.losses[22] + r.losses[23]) / 3;
  EXPECT_LT(tail, head - 0.5);
  EXPECT_GT(r.tokens_per_s, 0.0);
}

TEST(Train, ReferenceTrainerAgreesWithStreamedOnTheSameRun) {
  TrainOptions o = small(3);
  const auto s = train(o);
  o.reference = true;
  const auto r = train(o);
  ASSERT_EQ(r.losses.size(), 3u);
  EXPECT_EQ(r.trainer, "reference");
  for (std::size_t i = 0; i < 3; ++i) EXPECT_NEAR(s.losses[i], r.losses[i], 1e-5 * r.losses[i]);
}

TEST(Train, BadOptionsAndMismatchedResumeAreInputErrors) {
  TrainOptions o = small(1);
  o.seq = 1;
  EXPECT_THROW(train(o), InputError);
  o = small(1);
  o.data = "/nonexistent/corpus.txt";
  EXPECT_THROW(train(o), InputError);
  const auto dir = temp_dir("mismatch");
  o = small(1);
  o.checkpoint_dir = dir.string();
  train(o);
  o = small(1);
  o.seq = 32;
  o.resume_dir = dir.string();
  try {
    train(o);
    FAIL() << "resumed with another sequence length";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("run.seq"), std::string::npos) << e.what();
  }
}

int oom(const std::vector<std::string>& args, std::string* out, std::string* err) {
  std::ostringstream o, e;
  const int rc = cli::run(args, {o, e});
  *out = o.str();
  *err = e.str();
  return rc;
}

TEST(OomTrain, JsonEndsWithLossesAndTokensPerSecondAndStepLinesGoToStderr) {
  std::string out, err;
  ASSERT_EQ(oom({"train", "--model", "tiny-moe", "--steps", "2", "--seq", "16", "--batch", "1", "--json"}, &out, &err), 0) << err;
  const auto j = nlohmann::json::parse(out);
  ASSERT_EQ(j["losses"].size(), 2u);
  EXPECT_GT(j["tokens_per_s"].get<double>(), 0.0);
  EXPECT_EQ(j["trainer"], "streamed");
  EXPECT_NE(err.find("step     2"), std::string::npos) << err;
  EXPECT_NE(err.find("100%"), std::string::npos) << err;

  ASSERT_EQ(oom({"train", "--steps", "1", "--seq", "16", "--batch", "1", "--reference"}, &out, &err), 0) << err;
  EXPECT_NE(out.find("loss"), std::string::npos);
  EXPECT_NE(out.find("reference trainer"), std::string::npos);
}

// The compute device is an option, not a build accident: a bad name, or cuda where LibTorch sees
// no GPU, is one line naming --device and exit 2 before any work.
TEST(OomTrain, DeviceIsCheckedBeforeAnyWork) {
  std::string out, err;
  EXPECT_EQ(oom({"train", "--device", "tpu", "--steps", "1"}, &out, &err), 2);
  EXPECT_NE(err.find("--device"), std::string::npos) << err;
  EXPECT_EQ(resolve_device("cpu"), "cpu");
  if (!at::hasCUDA()) {
    EXPECT_EQ(resolve_device("auto"), "cpu");
    EXPECT_EQ(oom({"train", "--device", "cuda", "--steps", "1", "--seq", "16", "--batch", "1"}, &out, &err), 2);
    EXPECT_NE(err.find("--device"), std::string::npos) << err;
    EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
    EXPECT_EQ(oom({"train", "--ranks", "2", "--device", "cuda", "--steps", "1", "--seq", "16", "--batch", "2"}, &out, &err), 2);
    EXPECT_NE(err.find("--device"), std::string::npos) << err;
  }
}

TEST(OomTrain, CorruptCheckpointIsOneErrorAndNothingIsOverwritten) {
  const auto dir = temp_dir("cli_corrupt");
  std::string out, err;
  ASSERT_EQ(oom({"train", "--steps", "1", "--seq", "16", "--batch", "1", "--checkpoint", dir.string()}, &out, &err), 0) << err;
  const auto file = fs::path(checkpoint_file(dir.string()));
  std::string bytes = slurp(file);
  bytes[bytes.size() / 2] ^= 0x01;
  std::ofstream(file, std::ios::binary | std::ios::trunc) << bytes;
  EXPECT_EQ(oom({"train", "--steps", "1", "--seq", "16", "--batch", "1", "--resume", dir.string(), "--checkpoint",
                 dir.string()}, &out, &err), cli::kExitBadInput);
  EXPECT_NE(err.find("error: "), std::string::npos);
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
  EXPECT_EQ(slurp(file), bytes);  // untouched
  EXPECT_EQ(oom({"train", "--model", "no-such-model", "--steps", "1"}, &out, &err), cli::kExitBadInput);
}

}  // namespace
}  // namespace oom::backend
