// Tests of planner/lowering/step_graph.h: the builder's invariants, check_step_graph(), and lower() for
// both paths: the runtime rules of reference §3 and §4 show up as stages and edges, every
// allocation is freed by the end of the step, and the graph's memory matches the static Eq. 2 model.
#include "planner/lowering/step_graph.h"

#include <functional>
#include <map>
#include <set>
#include <string>

#include <gtest/gtest.h>

#include "costmodel/flops.h"
#include "costmodel/input_error.h"
#include "planner/engine/cost_report.h"
#include "planner/lowering/memory_report.h"

namespace oom {
namespace {

const WorkloadContext& default_ctx() {
  static const WorkloadContext ctx = resolve_workload(default_workload(), "default workload");
  return ctx;
}

WorkloadContext ctx_with(std::int64_t global_batch, std::int64_t seq_len, double yarn = 1) {
  Workload w = default_workload();
  w.global_batch = global_batch;
  w.seq_len = seq_len;
  w.yarn_factor = yarn;
  return resolve_workload(w, "test workload");
}

// Rank 0's stages whose key satisfies `pred`.
template <typename Pred>
int count_keys(const StepGraph& g, Pred pred) {
  int n = 0;
  for (const Stage& s : g.stages) n += (s.key.rank == 0 && pred(s.key)) ? 1 : 0;
  return n;
}
bool is_all_to_all(const StageKey& k) {
  return k.op == StageOp::kA2aDispatch || k.op == StageOp::kA2aReturn || k.op == StageOp::kA2aGradDispatch ||
         k.op == StageOp::kA2aGradReturn;
}

bool has_stage(const StepGraph& g, const std::string& name) {
  for (const Stage& s : g.stages) {
    if (s.name == name) return true;
  }
  return false;
}

// Net bytes per device over the whole step (allocations minus frees).
std::map<std::pair<int, int>, Bytes> net_memory(const StepGraph& g) {
  std::map<std::pair<int, int>, Bytes> net;
  for (const Stage& s : g.stages) {
    for (const MemoryEvent& m : s.memory) net[{static_cast<int>(m.space), m.device}] += m.bytes;
  }
  return net;
}

TEST(StepGraphBuilder, AssignsIdsAndIssueOrder) {
  StepGraphBuilder b(1, 1);
  const ResourceId r = b.add_resource(ResourceKind::kGpuCompute, "gpu0.compute", 0, -1);
  Stage s;
  s.resource = r;
  s.key.chunk = 0;
  const StageId a = b.add(s);
  s.deps = {a};
  s.key.chunk = 1;
  const StageId c = b.add(s);
  const StepGraph g = b.take();
  EXPECT_EQ(a, 0);
  EXPECT_EQ(c, 1);
  EXPECT_EQ(g.resource(r).order, (std::vector<StageId>{0, 1}));
  EXPECT_EQ(check_step_graph(g), "");
}

TEST(CheckStepGraph, ReportsForwardDependenciesAndDoubleIssue) {
  StepGraphBuilder b(1, 1);
  const ResourceId r = b.add_resource(ResourceKind::kGpuCompute, "gpu0.compute", 0, -1);
  Stage s;
  s.resource = r;
  b.add(s);
  s.key.chunk = 1;
  b.add(s);
  StepGraph g = b.take();
  g.stages[0].deps = {1};
  EXPECT_NE(check_step_graph(g).find("depends on 1"), std::string::npos);
  g.stages[0].deps.clear();
  g.resources[0].order = {0, 0, 1};
  EXPECT_NE(check_step_graph(g), "");
  g.resources[0].order = {0, 1};
  g.stages[1].memory = {{MemorySpace::kGpu, 3, 1, false}};
  EXPECT_NE(check_step_graph(g).find("device 3"), std::string::npos);
  g.stages[1].memory.clear();
  // Keys: unique, and the name and the rank, decoder and phase copies agree with them.
  g.stages[1].key = g.stages[0].key;
  g.stages[1].name = g.stages[0].name;
  EXPECT_NE(check_step_graph(g).find("repeats the key g0.fwd.layer.proj"), std::string::npos) << check_step_graph(g);
  g.stages[1].key.chunk = 1;
  EXPECT_NE(check_step_graph(g).find("disagrees with its key"), std::string::npos);
  g.stages[1].name = format_stage_key(g.stages[1].key);
  g.stages[1].gpu = 1;
  EXPECT_NE(check_step_graph(g).find("disagrees with its key"), std::string::npos);
  g.stages[1].gpu = 0;
  EXPECT_EQ(check_step_graph(g), "");
}

// Every stage of every path and schedule has its own key, and its name reads back as that key.
TEST(LowerKeys, EveryPlanShapeHasUniqueKeysThatRoundTrip) {
  std::vector<std::pair<Plan, WorkloadContext>> cases;
  Plan ep = default_plan();
  ep.routing_chunk_tokens = 8192;
  ep.moe_retained_layers = {2, 6};
  cases.push_back({ep, default_ctx()});
  ep.flat.expert_dispatch = ExpertDispatch::kPipelinedLlep;
  ep.flat.vocab_projection = VocabProjection::kRingDtp;
  ep.flat.optimizer_bucket_mib = 64;
  cases.push_back({ep, default_ctx()});
  Plan local;
  local.path = ExpertPath::kLocal;
  local.split.attention_head_group = 2;
  local.split.gdn_chunk_tokens = 8192;
  local.split.moe_chunk_tokens = 16384;
  local.keep_attention_results = true;
  local.boundaries.host_kept_all = false;
  local.boundaries.host_kept = {0, 4};
  local.boundaries.gpu_held = {2};
  cases.push_back({local, ctx_with(4, 32768)});
  local.keep_attention_results = false;
  local.param_transfer = ParamTransfer::kShard;
  local.flat.optimizer_bucket_mib = 32;
  cases.push_back({local, ctx_with(4, 32768)});
  for (const auto& [plan, ctx] : cases) {
    validate_plan(plan, ctx.model, ctx.workload, "test plan");
    const StepGraph g = lower(plan, ctx);
    EXPECT_EQ(check_step_graph(g), "");
    for (const Stage& s : g.stages) {
      const auto k = parse_stage_key(s.name);
      ASSERT_TRUE(k.has_value()) << s.name;
      EXPECT_EQ(*k, s.key) << s.name;
    }
  }
}

TEST(LowerEp, DefaultPlanIsWellFormedWithResourcesPerRank) {
  const StepGraph g = lower(default_plan(), default_ctx());
  EXPECT_EQ(check_step_graph(g), "");
  EXPECT_EQ(g.gpus, 4);
  EXPECT_EQ(g.resources.size(), 4u * 7u);  // compute, h2d, d2h, expert-grad d2h, fabric, cpu update, host prep
  std::set<ResourceKind> kinds;
  for (const Resource& r : g.resources) kinds.insert(r.kind);
  EXPECT_EQ(kinds.size(), 7u);
  // Ranks sit on their GPU's socket: two ranks per NUMA node on the H100 node.
  std::map<int, int> cpu_per_numa;
  for (const Resource& r : g.resources) cpu_per_numa[r.numa] += r.kind == ResourceKind::kCpuUpdate ? 1 : 0;
  EXPECT_EQ(cpu_per_numa[0], 2);
  EXPECT_EQ(cpu_per_numa[1], 2);
}

TEST(LowerEp, ResidentShardsAreUpdatedOnTheGpuWithoutCopies) {
  const Plan plan = default_plan();  // decoder 0 resident, decoder 2 streamed
  const StepGraph g = lower(plan, default_ctx());
  EXPECT_TRUE(has_stage(g, "g0.opt.L0.experts.gpu_adamw"));
  EXPECT_FALSE(has_stage(g, "g0.bwd.L0.experts.grad_d2h"));
  EXPECT_TRUE(has_stage(g, "g0.bwd.L2.experts.grad_d2h"));
  EXPECT_FALSE(has_stage(g, "g0.opt.L2.experts.gpu_adamw"));
  // The weight copy of a resident decoder carries only the common parameters.
  Bytes resident_copy = 0, streamed_copy = 0;
  for (const Stage& s : g.stages) {
    if (s.name == "g0.fwd.L0.weights.h2d") resident_copy = s.bytes;
    if (s.name == "g0.fwd.L2.weights.h2d") streamed_copy = s.bytes;
  }
  const ModelParams p = model_params(default_ctx().model);
  EXPECT_EQ(resident_copy, working_weight_bytes(p.layers[0].common()));
  EXPECT_EQ(streamed_copy, working_weight_bytes(p.layers[2].common() + p.layers[2].routed_experts / 4));
}

TEST(LowerEp, ExpertGradientsUseTheirOwnStreamAndUpdatesWaitForAllGradients) {
  const StepGraph g = lower(default_plan(), default_ctx());
  for (const Stage& s : g.stages) {
    if (s.name == "g0.bwd.L2.experts.grad_d2h") EXPECT_EQ(g.resource(s.resource).kind, ResourceKind::kExpertGradD2h);
    if (s.name == "g0.bwd.L2.common.grad_d2h") EXPECT_EQ(g.resource(s.resource).kind, ResourceKind::kD2h);
    if (s.name == "g0.opt.L2.layer.cpu_adamw") {
      std::set<std::string> deps;
      for (const StageId d : s.deps) deps.insert(g.stage(d).name);
      EXPECT_TRUE(deps.count("g0.bwd.L2.experts.grad_d2h"));
      EXPECT_TRUE(deps.count("g0.bwd.L2.common.grad_d2h"));
    }
  }
}

TEST(LowerEp, RoutingChunksAndAllToAllFollowThePlan) {
  Plan plan = default_plan();
  plan.routing_chunk_tokens = 8192;  // 32768 tokens per GPU → 4 dispatch rounds
  const StepGraph g = lower(plan, default_ctx());
  EXPECT_EQ(count_keys(g, [](const StageKey& k) { return k.phase == Phase::kForward && k.decoder == 5 && k.part == StagePart::kMoe; }),
            4 * 5);  // router/shared, dispatch, experts, return, combine per chunk
  EXPECT_TRUE(has_stage(g, "g0.fwd.L5.moe.c3.a2a_dispatch"));
  for (const Stage& s : g.stages) {
    if (s.name == "g1.fwd.L5.moe.c0.a2a_dispatch") {
      EXPECT_EQ(s.peers.size(), 4u);
      EXPECT_EQ(s.deps.size(), 4u);  // every member's router output
      EXPECT_EQ(s.bytes, ep_a2a_bytes(8, 8192, 2048, kBf16Bytes, 4) / 2);
    }
  }
}

TEST(LowerEp, MoeRetainedDecodersReplayOnlyAttention) {
  Plan plan = default_plan();
  plan.moe_retained_layers = {39};
  const StepGraph g = lower(plan, default_ctx());
  EXPECT_FALSE(has_stage(g, "g0.recompute.L39.moe.c0.experts"));
  EXPECT_TRUE(has_stage(g, "g0.recompute.L39.attn.proj"));
  EXPECT_TRUE(has_stage(g, "g0.recompute.L38.moe.c0.experts"));
}

TEST(LowerEp, EveryAllocationIsFreedAndThePeakMatchesEq2) {
  const StepGraph g = lower(default_plan(), default_ctx());
  for (const auto& [device, bytes] : net_memory(g)) EXPECT_EQ(bytes, 0) << device.first << ":" << device.second;
}

TEST(LowerLocal, ShardDeliveryAllGathersAndReducesOnTheGpus) {
  Plan plan;
  plan.path = ExpertPath::kLocal;
  plan.param_transfer = ParamTransfer::kShard;
  plan.cpu_grad_slots = 1;
  const WorkloadContext ctx = ctx_with(128, 4096);
  const StepGraph g = lower(plan, ctx);
  EXPECT_EQ(check_step_graph(g), "");
  EXPECT_TRUE(has_stage(g, "g0.fwd.L4.weights.allgather"));
  EXPECT_TRUE(has_stage(g, "g0.bwd.L4.layer.reduce_scatter"));
  EXPECT_EQ(count_keys(g, is_all_to_all), 0);
  // With one CPU gradient slot, a layer's gradient copy waits for the previous layer's update.
  for (const Stage& s : g.stages) {
    if (s.name == "g0.bwd.L4.layer.grad_d2h") {
      std::set<std::string> deps;
      for (const StageId d : s.deps) deps.insert(g.stage(d).name);
      EXPECT_TRUE(deps.count("g0.opt.L5.layer.cpu_adamw"));
    }
  }
  for (const auto& [device, bytes] : net_memory(g)) EXPECT_EQ(bytes, 0);
}

TEST(LowerLocal, WeightCopiesGoInTransferChunks) {
  Plan plan;
  plan.path = ExpertPath::kLocal;
  const WorkloadContext ctx = ctx_with(4, 4096);
  auto copies = [&](std::int64_t chunk_mib) {
    plan.transfer_chunk_mib = chunk_mib;
    std::int64_t n = 0;
    for (const Stage& s : lower(plan, ctx).stages) {
      if (s.key.rank != 0 || s.key.decoder != 3 || s.key.phase != Phase::kForward || s.key.op != StageOp::kH2d) continue;
      EXPECT_EQ(s.transfers, (s.bytes + chunk_mib * kMiB - 1) / (chunk_mib * kMiB));
      n += s.transfers;
    }
    return n;
  };
  const std::int64_t big = copies(1024), small = copies(16);
  EXPECT_GE(big, 1);
  EXPECT_GT(small, 32 * big);
}

// Compute stages carry the operators the backend dispatches for them (Stage::ops): every stage
// with arithmetic has some; a decoder's weights are prepared once per pass (its first sub-batch's
// projection); the replay before a backward runs under autograd (more than the forward); the
// attention core repeats per 64-query block; an expert stage pays per expert that gets tokens.
TEST(LowerLocal, ComputeStagesCarryTheBackendsOperators) {
  Workload w;
  w.model = "tiny-moe";
  w.hardware = "local-cpu";
  w.global_batch = 4;
  w.seq_len = 64;
  const WorkloadContext ctx = resolve_workload(w, "test");
  Plan plan;
  plan.path = ExpertPath::kLocal;
  auto ops_of = [](const StepGraph& g) {
    std::map<std::string, std::int64_t> by_name;
    std::int64_t total = 0;
    for (const Stage& s : g.stages) {
      if (g.resource(s.resource).kind != ResourceKind::kGpuCompute) continue;
      if (s.flops > 0) EXPECT_GT(s.ops, 0) << s.name;
      by_name[s.name] += s.ops;
      total += s.ops;
    }
    return std::make_pair(by_name, total);
  };
  const auto [plain, plain_total] = ops_of(lower(plan, ctx));
  EXPECT_GT(plain.at("g0.recompute.L1.attn.proj"), plain.at("g0.fwd.L1.attn.proj"));
  plan.split.sub_batch_seqs = 2;
  const auto [split, split_total] = ops_of(lower(plan, ctx));
  EXPECT_GT(split_total, plain_total);  // each sub-batch's stages dispatch their own operators
  EXPECT_EQ(split.at("g0.fwd.L1.attn.sb0.proj"), plain.at("g0.fwd.L1.attn.proj"));
  EXPECT_LT(split.at("g0.fwd.L1.attn.sb1.proj"), split.at("g0.fwd.L1.attn.sb0.proj"));
  plan.split = {};
  plan.split.moe_chunk_tokens = 2;  // 2 tokens, 4 assignments: at most 4 of the 8 experts
  const auto [chunked, chunked_total] = ops_of(lower(plan, ctx));
  EXPECT_LT(chunked.at("g0.fwd.L1.moe.c0.experts"), plain.at("g0.fwd.L1.moe.c0.experts"));
  w.seq_len = 128;
  plan.split = {};
  const auto [longer, longer_total] = ops_of(lower(plan, resolve_workload(w, "test")));
  EXPECT_GT(longer.at("g0.fwd.L3.attn.h0.core"), plain.at("g0.fwd.L3.attn.h0.core"));
  EXPECT_EQ(longer.at("g0.fwd.L1.moe.c0.experts"), plain.at("g0.fwd.L1.moe.c0.experts"));
}

// Over EP ranks and under context parallelism the stages carry what the backend's cluster paths
// dispatch: a rank's expert stage pays per expert it holds that receives rows (more with EP groups
// of 2, which hold 4 of tiny-moe's 8 experts, than over 4 ranks, which hold 2), the all-to-alls
// their bookkeeping, a combine after the return; under context parallelism the attention core
// runs twice (one call per zig-zag chunk of the piece) and the GDN's chain runs in one stage,
// the pieces' stages none.
TEST(LowerClusters, StagesOverRanksCarryTheBackendsOperators) {
  const auto lower_ops = [](std::int64_t seqs, const std::function<void(Plan&)>& fields) {
    Workload w;
    w.model = "tiny-moe";
    w.hardware = "h100-sxm-node";
    w.gpus = 4;
    w.nodes = 2;
    w.gpus_per_node = 2;
    w.global_batch = seqs;
    w.seq_len = 16;
    Plan plan;
    plan.path = ExpertPath::kEp;
    plan.routing_chunk_tokens = 12;
    fields(plan);
    std::map<std::string, std::int64_t> by_name;
    for (const Stage& s : lower(plan, resolve_workload(w, "test")).stages) by_name[s.name] = s.ops;
    return by_name;
  };
  const auto four = lower_ops(4, [](Plan&) {});
  const auto groups = lower_ops(4, [](Plan& p) { p.ep_group_gpus = 2; });
  EXPECT_GT(groups.at("g0.fwd.L0.moe.c0.experts"), four.at("g0.fwd.L0.moe.c0.experts"));
  EXPECT_GT(groups.at("g0.bwd.L0.moe.c0.experts_bwd"), four.at("g0.bwd.L0.moe.c0.experts_bwd"));
  for (const char* name : {"g0.fwd.L0.moe.c0.a2a_dispatch", "g0.fwd.L0.moe.c0.a2a_return", "g0.fwd.L0.moe.c0.combine",
                           "g0.bwd.L0.moe.c0.a2a_grad_dispatch", "g0.bwd.L0.moe.c0.a2a_grad_return"}) {
    EXPECT_GT(four.at(name), 0) << name;
  }
  // A replay builds graphs: the owner keeps the rows and activations and writes no output rows.
  EXPECT_LT(four.at("g0.recompute.L0.moe.c0.combine"), four.at("g0.fwd.L0.moe.c0.combine"));
  const auto cp = lower_ops(2, [](Plan& p) { p.context_parallel_gpus = 2; });
  const auto whole = lower_ops(4, [](Plan&) {});  // the same 16 tokens a GPU, whole sequences
  EXPECT_GT(cp.at("g0.fwd.L1.attn.h0.core"), 2 * whole.at("g0.fwd.L1.attn.h0.core") - 2);
  EXPECT_GT(cp.at("g0.fwd.L1.attn.allgather"), 0);
  EXPECT_EQ(cp.at("g0.fwd.L0.gdn.c0.core"), 0);
  EXPECT_EQ(cp.at("g0.bwd.L0.gdn.c0.core_bwd"), 0);
  EXPECT_GT(cp.at("g0.fwd.L0.gdn.c1.core"), whole.at("g0.fwd.L0.gdn.c0.core"));
}

TEST(LowerLocal, FullDeliveryAccumulatesPartialsOnTheHost) {
  Plan plan;
  plan.path = ExpertPath::kLocal;
  plan.param_transfer = ParamTransfer::kFull;
  const StepGraph g = lower(plan, ctx_with(64, 4096));
  EXPECT_FALSE(has_stage(g, "g0.fwd.L4.weights.allgather"));
  EXPECT_TRUE(has_stage(g, "g0.opt.L4.layer.host_accumulate"));
  for (const Stage& s : g.stages) {
    if (s.name == "g0.opt.L4.layer.cpu_adamw") {
      // Each rank's share of the update waits for every rank's accumulated partial.
      int accumulates = 0;
      for (const StageId d : s.deps) accumulates += g.stage(d).op == OpKind::kHostAccumulate ? 1 : 0;
      EXPECT_EQ(accumulates, 4);
    }
  }
}

TEST(LowerLocal, AnAccumulatedPartialFreesItsLandingSlotBeforeTheUpdate) {
  // One CPU gradient slot: the next decoder's partial may land once this one is added into the
  // FP32 sum; only its own accumulation waits for the update that reads the sum.
  Plan plan;
  plan.path = ExpertPath::kLocal;
  plan.param_transfer = ParamTransfer::kFull;
  plan.cpu_grad_slots = 1;
  const StepGraph g = lower(plan, ctx_with(64, 4096));
  const auto deps_of = [&g](const std::string& name) {
    std::set<std::string> out;
    for (const Stage& s : g.stages) {
      if (s.name != name) continue;
      for (const StageId d : s.deps) out.insert(g.stage(d).name);
    }
    return out;
  };
  const auto d2h = deps_of("g0.bwd.L3.layer.grad_d2h");
  EXPECT_TRUE(d2h.count("g0.opt.L4.layer.host_accumulate"));
  EXPECT_FALSE(d2h.count("g0.opt.L4.layer.cpu_adamw"));
  const auto accumulate = deps_of("g0.opt.L3.layer.host_accumulate");
  EXPECT_TRUE(accumulate.count("g0.bwd.L3.layer.grad_d2h"));
  EXPECT_TRUE(accumulate.count("g0.opt.L4.layer.cpu_adamw"));
  // Shard delivery reduces on the GPUs: its D2H still waits for the update that read the slot.
  plan.param_transfer = ParamTransfer::kShard;
  const StepGraph shard = lower(plan, ctx_with(64, 4096));
  bool waits_for_update = false;
  for (const Stage& s : shard.stages) {
    if (s.name != "g0.bwd.L3.layer.grad_d2h") continue;
    for (const StageId d : s.deps) waits_for_update |= shard.stage(d).name == "g0.opt.L4.layer.cpu_adamw";
  }
  EXPECT_TRUE(waits_for_update);
}

TEST(LowerLocal, OperatorPartitionsSplitAttentionGdnAndMoe) {
  Plan plan;
  plan.path = ExpertPath::kLocal;
  plan.split.attention_head_group = 2;  // 16 query heads in groups of 2 within each of 2 KV groups → 8 head groups
  plan.split.gdn_chunk_tokens = 8192;   // 32K tokens → 4 chunks
  plan.split.moe_chunk_tokens = 16384;  // 32K tokens → 2 chunks
  const StepGraph g = lower(plan, ctx_with(4, 32768));
  auto forward = [&g](int l, StagePart part, StageOp op) {
    return count_keys(g, [=](const StageKey& k) { return k.phase == Phase::kForward && k.decoder == l && k.part == part && k.op == op; });
  };
  EXPECT_EQ(forward(3, StagePart::kAttention, StageOp::kCore), 8);
  EXPECT_TRUE(has_stage(g, "g0.fwd.L3.attn.h7.core"));
  EXPECT_EQ(forward(0, StagePart::kGdn, StageOp::kCore), 4);
  EXPECT_TRUE(has_stage(g, "g0.fwd.L0.gdn.c3.core"));
  // Router/shared and experts per chunk.
  EXPECT_EQ(forward(0, StagePart::kMoe, StageOp::kRouterShared) + forward(0, StagePart::kMoe, StageOp::kExperts), 2 * 2);
  // Without O/LSE kept, each head group's forward is recomputed before its backward.
  EXPECT_EQ(count_keys(g, [](const StageKey& k) { return k.decoder == 3 && k.op == StageOp::kCoreRefwd; }), 8);
  // A group of every query head of a KV group runs each GQA group apart: 2 groups, each recomputed.
  plan.split.attention_head_group = 8;
  const StepGraph by_kv = lower(plan, ctx_with(4, 32768));
  EXPECT_EQ(count_keys(by_kv, [](const StageKey& k) { return k.phase == Phase::kForward && k.decoder == 3 && k.op == StageOp::kCore; }), 2);
  EXPECT_EQ(count_keys(by_kv, [](const StageKey& k) { return k.decoder == 3 && k.op == StageOp::kCoreRefwd; }), 2);
}

TEST(LowerLocal, KeptAttentionResultsReplaceAttentionReplay) {
  Plan plan;
  plan.path = ExpertPath::kLocal;
  plan.keep_attention_results = true;
  const StepGraph g = lower(plan, ctx_with(4, 32768));
  EXPECT_TRUE(has_stage(g, "g0.fwd.L3.attn.olse_d2h"));
  EXPECT_TRUE(has_stage(g, "g0.recompute.L3.attn.olse_h2d"));
  EXPECT_EQ(count_keys(g, [](const StageKey& k) {
              return k.phase == Phase::kRecompute && k.decoder == 3 && k.part == StagePart::kAttention && k.op == StageOp::kCore;
            }),
            0);
  for (const auto& [device, bytes] : net_memory(g)) EXPECT_EQ(bytes, 0);
}

TEST(LowerLocal, RegeneratedBoundariesComeFromTheNearestKeptOne) {
  Plan plan;
  plan.path = ExpertPath::kLocal;
  plan.boundaries.host_kept_all = false;
  plan.boundaries.host_kept = {0, 4, 8, 12, 16, 20, 24, 28, 32, 36};  // "3+1": one in four kept
  plan.boundaries.regenerate_cap = 1;
  const StepGraph g = lower(plan, ctx_with(4, 32768));
  EXPECT_EQ(check_step_graph(g), "");
  EXPECT_FALSE(has_stage(g, "g0.fwd.L5.boundary.d2h"));
  EXPECT_TRUE(has_stage(g, "g0.fwd.L4.boundary.d2h"));
  // Decoder 7's input is regenerated from boundary 4 through decoders 4, 5, 6 (cap 1: one run per
  // regenerated boundary), so decoder 4 runs no-grad forwards for 7, 6 and 5.
  int regenerations_of_4 = 0;
  for (const Stage& s : g.stages) {
    const StageKey& k = s.key;
    regenerations_of_4 += (k.rank == 0 && k.phase == Phase::kRecompute && k.decoder == 4 && k.part == StagePart::kWeights &&
                           k.op == StageOp::kH2d)
                              ? 1
                              : 0;
  }
  EXPECT_EQ(regenerations_of_4, 3);
  EXPECT_TRUE(has_stage(g, "g0.recompute.L4.weights.r2.h2d"));  // the third repeats the first twice
  for (const auto& [device, bytes] : net_memory(g)) EXPECT_EQ(bytes, 0);
}

TEST(LowerLocal, ADecodersInputGoesAtItsReplayAndARegenerationsStartIsLoadedOnce) {
  Plan plan;
  plan.path = ExpertPath::kLocal;
  plan.keep_attention_results = true;
  plan.boundaries.host_kept_all = false;
  for (int l = 0; l < 40; l += 2) plan.boundaries.host_kept.push_back(l);  // "1+1": one in two kept
  plan.boundaries.regenerate_cap = 1;
  const WorkloadContext ctx = ctx_with(4, 32768);
  ASSERT_EQ(ctx.model.layers, 40);
  const StepGraph g = lower(plan, ctx);
  EXPECT_EQ(check_step_graph(g), "");
  // Every GPU boundary is released by the replayed mixing forward of the decoder it feeds (its output
  // projection's stage), never later in that decoder's backward.
  int released = 0;
  for (const Stage& s : g.stages) {
    for (const MemoryEvent& m : s.memory) {
      if (m.space != MemorySpace::kGpu || m.use != MemoryUse::kBoundaries || m.bytes >= 0 || s.gpu != 0) continue;
      ++released;
      EXPECT_EQ(s.key.phase, Phase::kRecompute) << s.name;
      EXPECT_EQ(s.key.op, StageOp::kOut) << s.name;
    }
  }
  EXPECT_EQ(released, 40);  // one input per decoder: 20 loaded, 20 regenerated
  // A kept boundary loaded to start the regeneration of the decoder after it stays for its own
  // backward: each is copied to the GPU once.
  std::map<int, int> loads;
  for (const Stage& s : g.stages) {
    if (s.gpu == 0 && s.key.part == StagePart::kBoundary && s.key.op == StageOp::kH2d) ++loads[s.key.decoder];
  }
  EXPECT_EQ(loads.size(), 20u);
  for (const auto& [layer, n] : loads) EXPECT_EQ(n, 1) << "decoder " << layer;
  for (const auto& [device, bytes] : net_memory(g)) EXPECT_EQ(bytes, 0);
}

TEST(LowerLocal, RegenerationCapHoldsSeveralBoundariesFromOneRun) {
  Plan plan;
  plan.path = ExpertPath::kLocal;
  plan.boundaries.host_kept_all = false;
  plan.boundaries.host_kept = {0, 4, 8, 12, 16, 20, 24, 28, 32, 36};
  plan.boundaries.regenerate_cap = 3;
  const StepGraph g = lower(plan, ctx_with(4, 32768));
  int regenerations_of_4 = 0;
  for (const Stage& s : g.stages) {
    const StageKey& k = s.key;
    regenerations_of_4 += (k.rank == 0 && k.phase == Phase::kRecompute && k.decoder == 4 && k.part == StagePart::kWeights &&
                           k.op == StageOp::kH2d)
                              ? 1
                              : 0;
  }
  EXPECT_EQ(regenerations_of_4, 1);
}

TEST(Lower, ShortExecutionsLowerTheFirstDecodersOnly) {
  LoweringOptions options;
  options.decoder_layers = 4;
  const StepGraph g = lower(default_plan(), default_ctx(), options);
  int max_layer = -1;
  for (const Stage& s : g.stages) max_layer = std::max(max_layer, s.layer);
  EXPECT_EQ(max_layer, 3);
  EXPECT_LT(g.stages.size(), lower(default_plan(), default_ctx()).stages.size());
}

TEST(Lower, BaseBytesHoldStateAndTheTwoWindowSlots) {
  const WorkloadContext& ctx = default_ctx();
  const StepGraph g = lower(default_plan(), ctx);
  const MemoryReport r = static_memory(ctx, default_plan());
  // M_0 + M_state + two slots sized for the largest group (the LM head with the final norm here).
  const ModelParams p = model_params(ctx.model);
  EXPECT_EQ(g.gpu_base_bytes[0], r.gpu.eq2.fixed + r.gpu.eq2.state + 2 * working_weight_bytes(p.lm_head + p.final_norm));
  EXPECT_DOUBLE_EQ(g.gpu_headroom_fraction, MemoryConstants{}.gpu_headroom_fraction);
}


WorkloadContext tiny_ctx(const std::string& model) {
  Workload w;
  w.model = model;
  w.hardware = "h100-sxm-node";
  w.gpus = 1;
  w.global_batch = 8;
  w.seq_len = 64;
  return resolve_workload(w, "test workload");
}

// Every parameter is updated once and its gradient leaves the GPU once: a tied LM head is the
// embedding table, whose one gradient the head's backward starts and the embeddings' backward
// completes (the head's own group is the final norm).
TEST(Lower, EveryParameterHasOneGradientCopyAndOneUpdateTiedOrNot) {
  for (const char* model : {"tiny-moe", "tiny-moe-gemma"}) {
    const WorkloadContext ctx = tiny_ctx(model);
    Plan plan;  // the plain Plan: default_plan() names decoders tiny-moe does not have
    plan.path = ExpertPath::kLocal;
    validate_plan(plan, ctx.model, ctx.workload, "test plan");
    const StepGraph g = lower(plan, ctx);
    ParamCount updated = 0;
    Bytes copied = 0, head_copied = 0;
    for (const Stage& s : g.stages) {
      if (s.op == OpKind::kCpuAdamW) updated += s.params;
      if (s.key.op == StageOp::kGradD2h) copied += s.bytes;
      if (s.key.op == StageOp::kGradD2h && s.key.part == StagePart::kLmHead) head_copied += s.bytes;
    }
    const ModelParams p = model_params(ctx.model);
    EXPECT_EQ(updated, p.total()) << model;
    EXPECT_EQ(copied, gradient_bytes(p.total())) << model;
    EXPECT_EQ(head_copied, gradient_bytes(p.lm_head + p.final_norm)) << model;
    EXPECT_EQ(ctx.model.tied_embeddings, p.lm_head == 0) << model;
  }
}

// Over more than one logits block the LM head's gradient is summed in FP32 during the loss's
// backward (4 B per head element beside its BF16 gradient); one block writes it directly.
TEST(Lower, HeadGradientSumOverLogitsBlocksIsPriced) {
  const WorkloadContext ctx = tiny_ctx("tiny-moe");
  const ModelParams p = model_params(ctx.model);
  const auto head_backward_optimizer_bytes = [&](std::int64_t block) {
    Plan plan;  // the plain Plan: default_plan() names decoders tiny-moe does not have
    plan.path = ExpertPath::kLocal;
    validate_plan(plan, ctx.model, ctx.workload, "test plan");
    plan.flat.vocab_chunk_tokens = block;
    Bytes allocated = 0;
    for (const Stage& s : lower(plan, ctx).stages) {
      if (s.key.rank != 0 || s.key.part != StagePart::kLmHead || s.key.op != StageOp::kBackward) continue;
      for (const MemoryEvent& m : s.memory) allocated += m.bytes > 0 && m.use == MemoryUse::kOptimizer ? m.bytes : 0;
    }
    return allocated;
  };
  EXPECT_EQ(head_backward_optimizer_bytes(0), gradient_bytes(p.lm_head + p.final_norm));
  EXPECT_EQ(head_backward_optimizer_bytes(64), gradient_bytes(p.lm_head + p.final_norm) + 4 * (p.lm_head + p.final_norm));
}

// The loss keeps only each token's log-sum-exp (backend/model/model.cc ChunkedCrossEntropy, and
// plan_ops::ring_backward under Ring-DTP): its backward computes each block's logits again before
// dL/dx and dL/dW, three products of the forward's size, and writes and caps those logits again.
TEST(Lower, LossBackwardRecomputesTheLogits) {
  for (const VocabProjection projection : {VocabProjection::kChunked, VocabProjection::kRingDtp}) {
    Workload w = tiny_ctx("tiny-moe").workload;
    w.gpus = projection == VocabProjection::kRingDtp ? 2 : 1;  // a ring needs more than one GPU
    const WorkloadContext ctx = resolve_workload(w, "test workload");
    Plan plan;
    plan.path = ExpertPath::kLocal;
    validate_plan(plan, ctx.model, ctx.workload, "test plan");
    plan.flat.vocab_projection = projection;
    double forward = 0, backward = 0;
    Bytes forward_bytes = 0, backward_bytes = 0;
    for (const Stage& s : lower(plan, ctx).stages) {
      if (s.key.rank != 0 || s.key.part != StagePart::kLmHead) continue;
      if (s.key.op == StageOp::kLoss) {
        forward += s.flops;
        forward_bytes += s.bytes;
      }
      if (s.key.op == StageOp::kBackward) {
        backward += s.flops;
        backward_bytes += s.bytes;
      }
    }
    ASSERT_TRUE(plan.flat.ring_dtp(w.gpus) == (projection == VocabProjection::kRingDtp));
    ASSERT_GT(forward, 0);
    EXPECT_DOUBLE_EQ(backward, (1 + kMatmulBackwardRatio) * forward);
    EXPECT_GT(backward_bytes, forward_bytes);
  }
}

}  // namespace
}  // namespace oom
