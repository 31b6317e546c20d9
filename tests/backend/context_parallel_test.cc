// Context parallelism through the graph runner (backend/runner/context.cc): a global batch of fewer
// sequences than ranks, each sequence split over C = ranks / batch consecutive ranks (zig-zag
// pieces; ring attention over the sequence's K/V; the GDN state passed along the sequence's
// ranks), equals autograd over the whole model on tiny-moe (GDN, sliding and full attention, MoE
// over EP all-to-alls): the first step's loss, gradient norm and every block's gradient within
// 1e-5 relative (FP32 on CPU), and `oom train --ranks 2` on one sequence the plain trainer's
// losses and weights within dist_ep_test.cc's bounds; two torchrun-style node launches of two
// ranks each repeat `oom train --ranks 4`. Rank processes are the `oom` program (OOM_BINARY).
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "backend/data/data.h"
#include "backend/dist/rank_train.h"
#include "backend/train/plain_trainer.h"
#include "planner/plan/plan.h"
#include "tests/backend/drift.h"
#include "tests/backend/ep_threads.h"
#include "tests/backend/plain_runs.h"
#include "tests/backend/reference_ops.h"

namespace oom::backend {
namespace {

using testing::rel_l2;
namespace fs = std::filesystem;

constexpr double kTol = 1e-5;
// dist_ep_test.cc's bounds on losses after an AdamW update and on the weights after the steps.
constexpr double kAfterUpdateTol = testing::kLossAfterUpdateTol;
constexpr double kParamMaxTol = 1e-3;
constexpr double kParamL2Tol = 5e-5;

fs::path scratch(const std::string& tag) { return testing::scratch_dir("oom-cp-test", tag); }

// A plan's split: query-head groups of one head.
const nlohmann::json kHeadGroupsOfOne = {
    {"attention_head_group", 1}, {"gdn_chunk_tokens", 0}, {"moe_chunk_tokens", 0}, {"sub_batch_seqs", 0}};

// An EP plan with each sequence over `C` ranks; `fields` override the rest.
std::string write_cp_plan(const fs::path& dir, int C, const nlohmann::json& fields = {}) {
  nlohmann::json plan = {{"context_parallel_gpus", C}};
  if (fields.is_object()) plan.update(fields);
  return testing::write_ep_plan(dir, "cp.json", plan);
}

struct Case {
  const char* tag;
  int ranks, batch;
  std::int64_t seq;
  nlohmann::json fields;
};

// One step on `ranks` rank threads against autograd over the whole model, every block's gradient
// compared (the ranks' sent gradients summed).
void expect_step_matches_autograd(const Case& c) {
  const ModelSpec spec = load_model_spec("tiny-moe");
  const auto dir = scratch(c.tag);
  HostState init(spec);
  init.init_from_seed(61);
  torch::manual_seed(62);
  const auto tokens = torch::randint(0, 256, {c.batch, c.seq}, torch::kLong);
  const auto targets = torch::randint(0, 256, {c.batch, c.seq}, torch::kLong);
  TrainerConfig cfg;
  cfg.adam.lr = 3e-3;
  cfg.max_grad_norm = 1e9;  // the norm is computed, never binding
  cfg.model.gdn_chunk_tokens = 8;
  const Plan plan = load_plan(write_cp_plan(dir, c.ranks / c.batch, c.fields));
  const auto run = testing::ep_step_in_threads(init, tokens, targets, cfg, plan, c.ranks, (dir / "threads").string());
  for (int r = 0; r < c.ranks; ++r) ASSERT_EQ(run.errors[static_cast<std::size_t>(r)], "") << c.tag << " rank " << r;
  const auto ref = testing::reference_gradients(init, tokens, targets, cfg.model);
  double worst = 0;
  for (int r = 0; r < c.ranks; ++r) {
    EXPECT_LE(testing::record_drift(fmt::format("{} loss", c.tag), run.losses[static_cast<std::size_t>(r)], ref.loss), kTol) << c.tag;
    EXPECT_NEAR(run.norms[static_cast<std::size_t>(r)], ref.norm, kTol * ref.norm) << c.tag << " rank " << r;
  }
  ASSERT_EQ(run.grads.size(), ref.blocks.size());
  for (std::size_t b = 0; b < run.grads.size(); ++b) {
    const double d = rel_l2(run.grads[b], ref.blocks[b]);
    EXPECT_LE(d, kTol) << c.tag << ": gradient of block " << b;
    worst = std::max(worst, d);
  }
  std::cout << c.tag << ": loss " << run.losses[0] << " (reference " << ref.loss << "), worst block gradient relative L2 " << worst
            << "\n";
  testing::record_drift(std::string(c.tag) + " gradients l2", worst);
  fs::remove_all(dir);
}

// C = 2: one sequence over two ranks; the plain plan (the core's autograd graph in backward).
TEST(ContextParallel, OneSequenceOverTwoRanksEqualsAutograd) { expect_step_matches_autograd({"cp2", 2, 1, 16, {}}); }

// C = 2 twice (two sequences over four ranks), with kept O/LSE (flash-style backward over the
// sequence's K/V) in query-head groups of one, a retained MoE decoder and chunked dispatch.
TEST(ContextParallel, TwoSequencesOverFourRanksWithKeptOLseEqualAutograd) {
  expect_step_matches_autograd({"cp2x2", 4, 2, 16,
                                {{"keep_attention_results", true},
                                 {"moe_retained_layers", {1}},
                                 {"routing_chunk_tokens", 3},
                                 {"split", kHeadGroupsOfOne}}});
}

// C = 4: one sequence over four ranks (8 chunks of 4 tokens; the GDN chain's 7 hops), query-head
// groups re-forwarded in backward.
TEST(ContextParallel, OneSequenceOverFourRanksEqualsAutograd) {
  expect_step_matches_autograd({"cp4", 4, 1, 32, {{"split", kHeadGroupsOfOne}}});
}

TrainOptions small_run(int batch, std::int64_t seq, const std::string& plan) {
  TrainOptions o;
  o.model = "tiny-moe";
  o.steps = 2;
  o.seq = static_cast<int>(seq);
  o.batch = batch;
  o.lr = 3e-3;
  o.max_grad_norm = 0.5;
  o.seed = 7;
  o.gdn_chunk_tokens = 8;
  o.plan = plan;
  return o;
}

void expect_weights_match(const std::string& file, const std::vector<at::Tensor>& params, const std::string& tag) {
  testing::expect_weights_match("tiny-moe", file, params, tag, kParamMaxTol, kParamL2Tol);
}

// `oom train --ranks 2` on one sequence a step (rank processes, the host state shared): two steps
// with clipping equal the plain trainer's losses and weights.
TEST(ContextParallel, OomTrainTwoRanksOnOneSequenceMatchesPlainTrainer) {
  const auto dir = scratch("ranks2");
  const auto o = small_run(1, 16, write_cp_plan(dir, 2));
  dist::RanksOptions r;
  r.ranks = 2;
  r.worker_program = OOM_BINARY;
  r.save_weights = (dir / "final.safetensors").string();
  r.timeout_s = 60;
  r.deadline_s = 120;
  const auto got = dist::train_ranks(o, r);
  const auto [losses, params] = testing::plain_run(o);
  ASSERT_EQ(got.train.losses.size(), losses.size());
  for (std::size_t i = 0; i < losses.size(); ++i) {
    const double d = testing::record_drift(fmt::format("cp ranks2 loss step {}", i), got.train.losses[i], losses[i]);
    EXPECT_LE(d, i == 0 ? kTol : kAfterUpdateTol) << "step " << i;
  }
  expect_weights_match(r.save_weights, params, "cp ranks2");
  fs::remove_all(dir);
}

std::string read_text(const fs::path& file) {
  std::ifstream in(file);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Two torchrun launches standing for two nodes of two ranks each (the virtual environment's
// torchrun, --nnodes 2 --node-rank N, c10d over TCP on 127.0.0.1, a host state per node), two
// sequences of 16 tokens each over C = 2 ranks: the losses and final weights equal `oom train
// --ranks 4` on one node (the same arithmetic: 1e-6 relative), and the plain trainer's.
TEST(ContextParallel, TorchrunOnTwoNodesRepeatsTheOneNodeRun) {
  const std::string torchrun = OOM_TORCHRUN;
  if (!fs::exists(torchrun)) {
    if (const char* ci = std::getenv("CI"); ci != nullptr && std::string(ci) == "true") {
      FAIL() << "torchrun not found at " << torchrun << " (scripts/install-deps.sh installs torch into .venv)";
    }
    GTEST_SKIP() << "torchrun not found at " << torchrun;
  }
  const auto dir = scratch("two-nodes");
  const auto o = small_run(2, 16, write_cp_plan(dir, 2));
  const std::string args = fmt::format(" train --model tiny-moe --plan {} --steps 2 --seq 16 --batch 2 --lr 3e-3 --clip 0.5 --seed 7 "
                                       "--gdn-chunk 8 --device cpu --json",
                                       o.plan);
  const int port = 20000 + static_cast<int>((getpid() + 4099) % 20000);
  const auto node_cmd = [&](int node) {
    return fmt::format("{0} --nnodes 2 --nproc-per-node 2 --node-rank {1} --master-addr 127.0.0.1 --master-port {2} --no-python {3}{4} "
                       "--save-weights {5}/node.safetensors > {5}/out{1} 2> {5}/err{1}",
                       torchrun, node, port, OOM_BINARY, args, dir.string());
  };
  const std::string script = node_cmd(1) + " & p=$!; " + node_cmd(0) + "; s=$?; wait $p; exit $((s | $?))";
  const int status = std::system(("timeout 120 sh -c '" + script + "'").c_str());
  ASSERT_EQ(status, 0) << read_text(dir / "err0") << read_text(dir / "err1");
  // The one-node run: rank processes sharing one host state.
  dist::RanksOptions r;
  r.ranks = 4;
  r.worker_program = OOM_BINARY;
  r.save_weights = (dir / "one.safetensors").string();
  r.timeout_s = 60;
  r.deadline_s = 120;
  const auto one = dist::train_ranks(o, r);
  const auto out = read_text(dir / "out0");
  const auto j = nlohmann::json::parse(out.substr(out.rfind("\n{") == std::string::npos ? out.find('{') : out.rfind("\n{") + 1));
  ASSERT_EQ(j["losses"].size(), 2u);
  for (std::size_t i = 0; i < 2; ++i) {
    EXPECT_LE(testing::record_drift(fmt::format("cp two nodes vs one step {}", i), j["losses"][i].get<double>(), one.train.losses[i]), 1e-6)
        << "step " << i;
  }
  const auto [losses, params] = testing::plain_run(o);
  EXPECT_LE(testing::record_drift("cp two nodes loss step 0", j["losses"][0].get<double>(), losses[0]), kTol);
  expect_weights_match((dir / "node.safetensors").string(), params, "cp two nodes");
  expect_weights_match(r.save_weights, params, "cp ranks4");
  fs::remove_all(dir);
}

}  // namespace
}  // namespace oom::backend
