// Context parallelism through the graph runner (backend/runner/context.cc): a global batch of fewer
// sequences than ranks, each sequence split over C = ranks / batch consecutive ranks (zig-zag
// pieces; ring attention over the sequence's K/V; the GDN state passed along the sequence's
// ranks), equals autograd over the whole model on tiny-moe (GDN, sliding and full attention, MoE
// over EP all-to-alls): the first step's loss, gradient norm and every block's gradient within
// 1e-5 relative (FP32 on CPU), and `oom train --ranks 2` on one sequence the plain trainer's
// losses and weights within dist_ep_test.cc's bounds; two torchrun-style node launches of two
// ranks each repeat `oom train --ranks 4`. With the other plan fields: EP groups of two (C = 2 and
// 4), Ring-DTP, boundaries held and regenerated, FLAT's update buckets, SCO and logits blocks, the
// GDN split equal autograd the same way; PipelinedLLEP over `oom train --ranks 4` matches the plain
// trainer and resumes bit for bit, and in EP groups is refused in one line; a measured trace holds
// the prediction's stages. A checkpoint after two steps resumes the third bit for bit on one node
// and on two torchrun nodes (with and without EP groups). Rank processes are the `oom` program
// (OOM_BINARY).
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <set>
#include <sstream>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "backend/data/data.h"
#include "backend/dist/rank_train.h"
#include "backend/train/plain_trainer.h"
#include "cli/cli.h"
#include "planner/plan/plan.h"
#include "tests/backend/drift.h"
#include "tests/backend/ep_threads.h"
#include "tests/backend/plain_runs.h"
#include "tests/backend/reference_ops.h"
#include "tests/backend/torchrun_nodes.h"
#include "traces/stage_key.h"

