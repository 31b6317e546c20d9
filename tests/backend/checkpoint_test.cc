// backend/train/checkpoint.h: full training state round trip; corrupt or mismatched files raise one
// InputError and leave the state untouched.
#include "backend/train/checkpoint.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "costmodel/input_error.h"

namespace oom::backend {
namespace {

namespace fs = std::filesystem;

fs::path temp_dir(const std::string& name) {
  auto d = fs::temp_directory_path() / ("oom_backend_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  return d;
}

std::string slurp(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(Checkpoint, RestoresMastersMomentsStepAndRunInfo) {
  const auto dir = temp_dir("ck");
  const ModelSpec spec = load_model_spec("tiny-moe");
  HostState a(spec);
  a.init_from_seed(1);
  a.exp_avg(2).normal_();
  a.exp_avg_sq(2).uniform_();
  a.step = 17;
  save_checkpoint(dir.string(), a, {{"batches_drawn", 5}});
  HostState b(spec);
  b.init_from_seed(2);
  const auto run = load_checkpoint(dir.string(), b);
  EXPECT_EQ(run["batches_drawn"], 5);
  EXPECT_EQ(b.step, 17);
  for (int i = 0; i < a.blocks(); ++i) {
    EXPECT_TRUE(at::equal(a.master(i), b.master(i)));
    EXPECT_TRUE(at::equal(a.exp_avg(i), b.exp_avg(i)));
    EXPECT_TRUE(at::equal(a.exp_avg_sq(i), b.exp_avg_sq(i)));
    EXPECT_TRUE(at::equal(b.working(i), b.master(i)));
  }
}

TEST(Checkpoint, CorruptTruncatedOrForeignFilesAreRejectedWithoutChangingState) {
  const auto dir = temp_dir("ck_bad");
  const ModelSpec spec = load_model_spec("tiny-moe");
  HostState a(spec);
  a.init_from_seed(1);
  save_checkpoint(dir.string(), a, nlohmann::json::object());
  const std::string file = checkpoint_file(dir.string());
  const std::string good = slurp(file);

  HostState b(spec);
  b.init_from_seed(2);
  const auto before = b.master(1).clone();
  auto expect_rejected = [&](const std::string& content, const std::string& field) {
    std::ofstream(file, std::ios::binary | std::ios::trunc) << content;
    try {
      load_checkpoint(dir.string(), b);
      ADD_FAILURE() << "accepted a bad checkpoint (" << field << ")";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
    EXPECT_TRUE(at::equal(b.master(1), before));
    EXPECT_EQ(b.step, 0);
  };
  std::string flipped = good;
  flipped[flipped.size() - 5] ^= 0x40;
  expect_rejected(flipped, "payload_fnv1a64");
  expect_rejected(good.substr(0, good.size() - 4), "payload_bytes");
  expect_rejected("XXXXXXXX" + good.substr(8), "magic");

  const ModelSpec other = load_model_spec("tiny-moe-qwen");
  HostState q(other);
  q.init_from_seed(1);
  save_checkpoint(dir.string(), q, nlohmann::json::object());
  expect_rejected(slurp(file), "model");
  EXPECT_THROW(load_checkpoint((dir / "nowhere").string(), b), InputError);
}

}  // namespace
}  // namespace oom::backend
