// Memory equations against hand-computed values and the published sizes of reference §10.
#include "costmodel/memory.h"

#include <cmath>

#include <gtest/gtest.h>

namespace oom {
namespace {

TEST(Memory, CanonicalStateIsTwelveBytesPerParameter) {
  EXPECT_EQ(canonical_state_bytes(1000), 12000);  // FP32 master + m + v
  EXPECT_EQ(working_weight_bytes(1000), 2000);
  EXPECT_EQ(gradient_bytes(1000), 2000);
}

TEST(Memory, ThreeQwen36BoundariesAt512kAreSixGiB) {
  // Reference §10: the three regenerable boundaries of a 3+1 block free 6.0 GiB at 512K:
  // 3 · 2 B · 524,288 · 2048 = 6,442,450,944 B = 6.0 GiB.
  EXPECT_EQ(boundary_bytes(3, 1, 524288, 2048), 6LL * kGiB);
}

TEST(Memory, Qwen36OLseAt512kIs4point03GiB) {
  // 524,288 tokens · 16 heads · (2 B · 256 + 4 B) = 4,328,521,728 B = 4.03 GiB (reference §10).
  const ModelSpec m = load_model_spec("qwen3.6-35b-a3b");
  const Bytes b = attention_result_bytes(m.full_attention, 1, 524288);
  EXPECT_EQ(b, 4'328'521'728LL);
  EXPECT_NEAR(to_gib(b), 4.03, 0.005);
}

TEST(Memory, Gemma4BlockSizesMatchThePublishedTable) {
  // Per 5+1 block, one sequence: O/LSE of the global layer 0.50/1.00/2.01/4.02 GiB and five freed
  // sliding boundaries 0.86/1.72/3.44/6.88 GiB at 32K/64K/128K/256K (reference §10).
  const ModelSpec m = load_model_spec("gemma4-26b-a4b");
  const double olse[] = {0.50, 1.00, 2.01, 4.02};
  const double freed[] = {0.86, 1.72, 3.44, 6.88};
  for (int i = 0; i < 4; ++i) {
    const std::int64_t S = 32768LL << i;
    EXPECT_NEAR(to_gib(attention_result_bytes(m.full_attention, 1, S)), olse[i], 0.006) << S;
    EXPECT_NEAR(to_gib(boundary_bytes(5, 1, S, m.hidden)), freed[i], 0.006) << S;
  }
}

TEST(Memory, Eq4GdnChunkStates) {
  const ModelSpec m = load_model_spec("qwen3.6-35b-a3b");
  // 4 B · B=1 · (⌈524288/131072⌉ − 1 = 3) · 32 heads · 128 · 128 = 6,291,456 B
  EXPECT_EQ(gdn_chunk_state_bytes(m.gdn, 1, 524288, 131072), 6'291'456);
  EXPECT_EQ(gdn_chunk_state_bytes(m.gdn, 2, 1000, 300), 4LL * 2 * 3 * 32 * 128 * 128);  // ⌈1000/300⌉ = 4
  EXPECT_EQ(gdn_chunk_state_bytes(m.gdn, 1, 4096, 0), 0);
  EXPECT_EQ(gdn_chunk_state_bytes(m.gdn, 1, 4096, 4096), 0);
}

TEST(Memory, Eq6EpAllToAllVolume) {
  // 2 · k=8 · N=32768 · h=2048 · 2 B · (4−1)/4 = 1,610,612,736 B
  EXPECT_EQ(ep_a2a_bytes(8, 32768, 2048, 2, 4), 1'610'612'736LL);
  EXPECT_EQ(ep_a2a_bytes(8, 32768, 2048, 2, 1), 0);  // one GPU: nothing leaves
}

TEST(Memory, AttentionHeadGroupsShrinkOnlyTheQuerySide) {
  const ModelSpec m = load_model_spec("qwen3.6-35b-a3b");
  const AttentionSpec& a = m.full_attention;
  const Bytes all = attention_activation_bytes(a, m.hidden, 1, 1000, 0);
  const Bytes g2 = attention_activation_bytes(a, m.hidden, 1, 1000, 2);
  // Q and gate shrink from 16 to 2 heads (2 B each per element), LSE from 16 to 2 (4 B).
  EXPECT_EQ(all - g2, 1000LL * (14 * 256 * 2 * 2 + 14 * 4));
}

TEST(Memory, AttentionBackwardGradientsByHand) {
  const ModelSpec m = load_model_spec("qwen3.6-35b-a3b");
  const AttentionSpec& a = m.full_attention;  // 16 query heads on 2 KV heads, d 256, output gate
  const std::int64_t T = 1000;
  // Held: dO, the gate's gradient and dQ at 16 heads, dK and dV at 2 (BF16).
  const std::int64_t held = T * (3 * 16 * 256 * 2 + 2 * 2 * 256 * 2);
  // All heads in one call: FP32 dQ accumulator and softmax_d at 16 heads, dK/dV expanded to 16.
  const AttentionBackwardBytes all = attention_backward_bytes(a, m.hidden, 1, T, 0);
  EXPECT_EQ(all.held, held);
  EXPECT_EQ(all.per_call, T * (16 * 256 * 4 + 16 * 4 + 16 * 2 * 256 * 2));
  // A group is capped at the query heads of one KV group: 16 heads a group is 8, one per KV head.
  const AttentionBackwardBytes g16 = attention_backward_bytes(a, m.hidden, 1, T, 16);
  const AttentionBackwardBytes g8 = attention_backward_bytes(a, m.hidden, 1, T, 8);
  EXPECT_EQ(g16.held, g8.held);
  EXPECT_EQ(g16.per_call, g8.per_call);
  EXPECT_EQ(g8.held, T * (2048 * 2 + 2 * 256 * 2));
  // Two query heads on their one KV head per call, the sublayer's backward group by group (Split,
  // reference §4): held across the groups are the normalized input's gradient [T, 2048] and one KV
  // head's dK and dV [T, 256]; each group's dO, gate gradient and dQ at 2 heads live in its call
  // beside the FP32 dQ accumulator, softmax_d and dK/dV expanded to the 2 heads.
  const AttentionBackwardBytes g2 = attention_backward_bytes(a, m.hidden, 1, T, 2);
  EXPECT_EQ(g2.held, T * (2048 * 2 + 2 * 256 * 2));
  EXPECT_EQ(g2.per_call, T * (3 * 2 * 256 * 2 + 2 * 256 * 4 + 2 * 4 + 2 * 2 * 256 * 2));
  EXPECT_LT(g2.held + g2.per_call, all.held + all.per_call);
  // Without GQA (MLA: per-head K and V) nothing is expanded; d_v 128 beside d 192; no gate.
  const ModelSpec k = load_model_spec("kimi-k2");
  const AttentionBackwardBytes mla = attention_backward_bytes(k.latent_attention, k.hidden, 2, 5, 0);
  EXPECT_EQ(mla.held, 10LL * (64 * 128 * 2 + 64 * 192 * 2 + 64 * 192 * 2 + 64 * 128 * 2));
  EXPECT_EQ(mla.per_call, 10LL * (64 * 192 * 4 + 64 * 4));
  // MLA in head groups: kv_b expands K and V per head from one latent, so the held buffers stay whole.
  const AttentionBackwardBytes mla8 = attention_backward_bytes(k.latent_attention, k.hidden, 2, 5, 8);
  EXPECT_EQ(mla8.held, mla.held);
  // Gemma 4's global layers: V is K (one gradient), 16 query heads on 2 KV heads of width 512.
  const ModelSpec g = load_model_spec("gemma4-26b-a4b");
  const AttentionBackwardBytes global = attention_backward_bytes(g.full_attention, g.hidden, 1, T, 0);
  EXPECT_EQ(global.held, T * (2 * 16 * 512 * 2 + 2 * 512 * 2));
  // ... and in groups of 8 query heads: the input's gradient and the one KV head's dK (V is K).
  const AttentionBackwardBytes global8 = attention_backward_bytes(g.full_attention, g.hidden, 1, T, 8);
  EXPECT_EQ(global8.held, T * (g.hidden * 2 + 512 * 2));
}

TEST(Memory, GdnBackwardBuffersByHand) {
  const ModelSpec m = load_model_spec("qwen3.6-35b-a3b");
  const GdnSpec& g = m.gdn;  // 16 key heads, 32 value heads, d_k = d_v = 128
  ASSERT_EQ(g.value_heads, 32);
  ASSERT_EQ(g.key_head_dim, 128);
  ASSERT_EQ(g.value_head_dim, 128);
  // One call over T tokens in c chunks of 64: w, dq, dk, dw, dk2 and u, v_new, dv, dv2 at the 32
  // value heads (BF16), h and dh per chunk, two FP32 gate gradients and beta's (BF16); what the
  // forward saved: normalized q and k (BF16), their reciprocal norms and the cumulative gate (FP32),
  // A (64 BF16 per token and head).
  const auto by_hand = [](std::int64_t T, std::int64_t c) {
    return T * 32 * (9 * 128 * 2 + 4 + 4 + 2) + 2 * c * 32 * 128 * 128 * 2 + T * 32 * (2 * 128 * 2 + 3 * 4 + 64 * 2);
  };
  EXPECT_EQ(gdn_backward_bytes(g, 1, 1000, 0), by_hand(1000, 16));  // ⌈1000/64⌉ = 16 chunks
  // Pieces of 256 tokens of two sequences: one call takes 256 tokens of each.
  EXPECT_EQ(gdn_backward_bytes(g, 2, 1000, 256), by_hand(512, 8));
  // Pieces of 2000 tokens over three 1000-token sequences: two whole sequences a call.
  EXPECT_EQ(gdn_backward_bytes(g, 3, 1000, 2000), by_hand(2000, 32));
  // The decoder's mixing backward in one call: the GDN call over every sequence, or an attention
  // core's two parts.
  int gdn_layer = -1, attention_layer = -1;
  for (int l = 0; l < m.layers; ++l) {
    (m.layer_kinds[static_cast<std::size_t>(l)] == LayerKind::kLinearAttention ? gdn_layer : attention_layer) = l;
  }
  ASSERT_GE(gdn_layer, 0);
  ASSERT_GE(attention_layer, 0);
  EXPECT_EQ(mixing_backward_total_bytes(m, gdn_layer, 3, 1000), gdn_backward_bytes(g, 3, 1000, 0));
  const AttentionBackwardBytes a = attention_backward_bytes(m.full_attention, m.hidden, 3, 1000, 0);
  EXPECT_EQ(mixing_backward_total_bytes(m, attention_layer, 3, 1000), a.held + a.per_call);
}

// A GDN piece's calls, which the memory model, the lowering's operator counts and the backend
// all read: pieces of every sequence (one call each), or whole sequences C/S a call.
TEST(Memory, GdnCallShapes) {
  const auto expect = [](GdnCallShape c, int pieces, std::int64_t seq_tokens, std::int64_t call_seqs, std::int64_t calls) {
    EXPECT_EQ(c.pieces, pieces);
    EXPECT_EQ(c.seq_tokens, seq_tokens);
    EXPECT_EQ(c.call_seqs, call_seqs);
    EXPECT_EQ(c.calls, calls);
    EXPECT_EQ(c.call_tokens(), call_seqs * seq_tokens);
  };
  expect(gdn_call_shape(3, 1000, 0), 1, 1000, 3, 1);     // unsplit: one call over everything
  expect(gdn_call_shape(2, 1000, 256), 4, 256, 2, 1);    // ⌈1000/256⌉ pieces, the last of 232 tokens
  expect(gdn_call_shape(3, 1000, 1000), 1, 1000, 1, 3);  // one sequence a call
  expect(gdn_call_shape(3, 1000, 2000), 1, 1000, 2, 2);  // two a call: calls of two and of one
  expect(gdn_call_shape(2, 1000, 8000), 1, 1000, 2, 1);  // more than the sub-batch: all in one call
}

TEST(Memory, MoeActivationsByHand) {
  const ModelSpec m = load_model_spec("tiny-moe");  // h 64, E 8, k 2, I 32, shared 32, dense 48
  const std::int64_t per_token = 64 * 2 + 8 * 4 + 2 * 12 + 2 * 64 * 2 + 2 * 3 * 32 * 2 + 2 * 64 * 2 + 3 * 32 * 2 + 3 * 48 * 2;
  EXPECT_EQ(moe_activation_bytes(m, 0, 10), 10 * per_token);
}

TEST(Memory, LatentAttentionActivationsByHand) {
  const ModelSpec m = load_model_spec("kimi-k2");
  const AttentionSpec& a = m.latent_attention;  // 64 heads, d_qk 192, d_v 128, r_q 1536, r_kv 512, rope 64
  const std::int64_t per_token = 7168 * 2                 // normed input
                                 + (2 * 1536 + 2 * 512 + 64) * 2  // latents before and after their norms
                                 + 64 * (192 + 128) * 2    // per-head K and V
                                 + 64 * 192 * 2 + 64 * 4   // Q, LSE
                                 + 64 * 128 * 2;           // O
  EXPECT_EQ(attention_activation_bytes(a, m.hidden, 2, 5, 0), 10 * per_token);
  EXPECT_EQ(attention_result_bytes(a, 2, 5), 10LL * (64 * 128 * 2 + 64 * 4));
}

TEST(Memory, DenseFirstLayerHoldsItsMlpAndNoRoutedActivations) {
  const ModelSpec m = load_model_spec("kimi-k2");
  EXPECT_EQ(moe_activation_bytes(m, 0, 10), 10LL * (7168 * 2 + 3 * 18432 * 2));
  EXPECT_EQ(a2a_buffer_bytes(m, 0, 10), 0);
  EXPECT_EQ(a2a_buffer_bytes(m, 1, 10), 2LL * 8 * 10 * 7168 * 2);
  EXPECT_GT(moe_activation_bytes(m, 1, 10), moe_activation_bytes(m, 0, 10));
}

TEST(Memory, Eq2AddsHeadroomAsAFractionOfTheRest) {
  const GpuPeakTerms t = eq2_gpu_peak(100, 200, 300, 400, 0.1);
  EXPECT_EQ(t.headroom, 100);
  EXPECT_EQ(t.total(), 1100);
}

}  // namespace
}  // namespace oom
