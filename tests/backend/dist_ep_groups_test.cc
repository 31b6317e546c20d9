// EP groups over ranks (Plan "ep_group_gpus", README.md's cluster section): four ranks in two
// groups of two, the all-to-alls within a group, each expert shard on two replicas (ranks e and
// 2 + e), its gradient summed over them and each replica's host updating its half (a resident
// decoder's on the device). One step's loss, gradient norm and every gradient the ranks sent or
// updated equal autograd over the whole model (1e-5 relative, FP32); `oom train --ranks 4` matches
// the plain trainer; two torchrun nodes of one group each repeat the one-node run bit for bit and
// resume from their checkpoint bit for bit.
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "backend/data/data.h"
#include "backend/dist/rank_train.h"
#include "backend/train/plain_trainer.h"
#include "cli/cli.h"
#include "planner/plan/plan.h"
#include "tests/backend/ep_threads.h"
#include "tests/backend/plain_runs.h"
#include "tests/backend/reference_ops.h"
#include "tests/backend/torchrun_nodes.h"

namespace oom::backend::dist {
namespace {

namespace fs = std::filesystem;
using testing::last_json_line;
using testing::read_text;
using testing::rel_diff;
using testing::rel_l2;

constexpr double kTol = 1e-5;
// Weights after AdamW steps against the plain trainer: dist_ep_test.cc's bounds and their reasons.
constexpr double kParamMaxTol = 1e-3;
constexpr double kParamL2Tol = 5e-5;

fs::path scratch(const std::string& tag) { return testing::scratch_dir("oom-ep-groups-test", tag); }

// Four ranks in EP groups of two with `fields` over a plain EP plan of tiny-moe (8 experts: 4 a
// shard), routing rounds of 12 tokens.
std::string write_group_plan(const fs::path& dir, const nlohmann::json& fields) {
  nlohmann::json plan = {{"ep_group_gpus", 2}, {"routing_chunk_tokens", 12}};
  plan.update(fields);
  return testing::write_ep_plan(dir, "groups.json", plan);
}

void expect_params_match(const std::string& weights, const std::vector<at::Tensor>& params, const std::string& tag) {
  testing::expect_weights_match("tiny-moe", weights, params, tag, kParamMaxTol, kParamL2Tol);
}

// Four ranks in threads of this process, one step: the gradients each rank sent to the host (its
// slice of the common parts, its replica's half of its shard, summed over the shard's replicas) or
// updated on the device (a resident decoder's half-shard) add up to autograd's over the whole model.
// Decoder 1 resident, 2 MoE-retained, 0 and 3 streamed.
TEST(EpGroups, GradientsOfFourRanksInTwoGroupsEqualAutograd) {
  const ModelSpec spec = load_model_spec("tiny-moe");
  const auto dir = scratch("grads");
  HostState init(spec);
  init.init_from_seed(51);
  torch::manual_seed(52);
  const auto tokens = torch::randint(0, 256, {4, 16}, torch::kLong);
  const auto targets = torch::randint(0, 256, {4, 16}, torch::kLong);
  TrainerConfig cfg;
  cfg.adam.lr = 3e-3;
  cfg.max_grad_norm = 1e9;  // the norm is computed, never binding
  cfg.model.gdn_chunk_tokens = 8;
  const Plan plan = load_plan(write_group_plan(dir, {{"resident_layers", {1}}, {"moe_retained_layers", {2}}}));
  ASSERT_EQ(plan.ep_replicas(4), 2);

  const auto run = testing::ep_step_in_threads(init, tokens, targets, cfg, plan, 4, (dir / "threads").string());
  for (int r = 0; r < 4; ++r) ASSERT_EQ(run.errors[static_cast<std::size_t>(r)], "") << "rank " << r;
  const auto ref = testing::reference_gradients(init, tokens, targets, cfg.model);
  for (int r = 0; r < 4; ++r) {
    EXPECT_NEAR(run.losses[static_cast<std::size_t>(r)], ref.loss, kTol * ref.loss) << "rank " << r;
    EXPECT_NEAR(run.norms[static_cast<std::size_t>(r)], ref.norm, kTol * ref.norm) << "rank " << r;
  }
  std::cout << "loss relative difference " << std::abs(run.losses[0] - ref.loss) / ref.loss << ", gradient norm "
            << std::abs(run.norms[0] - ref.norm) / ref.norm << "\n";
  ASSERT_EQ(run.grads.size(), ref.blocks.size());
  double worst = 0;
  for (std::size_t b = 0; b < run.grads.size(); ++b) {
    const double d = rel_l2(run.grads[b], ref.blocks[b]);
    EXPECT_LE(d, kTol) << "gradient of block " << b;
    EXPECT_LE(rel_diff(run.grads[b], ref.blocks[b]), 3e-4) << "gradient of block " << b;  // as dist_ep_test.cc
    worst = std::max(worst, d);
  }
  std::cout << "gradients: worst block relative L2 " << worst << "\n";
  fs::remove_all(dir);
}

// `oom train --ranks 4` (the rank processes share one host state) with EP groups of two, decoders
// 0 and 2 resident: the first step's loss and gradient norm equal autograd's, and the weights after
// two steps the plain trainer's. The merged trace of the four ranks holds every stage the
// four-GPU prediction has (the replicas' reduce-scatters and all-gathers included), and no other.
TEST(EpGroups, FourRanksInTwoGroupsMatchThePlainTrainer) {
  const auto dir = scratch("ranks");
  TrainOptions o;
  o.model = "tiny-moe";
  o.steps = 2;
  o.seq = 16;
  o.batch = 4;
  o.lr = 3e-3;
  o.max_grad_norm = 1e9;
  o.seed = 7;
  o.gdn_chunk_tokens = 8;
  o.plan = write_group_plan(dir, {{"resident_layers", {0, 2}}, {"moe_retained_layers", {1}}});
  o.trace = (dir / "measured.json").string();
  RanksOptions r;
  r.ranks = 4;
  r.worker_program = OOM_BINARY;
  r.save_weights = (dir / "final.safetensors").string();
  r.timeout_s = 60;
  r.deadline_s = 120;
  const auto got = train_ranks(o, r);
  ASSERT_EQ(got.train.losses.size(), 2u);
  const auto ref = testing::first_step_gradients(o);
  EXPECT_NEAR(got.train.losses[0], ref.loss, kTol * ref.loss);
  EXPECT_NEAR(got.train.grad_norms[0], ref.norm, kTol * ref.norm);
  std::cout << "loss relative difference " << std::abs(got.train.losses[0] - ref.loss) / ref.loss << ", gradient norm "
            << std::abs(got.train.grad_norms[0] - ref.norm) / ref.norm << "\n";
  expect_params_match(r.save_weights, testing::plain_run(o).second, "ranks 4, EP groups of 2");
  const auto workload = (dir / "workload.json").string();
  std::ofstream(workload) << R"({"model": "tiny-moe", "hardware": "h100-sxm-node", "gpus": 4, "global_batch": 4, "seq_len": 16})";
  std::ostringstream sout, serr;
  ASSERT_EQ(cli::run({"simulate", "--workload", workload, "--plan", o.plan, "--trace", (dir / "predicted.json").string()},
                     {sout, serr}), 0) << serr.str();
  std::ostringstream dout, derr;
  ASSERT_EQ(cli::run({"diff", (dir / "predicted.json").string(), o.trace, "--json"}, {dout, derr}), 0) << derr.str();
  const auto d = nlohmann::json::parse(dout.str());
  EXPECT_EQ(d["only_measured"], 0);
  EXPECT_EQ(d["only_predicted"], 0);
  fs::remove_all(dir);
}

// Two nodes of two ranks, each node one EP group of two with its own host state (shard e's
// replicas, ranks e and 2 + e, on both nodes; each node's host updates its replica's half and
// NodeStateSync exchanges the halves after each step), run with the venv's real torchrun launched
// twice (--nnodes 2 --node-rank N), and the same run on one node (`oom train --ranks 4`, one state).
class TwoNodes : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!testing::have_torchrun()) GTEST_SKIP() << "torchrun not found at " << OOM_TORCHRUN;
    dir_ = scratch(::testing::UnitTest::GetInstance()->current_test_info()->name());
    args_ = " train --model tiny-moe --plan " + write_group_plan(dir_, {{"resident_layers", {2}}, {"moe_retained_layers", {1}}}) +
            " --seq 16 --batch 4 --lr 3e-3 --clip 1e9 --seed 7 --gdn-chunk 8 --device cpu --json";
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }

  // Both nodes with `more` options: node 0's JSON result (null when a launch failed, which fails
  // the test unless `may_fail`); each node's stderr in dir_/err<node>-<launch>.
  nlohmann::json on_two_nodes(const std::string& more, bool may_fail = false) {
    const int port = 20000 + static_cast<int>((getpid() * 7 + 101 * launch_) % 20000);
    const int status = testing::run_two_torchrun_nodes(args_ + more, dir_, port, fmt::format("-{}", launch_), 150);
    const auto slurp = [&](const std::string& name) { return read_text(dir_ / fmt::format("{}-{}", name, launch_)); };
    if (!may_fail) {
      EXPECT_EQ(status, 0) << slurp("err0") << slurp("err1");
    }
    const std::string out = slurp("out0");
    ++launch_;
    return status == 0 ? last_json_line(out) : nlohmann::json();
  }

  // `oom train --ranks 4` with `more` options: its JSON result (null when it failed).
  nlohmann::json on_one_node(const std::string& more) {
    const std::string err = (dir_ / "err-one").string();
    const std::string cmd = std::string(OOM_BINARY) + args_ + more + " --ranks 4 2> " + err;
    FILE* p = popen(cmd.c_str(), "r");
    if (p == nullptr) return nlohmann::json();
    std::string out;
    char buf[4096];
    while (fgets(buf, sizeof(buf), p) != nullptr) out += buf;
    const int status = pclose(p);
    EXPECT_EQ(status, 0) << out << read_text(err);
    return status == 0 ? last_json_line(out) : nlohmann::json();
  }

  fs::path dir_;
  std::string args_;
  int launch_ = 0;
};

