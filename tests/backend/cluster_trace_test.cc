// Cluster plans traced on two torchrun nodes against the four-GPU two-node prediction: `oom train
// --plan P --trace` on two torchrun launches of two ranks each (the virtual environment's
// torchrun, --nnodes 2 --node-rank N, c10d over TCP on 127.0.0.1, a host state per node) writes
// one merged trace; `oom diff` holds it against `oom simulate --every-rank` of the same plan on two
// nodes of two H100s: every stage on both sides, and per stage kind the operators the backend
// dispatched within 20% of those the lowering counts (Stage::ops, planner/lowering/
// operator_counts.h). The first step's loss and gradient norm equal autograd's over the whole
// model (1e-5 relative, FP32). Plans: EP groups of two (each node one group) and context
// parallelism (each sequence over two ranks). Rank processes are the `oom` program (OOM_BINARY).
#include <unistd.h>

#include <cstdlib>
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

#include "backend/train/train.h"
#include "cli/cli.h"
#include "tests/backend/plain_runs.h"
#include "tests/backend/reference_ops.h"
#include "tests/backend/torchrun_nodes.h"
#include "traces/stage_key.h"

namespace oom::backend {
namespace {

namespace fs = std::filesystem;
using testing::last_json_line;
using testing::read_text;

constexpr double kTol = 1e-5;
// Operators per stage kind, measured against predicted (the bound).
constexpr double kOperatorTol = 0.2;
// The kinds whose operators the lowering counts: the compute kinds, and the EP all-to-alls' and
// the context-parallel K/V gather's bookkeeping. Transfers, the optimizers and the gradients'
// reduce-scatters are priced by their bytes and parameters, not counted.
const std::set<std::string> kCountedKinds = {"gemm", "attention", "gdn", "expert_gemm", "elementwise", "all_to_all", "all_gather"};

// One run of `o` (model tiny-moe, its plan) on two torchrun nodes of two ranks, traced, then the
// diff against the prediction, and the first step against autograd.
void expect_traced_as_predicted(const std::string& tag, const TrainOptions& o, const fs::path& dir) {
  if (!testing::have_torchrun()) GTEST_SKIP() << "torchrun not found at " << OOM_TORCHRUN;
  const std::string measured = (dir / "measured.json").string();
  const std::string args = fmt::format(" train --model {} --plan {} --steps 1 --seq {} --batch {} --lr 3e-3 --clip 1e9 --seed {} "
                                       "--device cpu --json --trace {}",
                                       o.model, o.plan, o.seq, o.batch, o.seed, measured);
  const int port = 20000 + static_cast<int>((getpid() * 3 + static_cast<int>(tag.size()) * 977) % 20000);
  const int status = testing::run_two_torchrun_nodes(args, dir, port);
  ASSERT_EQ(status, 0) << read_text(dir / "err0") << read_text(dir / "err1");
  const auto j = last_json_line(read_text(dir / "out0"));
  ASSERT_FALSE(j.is_null()) << read_text(dir / "out0");
  EXPECT_EQ(j["ranks"], 4);

  const auto ref = testing::first_step_gradients(o);
  const double loss = j["losses"][0].get<double>(), norm = j["grad_norms"][0].get<double>();
  EXPECT_NEAR(loss, ref.loss, kTol * ref.loss) << tag;
  EXPECT_NEAR(norm, ref.norm, kTol * ref.norm) << tag;
  std::cout << tag << ": loss relative difference " << std::abs(loss - ref.loss) / ref.loss << ", gradient norm "
            << std::abs(norm - ref.norm) / ref.norm << "\n";

  const auto workload = (dir / "workload.json").string();
  std::ofstream(workload) << nlohmann::json{{"model", o.model},   {"hardware", "h100-sxm-node"}, {"nodes", 2},
                                            {"gpus_per_node", 2}, {"gpus", 4},                    {"global_batch", o.batch},
                                            {"seq_len", o.seq}}
                                 .dump();
  std::ostringstream sout, serr;
  const std::string predicted = (dir / "predicted.json").string();
  ASSERT_EQ(cli::run({"simulate", "--workload", workload, "--plan", o.plan, "--every-rank", "--trace", predicted}, {sout, serr}), 0)
      << serr.str();
  std::ostringstream dout, derr;
  ASSERT_EQ(cli::run({"diff", predicted, measured, "--json"}, {dout, derr}), 0) << derr.str();
  const auto d = nlohmann::json::parse(dout.str());
  EXPECT_EQ(d["only_measured"], 0) << tag;
  EXPECT_EQ(d["only_predicted"], 0) << tag;
  std::set<int> ranks;
  for (const auto& st : d["stages"]) {
    if (const auto k = parse_stage_key(st["name"].get<std::string>())) ranks.insert(k->rank);
  }
  EXPECT_EQ(ranks, (std::set<int>{0, 1, 2, 3})) << tag;
  std::set<std::string> compared;
  for (const auto& k : d["kinds"]) {
    const std::string kind = k["name"];
    const double p = k.value("predicted_ops", 0.0), m = k.value("measured_ops", 0.0);
    std::cout << tag << ": " << kind << " operators predicted " << p << ", measured " << m << "\n";
    if (!kCountedKinds.count(kind) || (p == 0 && m == 0)) continue;
    EXPECT_NEAR(p, m, kOperatorTol * m) << tag << ": " << kind;
    compared.insert(kind);
  }
  for (const char* kind : {"gemm", "attention", "gdn", "expert_gemm", "elementwise", "all_to_all"}) {
    EXPECT_TRUE(compared.count(kind)) << tag << ": no " << kind << " operators on either side";
  }
}

TrainOptions tiny_moe(int batch, const std::string& plan) {
  TrainOptions o;
  o.model = "tiny-moe";
  o.steps = 1;
  o.seq = 16;
  o.batch = batch;
  o.lr = 3e-3;
  o.max_grad_norm = 1e9;
  o.seed = 7;
  o.plan = plan;
  return o;
}

// EP groups of two, each node one group: decoder 2 resident, 1 MoE-retained, routing rounds of
// 12 tokens (two a step per rank).
TEST(ClusterTrace, EpGroupsOfTwoOnTwoTorchrunNodesTraceAsPredicted) {
  const auto dir = testing::scratch_dir("oom-cluster-trace", "ep-groups");
  const auto plan = testing::write_ep_plan(
      dir, "groups.json", {{"ep_group_gpus", 2}, {"routing_chunk_tokens", 12}, {"resident_layers", {2}}, {"moe_retained_layers", {1}}});
  expect_traced_as_predicted("EP groups of 2", tiny_moe(4, plan), dir);
  fs::remove_all(dir);
}

// Context parallelism: two sequences, each over two ranks (zig-zag pieces, ring attention, the
// GDN chain along the sequence's ranks).
TEST(ClusterTrace, ContextParallelOnTwoTorchrunNodesTracesAsPredicted) {
  const auto dir = testing::scratch_dir("oom-cluster-trace", "cp");
  const auto plan = testing::write_ep_plan(dir, "cp.json", {{"context_parallel_gpus", 2}});
  expect_traced_as_predicted("context parallel", tiny_moe(2, plan), dir);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace oom::backend
