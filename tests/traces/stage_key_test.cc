// Tests of traces/stage_key.h: the one text form of a stage key, read back exactly.
#include "traces/stage_key.h"

#include <random>

#include <gtest/gtest.h>

namespace oom {
namespace {

StageKey key(int rank, Phase phase, int decoder, StagePart part, StageOp op) {
  StageKey k;
  k.rank = rank, k.phase = phase, k.decoder = decoder, k.part = part, k.op = op;
  return k;
}

TEST(StageKey, TextFormPutsIndicesBetweenPartAndOperator) {
  StageKey k = key(0, Phase::kForward, 3, StagePart::kMoe, StageOp::kExperts);
  k.chunk = 1;
  EXPECT_EQ(format_stage_key(k), "g0.fwd.L3.moe.c1.experts");
  k = key(2, Phase::kBackward, 0, StagePart::kAttention, StageOp::kCoreBwd);
  k.head_group = 1;
  k.sub_batch = 3;
  EXPECT_EQ(format_stage_key(k), "g2.bwd.L0.attn.sb3.h1.core_bwd");
  k = key(1, Phase::kOptimizer, -1, StagePart::kLmHead, StageOp::kCpuAdamW);
  k.bucket = 12;
  EXPECT_EQ(format_stage_key(k), "g1.opt.lm_head.b12.cpu_adamw");
  k = key(0, Phase::kRecompute, 7, StagePart::kWeights, StageOp::kH2d);
  k.micro_batch = 2;
  EXPECT_EQ(format_stage_key(k), "g0.recompute.mb2.L7.weights.h2d");
  k.repeat = 2;
  EXPECT_EQ(format_stage_key(k), "g0.recompute.mb2.L7.weights.r2.h2d");
  k = key(3, Phase::kForward, -1, StagePart::kLmHead, StageOp::kPass);
  k.ring_step = 2;
  EXPECT_EQ(format_stage_key(k), "g3.fwd.lm_head.s2.pass");
  k = key(8, Phase::kBackward, 4, StagePart::kMoe, StageOp::kA2aGradDispatch);
  k.join = true;
  EXPECT_EQ(format_stage_key(k), "g8.bwd.L4.moe.a2a_grad_dispatch.join");
}

TEST(StageKey, EveryPartOperatorAndIndexRoundTrips) {
  std::mt19937 rng(11);
  auto index = [&rng] { return rng() % 3 == 0 ? -1 : static_cast<int>(rng() % 40); };
  for (int p = 0; p < kStageParts; ++p) {
    for (int o = 0; o < kStageOps; ++o) {
      for (int trial = 0; trial < 4; ++trial) {
        StageKey k;
        k.rank = static_cast<int>(rng() % 16);
        k.phase = static_cast<Phase>(rng() % 4);
        k.micro_batch = index();
        k.decoder = index();
        k.part = static_cast<StagePart>(p);
        k.sub_batch = index();
        k.repeat = index();
        k.chunk = index();
        k.head_group = index();
        k.ring_step = index();
        k.bucket = index();
        k.op = static_cast<StageOp>(o);
        k.join = rng() % 4 == 0;
        const std::string text = format_stage_key(k);
        const auto back = parse_stage_key(text);
        ASSERT_TRUE(back.has_value()) << text;
        EXPECT_EQ(*back, k) << text;
      }
    }
  }
}

TEST(StageKey, NamesAreDistinct) {
  for (int p = 0; p < kStageParts; ++p) {
    for (int q = p + 1; q < kStageParts; ++q) EXPECT_NE(stage_part_name(static_cast<StagePart>(p)), stage_part_name(static_cast<StagePart>(q)));
  }
  for (int o = 0; o < kStageOps; ++o) {
    for (int q = o + 1; q < kStageOps; ++q) EXPECT_NE(stage_op_name(static_cast<StageOp>(o)), stage_op_name(static_cast<StageOp>(q)));
  }
}

TEST(StageKey, AnythingButTheTextFormIsRejected) {
  for (const char* text : {"", "g0", "g0.fwd", "g0.fwd.attn", "g0.fwd.L3.attn.core.h1",  // index after the operator
                           "g0.fwd.L3.attn.h1.c2.core",                                     // indices out of order
                           "g0.fwd.L3.attn.h1.h2.core", "g0.fwd.L03.attn.proj", "g-1.fwd.attn.proj", "G0.fwd.attn.proj",
                           "g0.forward.attn.proj", "g0.fwd.L3.attention.proj", "g0.fwd.L3.attn.projection",
                           "g0.fwd.L3.attn.proj.", "g0.fwd..attn.proj", "g0.fwd.L.attn.proj", "g0.fwd.Lx.attn.proj",
                           "g0.fwd.L3.attn.proj.proj", "g0.fwd.L3.L4.attn.proj", "g0.fwd.L99999999999.attn.proj",
                           "g0.opt.L0.adamw", "g0.fwd.L3.mb1.attn.proj",
                           "g0.fwd.attn.join", "g0.fwd.L3.moe.a2a_dispatch.join.join", "g0.fwd.L3.moe.join.a2a_dispatch",
                           "g0.fwd.L3.moe.a2a_dispatch.Join"}) {
    EXPECT_FALSE(parse_stage_key(text).has_value()) << text;
  }
}

TEST(StageKey, BackwardOperatorsOfForwardCompute) {
  EXPECT_EQ(backward_op(StageOp::kProj), StageOp::kProjBwd);
  EXPECT_EQ(backward_op(StageOp::kCore), StageOp::kCoreBwd);
  EXPECT_EQ(backward_op(StageOp::kRouterShared), StageOp::kRouterSharedBwd);
  EXPECT_EQ(backward_op(StageOp::kExperts), StageOp::kExpertsBwd);
  EXPECT_EQ(backward_op(StageOp::kAllGather), StageOp::kAllGather);
}

}  // namespace
}  // namespace oom