// Three steps on two nodes repeat the one-node run bit for bit (losses, gradient norms, weights),
// and the first step's loss and gradient norm equal autograd's over the whole model.
TEST_F(TwoNodes, EpGroupsRepeatTheOneNodeRunAndTheReference) {
  const auto a = on_two_nodes(" --steps 3 --save-weights " + (dir_ / "nodes.safetensors").string());
  const auto b = on_one_node(" --steps 3 --save-weights " + (dir_ / "one.safetensors").string());
  ASSERT_FALSE(a.is_null());
  ASSERT_FALSE(b.is_null());
  EXPECT_EQ(a["ranks"], 4);
  ASSERT_EQ(a["losses"].size(), 3u);
  EXPECT_EQ(a["losses"], b["losses"]);
  EXPECT_EQ(a["grad_norms"], b["grad_norms"]);
  HostState two(load_model_spec("tiny-moe")), one(load_model_spec("tiny-moe"));
  two.load_safetensors((dir_ / "nodes.safetensors").string());
  one.load_safetensors((dir_ / "one.safetensors").string());
  for (int blk = 0; blk < one.blocks(); ++blk) EXPECT_TRUE(at::equal(two.master(blk), one.master(blk))) << "block " << blk;
  TrainOptions o;
  o.model = "tiny-moe";
  o.seq = 16;
  o.batch = 4;
  o.seed = 7;
  o.gdn_chunk_tokens = 8;
  const auto ref = testing::first_step_gradients(o);
  const double loss = a["losses"][0].get<double>(), norm = a["grad_norms"][0].get<double>();
  EXPECT_NEAR(loss, ref.loss, kTol * ref.loss);
  EXPECT_NEAR(norm, ref.norm, kTol * ref.norm);
  std::cout << "two nodes: loss relative difference " << std::abs(loss - ref.loss) / ref.loss << ", gradient norm "
            << std::abs(norm - ref.norm) / ref.norm << "\n";
}

