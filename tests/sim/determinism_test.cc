// Determinism gate: both step engines give bit-identical Traces for the same inputs across runs
// and threads: each engine is run twice from one thread, then the analytic engine from 2 and 4
// threads at once (it keeps no shared mutable state) and SimGrid from another thread (each run is
// its own forked process, so runs are issued from one thread at a time).
// SimGrid itself simulates on one thread: its parallel actor execution (contexts/nthreads) is not
// used. Traces are compared through their JSON text, so every stage time, memory sample and peak
// must agree to the last bit.
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "planner/calibration/calibration.h"
#include "planner/engine/cost_report.h"
#include "planner/engine/duration_model.h"
#include "planner/engine/step_engine.h"
#include "planner/lowering/baselines.h"
#include "planner/lowering/step_graph.h"
#include "sim/simgrid_engine.h"
#include "tests/common/cluster_workload.h"
#include "traces/trace.h"

namespace oom::sim {
namespace {

struct Case {
  std::string label;
  WorkloadContext ctx;
  StepGraph graph;
};

// The default workload (Qwen3.6 on four H100s, EP plan R23), a Local plan with every split on a
// small Qwen-like model on one H200, the default workload under skewed routing with FLAT's
// four schedules, and the default plan on two nodes (every rank's stages, and one node's), also
// in EP groups of one node.
std::vector<Case> cases() {
  std::vector<Case> out;
  {
    WorkloadContext ctx = resolve_workload(default_workload(), "default");
    StepGraph g = lower(default_plan(), ctx);
    out.push_back({"default-r23", std::move(ctx), std::move(g)});
  }
  {
    Workload w;
    w.model = "tiny-moe-qwen";
    w.hardware = "h200-node";
    w.gpus = 1;
    w.global_batch = 4;
    w.seq_len = 512;
    WorkloadContext ctx = resolve_workload(w, "tiny-local");
    Plan p;
    p.path = ExpertPath::kLocal;
    p.split.attention_head_group = 1;
    p.split.gdn_chunk_tokens = 128;
    p.split.moe_chunk_tokens = 256;
    p.split.sub_batch_seqs = 2;
    p.keep_attention_results = true;
    p.boundaries.host_kept_all = false;
    p.boundaries.host_kept = {0};
    p.boundaries.regenerate_cap = 1;
    validate_plan(p, ctx.model, ctx.workload, "tiny-local");
    StepGraph g = lower(p, ctx);
    out.push_back({"tiny-local", std::move(ctx), std::move(g)});
  }
  {
    // FLAT's four schedules under skewed routing: uneven per-rank stages, LLEP's weight fetches,
    // Ring-DTP's ring passes, SCO's prefetch and the bucketed optimizer.
    Workload w = default_workload();
    w.routing = routing_from_json({{"kind", "zipf"}, {"skew", 1.2}}, "flat", "routing");
    WorkloadContext ctx = resolve_workload(w, "flat-skewed");
    Plan p = default_plan();
    p.routing_chunk_tokens = 16384;
    p.flat.expert_dispatch = ExpertDispatch::kPipelinedLlep;
    p.flat.vocab_projection = VocabProjection::kRingDtp;
    p.flat.selective_checkpoint_offload = true;
    p.flat.optimizer_bucket_mib = 64;
    validate_plan(p, ctx.model, ctx.workload, "flat-skewed");
    StepGraph g = lower(p, ctx);
    out.push_back({"flat-skewed", std::move(ctx), std::move(g)});
  }
  {
    // Two DGX H200 nodes: collectives across nodes through their joins and the network, and one
    // node's stages standing for both (both engines run such graphs).
    WorkloadContext ctx = test_support::cluster_workload("qwen3.6-35b-a3b", 2);
    LoweringOptions o;
    o.decoder_layers = 4;
    StepGraph full = lower(default_plan(), ctx, o);
    o.symmetric_nodes = true;
    StepGraph one_node = lower(default_plan(), ctx, o);
    // EP groups of one node: the all-to-all on NVLink, the shards' all-gathers and reduce-scatters
    // over their replicas across the nodes.
    Plan grouped = default_plan();
    grouped.resident_layers.clear();
    grouped.ep_group_gpus = 8;
    StepGraph groups = lower(grouped, ctx, o);
    out.push_back({"two-nodes", ctx, std::move(full)});
    out.push_back({"two-nodes-one-node's-stages", ctx, std::move(one_node)});
    out.push_back({"two-nodes-ep-groups-of-8", std::move(ctx), std::move(groups)});
  }
  {
    // Context parallelism: four 16K sequences over two nodes, each over 4 GPUs (ring attention's
    // K/V pieces and their gradients among them), every rank's stages.
    WorkloadContext ctx = test_support::h200_workload("qwen3-30b-a3b", 2, 16, 4, 16384);
    Plan p;
    p.routing_chunk_tokens = 4096;
    p.context_parallel_gpus = 4;
    validate_plan(p, ctx.model, ctx.workload, "context-parallel");
    LoweringOptions o;
    o.decoder_layers = 3;
    StepGraph g = lower(p, ctx, o);
    // FSDP2 with the same split: its pieces, ring attention and sharded weights over every rank.
    StepGraph fsdp2 = lower_baseline(BaselineSetup{BaselineSystem::kFsdp2Offload, 1, 1, 4}, ctx, o);
    out.push_back({"two-nodes-context-parallel-4", ctx, std::move(g)});
    out.push_back({"two-nodes-fsdp2-context-parallel-4", std::move(ctx), std::move(fsdp2)});
  }
  return out;
}

std::string run_engine(StepEngine& engine, const Case& c) {
  const CalibratedDurationModel durations(c.ctx.hardware, load_calibration_for(c.ctx.hardware), c.ctx.workload.gpus);
  return trace_to_json(engine.execute(c.graph, durations)).dump();
}

TEST(Determinism, AnalyticEngineIsBitIdenticalAcrossRunsAndConcurrentThreads) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.label);
    auto engine = StepEngines().make("analytic");
    const std::string reference = run_engine(*engine, c);
    ASSERT_GT(reference.size(), 1000u);
    EXPECT_EQ(run_engine(*engine, c), reference);
    for (const int threads : {2, 4}) {
      std::vector<std::string> results(static_cast<std::size_t>(threads));
      std::vector<std::thread> pool;
      for (int t = 0; t < threads; ++t) {
        pool.emplace_back([&, t] {
          auto own = StepEngines().make("analytic");
          results[static_cast<std::size_t>(t)] = run_engine(*own, c);
        });
      }
      for (auto& th : pool) th.join();
      for (const std::string& r : results) EXPECT_EQ(r, reference) << threads << " threads";
    }
  }
}

TEST(Determinism, SimGridEngineIsBitIdenticalAcrossRunsAndThreads) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.label);
    SimGridEngine engine;
    const std::string reference = run_engine(engine, c);
    ASSERT_GT(reference.size(), 1000u);
    EXPECT_EQ(run_engine(engine, c), reference);
    // From another thread (one at a time: execute() forks, and forking while other threads run
    // can deadlock the child on a lock one of them held).
    std::string from_thread;
    std::thread([&] {
      SimGridEngine own;
      from_thread = run_engine(own, c);
    }).join();
    EXPECT_EQ(from_thread, reference);
  }
}

}  // namespace
}  // namespace oom::sim
