// FLOP equations (Eq. 1) against hand-computed values.
#include "costmodel/flops.h"

#include <gtest/gtest.h>

namespace oom {
namespace {

AttentionSpec small_attention(std::int64_t window = 0) {
  AttentionSpec a;
  a.heads = 2;
  a.kv_heads = 1;
  a.head_dim = 8;
  a.window_tokens = window;
  return a;
}

TEST(Flops, CausalPairsCountQueryKeyPairs) {
  EXPECT_DOUBLE_EQ(causal_pairs(4, 0), 10.0);   // 1 + 2 + 3 + 4
  EXPECT_DOUBLE_EQ(causal_pairs(10, 4), 34.0);  // 1 + 2 + 3 + 4, then 6 queries × 4 keys
  EXPECT_DOUBLE_EQ(causal_pairs(3, 8), 6.0);    // window longer than the sequence
  double brute = 0;
  for (int q = 0; q < 1000; ++q) brute += std::min(q + 1, 128);
  EXPECT_DOUBLE_EQ(causal_pairs(1000, 128), brute);
}

TEST(Flops, FullAttentionCoreSplitsIntoQuadraticAndDiagonal) {
  // 4·heads·d = 64 FLOPs per pair; S = 4: quadratic 64·16/2 = 512, linear 64·4/2 = 128, total 64·10.
  const Eq1Flops f = attention_core_flops(small_attention(), 1, 4);
  EXPECT_DOUBLE_EQ(f.quadratic, 512.0);
  EXPECT_DOUBLE_EQ(f.linear, 128.0);
  EXPECT_DOUBLE_EQ(f.total(), 64.0 * causal_pairs(4, 0));
  EXPECT_DOUBLE_EQ(attention_core_flops(small_attention(), 3, 4).total(), 3 * 640.0);
}

TEST(Flops, SlidingWindowAttentionIsTokenLinearPastItsWindow) {
  const Eq1Flops f = attention_core_flops(small_attention(4), 1, 10);
  EXPECT_DOUBLE_EQ(f.quadratic, 0.0);
  EXPECT_DOUBLE_EQ(f.linear, 64.0 * 34.0);
  // Each extra token past the window adds exactly w pairs.
  EXPECT_DOUBLE_EQ(attention_core_flops(small_attention(4), 1, 11).linear - f.linear, 64.0 * 4);
}

TEST(Flops, AtEqualTokensAttentionStillDependsOnSequenceLength) {
  const ModelSpec m = load_model_spec("qwen3.6-35b-a3b");
  const Eq1Flops short_seqs = model_forward_flops(m, 2, 2048);
  const Eq1Flops long_seq = model_forward_flops(m, 1, 4096);
  EXPECT_DOUBLE_EQ(short_seqs.linear, long_seq.linear);
  EXPECT_DOUBLE_EQ(long_seq.quadratic, 2.0 * short_seqs.quadratic);  // b·B·S²: B halves, S² quadruples
  // b = 2·heads·d per full-attention layer: 10 layers · 2·16·256 · 1 · 4096².
  EXPECT_DOUBLE_EQ(long_seq.quadratic, 10.0 * 2 * 16 * 256 * 4096.0 * 4096.0);
}

TEST(Flops, MoeCountsRouterTopKExpertsSharedAndDense) {
  const ModelSpec m = load_model_spec("tiny-moe");  // h 64, E 8, k 2, I 32, shared 32, dense 48
  const MoeFlops f = moe_flops(m, 0, 10);
  EXPECT_DOUBLE_EQ(f.router, 2.0 * 10 * 64 * 8);
  EXPECT_DOUBLE_EQ(f.routed_experts, 2.0 * 10 * 2 * (3 * 64 * 32));
  EXPECT_DOUBLE_EQ(f.shared_expert, 2.0 * 10 * (3 * 64 * 32 + 64));
  EXPECT_DOUBLE_EQ(f.dense_mlp, 2.0 * 10 * (3 * 64 * 48));
}

TEST(Flops, LatentAttentionScoresOverQkWidthAndValuesOverVWidth) {
  const ModelSpec m = load_model_spec("deepseek-v3");
  const AttentionSpec& a = m.latent_attention;
  // 2·heads·(d_qk + d_v) = 2·128·(192 + 128) FLOPs per query–key pair.
  EXPECT_DOUBLE_EQ(attention_core_flops(a, 1, 4).total(), 2.0 * 128 * (192 + 128) * causal_pairs(4, 0));
  // Projections: one multiply-accumulate per weight but the two latent norms'.
  EXPECT_DOUBLE_EQ(attention_projection_flops(a, m.hidden, 10), 2.0 * 10 * (187'107'328 - 1536 - 512));
  const LayerFlops f = layer_flops(m, 0, 1, 10);
  EXPECT_DOUBLE_EQ(f.mixing_output, 2.0 * 10 * 128 * 128 * 7168);  // o_proj reads heads·d_v
}

TEST(Flops, DenseFirstLayersRunTheirMlpAndNoExperts) {
  const ModelSpec m = load_model_spec("deepseek-v3");
  const MoeFlops dense = moe_flops(m, 0, 10);
  EXPECT_DOUBLE_EQ(dense.dense_mlp, 2.0 * 10 * 3 * 7168 * 18432);
  EXPECT_DOUBLE_EQ(dense.router + dense.routed_experts + dense.shared_expert, 0.0);
  const MoeFlops moe = moe_flops(m, 3, 10);
  EXPECT_DOUBLE_EQ(moe.routed_experts, 2.0 * 10 * 8 * 3 * 7168 * 2048);
  EXPECT_DOUBLE_EQ(moe.shared_expert, 2.0 * 10 * 3 * 7168 * 2048);  // no gate
  EXPECT_DOUBLE_EQ(moe.router, 2.0 * 10 * 7168 * 256);
  EXPECT_DOUBLE_EQ(moe.dense_mlp, 0.0);
}

TEST(Flops, GdnRecurrenceIsLinearInTokens) {
  const ModelSpec m = load_model_spec("tiny-moe");  // 4 value heads, d_k = d_v = 16, C = 64
  // per token and head: 6·16·16 + 2·64·(2·16 + 2·16) = 1536 + 8192
  EXPECT_DOUBLE_EQ(gdn_core_flops(m.gdn, 100), 100.0 * 4 * (1536 + 8192));
  const LayerFlops f = layer_flops(m, 0, 2, 50);
  EXPECT_TRUE(f.core_is_recurrent);
  EXPECT_DOUBLE_EQ(f.mixing_core.quadratic, 0.0);
  EXPECT_DOUBLE_EQ(f.mixing_core.linear, gdn_core_flops(m.gdn, 100));
}

TEST(Flops, BackwardIsTwiceTheMatmulsAndTwoAndAHalfTimesAttention) {
  const ModelSpec m = load_model_spec("tiny-moe");
  const LayerFlops f = layer_flops(m, 3, 1, 32);  // full attention
  EXPECT_DOUBLE_EQ(f.backward(), 2.0 * (f.mixing_projection + f.moe.total()) + 2.5 * f.mixing_core.total());
}

TEST(Flops, ProjectionFlopsAreTwicePerTokenPerWeight) {
  const ModelSpec m = load_model_spec("mixtral-8x7b");
  EXPECT_DOUBLE_EQ(attention_projection_flops(m.sliding_attention, m.hidden, 3), 2.0 * 3 * 41'943'040);
  EXPECT_DOUBLE_EQ(lm_head_flops(m, 5), 2.0 * 5 * 4096 * 32000);
}

}  // namespace
}  // namespace oom