TEST_F(TwoNodes, ARankThatFailsStopsEveryRankNamingIt) {
  // Rank 0 (node 0) fails writing the weights after the step while the others wait for it in the
  // last barrier; the collective timeout is long, so only the failure itself ends them quickly.
  const auto t0 = std::chrono::steady_clock::now();
  const auto failed = on_two_nodes(" --steps 1 --rank-timeout 100 --save-weights /nonexistent-dir/w.safetensors", true);
  EXPECT_TRUE(failed.is_null());
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 60.0);
  const std::string node0 = read_text(dir_ / "err0-0"), node1 = read_text(dir_ / "err1-0");
  EXPECT_NE(node0.find("nonexistent-dir"), std::string::npos) << node0;
  // Node 1, which shares no parent with rank 0, learns of it through the failure watch
  // (backend/dist/failure_watch.h): its ranks print one line each naming rank 0, or the first to
  // print exits and its torchrun agent stops the other (SIGTERM) before it prints; rank 1 is
  // stopped by node 0's agent the same way. Node 0's ranks keep the agent's store up until node 1
  // has read the failure.
  const auto count = [](const std::string& text, const std::string& what) {
    std::size_t n = 0;
    for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
    return n;
  };
  const std::string line = "rank 0 (node 0) failed:";
  EXPECT_LE(count(node0, line), 1u) << node0;
  EXPECT_GE(count(node1, line), 1u) << node1;
  EXPECT_LE(count(node1, line), 2u) << node1;
  EXPECT_EQ(node1.find("stopped answering"), std::string::npos) << node1;
}

// Two steps on two nodes with a checkpoint (each node's first rank writes its node's copy,
// whole after the exchange), then a third resumed from it on two fresh nodes: the third step's loss and gradient
// norm are the uninterrupted one-node run's, bit for bit.
TEST_F(TwoNodes, EpGroupsResumeFromACheckpointBitExactly) {
  const std::string ckpt = (dir_ / "ckpt").string();
  const auto first = on_two_nodes(" --steps 2 --checkpoint " + ckpt);
  ASSERT_FALSE(first.is_null());
  ASSERT_EQ(first["losses"].size(), 2u);
  const auto resumed = on_two_nodes(" --steps 1 --resume " + ckpt);
  const auto whole = on_one_node(" --steps 3");
  ASSERT_FALSE(resumed.is_null());
  ASSERT_FALSE(whole.is_null());
  ASSERT_EQ(resumed["losses"].size(), 1u);
  ASSERT_EQ(whole["losses"].size(), 3u);
  EXPECT_EQ(resumed["first_step"], 3);
  EXPECT_EQ(first["losses"][1], whole["losses"][1]);
  EXPECT_EQ(resumed["losses"][0], whole["losses"][2]);
  EXPECT_EQ(resumed["grad_norms"][0], whole["grad_norms"][2]);
}

}  // namespace
}  // namespace oom::backend::dist
