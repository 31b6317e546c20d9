// Context parallelism (Plan::context_parallel_gpus): a workload with fewer sequences than GPUs
// splits each sequence over gpus / global_batch GPUs. Checked: the workload's and the plan's
// fields and their validation; that the split moves work and nothing else (the FLOPs of every
// operator kind summed over the GPUs equal the unsplit run's); ring attention's collectives (over
// the sequence's GPUs, the K/V pieces' bytes, twice in backward) and buffers; the static reports;
// one node's stages standing for the cluster; the planner, the presets, the Local path's and the
// baselines' refusals.
#include <functional>
#include <map>
#include <string>

#include <gtest/gtest.h>

#include "costmodel/flops.h"
#include "costmodel/input_error.h"
#include "costmodel/memory.h"
#include "planner/engine/analytic_evaluator.h"
#include "planner/engine/cost_report.h"
#include "planner/engine/duration_model.h"
#include "planner/engine/baseline_run.h"
#include "planner/lowering/baselines.h"
#include "planner/lowering/memory_report.h"
#include "planner/lowering/step_graph.h"
#include "planner/search/plan_presets.h"
#include "planner/search/plan_pricing.h"
#include "planner/search/plan_search.h"
#include "tests/common/cluster_workload.h"

namespace oom {
namespace {

using test_support::h200_workload;
WorkloadContext workload(const std::string& model, int nodes, int gpus, std::int64_t seqs, std::int64_t seq_len) {
  return h200_workload(model, nodes, gpus, seqs, seq_len);
}

Plan ep_plan(const WorkloadContext& ctx) {
  Plan p;
  p.path = ExpertPath::kEp;
  p.routing_chunk_tokens = 4096;
  p.moe_retained_layers = {1};
  p.context_parallel_gpus = ctx.workload.gpus_per_seq() > 1 ? ctx.workload.gpus_per_seq() : 0;
  return p;
}

void expect_input_error(const std::function<void()>& f, const std::string& field, const std::string& phrase) {
  try {
    f();
    ADD_FAILURE() << "accepted; expected an error naming " << field;
  } catch (const InputError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(field), std::string::npos) << what;
    EXPECT_NE(what.find(phrase), std::string::npos) << what;
  }
}

TEST(ContextParallel, AWorkloadWithFewerSequencesThanGpusSplitsEachSequence) {
  const WorkloadContext ctx = workload("qwen3-30b-a3b", 2, 16, 2, 32768);
  EXPECT_EQ(ctx.workload.gpus_per_seq(), 8);
  EXPECT_EQ(ctx.workload.seqs_per_gpu(), 1);
  EXPECT_EQ(ctx.workload.local_seq_len(), 4096);
  EXPECT_EQ(ctx.workload.tokens_per_gpu(), 4096);
  const WorkloadContext whole = workload("qwen3-30b-a3b", 2, 16, 32, 4096);
  EXPECT_EQ(whole.workload.gpus_per_seq(), 1);
  EXPECT_EQ(whole.workload.tokens_per_gpu(), 8192);

  nlohmann::json j = workload_to_json(ctx.workload);
  j["global_batch"] = 3;  // neither a multiple of 16 nor dividing it
  expect_input_error([&] { workload_from_json(j, "w.json"); }, "global_batch", "divide it");
  j["global_batch"] = 4;
  j["seq_len"] = 32770;  // 4 GPUs per sequence do not split it evenly
  expect_input_error([&] { workload_from_json(j, "w.json"); }, "seq_len", "split evenly over the 4 GPUs");
}

TEST(ContextParallel, PlanFieldIsWrittenOnlyWhenSetAndMustMatchTheWorkload) {
  Plan p;
  EXPECT_FALSE(plan_to_json(p).contains("context_parallel_gpus"));
  EXPECT_EQ(p.context_parallel(), 1);
  p.context_parallel_gpus = 8;
  const nlohmann::json j = plan_to_json(p);
  EXPECT_EQ(j.at("context_parallel_gpus"), 8);
  EXPECT_EQ(plan_from_json(j, "p.json"), p);
  nlohmann::json bad = j;
  bad["context_parallel_gpus"] = -1;
  EXPECT_THROW(plan_from_json(bad, "p.json"), InputError);

  const WorkloadContext split = workload("qwen3-30b-a3b", 2, 16, 2, 32768);
  const WorkloadContext whole = workload("qwen3-30b-a3b", 2, 16, 32, 4096);
  Plan q = ep_plan(split);
  EXPECT_NO_THROW(validate_plan(q, split.model, split.workload, "p.json"));
  q.context_parallel_gpus = 4;
  expect_input_error([&] { validate_plan(q, split.model, split.workload, "p.json"); }, "context_parallel_gpus",
                     "split each sequence over 8 GPUs");
  q.context_parallel_gpus = 0;
  expect_input_error([&] { validate_plan(q, split.model, split.workload, "p.json"); }, "context_parallel_gpus", "over 8 GPUs");
  q.context_parallel_gpus = 8;
  expect_input_error([&] { validate_plan(q, whole.model, whole.workload, "p.json"); }, "context_parallel_gpus",
                     "whole sequences per GPU");
  Plan local;
  local.path = ExpertPath::kLocal;
  local.routing_chunk_tokens = Plan{}.routing_chunk_tokens;
  expect_input_error([&] { validate_plan(local, split.model, split.workload, "p.json"); }, "path", "plan the ep path");
  // Gated DeltaNet passes its recurrent state along the sequence's GPUs.
  const WorkloadContext gdn = workload("qwen3.6-35b-a3b", 1, 8, 1, 32768);
  EXPECT_NO_THROW(validate_plan(ep_plan(gdn), gdn.model, gdn.workload, "p.json"));
}

// FLOPs per operator kind and phase, summed over every rank's stages.
std::map<std::pair<OpKind, Phase>, double> flops_by_kind(const StepGraph& g) {
  std::map<std::pair<OpKind, Phase>, double> out;
  for (const Stage& s : g.stages) {
    if (!s.key.join && s.flops > 0) out[{s.op, s.phase}] += s.flops;
  }
  return out;
}

// Every operator kind's FLOPs per phase, summed over the GPUs, are the same in `a` as in `b`.
void expect_same_flop_sums(const StepGraph& a, const StepGraph& b) {
  const auto fa = flops_by_kind(a), fb = flops_by_kind(b);
  ASSERT_EQ(fa.size(), fb.size());
  for (const auto& [kind, flops] : fb) {
    ASSERT_TRUE(fa.count(kind)) << op_kind_name(kind.first);
    EXPECT_NEAR(fa.at(kind), flops, 1e-9 * flops) << op_kind_name(kind.first) << " " << phase_name(kind.second);
  }
}

// Qwen3.6's GDN state chain in `a` (two 32K sequences over 16 GPUs, 8 per sequence, its first
// `layers` decoders) against `b` (the same sequences on 2 GPUs): C − 1 hops of one FP32 state per
// decoder, pass and GPU among the sequence's GPUs (forward, replay, backward), one correction per
// piece and decoder, and besides the corrections the same work as the unsplit run.
void expect_gdn_state_chain(const StepGraph& a, const StepGraph& b, const ModelSpec& m, int layers) {
  const int P = 16, C = 8;
  EXPECT_EQ(check_step_graph(a), "");
  const GdnSpec& g = m.gdn;
  const std::int64_t state = std::int64_t{g.value_heads} * g.key_head_dim * g.value_head_dim;
  int gdn_layers = 0;
  for (int l = 0; l < layers; ++l) gdn_layers += m.layer_kinds[static_cast<std::size_t>(l)] == LayerKind::kLinearAttention;
  ASSERT_GT(gdn_layers, 0);
  std::map<std::pair<StageOp, Phase>, int> passes;
  double corrections = 0;
  for (const Stage& s : a.stages) {
    if (s.key.join || s.key.part != StagePart::kGdn) continue;
    if (s.key.op == StageOp::kPass || s.key.op == StageOp::kGradPass) {
      passes[{s.key.op, s.phase}]++;
      EXPECT_EQ(s.bytes, kFp32Bytes * state) << s.name;  // one FP32 state [H_v, d_k, d_v] per sequence
      ASSERT_EQ(s.peers.size(), static_cast<std::size_t>(C)) << s.name;
      EXPECT_EQ(s.peers.front(), s.gpu / C * C) << s.name;
    }
    // The piece is one chunk (chunk 0); the correction follows it (chunk 1).
    if (s.op == OpKind::kGdn && s.phase == Phase::kForward && s.key.chunk == 1) {
      EXPECT_EQ(s.flops, 2.0 * 4096 * static_cast<double>(state)) << s.name;
      corrections += s.flops;
    }
  }
  // C − 1 hops per decoder and pass: forward, replay (no GDN decoder is retained), backward.
  EXPECT_EQ((passes[{StageOp::kPass, Phase::kForward}]), gdn_layers * (C - 1) * P);
  EXPECT_EQ((passes[{StageOp::kPass, Phase::kRecompute}]), gdn_layers * (C - 1) * P);
  EXPECT_EQ((passes[{StageOp::kGradPass, Phase::kBackward}]), gdn_layers * (C - 1) * P);
  // Every GPU corrects its piece once per GDN decoder; besides the corrections the pieces' work
  // sums to the unsplit run's.
  EXPECT_NEAR(corrections, gdn_layers * P * 2.0 * 4096 * state, 1e-9 * corrections);
  const auto fa = flops_by_kind(a), fb = flops_by_kind(b);
  const double split_gdn = fa.at({OpKind::kGdn, Phase::kForward}), whole_gdn = fb.at({OpKind::kGdn, Phase::kForward});
  EXPECT_NEAR(split_gdn - corrections, whole_gdn, 1e-9 * whole_gdn);
  EXPECT_NEAR(fa.at({OpKind::kAttention, Phase::kForward}), fb.at({OpKind::kAttention, Phase::kForward}),
              1e-9 * fb.at({OpKind::kAttention, Phase::kForward}));
}

TEST(ContextParallel, GatedDeltaNetPassesEachPiecesStateAlongTheSequenceAndCorrectsThePieces) {
  // Qwen3.6 (three GDN decoders to one attention decoder): two 32K sequences, each over a node.
  const WorkloadContext split = workload("qwen3.6-35b-a3b", 2, 16, 2, 32768);
  const WorkloadContext whole = workload("qwen3.6-35b-a3b", 1, 2, 2, 32768);
  LoweringOptions o;
  o.decoder_layers = 4;
  expect_gdn_state_chain(lower(ep_plan(split), split, o), lower(ep_plan(whole), whole, o), split.model, 4);
}

TEST(ContextParallel, RingKvBytesAreTheCompressedLatentUnderMlaAndTheKvHeadsElse) {
  const WorkloadContext kimi = workload("kimi-k2", 1, 8, 8, 4096);
  const AttentionSpec& mla = kimi.model.attention(LayerKind::kLatentAttention);
  EXPECT_EQ(ring_kv_bytes(mla, 1000), 1000 * (mla.kv_lora_rank + mla.rope_head_dim) * kBf16Bytes);
  EXPECT_GT(ring_attention_buffer_bytes(mla, 1000, false), 2 * ring_kv_bytes(mla, 1000));  // the expanded piece too
  const WorkloadContext qwen = workload("qwen3-30b-a3b", 1, 8, 8, 4096);
  const AttentionSpec& gqa = qwen.model.attention(LayerKind::kFullAttention);
  EXPECT_EQ(ring_kv_bytes(gqa, 1000), 1000 * gqa.kv_heads * 2 * gqa.head_dim * kBf16Bytes);
  EXPECT_EQ(ring_attention_buffer_bytes(gqa, 1000, false), 2 * ring_kv_bytes(gqa, 1000));
  EXPECT_EQ(ring_attention_buffer_bytes(gqa, 1000, true), 4 * ring_kv_bytes(gqa, 1000));
}

TEST(ContextParallel, SplittingASequenceMovesItsWorkAndChangesNoSum) {
  // Two 32K sequences: each over one node's 8 GPUs, or each on one of 2 GPUs.
  const WorkloadContext split = workload("qwen3-30b-a3b", 2, 16, 2, 32768);
  const WorkloadContext whole = workload("qwen3-30b-a3b", 1, 2, 2, 32768);
  LoweringOptions o;
  o.decoder_layers = 3;
  const StepGraph a = lower(ep_plan(split), split, o), b = lower(ep_plan(whole), whole, o);
  EXPECT_EQ(check_step_graph(a), "");
  expect_same_flop_sums(a, b);
  // Every GPU of a sequence does the same share of its attention core.
  const double core = flops_by_kind(a).at({OpKind::kAttention, Phase::kForward});
  for (const Stage& s : a.stages) {
    if (s.op == OpKind::kAttention && s.phase == Phase::kForward) EXPECT_NEAR(s.flops * 16 * 3, core, 1e-9 * core) << s.name;
  }
}

// The ring's collectives of `g` (sequences over C consecutive GPUs, pieces of `tokens` tokens):
// each passes C − 1 pieces among the sequence's GPUs and allocates the ring's buffers as the K/V
// pieces start to pass. Returns their count per phase: all-gathers, then reduce-scatters.
std::pair<std::map<Phase, int>, std::map<Phase, int>> ring_collectives(const StepGraph& g, const AttentionSpec& a, int C,
                                                                       std::int64_t tokens) {
  const Bytes wire = (C - 1) * ring_kv_bytes(a, tokens);
  std::map<Phase, int> gathers, scatters;
  for (const Stage& s : g.stages) {
    if (s.key.join || s.key.part != StagePart::kAttention) continue;
    if (s.op != OpKind::kAllGather && s.op != OpKind::kReduceScatter) continue;
    (s.op == OpKind::kAllGather ? gathers : scatters)[s.phase]++;
    EXPECT_EQ(s.bytes, wire) << s.name;
    EXPECT_EQ(s.peers.size(), static_cast<std::size_t>(C)) << s.name;
    for (std::size_t i = 0; i < s.peers.size(); ++i) EXPECT_EQ(s.peers[i], s.gpu / C * C + static_cast<int>(i)) << s.name;
    if (s.op == OpKind::kAllGather) {
      Bytes allocated = 0;
      for (const MemoryEvent& m : s.memory) {
        if (m.space == MemorySpace::kGpu && m.bytes > 0) allocated += m.bytes;
      }
      EXPECT_EQ(allocated, ring_attention_buffer_bytes(a, tokens, s.phase == Phase::kBackward)) << s.name;
    }
  }
  return {gathers, scatters};
}

TEST(ContextParallel, RingAttentionPassesThePiecesAmongTheSequencesGpus) {
  const WorkloadContext ctx = workload("qwen3-30b-a3b", 2, 16, 2, 32768);
  const AttentionSpec& a = ctx.model.attention(LayerKind::kFullAttention);
  const int layers = 3, P = 16, C = 8;
  LoweringOptions o;
  o.decoder_layers = layers;
  const StepGraph g = lower(ep_plan(ctx), ctx, o);
  auto [gathers, scatters] = ring_collectives(g, a, C, 4096);
  // Forward, the replay of the two decoders that are not MoE-retained (decoder 1 replays its
  // mixing too), and backward: one pass of the pieces each; backward also returns their gradients.
  EXPECT_EQ(gathers[Phase::kForward], layers * P);
  EXPECT_EQ(gathers[Phase::kRecompute], layers * P);
  EXPECT_EQ(gathers[Phase::kBackward], layers * P);
  EXPECT_EQ(scatters[Phase::kBackward], layers * P);
  EXPECT_EQ(scatters.count(Phase::kForward), 0u);
}

// The FSDP2 baseline's graph of `ctx` (micro-batches of one sequence), its first `layers` decoders.
StepGraph fsdp2_graph(const WorkloadContext& ctx, int layers) {
  LoweringOptions o;
  o.decoder_layers = layers;
  return lower_baseline(BaselineSetup{BaselineSystem::kFsdp2Offload, 1, static_cast<int>(ctx.workload.seqs_per_gpu()), 1}, ctx, o);
}

TEST(ContextParallel, UnderMlaTheCoreExpandsTheOtherPiecesLatents) {
  // Kimi-K2: one 64K sequence over a node's 8 GPUs; each receives 7 pieces of 8K compressed tokens.
  const WorkloadContext kimi = workload("kimi-k2", 1, 8, 1, 65536);
  const AttentionSpec& a = kimi.model.attention(LayerKind::kLatentAttention);
  EXPECT_EQ(latent_expansion_flops(a, 1000), 2.0 * 1000 * 512 * 64 * (192 - 64 + 128));  // kv_b: 512 → 64 heads × (128 + 128)
  EXPECT_EQ(latent_expansion_flops(workload("qwen3-30b-a3b", 1, 8, 8, 4096).model.attention(LayerKind::kFullAttention), 1000), 0);
  const Flops expected = layer_flops(kimi.model, 0, 1, 65536).mixing_core.total() / 8 + latent_expansion_flops(a, 7 * 8192);
  LoweringOptions o;
  o.decoder_layers = 2;
  int cores = 0;
  for (const StepGraph& g : {lower(ep_plan(kimi), kimi, o), fsdp2_graph(kimi, 2)}) {
    for (const Stage& s : g.stages) {
      if (s.op != OpKind::kAttention || s.phase != Phase::kForward) continue;
      EXPECT_NEAR(s.flops, expected, 1e-9 * expected) << s.name;
      ++cores;
    }
  }
  EXPECT_EQ(cores, 2 * 2 * 8);
  // The static report counts it in every pass that runs the core.
  const WorkloadContext whole = workload("kimi-k2", 1, 1, 1, 65536);
  const Plan plan = ep_plan(kimi);
  const StaticCost split = static_cost(kimi, plan);
  Plan unsplit = plan;
  unsplit.context_parallel_gpus = 0;
  const StaticCost one = static_cost(whole, unsplit);
  const Flops expansion = kimi.model.layers * latent_expansion_flops(a, 7 * 8192);
  EXPECT_NEAR(split.forward_flops, one.forward_flops / 8 + expansion, 1e-9 * split.forward_flops);
}

TEST(ContextParallel, StaticReportsPriceTheRingAndOneGpusShare) {
  const WorkloadContext split = workload("qwen3-30b-a3b", 2, 16, 2, 32768);
  const WorkloadContext whole = workload("qwen3-30b-a3b", 1, 2, 2, 32768);
  const StaticCost cs = static_cost(split, ep_plan(split)), cw = static_cost(whole, ep_plan(whole));
  EXPECT_NEAR(cs.forward_flops * 8, cw.forward_flops, 1e-9 * cw.forward_flops);
  EXPECT_NEAR(cs.eq1_quadratic_flops * 8, cw.eq1_quadratic_flops, 1e-9 * cw.eq1_quadratic_flops);
  const AttentionSpec& a = split.model.attention(LayerKind::kFullAttention);
  EXPECT_EQ(cs.allgather_bytes, split.model.layers * 4 * 7 * ring_kv_bytes(a, 4096));
  EXPECT_EQ(cw.allgather_bytes, 0);

  // Kimi-K2's expert banks make a decoder's backward the GPU's largest workset: its ring buffers
  // hold the K/V latents in flight and the expanded heads of the piece in use.
  const WorkloadContext kimi = workload("kimi-k2", 1, 8, 1, 65536);
  const MemoryReport m = static_memory(kimi, ep_plan(kimi), {});
  ASSERT_NE(m.gpu.work_peak_at.find("backward"), std::string::npos) << m.gpu.work_peak_at;
  Bytes ring = -1;
  for (const MemoryItem& i : m.gpu.work) {
    if (i.name.rfind("ring attention", 0) == 0) ring = i.bytes;
  }
  EXPECT_EQ(ring, ring_attention_buffer_bytes(kimi.model.attention(LayerKind::kLatentAttention), 8192, true));
}

Seconds step_and_peaks(const StepGraph& g, const WorkloadContext& ctx, MemoryPeaks& peaks) {
  const CalibratedDurationModel durations(ctx.hardware, load_calibration_for(ctx.hardware), ctx.workload.gpus);
  const StageTimes t = analytic_step_times(g, durations);
  peaks = memory_peaks(g, t, false);
  return t.step_s;
}

TEST(ContextParallel, OneNodesStagesStandForTheClusterWhenSequencesSpanWholeNodesOrPartsOfOne) {
  // Sequences over half a node, one node, two nodes; softmax attention only, and with Gated DeltaNet.
  for (const std::string model : {"qwen3-30b-a3b", "qwen3.6-35b-a3b"}) {
  for (const auto& [nodes, seqs] : {std::pair{2, 4}, std::pair{2, 2}, std::pair{4, 2}}) {
    SCOPED_TRACE(model);
    const WorkloadContext ctx = workload(model, nodes, 8 * nodes, seqs, 32768);
    LoweringOptions full, sym;
    full.decoder_layers = sym.decoder_layers = 3;
    sym.symmetric_nodes = true;
    const StepGraph a = lower(ep_plan(ctx), ctx, full), b = lower(ep_plan(ctx), ctx, sym);
    EXPECT_EQ(b.ranks_emitted, 8);
    MemoryPeaks pa, pb;
    const Seconds sa = step_and_peaks(a, ctx, pa), sb = step_and_peaks(b, ctx, pb);
    EXPECT_NEAR(sb / sa, 1.0, 1e-12) << nodes << " nodes, " << seqs << " sequences";
    EXPECT_EQ(pa.gpu_peak_bytes, pb.gpu_peak_bytes);
    EXPECT_EQ(pa.numa_peak_bytes, pb.numa_peak_bytes);
  }
  }
}

TEST(ContextParallel, ThePlannerAndThePresetSplitTheSequencesAndOfTheBaselinesOnlyFsdp2) {
  const WorkloadContext ctx = workload("qwen3-30b-a3b", 2, 16, 2, 32768);
  const PlanSearchResult r = search_plan(ctx, load_calibration_for(ctx.hardware));
  EXPECT_EQ(r.chosen.plan.path, ExpertPath::kEp);
  EXPECT_EQ(r.chosen.plan.context_parallel_gpus, 8);
  EXPECT_NE(r.chosen.plan.notes.find("each sequence over 8 GPUs"), std::string::npos) << r.chosen.plan.notes;
  EXPECT_NO_THROW(validate_plan(r.chosen.plan, ctx.model, ctx.workload, "plan"));
  EXPECT_GT(r.chosen.predicted_step_s, 0);

  const std::optional<Plan> base = preset_plan("base", ExpertPath::kEp, ctx);
  ASSERT_TRUE(base);
  EXPECT_EQ(base->context_parallel_gpus, 8);
  EXPECT_FALSE(preset_plan("base", ExpertPath::kLocal, ctx));
  EXPECT_EQ(preset_plan_search("base", ctx, load_calibration_for(ctx.hardware), "auto").chosen.plan.context_parallel_gpus, 8);

  expect_input_error([&] { check_local_applies(ctx); }, "global_batch", "whole sequences per GPU");
  const BaselineResult b = run_baseline(BaselineSystem::kZeroOffload, ctx, StepEngines(), "analytic",
                                        load_calibration_for(ctx.hardware));
  EXPECT_FALSE(b.fits());
  EXPECT_FALSE(b.oom);
  EXPECT_NE(b.not_run.find("whole sequences per GPU"), std::string::npos) << b.not_run;
  EXPECT_EQ(b.failure_cell(), "n/a");
  EXPECT_EQ(baseline_result_to_json(b).at("not_run"), b.not_run);
  expect_input_error([&] { configure_baseline(BaselineSystem::kZeroOffload, ctx); }, "global_batch", "whole sequences");
  expect_input_error([&] { configure_baseline(BaselineSystem::kMegaTrain, ctx); }, "global_batch", "whole sequences");
  // FSDP2 splits them with ring attention (context parallelism).
  const BaselineResult fsdp2 = run_baseline(BaselineSystem::kFsdp2Offload, ctx, StepEngines(), "analytic",
                                            load_calibration_for(ctx.hardware));
  EXPECT_TRUE(fsdp2.not_run.empty()) << fsdp2.not_run;
  EXPECT_TRUE(fsdp2.fits());
  EXPECT_GT(fsdp2.step_s, 0);
  EXPECT_NE(baseline_static_memory(*fsdp2.setup, ctx).gpu_peak_at.find("each sequence over 8 GPUs"), std::string::npos);
}


TEST(ContextParallel, Fsdp2SplitsASequenceWithRingAttentionAndChangesNoSum) {
  // Two 32K sequences: each over one node's 8 GPUs, or each on one of 2 GPUs.
  const WorkloadContext split = workload("qwen3-30b-a3b", 2, 16, 2, 32768);
  const WorkloadContext whole = workload("qwen3-30b-a3b", 1, 2, 2, 32768);
  const AttentionSpec& a = split.model.attention(LayerKind::kFullAttention);
  const int layers = 3, P = 16, C = 8;
  const StepGraph g = fsdp2_graph(split, layers), b = fsdp2_graph(whole, layers);
  EXPECT_EQ(check_step_graph(g), "");
  expect_same_flop_sums(g, b);
  // The ring: C − 1 pieces of 4096 tokens per member, over the sequence's 8 consecutive GPUs, in
  // the forward, the recompute and the backward (which also returns the pieces' gradients).
  for (const Stage& s : g.stages) {
    if (s.op == OpKind::kAttention) EXPECT_EQ(s.shape.seq_len, 32768) << s.name;  // keys over the whole sequence
  }
  auto [gathers, scatters] = ring_collectives(g, a, C, 4096);
  for (const Phase ph : {Phase::kForward, Phase::kRecompute, Phase::kBackward}) EXPECT_EQ(gathers[ph], layers * P) << phase_name(ph);
  EXPECT_EQ(scatters[Phase::kBackward], layers * P);
  EXPECT_EQ(scatters.count(Phase::kForward), 0u);
  // Every allocation is freed: the step ends where it began on every GPU.
  std::map<int, Bytes> net;
  for (const Stage& s : g.stages) {
    for (const MemoryEvent& m : s.memory) {
      if (m.space == MemorySpace::kGpu) net[m.device] += m.bytes;
    }
  }
  for (const auto& [gpu, bytes] : net) EXPECT_EQ(bytes, 0) << "GPU " << gpu;
  // The static estimate holds a piece of each sequence and the ring's buffers.
  const BaselineSetup setup{BaselineSystem::kFsdp2Offload, 1, 1, 1};
  const BaselineMemory ms = baseline_static_memory(setup, split), mw = baseline_static_memory(setup, whole);
  EXPECT_LT(ms.gpu_peak_bytes, mw.gpu_peak_bytes);
}

TEST(ContextParallel, Fsdp2PassesGatedDeltaNetStatesAlongTheSequence) {
  const WorkloadContext split = workload("qwen3.6-35b-a3b", 2, 16, 2, 32768);
  const WorkloadContext whole = workload("qwen3.6-35b-a3b", 1, 2, 2, 32768);
  expect_gdn_state_chain(fsdp2_graph(split, 4), fsdp2_graph(whole, 4), split.model, 4);
}

}  // namespace
}  // namespace oom
