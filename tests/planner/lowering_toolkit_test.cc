// Tests of planner/lowering/lowering_toolkit.h: the loss head every baseline lowering prices, whole
// and as one tensor-parallel shard of the vocabulary.
#include "planner/lowering/lowering_toolkit.h"

#include <gtest/gtest.h>

#include "costmodel/flops.h"
#include "costmodel/model_spec.h"
#include "costmodel/traffic.h"

namespace oom {
namespace {

TEST(LossHead, WholeVocabularyIsTheLmHeadGemmAndItsBackward) {
  const ModelSpec m = load_model_spec("qwen3.6-35b-a3b");
  const std::int64_t tokens = 4096;
  const lowering::LossHead h = lowering::loss_head(m, tokens);
  EXPECT_EQ(h.shape.tokens, tokens);
  EXPECT_EQ(h.shape.k, m.hidden);
  EXPECT_EQ(h.shape.n, m.vocab);
  EXPECT_EQ(h.forward_flops, lm_head_flops(m, tokens));
  EXPECT_EQ(h.backward_flops, kMatmulBackwardRatio * lm_head_flops(m, tokens));
  EXPECT_EQ(h.forward_bytes, loss_forward_hbm_bytes(m, tokens));
  EXPECT_EQ(h.backward_bytes, loss_backward_hbm_bytes(m, tokens));
}

TEST(LossHead, OneVocabularyShardDoesItsShareOfTheWork) {
  const ModelSpec m = load_model_spec("qwen3.6-35b-a3b");
  const std::int64_t tokens = 8192;
  const int shards = 4;
  const lowering::LossHead whole = lowering::loss_head(m, tokens);
  const lowering::LossHead shard = lowering::loss_head(m, tokens, shards);
  EXPECT_EQ(shard.shape.tokens, tokens);
  EXPECT_EQ(shard.shape.n, m.vocab / shards);
  EXPECT_DOUBLE_EQ(shard.forward_flops * shards, whole.forward_flops);
  EXPECT_DOUBLE_EQ(shard.backward_flops * shards, whole.backward_flops);
  EXPECT_EQ(shard.forward_bytes, whole.forward_bytes / shards);
  EXPECT_EQ(shard.backward_bytes, whole.backward_bytes / shards);
}

}  // namespace
}  // namespace oom
