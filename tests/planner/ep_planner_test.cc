// Tests of planner/search/ep_planner.h: resident and retained sets, the memory filter against a plain
// static_memory() enumeration, residency at batch 32 and under a tighter GPU budget (reference §3).
#include "planner/search/ep_planner.h"

#include <optional>
#include <string>

#include <gtest/gtest.h>

#include "costmodel/token_text.h"
#include "planner/lowering/memory_report.h"
#include "planner/search/mixing_levels.h"

namespace oom {
namespace {

WorkloadContext h100_node(const std::string& model, std::int64_t batch, std::int64_t seq) {
  Workload w;
  w.model = model;
  w.hardware = "h100-sxm-node";
  w.gpus = 4;
  w.global_batch = batch;
  w.seq_len = seq;
  return resolve_workload(w, "test");
}

WorkloadContext qwen_h100(std::int64_t batch, std::int64_t seq = 4096) { return h100_node("qwen3.6-35b-a3b", batch, seq); }

// The EP search at global batch 32 and 4K with the node's budgets, run once for the suite.
const EpSearchResult& ep_at_batch32() {
  static const WorkloadContext ctx = qwen_h100(32);
  static const EpSearchResult r = plan_ep(PlanPricer(ctx, load_calibration_for(ctx.hardware)));
  return r;
}

TEST(ResidentSets, InterleavedSetMatchesTheReferenceExample) {
  EXPECT_EQ(interleaved_resident_set(40, 12), (std::vector<int>{0, 1, 3, 7, 11, 15, 19, 22, 26, 30, 34, 38}));
  EXPECT_EQ(contiguous_resident_set(40, 3), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(retained_set(40, 2), (std::vector<int>{38, 39}));
}

TEST(ResidentSets, EveryCountGivesThatManyDistinctLayersInRange) {
  for (int L : {1, 4, 30, 40, 48}) {
    for (int r = 0; r <= L; ++r) {
      const std::vector<int> s = interleaved_resident_set(L, r);
      ASSERT_EQ(static_cast<int>(s.size()), r) << L << " " << r;
      for (std::size_t i = 0; i < s.size(); ++i) {
        EXPECT_GE(s[i], 0);
        EXPECT_LT(s[i], L);
        if (i > 0) {
          EXPECT_LT(s[i - 1], s[i]);
        }
      }
      if (r >= 2) {
        EXPECT_EQ(s[0], 0);
        EXPECT_EQ(s[1], 1);
      }
    }
  }
}

// The planner's decomposed memory filter counts exactly the plans a plain static_memory() call
// per candidate accepts (tight GPU budget so that the frontier is inside the space).
TEST(EpPlanner, MemoryFilterMatchesStaticMemoryForEveryCandidate) {
  Workload w;
  w.model = "tiny-moe";
  w.hardware = "h100-sxm-node";
  w.gpus = 4;
  w.global_batch = 8;
  w.seq_len = 4096;
  const WorkloadContext probe = resolve_workload(w, "test");
  Plan none;
  const Bytes low = static_memory(probe, none).gpu.eq2.total();
  w.gpu_budget_gib = to_gib(low) + 0.002;
  const WorkloadContext ctx = resolve_workload(w, "test");
  const PlanPricer pricer(ctx, default_calibration(ctx.hardware));
  EpPlannerOptions o;
  o.routing_chunks_tokens = {2048, 4096};  // below the 8192 tokens per GPU: no chunk is a duplicate
  const EpSearchResult r = plan_ep(pricer, o);
  const Budgets b = workload_budgets(ctx);
  std::int64_t brute = 0, all = 0;
  const int L = ctx.model.layers;
  for (std::int64_t c : o.routing_chunks_tokens) {
    for (int slots : o.cpu_grad_slots) {
      for (int k = 0; k <= L; ++k) {
        for (int shape = 0; shape < 2; ++shape) {
          for (int res = 0; res <= L; ++res) {
            Plan p;
            p.resident_layers = shape == 0 ? contiguous_resident_set(L, res) : interleaved_resident_set(L, res);
            p.moe_retained_layers = retained_set(L, k);
            p.routing_chunk_tokens = c;
            p.cpu_grad_slots = slots;
            const MemoryReport m = static_memory(ctx, p);
            std::vector<Bytes> host;
            for (const auto& h : m.host) host.push_back(h.total());
            ++all;
            if (!check_budgets(b, m.gpu.eq2.total(), host, "", "")) ++brute;
          }
        }
      }
    }
  }
  EXPECT_EQ(r.enumerated, all);
  EXPECT_EQ(r.memory_feasible, brute);
  EXPECT_GT(brute, 0);
  EXPECT_LT(brute, all);
}

TEST(EpPlanner, ChosenPlanFitsItsBudgetsAndPrefersResidencyAtBatch32) {
  const WorkloadContext ctx = qwen_h100(32);
  const PlanPricer pricer(ctx, load_calibration_for(ctx.hardware));
  const EpSearchResult& r = ep_at_batch32();
  ASSERT_TRUE(r.best);
  EXPECT_GT(r.priced, 10);
  EXPECT_GT(r.memory_feasible, 0);
  const Budgets b = workload_budgets(ctx);
  EXPECT_LE(r.best->gpu_peak_max(), b.gpu_bytes);
  EXPECT_LE(static_memory(ctx, r.best->plan).gpu.eq2.total(), b.gpu_bytes);
  EXPECT_GE(r.best->plan.resident_layers.size(), 12u) << r.best->plan.notes;
  // Faster than streaming every expert shard (the published 8.5 s vs 5.0 s).
  Plan r0 = r.best->plan;
  r0.resident_layers.clear();
  r0.moe_retained_layers.clear();
  EXPECT_LT(r.best->step_s, 0.8 * pricer.price(r0).step_s);
}

// (The shift from resident state to retained activations as the batch grows is checked on the
// plan search's EP plans in plan_search_test.cc.)

TEST(EpPlanner, TighterGpuBudgetKeepsFewerResidentLayers) {
  Workload w = qwen_h100(32).workload;
  w.gpu_budget_gib = 40;
  const WorkloadContext tight = resolve_workload(w, "test");
  const PlanPricer pricer(tight, load_calibration_for(tight.hardware));
  const EpSearchResult r = plan_ep(pricer);
  ASSERT_TRUE(r.best);
  EXPECT_LE(r.best->gpu_peak_max(), from_gib(40));
  ASSERT_TRUE(ep_at_batch32().best);
  EXPECT_LT(r.best->plan.resident_layers.size(), ep_at_batch32().best->plan.resident_layers.size());
}

// Both planners' head groups: divisors of the query heads per KV group common to every attention
// kind, the whole group only where there are several KV heads.
TEST(HeadGroupLevels, DivideEveryAttentionKindsQueryHeadsPerKvGroup) {
  // Qwen3.6: 16 query heads over 2 KV heads.
  EXPECT_EQ(attention_head_group_levels(load_model_spec("qwen3.6-35b-a3b")), (std::vector<int>{8, 4, 2, 1}));
  // Mixtral: 32 over 8.
  EXPECT_EQ(attention_head_group_levels(load_model_spec("mixtral-8x7b")), (std::vector<int>{4, 2, 1}));
  // Gemma 4: 2 per group in the sliding layers (8 KV heads), 8 in the global ones (2): gcd 2.
  EXPECT_EQ(attention_head_group_levels(load_model_spec("gemma4-26b-a4b")), (std::vector<int>{2, 1}));
  // Kimi-K2's latent attention: a K and V per query head, so one head per call at most.
  EXPECT_EQ(attention_head_group_levels(load_model_spec("kimi-k2")), (std::vector<int>{1}));
}

// GDN pieces: whole sequences below the tokens per GPU, then pieces of one sequence; nothing that
// is neither, nothing for a model without GDN.
TEST(GdnPieceLevels, WholeSequencesThenPiecesOfOneLongestFirst) {
  const std::vector<std::int64_t> pieces = {262144, 4096, 8192, 16384, 24576, 32768, 65536, 131072, 8192};
  // 8 sequences of 16K per GPU (131,072 tokens): 4, 2 and 1 sequences, then 8K and 4K pieces.
  EXPECT_EQ(gdn_piece_levels(qwen_h100(32, 16384), pieces), (std::vector<std::int64_t>{65536, 32768, 16384, 8192, 4096}));
  // One 256K sequence per GPU: pieces of it only.
  EXPECT_EQ(gdn_piece_levels(qwen_h100(4, 262144), pieces),
            (std::vector<std::int64_t>{131072, 65536, 32768, 24576, 16384, 8192, 4096}));
  EXPECT_TRUE(gdn_piece_levels(h100_node("mixtral-8x7b", 32, 4096), pieces).empty());
}

TEST(TokensText, WholeKibiAndMebiTokensTakeTheirSuffix) {
  EXPECT_EQ(tokens_text(65536), "64K");
  EXPECT_EQ(tokens_text(1048576), "1M");
  EXPECT_EQ(tokens_text(3 * 1048576 + 1024), "3073K");
  EXPECT_EQ(tokens_text(1000), "1000");
  EXPECT_EQ(tokens_text(512), "512");
  EXPECT_EQ(tokens_text(0), "0");
}

TEST(EpMixingSplits, UnsplitFirstThenHeadGroupsAndGdnPiecesRefinedTogether) {
  const std::vector<std::int64_t> pieces = EpPlannerOptions{}.gdn_pieces_tokens;
  // Qwen3.6: 16 query heads over 2 KV heads (8 per group), GDN pieces below a 256K sequence.
  const std::vector<SplitSpec> q = ep_mixing_splits(qwen_h100(4, 262144), pieces);
  ASSERT_EQ(q.size(), 7u);
  EXPECT_EQ(q[0], SplitSpec{});
  // Head groups run out at 1; the GDN pieces go on to 4K.
  const std::vector<std::pair<int, std::int64_t>> want = {{8, 131072}, {4, 65536}, {2, 32768}, {1, 16384}, {1, 8192}, {1, 4096}};
  for (std::size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(q[i + 1].attention_head_group, want[i].first) << i;
    EXPECT_EQ(q[i + 1].gdn_chunk_tokens, want[i].second) << i;
    EXPECT_EQ(q[i + 1].moe_chunk_tokens, 0);
    EXPECT_EQ(q[i + 1].sub_batch_seqs, 0);
  }
  // At 4K with 8 sequences per GPU no GDN piece is shorter than the sequence: the GDN runs 4, 2,
  // then 1 sequence at a time.
  const std::vector<SplitSpec> s = ep_mixing_splits(qwen_h100(32), pieces);
  ASSERT_EQ(s.size(), 5u);
  const std::vector<std::pair<int, std::int64_t>> at4k = {{8, 16384}, {4, 8192}, {2, 4096}, {1, 4096}};
  for (std::size_t i = 0; i < at4k.size(); ++i) {
    EXPECT_EQ(s[i + 1].attention_head_group, at4k[i].first) << i;
    EXPECT_EQ(s[i + 1].gdn_chunk_tokens, at4k[i].second) << i;
  }
  // Each sequence over two GPUs (ring attention): nothing further.
  EXPECT_EQ(ep_mixing_splits(qwen_h100(2, 262144), pieces).size(), 1u);
}

// One 256K-token sequence per GPU under 25 GiB: unsplit, no EP plan fits (a mixing sublayer's
// saved tensors and the attention backward's buffers beside the MoE backward); the planner then
// partitions the heads and the GDN and finds a plan that fits.
TEST(EpPlanner, PartitionsTheMixingSublayersWhenNothingFitsUnsplit) {
  Workload w = qwen_h100(4, 262144).workload;
  w.gpu_budget_gib = 25;
  const WorkloadContext ctx = resolve_workload(w, "test");
  const PlanPricer pricer(ctx, load_calibration_for(ctx.hardware));
  // The least demanding unsplit EP plan: no resident layers, the smallest routing chunk.
  const MemoryReport whole = static_memory(ctx, pricer.with_flat([&] {
    Plan p;
    p.path = ExpertPath::kEp;
    p.resident_layers.clear();
    p.routing_chunk_tokens = 16384;
    p.cpu_grad_slots = 1;
    return p;
  }()), pricer.constants());
  EXPECT_GT(whole.gpu.eq2.total(), from_gib(25)) << whole.gpu.work_peak_at;
  const EpSearchResult r = plan_ep(pricer);
  ASSERT_TRUE(r.best);
  EXPECT_LE(r.best->gpu_peak_max(), from_gib(25));
  EXPECT_GT(r.best->plan.split.attention_head_group, 0);
  EXPECT_NE(r.best->plan.notes.find("attention head groups of"), std::string::npos) << r.best->plan.notes;
}

// Past the first partition that fits, a finer one frees GPU memory for a larger routing chunk or
// resident layers: the planner searches them all and keeps the fastest plan, here one finer than
// the first that fits.
TEST(EpPlanner, KeepsTheFastestPartitionNotTheFirstThatFits) {
  // Four 64K sequences per GPU under 20 GiB: the first partition that fits is head groups of 4
  // with the GDN one sequence at a time; one head per call with 16K GDN pieces is faster.
  Workload w = qwen_h100(16, 65536).workload;
  w.gpu_budget_gib = 20;
  const WorkloadContext ctx = resolve_workload(w, "test");
  const PlanPricer pricer(ctx, load_calibration_for(ctx.hardware));
  const EpPlannerOptions options;
  ASSERT_EQ(ep_group_candidates(ctx), (std::vector<int>{4}));
  std::optional<PricedPlan> first, fastest;
  for (const SplitSpec& split : ep_mixing_splits(ctx, options.gdn_pieces_tokens)) {
    EpSearchResult r = plan_ep_under(pricer, options, 4, split);
    if (!r.best) continue;
    if (!first) first = r.best;
    if (!fastest || r.best->step_s < fastest->step_s) fastest = r.best;
  }
  ASSERT_TRUE(first && fastest);
  EXPECT_LT(fastest->step_s, first->step_s);
  EXPECT_NE(fastest->plan.split, first->plan.split);
  const EpSearchResult chosen = plan_ep(pricer, options);
  ASSERT_TRUE(chosen.best);
  EXPECT_EQ(chosen.best->plan.split, fastest->plan.split);
  EXPECT_DOUBLE_EQ(chosen.best->step_s, fastest->step_s);
}

TEST(EpPlanner, AHostShortfallAtAFinerPartitionNamesIt) {
  Workload w = qwen_h100(4, 262144).workload;
  w.gpu_budget_gib = 25;
  w.host_budget_gib = 150;  // 75 GiB per NUMA node
  const WorkloadContext ctx = resolve_workload(w, "test");
  const EpSearchResult r = plan_ep(PlanPricer(ctx, load_calibration_for(ctx.hardware)));
  EXPECT_FALSE(r.best);
  ASSERT_TRUE(r.shortfall);
  EXPECT_EQ(r.shortfall->budget.rfind("host", 0), 0u) << r.shortfall->message();
  EXPECT_NE(r.shortfall->message().find("(as many as the GPU holds, attention head groups of 1, GDN pieces of 4K)"), std::string::npos)
      << r.shortfall->message();
}

TEST(EpPlanner, NamesTheGpuBudgetWhenNothingFits) {
  Workload w = qwen_h100(32).workload;
  w.gpu_budget_gib = 3;
  const WorkloadContext ctx = resolve_workload(w, "test");
  const EpSearchResult r = plan_ep(PlanPricer(ctx, load_calibration_for(ctx.hardware)));
  EXPECT_FALSE(r.best);
  ASSERT_TRUE(r.shortfall);
  EXPECT_EQ(r.shortfall->budget, "GPU");
  EXPECT_EQ(r.shortfall->budget_bytes, from_gib(3));
  EXPECT_GT(r.shortfall->needed_bytes, from_gib(3));
  EXPECT_NE(r.shortfall->message().find("GPU budget 3.0 GiB < "), std::string::npos) << r.shortfall->message();
  // The finest partition's shortfall, where its peak is: with the GDN one sequence at a time and
  // one query head per call, the vocabulary projection's.
  EXPECT_NE(r.shortfall->message().find("needed by loss (vocabulary projection)"), std::string::npos) << r.shortfall->message();
  EXPECT_NE(r.shortfall->message().find("attention head groups of 1, GDN pieces of 4K"), std::string::npos) << r.shortfall->message();
}

}  // namespace
}  // namespace oom
