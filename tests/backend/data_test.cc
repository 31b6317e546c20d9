// backend/data.h: byte-level batches, next-byte targets, sampler state round trip.
#include "backend/data.h"

#include <gtest/gtest.h>

#include "costmodel/input_error.h"

namespace oom::backend {
namespace {

TEST(ByteCorpus, TargetsAreTheNextBytesAndRestoredSamplersDrawTheSameBatches) {
  std::string text;
  for (int i = 0; i < 500; ++i) text.push_back(static_cast<char>('a' + i % 26));
  ByteCorpus a(text, 10, "mem");
  a.seed(4);
  const auto b0 = a.next(3);
  EXPECT_EQ(b0.tokens.sizes(), (std::vector<std::int64_t>{3, 10}));
  EXPECT_TRUE(at::equal(b0.tokens.narrow(1, 1, 9), b0.targets.narrow(1, 0, 9)));
  const auto state = a.sampler_state();
  const auto b1 = a.next(3);
  ByteCorpus b(text, 10, "mem");
  b.restore_sampler_state(state, 1, "ckpt");
  EXPECT_TRUE(at::equal(b.next(3).tokens, b1.tokens));
  EXPECT_EQ(b.batches_drawn(), 2);
  EXPECT_THROW(b.restore_sampler_state("not a state", 0, "ckpt"), InputError);
  EXPECT_THROW(ByteCorpus("short", 10, "mem"), InputError);
}

}  // namespace
}  // namespace oom::backend