namespace oom::backend {
namespace {

using testing::last_json_line;
using testing::read_text;
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
  std::cout << c.tag << ": loss " << run.losses[0] << " (reference " << ref.loss << ", relative difference "
            << std::abs(run.losses[0] - ref.loss) / ref.loss << "), gradient norm relative difference "
            << std::abs(run.norms[0] - ref.norm) / ref.norm << ", worst block gradient relative L2 " << worst << "\n";
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

// Two torchrun launches standing for two nodes of two ranks each (the virtual environment's
// torchrun, --nnodes 2 --node-rank N, c10d over TCP on 127.0.0.1, a host state per node), two
// sequences of 16 tokens each over C = 2 ranks: the losses and final weights equal `oom train
// --ranks 4` on one node bit for bit (the same arithmetic), and the plain trainer's.
TEST(ContextParallel, TorchrunOnTwoNodesRepeatsTheOneNodeRun) {
  if (!testing::have_torchrun()) GTEST_SKIP() << "torchrun not found at " << OOM_TORCHRUN;
  const auto dir = scratch("two-nodes");
  const auto o = small_run(2, 16, write_cp_plan(dir, 2));
  const std::string args = fmt::format(" train --model tiny-moe --plan {} --steps 2 --seq 16 --batch 2 --lr 3e-3 --clip 0.5 --seed 7 "
                                       "--gdn-chunk 8 --device cpu --json",
                                       o.plan);
  const int port = 20000 + static_cast<int>((getpid() + 4099) % 20000);
  const int status = testing::run_two_torchrun_nodes(args + " --save-weights " + (dir / "node.safetensors").string(), dir, port);
  ASSERT_EQ(status, 0) << read_text(dir / "err0") << read_text(dir / "err1");
  // The one-node run: rank processes sharing one host state.
  dist::RanksOptions r;
  r.ranks = 4;
  r.worker_program = OOM_BINARY;
  r.save_weights = (dir / "one.safetensors").string();
  r.timeout_s = 60;
  r.deadline_s = 120;
  const auto one = dist::train_ranks(o, r);
  const auto j = last_json_line(read_text(dir / "out0"));
  ASSERT_EQ(j["losses"].size(), 2u);
  for (std::size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(j["losses"][i].get<double>(), one.train.losses[i]) << "step " << i;
  }
  HostState two_states(load_model_spec("tiny-moe")), one_state(load_model_spec("tiny-moe"));
  two_states.load_safetensors((dir / "node.safetensors").string());
  one_state.load_safetensors(r.save_weights);
  for (int blk = 0; blk < one_state.blocks(); ++blk) {
    EXPECT_TRUE(at::equal(two_states.master(blk), one_state.master(blk))) << "block " << blk;
  }
  const auto [losses, params] = testing::plain_run(o);
  EXPECT_LE(testing::record_drift("cp two nodes loss step 0", j["losses"][0].get<double>(), losses[0]), kTol);
  expect_weights_match((dir / "node.safetensors").string(), params, "cp two nodes");
  expect_weights_match(r.save_weights, params, "cp ranks4");
  fs::remove_all(dir);
}

// EP groups with context parallelism: four ranks in EP groups of two (each shard on two replicas,
// its gradient reduce-scattered over them), each sequence over two ranks (the ranks of one group)
// or over all four (pieces on both groups; a resident decoder's half-shards updated on the device).
TEST(ContextParallel, EpGroupsOfTwoWithTwoRanksASequenceEqualAutograd) {
  expect_step_matches_autograd({"cp2-groups2", 4, 2, 16, {{"ep_group_gpus", 2}, {"routing_chunk_tokens", 12}}});
}

TEST(ContextParallel, EpGroupsOfTwoWithFourRanksASequenceEqualAutograd) {
  expect_step_matches_autograd({"cp4-groups2", 4, 1, 32,
                                {{"ep_group_gpus", 2}, {"resident_layers", {1}}, {"moe_retained_layers", {2}},
                                 {"keep_attention_results", true}}});
}

// Ring-DTP with context parallelism: the LM head sharded over the four ranks, each rank's piece of
// its sequence going round the ring; and with EP groups of two, one sequence over all four ranks.
TEST(ContextParallel, RingDtpOverSequencePiecesEqualsAutograd) {
  expect_step_matches_autograd({"cp2-ring", 4, 2, 16, {{"flat", {{"vocab_projection", "ring_dtp"}, {"vocab_chunk_tokens", 7}}}}});
  expect_step_matches_autograd({"cp4-groups2-ring", 4, 1, 32,
                                {{"ep_group_gpus", 2},
                                 {"keep_attention_results", true},
                                 {"flat", {{"vocab_projection", "ring_dtp"}, {"vocab_chunk_tokens", 7}}}}});
}

// The other plan fields over sequence pieces: a boundary held on the device and the others
// regenerated (their decoders' forward again, all-gathers and GDN chain included); a resident and a
// retained decoder with streamed update buckets, selective checkpoint offload and logits blocks;
// the GDN split in chunks of 4 tokens within each piece's chunks.
TEST(ContextParallel, BoundariesFlatSchedulesAndGdnSplitOverSequencePiecesEqualAutograd) {
  expect_step_matches_autograd(
      {"cp2-boundaries", 4, 2, 16, {{"boundaries", {{"host_kept", {0}}, {"gpu_held", {1}}, {"regenerate_cap", 1}}}}});
  expect_step_matches_autograd({"cp4-boundaries", 4, 1, 32,
                                {{"keep_attention_results", true},
                                 {"split", kHeadGroupsOfOne},
                                 {"boundaries", {{"host_kept", {2}}, {"gpu_held", {0}}, {"regenerate_cap", 1}}}}});
  expect_step_matches_autograd({"cp2-flat", 4, 2, 16,
                                {{"resident_layers", {0}},
                                 {"moe_retained_layers", {1}},
                                 {"flat", {{"optimizer_bucket_mib", 1}, {"vocab_chunk_tokens", 5}, {"checkpoint_offload", "sco"}}}}});
  expect_step_matches_autograd({"cp2-gdn-split", 2, 1, 32,
                                {{"split",
                                  {{"attention_head_group", 0}, {"gdn_chunk_tokens", 4}, {"moe_chunk_tokens", 0}, {"sub_batch_seqs", 0}}}}});
}

// PipelinedLLEP places its helpers over one EP group of all ranks: with EP groups of two (and each
// sequence over two ranks) the run is refused before any work, in one line naming the field.
TEST(ContextParallel, PipelinedLlepInEpGroupsIsRefused) {
  const ModelSpec spec = load_model_spec("tiny-moe");
  const auto dir = scratch("llep-groups");
  HostState init(spec);
  init.init_from_seed(61);
  const auto tokens = torch::randint(0, 256, {2, 16}, torch::kLong);
  TrainerConfig cfg;
  cfg.model.gdn_chunk_tokens = 8;
  const Plan plan = load_plan(write_cp_plan(dir, 2, {{"ep_group_gpus", 2}, {"flat", {{"expert_dispatch", "pipelined_llep"}}}}));
  const auto run = testing::ep_step_in_threads(init, tokens, tokens, cfg, plan, 4, (dir / "threads").string());
  ASSERT_EQ(run.errors.size(), 4u);
  for (const std::string& e : run.errors) {
    EXPECT_EQ(e, "plan: field 'flat.expert_dispatch': value \"pipelined_llep\": this runtime places PipelinedLLEP's helpers over one "
                 "EP group of all 4 ranks, not in groups of 2");
  }
  fs::remove_all(dir);
}

// PipelinedLLEP with context parallelism: `oom train --ranks 4` on two sequences of 16 tokens, each
// over two ranks, dispatch rounds of 12 tokens; the second step places fetched experts from the
// first step's routing. Two steps equal the plain trainer's losses and weights, and experts were
// fetched. A run checkpointed after the first step and resumed (the checkpoint keeps the routing
// the placement follows) repeats the second step bit for bit.
TEST(ContextParallel, PipelinedLlepOverSequencePiecesMatchesPlainTrainer) {
  const auto dir = scratch("llep");
  auto o = small_run(2, 16, write_cp_plan(dir, 2, {{"moe_retained_layers", {1}}, {"routing_chunk_tokens", 12},
                                                   {"flat", {{"expert_dispatch", "pipelined_llep"}}}}));
  o.trace = (dir / "measured.json").string();
  dist::RanksOptions r;
  r.ranks = 4;
  r.worker_program = OOM_BINARY;
  r.save_weights = (dir / "final.safetensors").string();
  r.timeout_s = 60;
  r.deadline_s = 120;
  const auto got = dist::train_ranks(o, r);
  const auto [losses, params] = testing::plain_run(o);
  ASSERT_EQ(got.train.losses.size(), losses.size());
  for (std::size_t i = 0; i < losses.size(); ++i) {
    const double d = testing::record_drift(fmt::format("cp llep loss step {}", i), got.train.losses[i], losses[i]);
    EXPECT_LE(d, i == 0 ? kTol : kAfterUpdateTol) << "step " << i;
    std::cout << "cp llep: step " << i << " loss relative difference " << d << "\n";
  }
  expect_weights_match(r.save_weights, params, "cp llep");
  std::ifstream in(o.trace);
  const auto chrome = nlohmann::json::parse(in);
  int fetches = 0;
  for (const auto& e : chrome["traceEvents"]) {
    if (e["ph"] != "X") continue;
    const auto k = parse_stage_key(e["name"].get<std::string>());
    if (k && k->part == StagePart::kLlep && k->op == StageOp::kFetch) ++fetches;
  }
  EXPECT_GT(fetches, 0) << "the routing overloaded no decoder: nothing was fetched";
  o.trace.clear();
  o.steps = 1;
  o.checkpoint_dir = (dir / "ckpt").string();
  r.save_weights.clear();
  dist::train_ranks(o, r);
  o.checkpoint_dir.clear();
  o.resume_dir = (dir / "ckpt").string();
  r.save_weights = (dir / "resumed.safetensors").string();
  const auto resumed = dist::train_ranks(o, r);
  ASSERT_EQ(resumed.train.losses.size(), 1u);
  EXPECT_EQ(resumed.train.first_step, 2);
  EXPECT_EQ(resumed.train.losses[0], got.train.losses[1]);
  EXPECT_EQ(resumed.train.grad_norms[0], got.train.grad_norms[1]);
  HostState whole(load_model_spec("tiny-moe")), again(load_model_spec("tiny-moe"));
  whole.load_safetensors((dir / "final.safetensors").string());
  again.load_safetensors(r.save_weights);
  for (int blk = 0; blk < whole.blocks(); ++blk) EXPECT_TRUE(at::equal(again.master(blk), whole.master(blk))) << "block " << blk;
  fs::remove_all(dir);
}

// The measured trace of `oom train --ranks 4` with each sequence over two ranks, in EP groups of
// two, with Ring-DTP, a resident and a retained decoder, a boundary held and one regenerated, holds
// every stage of the four-GPU prediction (the K/V all-gathers and reduce-scatters, the GDN pieces,
// hops and corrections included) and no other.
TEST(ContextParallel, MeasuredTraceHasThePredictedStages) {
  const auto dir = scratch("trace");
  auto o = small_run(2, 16, write_cp_plan(dir, 2, {{"ep_group_gpus", 2}, {"resident_layers", {0}}, {"moe_retained_layers", {1}},
                                                   {"boundaries", {{"host_kept", {2}}, {"gpu_held", {0}}, {"regenerate_cap", 1}}},
                                                   {"flat", {{"vocab_projection", "ring_dtp"}, {"vocab_chunk_tokens", 7}}}}));
  o.steps = 1;
  o.trace = (dir / "measured.json").string();
  dist::RanksOptions r;
  r.ranks = 4;
  r.worker_program = OOM_BINARY;
  r.timeout_s = 60;
  r.deadline_s = 120;
  dist::train_ranks(o, r);
  const auto workload = (dir / "workload.json").string();
  std::ofstream(workload) << R"({"model": "tiny-moe", "hardware": "h100-sxm-node", "gpus": 4, "global_batch": 2, "seq_len": 16})";
  std::ostringstream sout, serr;
  ASSERT_EQ(cli::run({"simulate", "--workload", workload, "--plan", o.plan, "--trace", (dir / "predicted.json").string()}, {sout, serr}),
            0)
      << serr.str();
  std::ostringstream dout, derr;
  ASSERT_EQ(cli::run({"diff", (dir / "predicted.json").string(), o.trace, "--json"}, {dout, derr}), 0) << derr.str();
  const auto d = nlohmann::json::parse(dout.str());
  EXPECT_EQ(d["only_measured"], 0);
  EXPECT_EQ(d["only_predicted"], 0);
  std::set<std::string> gathers, hops;  // rank 0's forward K/V all-gathers and GDN state passes
  std::ifstream in(o.trace);
  const auto chrome = nlohmann::json::parse(in);
  for (const auto& e : chrome["traceEvents"]) {
    const std::string name = e["name"].get<std::string>();
    if (e["ph"] != "X" || name.rfind("g0.fwd.", 0) != 0) continue;
    if (name.find(".attn.allgather") != std::string::npos) gathers.insert(name);
    if (name.find(".gdn.s0.pass") != std::string::npos) hops.insert(name);
  }
  EXPECT_EQ(gathers, (std::set<std::string>{"g0.fwd.L1.attn.allgather", "g0.fwd.L3.attn.allgather"}));
  EXPECT_EQ(hops, (std::set<std::string>{"g0.fwd.L0.gdn.s0.pass", "g0.fwd.L2.gdn.s0.pass"}));
  fs::remove_all(dir);
}

// `oom` with `args` as two torchrun nodes of two ranks each (launch `tag`): node 0's JSON result;
// the launch's status must be 0.
nlohmann::json on_two_nodes(const fs::path& dir, const std::string& args, const std::string& tag) {
  const int port = 20000 + static_cast<int>((getpid() * 13 + 7 * static_cast<int>(std::hash<std::string>{}(tag) % 1000)) % 20000);
  const int status = testing::run_two_torchrun_nodes(args, dir, port, "-" + tag);
  EXPECT_EQ(status, 0) << read_text(dir / ("err0-" + tag)) << read_text(dir / ("err1-" + tag));
  return status == 0 ? last_json_line(read_text(dir / ("out0-" + tag))) : nlohmann::json();
}

// Checkpoint and resume with each sequence over two ranks (`fields` over the plan): two steps with
// a checkpoint, then a third resumed from it, on one node (`oom train --ranks 4`, one host state)
// and on two torchrun nodes (a host state per node, each node's first rank writing its copy); both
// resumed third steps repeat the uninterrupted one-node run's, bit for bit (loss, gradient norm,
// final weights), and the two-node steps repeat the one-node ones.
void expect_resume_bit_exact(const std::string& tag, const nlohmann::json& fields) {
  if (!testing::have_torchrun()) GTEST_SKIP() << "torchrun not found at " << OOM_TORCHRUN;
  const auto dir = scratch(tag);
  auto o = small_run(2, 16, write_cp_plan(dir, 2, fields));
  dist::RanksOptions r;
  r.ranks = 4;
  r.worker_program = OOM_BINARY;
  r.timeout_s = 60;
  r.deadline_s = 120;
  // Uninterrupted, on one node.
  o.steps = 3;
  r.save_weights = (dir / "whole.safetensors").string();
  const auto whole = dist::train_ranks(o, r);
  ASSERT_EQ(whole.train.losses.size(), 3u);
  // Interrupted after two steps and resumed, on one node.
  o.steps = 2;
  o.checkpoint_dir = (dir / "ckpt-one").string();
  r.save_weights.clear();
  const auto first = dist::train_ranks(o, r);
  o.steps = 1;
  o.checkpoint_dir.clear();
  o.resume_dir = (dir / "ckpt-one").string();
  r.save_weights = (dir / "resumed-one.safetensors").string();
  const auto resumed = dist::train_ranks(o, r);
  ASSERT_EQ(first.train.losses.size(), 2u);
  ASSERT_EQ(resumed.train.losses.size(), 1u);
  EXPECT_EQ(resumed.train.first_step, 3);
  EXPECT_EQ(first.train.losses[1], whole.train.losses[1]);
  EXPECT_EQ(resumed.train.losses[0], whole.train.losses[2]);
  EXPECT_EQ(resumed.train.grad_norms[0], whole.train.grad_norms[2]);
  // The same over two nodes.
  const std::string args = fmt::format(" train --model tiny-moe --plan {} --seq 16 --batch 2 --lr 3e-3 --clip 0.5 --seed 7 "
                                       "--gdn-chunk 8 --device cpu --json",
                                       o.plan);
  const std::string ckpt = (dir / "ckpt-nodes").string();
  const auto a = on_two_nodes(dir, args + " --steps 2 --checkpoint " + ckpt, tag + "-first");
  const auto b = on_two_nodes(dir, args + " --steps 1 --resume " + ckpt + " --save-weights " + (dir / "resumed-nodes.safetensors").string(),
                              tag + "-resumed");
  ASSERT_FALSE(a.is_null());
  ASSERT_FALSE(b.is_null());
  ASSERT_EQ(a["losses"].size(), 2u);
  ASSERT_EQ(b["losses"].size(), 1u);
  EXPECT_EQ(b["first_step"], 3);
  EXPECT_EQ(a["losses"][0].get<double>(), whole.train.losses[0]);
  EXPECT_EQ(a["losses"][1].get<double>(), whole.train.losses[1]);
  EXPECT_EQ(b["losses"][0].get<double>(), whole.train.losses[2]);
  EXPECT_EQ(b["grad_norms"][0].get<double>(), whole.train.grad_norms[2]);
  HostState w(load_model_spec("tiny-moe")), one(load_model_spec("tiny-moe")), nodes(load_model_spec("tiny-moe"));
  w.load_safetensors((dir / "whole.safetensors").string());
  one.load_safetensors((dir / "resumed-one.safetensors").string());
  nodes.load_safetensors((dir / "resumed-nodes.safetensors").string());
  for (int blk = 0; blk < w.blocks(); ++blk) {
    EXPECT_TRUE(at::equal(one.master(blk), w.master(blk))) << tag << " one node, block " << blk;
    EXPECT_TRUE(at::equal(nodes.master(blk), w.master(blk))) << tag << " two nodes, block " << blk;
  }
  std::cout << tag << ": losses " << whole.train.losses[0] << " " << whole.train.losses[1] << " " << whole.train.losses[2]
            << "; resumed one node " << resumed.train.losses[0] << ", two nodes " << b["losses"][0].get<double>() << "\n";
  fs::remove_all(dir);
}

TEST(ContextParallel, ResumesFromACheckpointBitExactlyOnOneAndTwoNodes) { expect_resume_bit_exact("resume", {}); }

// The same with EP groups of two (each node one group; the shards' replicas on both nodes).
TEST(ContextParallel, ResumesWithEpGroupsFromACheckpointBitExactlyOnOneAndTwoNodes) {
  expect_resume_bit_exact("resume-groups", {{"ep_group_gpus", 2}, {"resident_layers", {2}}, {"routing_chunk_tokens", 12}});
}

}  // namespace
}  // namespace oom::backend
