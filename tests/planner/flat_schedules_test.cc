// FLAT's schedules in the lowering: skewed routing and PipelinedLLEP, Ring-DTP, SCO and
// OffloadStreamAdamW change only order, placement and granularity: work is conserved, every
// allocation is freed, and each bounds the peak it is for. Plan JSON and validation of "flat".
#include <algorithm>
#include <map>
#include <numeric>

#include <functional>
#include <optional>

#include <gtest/gtest.h>

#include "costmodel/flops.h"
#include "costmodel/input_error.h"
#include "costmodel/memory.h"
#include "planner/calibration/calibration.h"
#include "planner/engine/analytic_evaluator.h"
#include "planner/engine/cost_report.h"
#include "planner/engine/peak_composition.h"
#include "planner/lowering/step_graph.h"
#include "planner/search/plan_pricing.h"

namespace oom {
namespace {

WorkloadContext ctx_with(std::int64_t batch, std::int64_t seq, const nlohmann::json& routing = nullptr) {
  Workload w = default_workload();
  w.global_batch = batch;
  w.seq_len = seq;
  if (!routing.is_null()) w.routing = routing_from_json(routing, "test", "routing");
  return resolve_workload(w, "test workload");
}

const nlohmann::json kZipf = {{"kind", "zipf"}, {"skew", 1.2}};

struct Lowered {
  StepGraph g;
  StageTimes t;
};

Lowered run(const Plan& p, const WorkloadContext& ctx) {
  validate_plan(p, ctx.model, ctx.workload, "test plan");
  const PlanPricer pricer(ctx, load_calibration_for(ctx.hardware));
  Lowered r{pricer.lower_plan(p), {}};
  std::vector<Seconds> d(r.g.stages.size());
  for (const Stage& s : r.g.stages) d[static_cast<std::size_t>(s.id)] = pricer.durations().duration_s(s, r.g);
  r.t = analytic_times(r.g, d);
  return r;
}

Bytes use_peak(const StepGraph& g, const StageTimes& t, MemoryUse use) {
  return use_peaks(g, t)[static_cast<std::size_t>(use)];
}

// Every allocation is freed by the end of the step, per device and per use.
void expect_balanced(const StepGraph& g) {
  std::map<std::tuple<int, int, int>, Bytes> net;
  for (const Stage& s : g.stages) {
    for (const MemoryEvent& m : s.memory) net[{static_cast<int>(m.space), m.device, static_cast<int>(m.use)}] += m.bytes;
  }
  Bytes gpu_total = 0;
  for (const auto& [key, bytes] : net) {
    if (std::get<0>(key) == static_cast<int>(MemorySpace::kGpu)) gpu_total += bytes;
  }
  // The GPU's net is the held hidden-state gradient's exchange and nothing else: zero.
  EXPECT_EQ(gpu_total, 0);
}

using KeyTest = std::function<bool(const StageKey&)>;

// Stages of `part` (and operator `op`, when given) of decoder `layer` (−1: none) on rank `gpu` (−1: all).
KeyTest part_op(StagePart part, std::optional<StageOp> op = std::nullopt) {
  return [=](const StageKey& k) { return k.part == part && (!op || k.op == *op); };
}
// Routed-expert GEMMs (forward, recompute and backward), of one routing round when `chunk` ≥ 0.
KeyTest expert_gemms(int chunk = -1) {
  return [=](const StageKey& k) {
    return k.part == StagePart::kMoe && (k.op == StageOp::kExperts || k.op == StageOp::kExpertsBwd) && (chunk < 0 || k.chunk == chunk);
  };
}

double bytes_of(const StepGraph& g, const KeyTest& test, int layer, int gpu) {
  double s = 0;
  for (const Stage& st : g.stages) {
    if (st.layer == layer && (gpu < 0 || st.gpu == gpu) && test(st.key)) s += static_cast<double>(st.bytes);
  }
  return s;
}

Flops flops_of(const StepGraph& g, const KeyTest& test, int layer, int gpu) {
  Flops f = 0;
  for (const Stage& s : g.stages) {
    if (s.layer == layer && (gpu < 0 || s.gpu == gpu) && test(s.key)) f += s.flops;
  }
  return f;
}

Plan ep_plan(std::int64_t chunk) {
  Plan p = default_plan();
  p.resident_layers.clear();
  p.routing_chunk_tokens = chunk;
  return p;
}

TEST(FlatPlanJson, DefaultPlansCarryNoFlatObjectAndFlatRoundTrips) {
  EXPECT_FALSE(plan_to_json(default_plan()).contains("flat"));
  Plan p = default_plan();
  p.flat.expert_dispatch = ExpertDispatch::kPipelinedLlep;
  p.flat.vocab_projection = VocabProjection::kRingDtp;
  p.flat.vocab_chunk_tokens = 4096;
  p.flat.selective_checkpoint_offload = true;
  p.flat.optimizer_bucket_mib = 128;
  const nlohmann::json j = plan_to_json(p);
  ASSERT_TRUE(j.contains("flat"));
  EXPECT_EQ(plan_from_json(j, "p.json"), p);
}

TEST(FlatPlanJson, BadValuesAndMisplacedSchedulesNameTheField) {
  auto error_of = [](const nlohmann::json& flat, const Plan& base, const WorkloadContext& ctx) {
    nlohmann::json j = plan_to_json(base);
    j["flat"] = flat;
    try {
      validate_plan(plan_from_json(j, "p.json"), ctx.model, ctx.workload, "p.json");
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const WorkloadContext ctx = ctx_with(32, 4096);
  const Plan ep = default_plan();
  EXPECT_NE(error_of({{"expert_dispatch", "fast"}}, ep, ctx).find("flat.expert_dispatch"), std::string::npos);
  EXPECT_NE(error_of({{"optimizer_bucket_mib", -1}}, ep, ctx).find("flat.optimizer_bucket_mib"), std::string::npos);
  EXPECT_NE(error_of({{"stream", true}}, ep, ctx).find("stream"), std::string::npos);
  Plan local = ep;
  local.path = ExpertPath::kLocal;
  local.resident_layers.clear();
  EXPECT_NE(error_of({{"expert_dispatch", "pipelined_llep"}}, local, ctx).find("flat.expert_dispatch"), std::string::npos);
  Plan held = ep;
  held.boundaries.gpu_held = {3};
  EXPECT_NE(error_of({{"checkpoint_offload", "sco"}}, held, ctx).find("flat.checkpoint_offload"), std::string::npos);
  Workload one = default_workload();
  one.gpus = 1;
  one.global_batch = 8;
  const WorkloadContext single = resolve_workload(one, "w");
  EXPECT_NE(error_of({{"vocab_projection", "ring_dtp"}}, local, single).find("flat.vocab_projection"), std::string::npos);
  EXPECT_EQ(error_of({{"vocab_projection", "ring_dtp"}, {"optimizer_bucket_mib", 64}}, ep, ctx), "");
}

TEST(SkewedRouting, HotRanksDoMoreExpertWorkAndHoldMoreTheTotalStaysTheSame) {
  const WorkloadContext even = ctx_with(32, 4096), skewed = ctx_with(32, 4096, kZipf);
  const Plan p = ep_plan(65536);
  const Lowered u = run(p, even), z = run(p, skewed);
  const Flops total_u = flops_of(u.g, expert_gemms(), 0, -1), total_z = flops_of(z.g, expert_gemms(), 0, -1);
  EXPECT_NEAR(total_z / total_u, 1.0, 1e-9);
  std::vector<Flops> per_rank;
  for (int r = 0; r < 4; ++r) per_rank.push_back(flops_of(z.g, expert_gemms(), 0, r));
  EXPECT_GT(*std::max_element(per_rank.begin(), per_rank.end()), 1.2 * total_u / 4);
  EXPECT_GT(z.t.step_s, u.t.step_s);  // the slowest rank sets the pace
  EXPECT_GT(use_peak(z.g, z.t, MemoryUse::kDispatch), use_peak(u.g, u.t, MemoryUse::kDispatch));
  expect_balanced(z.g);
}

TEST(PipelinedLlep, BalancesTheExpertsFetchesWeightsAndPipelinesRounds) {
  const WorkloadContext skewed = ctx_with(32, 4096, kZipf);
  Plan standard = ep_plan(8192);
  Plan llep = standard;
  llep.flat.expert_dispatch = ExpertDispatch::kPipelinedLlep;
  const Lowered s = run(standard, skewed), l = run(llep, skewed);
  const Flops mean = flops_of(l.g, expert_gemms(0), 0, -1) / 4;
  ASSERT_GT(mean, 0);
  for (int r = 0; r < 4; ++r) EXPECT_LE(flops_of(l.g, expert_gemms(0), 0, r), 1.05 * mean * (1 + 1e-9));
  EXPECT_NEAR(flops_of(l.g, expert_gemms(), 0, -1) / flops_of(s.g, expert_gemms(), 0, -1), 1.0, 1e-9);
  EXPECT_GT(bytes_of(l.g, part_op(StagePart::kLlep, StageOp::kFetch), 0, -1), 0.0);
  EXPECT_GT(bytes_of(l.g, part_op(StagePart::kLlep, StageOp::kGradReturn), 0, -1), 0.0);
  EXPECT_LT(l.t.step_s, s.t.step_s);
  // Round 1's dispatch is issued on the fabric before round 0's return.
  StageId d1 = -1, r0 = -1;
  for (const Stage& st : l.g.stages) {
    if (st.gpu == 0 && st.layer == 0 && st.phase == Phase::kForward) {
      if (st.key.op == StageOp::kA2aDispatch && st.key.chunk == 1) d1 = st.id;
      if (st.key.op == StageOp::kA2aReturn && st.key.chunk == 0) r0 = st.id;
    }
  }
  ASSERT_GE(d1, 0);
  ASSERT_GE(r0, 0);
  EXPECT_LT(d1, r0);
  expect_balanced(l.g);
}

TEST(PipelinedLlep, SmallRoundsBoundTheDispatchPeakUnderSkew) {
  const WorkloadContext skewed = ctx_with(64, 8192, kZipf);
  const Lowered one_round = run(ep_plan(skewed.workload.tokens_per_gpu()), skewed);
  Plan llep = ep_plan(skewed.workload.tokens_per_gpu() / 8);
  llep.flat.expert_dispatch = ExpertDispatch::kPipelinedLlep;
  const Lowered l = run(llep, skewed);
  EXPECT_LT(use_peak(l.g, l.t, MemoryUse::kDispatch), 0.5 * use_peak(one_round.g, one_round.t, MemoryUse::kDispatch));
}

TEST(RingDtp, ShardsTheVocabularyKeepsTheWorkAndBoundsTheLogits) {
  const WorkloadContext ctx = ctx_with(32, 8192);
  Plan full = ep_plan(65536);
  full.flat.vocab_chunk_tokens = 0;  // all of a GPU's logits at once
  Plan ring = full;
  ring.flat.vocab_projection = VocabProjection::kRingDtp;
  ring.flat.vocab_chunk_tokens = 1024;
  const Lowered f = run(full, ctx), r = run(ring, ctx);
  EXPECT_NEAR(flops_of(r.g, [](const StageKey& k) { return k.part == StagePart::kLmHead && k.ring_step >= 0; }, -1, 0) /
                  flops_of(f.g, part_op(StagePart::kLmHead), -1, 0), 1.0, 1e-9);
  const Bytes vf = use_peak(f.g, f.t, MemoryUse::kVocabulary), vr = use_peak(r.g, r.t, MemoryUse::kVocabulary);
  EXPECT_LT(vr, 0.15 * vf);
  // The head's H2D is one shard per GPU.
  EXPECT_NEAR(bytes_of(r.g, part_op(StagePart::kLmHead, StageOp::kH2d), -1, 0) / bytes_of(f.g, part_op(StagePart::kLmHead, StageOp::kH2d), -1, 0), 0.25, 0.01);
  expect_balanced(r.g);
}

// On rank 0: when decoder `l`'s host-kept boundary starts loading for its backward, when decoder
// l + 1's MoE backward ends, and when its mixing backward ends.
struct BoundaryLoadTiming {
  Seconds load_start = -1, next_moe_end = 0, next_mixing_end = 0;
};
BoundaryLoadTiming boundary_load_timing(const Lowered& r, int l) {
  BoundaryLoadTiming out;
  for (const Stage& s : r.g.stages) {
    const StageKey& k = s.key;
    if (k.rank != 0 || k.phase != Phase::kBackward) continue;
    const auto i = static_cast<std::size_t>(s.id);
    if (k.decoder == l && k.part == StagePart::kBoundary && k.op == StageOp::kH2d) out.load_start = r.t.start_s[i];
    if (k.decoder != l + 1) continue;
    if (k.part == StagePart::kMoe) out.next_moe_end = std::max(out.next_moe_end, r.t.finish_s[i]);
    if (k.part == StagePart::kAttention || k.part == StagePart::kGdn) out.next_mixing_end = std::max(out.next_mixing_end, r.t.finish_s[i]);
  }
  return out;
}

// A host-kept boundary loads beside the decoder after's mixing backward: once that decoder's MoE
// backward has run (its dispatch buffers, the usual peak, released), before its mixing backward
// ends. SCO prefetches it a whole decoder ahead into a second buffer, so its load starts sooner.
// Either way at most two boundaries are on the GPU at once.
TEST(Sco, PrefetchesBoundariesIntoASecondBuffer) {
  const WorkloadContext ctx = ctx_with(32, 16384);
  Plan keep = ep_plan(65536);
  Plan sco = keep;
  sco.flat.selective_checkpoint_offload = true;
  const Lowered k = run(keep, ctx), s = run(sco, ctx);
  EXPECT_LE(s.t.step_s, k.t.step_s * (1 + 1e-9));
  const Bytes one = boundary_bytes(1, ctx.workload.seqs_per_gpu(), ctx.workload.seq_len, ctx.model.hidden);
  EXPECT_LE(use_peak(s.g, s.t, MemoryUse::kBoundaries), 2 * one);
  EXPECT_LE(use_peak(k.g, k.t, MemoryUse::kBoundaries), 2 * one);
  for (const int l : {5, 20}) {
    const BoundaryLoadTiming kt = boundary_load_timing(k, l), st = boundary_load_timing(s, l);
    ASSERT_GE(kt.load_start, 0) << l;
    EXPECT_GE(kt.load_start, kt.next_moe_end - 1e-12) << l;
    EXPECT_LT(kt.load_start, kt.next_mixing_end) << l;
    EXPECT_LT(st.load_start, st.next_moe_end) << l;
  }
  expect_balanced(k.g);
  expect_balanced(s.g);
}

TEST(OffloadStreamAdamW, BucketsConserveTheUpdateAndShortenTheTail) {
  const WorkloadContext ctx = ctx_with(32, 4096);
  Plan serial = ep_plan(65536);
  Plan stream = serial;
  stream.flat.optimizer_bucket_mib = 64;
  const Lowered a = run(serial, ctx), b = run(stream, ctx);
  double pa = 0, pb = 0;
  int buckets = 0;
  for (const Stage& s : a.g.stages) pa += s.op == OpKind::kCpuAdamW ? static_cast<double>(s.params) : 0.0;
  for (const Stage& s : b.g.stages) {
    pb += s.op == OpKind::kCpuAdamW ? static_cast<double>(s.params) : 0.0;
    buckets += s.op == OpKind::kCpuAdamW && s.gpu == 0 ? 1 : 0;
  }
  EXPECT_NEAR(pb / pa, 1.0, 1e-6);
  EXPECT_GT(buckets, ctx.model.layers + 2);
  EXPECT_LE(b.t.step_s, a.t.step_s);
  expect_balanced(b.g);
}

TEST(PeakComposition, PartsAddUpToThePeakAndNameWhatBinds) {
  const WorkloadContext ctx = ctx_with(32, 8192);
  Plan full = ep_plan(65536);
  full.flat.vocab_chunk_tokens = 0;
  const Lowered f = run(full, ctx);
  const PeakComposition c = gpu_peak_composition(f.g, f.t, 0);
  Bytes parts = c.base;
  for (Bytes b : c.by_use) parts += b;
  EXPECT_GE(parts, c.total);  // parts never negative; a part that dipped is clamped at zero
  const MemoryPeaks m = memory_peaks(f.g, f.t, false);
  EXPECT_EQ(c.total + static_cast<Bytes>(static_cast<double>(c.total) * f.g.gpu_headroom_fraction), m.gpu_peak_bytes[0]);
  // 32K tokens × 248K vocabulary of logits at once: the vocabulary binds.
  EXPECT_EQ(binding_peak(c, full).peak, "vocabulary");
  EXPECT_EQ(binding_peak(c, full).bounded_by, "unbounded");
}

TEST(PeakComposition, ActivationsBindInALongSequencesAttentionBackwardAndHeadGroupsBoundThem) {
  // One 256K-token sequence per GPU with 16K-token dispatch rounds: the MoE's buffers are small
  // beside a full-attention core's backward (its saved tensors, dO/dQ/dK/dV, FP32 dQ accumulator).
  const WorkloadContext ctx = ctx_with(4, 262144);
  const Plan whole = ep_plan(16384);
  const Lowered a = run(whole, ctx);
  const PeakComposition ca = gpu_peak_composition(a.g, a.t, 0);
  const BindingPeak ba = binding_peak(ca, whole);
  EXPECT_EQ(ba.peak, "activations") << ca.stage;
  EXPECT_EQ(ba.bounded_by, "nothing: the mixing sublayers run unsplit");
  EXPECT_EQ(ba.bytes, ca.of(MemoryUse::kActivations));

  Plan split = whole;
  split.split.attention_head_group = 2;
  split.split.gdn_chunk_tokens = 65536;
  const Lowered b = run(split, ctx);
  const PeakComposition cb = gpu_peak_composition(b.g, b.t, 0);
  const BindingPeak bb = binding_peak(cb, split);
  // The partitions shrink the activations at the peak, and the binding peak names them.
  EXPECT_LT(cb.of(MemoryUse::kActivations), ca.of(MemoryUse::kActivations));
  EXPECT_LT(cb.total, ca.total);
  EXPECT_EQ(bb.bytes, std::max({cb.of(MemoryUse::kActivations), cb.of(MemoryUse::kDispatch), cb.of(MemoryUse::kVocabulary),
                                 cb.of(MemoryUse::kBoundaries), cb.of(MemoryUse::kOptimizer)}));
}

TEST(PeakComposition, AGdnCoresBackwardHoldsItsWorkspaceAndGdnPiecesShrinkIt) {
  // One 256K-token sequence per GPU, unsplit: a GDN decoder's core backward holds the layer's saved
  // tensors and the chunked backward's workspace (26 GiB) at once, more than any other point.
  const WorkloadContext ctx = ctx_with(4, 262144);
  const GdnSpec& g = ctx.model.gdn;
  const Plan whole = ep_plan(16384);
  const Lowered a = run(whole, ctx);
  const PeakComposition ca = gpu_peak_composition(a.g, a.t, 0);
  EXPECT_NE(ca.stage.find(".gdn.c0.core_bwd"), std::string::npos) << ca.stage;
  const Bytes saved = gdn_activation_bytes(g, ctx.model.hidden, 1, 262144, 0);
  EXPECT_GE(ca.of(MemoryUse::kActivations), saved + gdn_backward_bytes(g, 1, 262144, 0));
  // In 64K pieces each call's workspace is a quarter: the activations at the peak shed at least
  // the three quarters, and the peak falls.
  Plan split = whole;
  split.split.attention_head_group = 2;
  split.split.gdn_chunk_tokens = 65536;
  const Lowered b = run(split, ctx);
  const PeakComposition cb = gpu_peak_composition(b.g, b.t, 0);
  EXPECT_EQ(4 * gdn_backward_bytes(g, 1, 262144, 65536), gdn_backward_bytes(g, 1, 262144, 0));
  EXPECT_LT(cb.total, ca.total);
  EXPECT_LT(cb.of(MemoryUse::kActivations), ca.of(MemoryUse::kActivations) - 3 * gdn_backward_bytes(g, 1, 262144, 65536)) << cb.stage;
}

TEST(PeakComposition, TheBindingPeakIsTheLargestPartAndNamesWhatBoundsIt) {
  PeakComposition c;
  c.by_use[static_cast<std::size_t>(MemoryUse::kOther)] = 9 * kGiB;  // weights: never binding
  c.by_use[static_cast<std::size_t>(MemoryUse::kDispatch)] = 5 * kGiB;
  c.by_use[static_cast<std::size_t>(MemoryUse::kActivations)] = 4 * kGiB;
  Plan p = ep_plan(32768);
  p.flat.expert_dispatch = ExpertDispatch::kPipelinedLlep;
  EXPECT_EQ(binding_peak(c, p).peak, "dispatch");
  EXPECT_EQ(binding_peak(c, p).bytes, 5 * kGiB);
  EXPECT_EQ(binding_peak(c, p).bounded_by, "PipelinedLLEP, rounds of 32K tokens per source");
  c.by_use[static_cast<std::size_t>(MemoryUse::kActivations)] = 6 * kGiB;
  p.split.attention_head_group = 2;
  p.split.gdn_chunk_tokens = 65536;
  EXPECT_EQ(binding_peak(c, p).peak, "activations");
  EXPECT_EQ(binding_peak(c, p).bounded_by, "attention head groups of 2, GDN pieces of 64K tokens");
  p.path = ExpertPath::kLocal;
  p.split.sub_batch_seqs = 2;
  EXPECT_EQ(binding_peak(c, p).bounded_by, "attention head groups of 2, GDN pieces of 64K tokens, sub-batches of 2 sequences");
  // On the Local path the dispatch part is bounded by MoE chunks, or by nothing when unchunked.
  c.by_use[static_cast<std::size_t>(MemoryUse::kActivations)] = 4 * kGiB;
  p.flat.expert_dispatch = ExpertDispatch::kStandard;
  p.split.moe_chunk_tokens = 16384;
  EXPECT_EQ(binding_peak(c, p).peak, "dispatch");
  EXPECT_EQ(binding_peak(c, p).bounded_by, "MoE chunks of 16K tokens");
  p.split.moe_chunk_tokens = 0;
  EXPECT_EQ(binding_peak(c, p).bounded_by, "nothing: each MoE call takes all its tokens at once");
}

}  // namespace
}  // namespace oom
