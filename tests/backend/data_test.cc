// backend/data/data.h: byte-level and token-file batches, next-token targets, the token sampler's
// epoch permutation, and sampler state round trips (resumed samplers draw the same batches).
#include "backend/data/data.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>

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

namespace fs = std::filesystem;

// A token file of `n` tokens 0, 1, …, n − 1 (token i at position i, so a window's start is its
// first token).
std::string counting_token_file(const std::string& name, std::int64_t n, int version = 1) {
  const auto p = fs::temp_directory_path() / ("oom_data_" + name + "_" + std::to_string(::getpid()) + ".bin");
  std::vector<std::uint32_t> t(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) t[static_cast<std::size_t>(i)] = static_cast<std::uint32_t>(i);
  io::write_token_file(p.string(), t, version);
  return p.string();
}

TEST(TokenCorpus, BatchesPackWindowsOfTheStreamWithNextTokenTargets) {
  const auto path = counting_token_file("pack", 41);  // W = (41 − 1) / 8 = 5 windows
  const auto data = open_training_data(path, 8);
  ASSERT_EQ(data->kind(), "tokens");
  auto& tc = dynamic_cast<TokenCorpus&>(*data);
  EXPECT_EQ(tc.windows(), 5);
  data->seed(3);
  const auto b = data->next(5);  // one epoch: every window once
  std::set<std::int64_t> starts;
  for (std::int64_t r = 0; r < 5; ++r) {
    const std::int64_t start = b.tokens[r][0].item<std::int64_t>();
    EXPECT_EQ(start % 8, 0);
    starts.insert(start);
    for (std::int64_t i = 0; i < 8; ++i) {
      EXPECT_EQ(b.tokens[r][i].item<std::int64_t>(), start + i);
      EXPECT_EQ(b.targets[r][i].item<std::int64_t>(), start + i + 1);
    }
  }
  EXPECT_EQ(starts, (std::set<std::int64_t>{0, 8, 16, 24, 32}));
  EXPECT_EQ(tc.epoch(), 0);
  const auto next_epoch = data->next(5);  // a new permutation: every window once again
  EXPECT_EQ(tc.epoch(), 1);
  std::set<std::int64_t> again;
  for (std::int64_t r = 0; r < 5; ++r) again.insert(next_epoch.tokens[r][0].item<std::int64_t>());
  EXPECT_EQ(again, starts);
  fs::remove(path);
}

TEST(TokenCorpus, RestoredSamplersDrawTheSameBatchesAcrossEpochs) {
  const auto path = counting_token_file("resume", 1000, 2);
  auto a = open_training_data(path, 10);
  a->seed(11);
  a->next(7);
  a->next(7);
  const auto saved = a->save_state();
  EXPECT_EQ(saved["data_tokens"], 1000);
  EXPECT_EQ(saved["batches_drawn"], 2);
  std::vector<at::Tensor> want;
  for (int i = 0; i < 30; ++i) want.push_back(a->next(7).tokens);  // 99 windows an epoch: crosses epochs
  auto b = open_training_data(path, 10);
  b->seed(999);  // restoring replaces the seed
  b->restore_state(nlohmann::json::parse(saved.dump()), "ckpt");
  for (int i = 0; i < 30; ++i) EXPECT_TRUE(at::equal(b->next(7).tokens, want[static_cast<std::size_t>(i)])) << "batch " << i;
  EXPECT_EQ(b->batches_drawn(), 32);
  // Another seed draws another order; a checkpoint of other data is refused.
  auto c = open_training_data(path, 10);
  c->seed(12);
  c->next(7);
  c->next(7);
  EXPECT_FALSE(at::equal(c->next(7).tokens, want[0]));
  auto other = saved;
  other["data_tokens"] = 999;
  EXPECT_THROW(b->restore_state(other, "ckpt"), InputError);
  other = saved;
  other["sampler"]["position"] = 100;
  EXPECT_THROW(b->restore_state(other, "ckpt"), InputError);
  other = saved;
  other.erase("sampler");
  EXPECT_THROW(b->restore_state(other, "ckpt"), InputError);
  fs::remove(path);
}

TEST(TokenCorpus, IdsBeyondTheVocabularyAndShortFilesAreInputErrors) {
  const auto path = counting_token_file("vocab", 300);
  const auto data = open_training_data(path, 8);
  data->check_vocab(300);
  try {
    data->check_vocab(256);
    FAIL() << "token 299 accepted with vocab_size 256";
  } catch (const InputError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(path), std::string::npos) << m;
    EXPECT_NE(m.find("tokens[299]"), std::string::npos) << m;
    EXPECT_NE(m.find("value 299"), std::string::npos) << m;
  }
  EXPECT_THROW(open_training_data(path, 300), InputError);  // 300 tokens: no window of 300 + 1
  EXPECT_NO_THROW(open_training_data(path, 299));
  fs::remove(path);
  // A text file is still bytes.
  const auto text = fs::temp_directory_path() / ("oom_data_text_" + std::to_string(::getpid()) + ".txt");
  std::ofstream(text) << std::string(100, 'x');
  EXPECT_EQ(open_training_data(text.string(), 8)->kind(), "bytes");
  fs::remove(text);
}

}  // namespace
}  // namespace oom::backend
