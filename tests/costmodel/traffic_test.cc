// Tests of costmodel/traffic.h: the HBM bytes of the memory-bound kernels follow the documented
// per-token counts, scale with tokens, and grow with the expert count and width they depend on.
#include "costmodel/traffic.h"

#include <gtest/gtest.h>

namespace oom {
namespace {

ModelSpec model() {
  ModelSpec m;
  m.layers = 2;
  m.hidden = 64;
  m.vocab = 1000;
  m.layer_kinds = {LayerKind::kFullAttention, LayerKind::kLinearAttention};
  m.full_attention = {.heads = 4, .kv_heads = 2, .head_dim = 16, .output_gate = true, .qk_norm = true};
  m.gdn = {.key_heads = 2, .value_heads = 4, .key_head_dim = 16, .value_head_dim = 8, .conv_kernel = 4};
  m.moe = {.experts = 8, .top_k = 2, .expert_intermediate = 32, .shared_expert_intermediate = 16};
  return m;
}

TEST(Traffic, AttentionMixingCountsNormsRopeGateAndResidual) {
  const ModelSpec m = model();
  // 5·h (norm, residual) + 2·(H+Hkv)·d (RoPE) + 2·(H+Hkv)·d (q/k norm) + 3·H·d (gate), BF16.
  const std::int64_t per_token = 5 * 64 + 2 * 96 + 2 * 96 + 3 * 64;
  EXPECT_EQ(mixing_hbm_bytes(m, 0, 10), 10 * per_token * kBf16Bytes);
  EXPECT_EQ(mixing_hbm_bytes(m, 0, 20), 2 * mixing_hbm_bytes(m, 0, 10));
}

TEST(Traffic, GdnMixingCountsConvNormsAndGates) {
  const ModelSpec m = model();
  const std::int64_t dk = 32, dv = 32;
  const std::int64_t per_token = 5 * 64 + 2 * (2 * dk + dv) + 4 * dk + 3 * dv;
  EXPECT_EQ(mixing_hbm_bytes(m, 1, 7), 7 * per_token * kBf16Bytes);
}

// Qwen3.6's GDN heads (d_k = d_v = 128, chunks of 64): 5,120 bytes per token and value head
// forward (14·128 + 12·128 of vectors, 12·64 of A, 4·128·128/64 of states), 10,880 backward
// (36·128 + 30·128 + 6·64 + 8·128·128/64). A sequence's last, partial chunk still writes a state.
TEST(Traffic, GdnCoreCountsTheChunkedKernelsIntermediates) {
  const GdnSpec g{.key_heads = 16, .value_heads = 32, .key_head_dim = 128, .value_head_dim = 128, .conv_kernel = 4};
  EXPECT_EQ(gdn_core_hbm_bytes(g, 1, 4096, false), 32 * 4096 * 5120);
  EXPECT_EQ(gdn_core_hbm_bytes(g, 1, 4096, true), 32 * 4096 * 10880);
  EXPECT_EQ(gdn_core_hbm_bytes(g, 3, 4096, true), 3 * gdn_core_hbm_bytes(g, 1, 4096, true));
  const std::int64_t state = 2 * 128 * 128 * kBf16Bytes;  // h written and read, per chunk
  EXPECT_EQ(gdn_core_hbm_bytes(g, 1, 65, false) - gdn_core_hbm_bytes(g, 1, 64, false),
            32 * ((5120 - state / 64) + state));  // one more token, and a second chunk's state
  // A layer's mixing core: its GDN kernels' traffic, none for attention's fused kernel.
  const ModelSpec m = model();
  EXPECT_EQ(mixing_core_hbm_bytes(m, 1, 2, 100, true), gdn_core_hbm_bytes(m.gdn, 2, 100, true));
  EXPECT_EQ(mixing_core_hbm_bytes(m, 0, 2, 100, true), 0);
}

TEST(Traffic, MoeCountsRouterPermutationAndActivations) {
  ModelSpec m = model();
  const MoeTraffic t = moe_hbm_bytes(m, 0, 10);
  EXPECT_EQ(t.pre, 10 * ((2 * 64 + 2 * 2 * 64 + 3 * 16) * kBf16Bytes + 2 * 8 * kFp32Bytes));
  EXPECT_EQ(t.experts, 10 * 3 * 2 * 32 * kBf16Bytes);
  EXPECT_EQ(t.combine, 10 * (2 * 64 + 64 + 3 * 64) * kBf16Bytes);
  EXPECT_EQ(t.total(), t.pre + t.experts + t.combine);
  // More experts per token move more bytes through the permutation and the activation.
  m.moe.top_k = 4;
  const MoeTraffic wider = moe_hbm_bytes(m, 0, 10);
  EXPECT_GT(wider.pre, t.pre);
  EXPECT_EQ(wider.experts, 2 * t.experts);
  EXPECT_GT(wider.combine, t.combine);
}

TEST(Traffic, LossMovesFp32LogitsTwiceForwardAndOnceBack) {
  const ModelSpec m = model();
  EXPECT_EQ(loss_forward_hbm_bytes(m, 3), 3 * 1000 * 8);
  EXPECT_EQ(loss_backward_hbm_bytes(m, 3), 3 * 1000 * 6);
}

TEST(Traffic, Gemma4CountsItsSandwichNormsAndTheLogitSoftcap) {
  ModelSpec m = model();
  const Bytes mixing = mixing_hbm_bytes(m, 0, 10);
  const MoeTraffic plain = moe_hbm_bytes(m, 0, 10);
  const Bytes loss_fwd = loss_forward_hbm_bytes(m, 3), loss_bwd = loss_backward_hbm_bytes(m, 3);
  m.model_type = "gemma4_text";
  ASSERT_TRUE(m.gemma4());
  // The v norm over the KV heads and the post-attention norm.
  EXPECT_EQ(mixing_hbm_bytes(m, 0, 10), mixing + 10 * (2 * 32 + 2 * 64) * kBf16Bytes);
  const MoeTraffic g = moe_hbm_bytes(m, 0, 10);
  // Three input norms and the router's scale (9·h) instead of one norm (2·h); three output norms,
  // their sum and the layer scalar (11·h).
  EXPECT_EQ(g.pre, plain.pre + 10 * 7 * 64 * kBf16Bytes);
  EXPECT_EQ(g.experts, plain.experts);
  EXPECT_EQ(g.combine, plain.combine + 10 * 11 * 64 * kBf16Bytes);
  // No softcap, no extra passes over the logits; with one, three more forward, seven accesses back.
  EXPECT_EQ(loss_forward_hbm_bytes(m, 3), loss_fwd);
  m.final_logit_softcap = 30;
  EXPECT_EQ(loss_forward_hbm_bytes(m, 3), loss_fwd + 3 * 1000 * 6 * kFp32Bytes);
  EXPECT_EQ(loss_backward_hbm_bytes(m, 3), loss_bwd + 3 * 1000 * 7 * kFp32Bytes);
}

}  // namespace
}  // namespace oom
