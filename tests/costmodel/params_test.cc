// Parameter counts against the published totals of each model.
#include "costmodel/params.h"

#include <cmath>

#include <gtest/gtest.h>

namespace oom {
namespace {

double rel(double a, double b) { return std::fabs(a - b) / b; }

TEST(Params, Mixtral8x7bIs46point70BTotalAnd12point9BActive) {
  const ModelParams p = model_params(load_model_spec("mixtral-8x7b"));
  EXPECT_LT(rel(p.total(), 46.70e9), 0.01) << p.total();
  EXPECT_LT(rel(p.active(), 12.9e9), 0.01) << p.active();
  // Hand count: attention 4096·(4096 + 1024 + 1024) + 4096·4096 = 41,943,040 per layer;
  // experts 8 · 3·4096·14336 = 1,409,286,144; router 4096·8; norms 2·4096.
  EXPECT_EQ(p.layers[0].mixing, 41'943'040);
  EXPECT_EQ(p.layers[0].routed_experts, 1'409'286'144);
  EXPECT_EQ(p.layers[0].router, 32'768);
  EXPECT_EQ(p.total(), 32LL * (41'943'040 + 1'409'286'144 + 32'768 + 8'192) + 2LL * 32000 * 4096 + 4096);
}

TEST(Params, Qwen3_30bIs30point53BTotalAnd3point3BActive) {
  const ModelParams p = model_params(load_model_spec("qwen3-30b-a3b"));
  EXPECT_LT(rel(p.total(), 30.53e9), 0.01) << p.total();
  // The card's "3.3B activated" truncates 3.35B (attention 18.87M + 8 experts 37.75M + router per layer,
  // ×48, + both 311M embedding matrices = 3.353B): 1.6% above 3.3, the same figure to the published digit.
  EXPECT_LT(rel(p.active(), 3.3e9), 0.02) << p.active();
  EXPECT_EQ(static_cast<long long>(p.active() / 100'000'000), 33);
}

// The FLAT studies' 120B–667B class (reference §6): Qwen3-235B-A22B and Qwen3-Coder-480B-A35B,
// both qwen3_moe, against their published totals and activated counts.
TEST(Params, Qwen3_235bIs235BTotalAnd22BActive) {
  const ModelParams p = model_params(load_model_spec("qwen3-235b-a22b"));
  EXPECT_LT(rel(p.total(), 235e9), 0.01) << p.total();
  EXPECT_LT(rel(p.active(), 22e9), 0.03) << p.active();
  // Attention 4096·8192 + 2·4096·512 + 8192·4096 + q/k norms 2·128; experts 128·3·4096·1536.
  EXPECT_EQ(p.layers[0].mixing, 4096LL * 8192 * 2 + 2LL * 4096 * 512 + 256);
  EXPECT_EQ(p.layers[0].routed_experts, 128LL * 3 * 4096 * 1536);
}

TEST(Params, Qwen3Coder480bIs480BTotalAnd35BActive) {
  const ModelParams p = model_params(load_model_spec("qwen3-coder-480b-a35b"));
  EXPECT_LT(rel(p.total(), 480e9), 0.01) << p.total();
  EXPECT_LT(rel(p.active(), 35e9), 0.03) << p.active();
  EXPECT_EQ(p.layers[0].routed_experts, 160LL * 3 * 6144 * 2560);
}

// DeepSeek-V3: 671B total, 37B activated (its model card; the 685B checkpoint adds the 14B
// multi-token-prediction module, which is not part of the decoder). Hand count of one layer:
// MLA q_a 7168·1536 + 1536 + q_b 1536·128·192 + kv_a 7168·576 + 512 + kv_b 512·128·256 +
// o 128·128·7168 = 187,107,328; three dense layers of 3·7168·18432; 58 MoE layers of 256 experts
// of 3·7168·2048, one ungated shared expert and a 256 × 7168 router.
TEST(Params, DeepSeekV3Is671BTotalAnd37BActive) {
  const ModelSpec m = load_model_spec("deepseek-v3");
  const ModelParams p = model_params(m);
  EXPECT_LT(rel(p.total(), 671e9), 0.005) << p.total();
  EXPECT_LT(rel(p.active(), 37e9), 0.02) << p.active();
  EXPECT_EQ(p.layers[0].mixing, 187'107'328);
  EXPECT_EQ(p.layers[0].dense_mlp, 3LL * 7168 * 18432);
  EXPECT_EQ(p.layers[0].routed_experts, 0);
  EXPECT_EQ(p.layers[0].router, 0);
  EXPECT_EQ(p.layers[3].dense_mlp, 0);
  EXPECT_EQ(p.layers[3].routed_experts, 256LL * 3 * 7168 * 2048);
  EXPECT_EQ(p.layers[3].shared_expert, 3LL * 7168 * 2048);  // no gate
  EXPECT_EQ(p.layers[3].router, 256LL * 7168);
  EXPECT_EQ(p.total(), 61LL * (187'107'328 + 2 * 7168) + 3LL * 3 * 7168 * 18432 +
                           58LL * (256LL * 7168 + 257LL * 3 * 7168 * 2048) + 2LL * 129280 * 7168 + 7168);
}

// Kimi-K2: 1.04T total, 32.6B activated (its technical report; the model card rounds to 1T and
// 32B). DeepSeek-V3's decoder with 64 heads, 384 experts and one dense layer: 1.026T counted,
// 1.3% under the report's figure.
TEST(Params, KimiK2IsAbout1point04TTotalAnd32point6BActive) {
  const ModelParams p = model_params(load_model_spec("kimi-k2"));
  EXPECT_LT(rel(p.total(), 1.04e12), 0.02) << p.total();
  EXPECT_LT(rel(p.active(), 32.6e9), 0.02) << p.active();
  // MLA with 64 heads: q_a 11,010,048 + 1536 + q_b 1536·64·192 + kv_a 7168·576 + 512 + kv_b
  // 512·64·256 + o 64·128·7168.
  EXPECT_EQ(p.layers[0].mixing, 11'010'048 + 1536 + 18'874'368 + 4'128'768 + 512 + 8'388'608 + 58'720'256);
  EXPECT_EQ(p.layers[1].routed_experts, 384LL * 3 * 7168 * 2048);
  EXPECT_EQ(p.active_per_token_experts, 60LL * 8 * 3 * 7168 * 2048);
}

TEST(Params, Qwen36BackboneIsWithin3PercentOf35B) {
  // The published 35B also counts the vision tower (~0.4B) and the multi-token-prediction layer;
  // the language backbone modelled here is 34.66B.
  const ModelParams p = model_params(load_model_spec("qwen3.6-35b-a3b"));
  EXPECT_LT(rel(p.total(), 35e9), 0.03) << p.total();
  // GDN layer by hand: in_proj_qkvz 2048·(2·2048 + 2·4096) = 25,165,824; in_proj_ba 2048·64 = 131,072;
  // conv (2·2048 + 4096)·4 = 32,768; dt_bias + A_log 64; norm 128; out_proj 4096·2048 = 8,388,608.
  EXPECT_EQ(p.layers[0].mixing, 25'165'824 + 131'072 + 32'768 + 64 + 128 + 8'388'608);
  // Gated full attention: q 2048·(16·256·2) = 16,777,216; k, v 2048·512 each; o 4096·2048; q/k norms 2·256.
  EXPECT_EQ(p.layers[3].mixing, 16'777'216 + 2 * 1'048'576 + 8'388'608 + 512);
  // Shared expert 3·2048·512 + gate 2048.
  EXPECT_EQ(p.layers[0].shared_expert, 3'145'728 + 2'048);
}

TEST(Params, Qwen35_122bBackboneIsWithin3PercentOf122B) {
  // As for Qwen3.6: the published total includes the vision tower and the MTP layer.
  const ModelParams p = model_params(load_model_spec("qwen3.5-122b-a10b"));
  EXPECT_LT(rel(p.total(), 122e9), 0.03) << p.total();
}

TEST(Params, Gemma4Is25point2BTotalAnd3point8BActive) {
  const ModelParams p = model_params(load_model_spec("gemma4-26b-a4b"));
  EXPECT_LT(rel(p.total(), 25.2e9), 0.03) << p.total();
  EXPECT_LT(rel(p.active(), 3.8e9), 0.03) << p.active();
  EXPECT_EQ(p.lm_head, 0);  // tied
  // Global layer: q 2816·8192, k 2816·1024, no v (K = V), o 8192·2816, q/k norms 2·512.
  EXPECT_EQ(p.layers[5].mixing, 2816LL * 8192 * 2 + 2816LL * 1024 + 1024);
  EXPECT_EQ(p.layers[0].dense_mlp, 3LL * 2816 * 2112);
}

TEST(Params, QwenNext80bIsWithin3PercentOf80B) {
  const ModelParams p = model_params(load_model_spec("qwen3-next-80b-a3b"));
  EXPECT_LT(rel(p.total(), 80e9), 0.03) << p.total();
}

TEST(Params, ActiveCountsTopKExpertsAndEverythingElse) {
  const ModelSpec m = load_model_spec("tiny-moe");
  const ModelParams p = model_params(m);
  const LayerParams s = p.layer_sum();
  EXPECT_EQ(p.total() - p.active(), s.routed_experts - std::int64_t{m.layers} * m.moe.top_k * expert_params(m));
}

}  // namespace
}  // namespace oom
