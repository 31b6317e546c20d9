// backend/io/checkpoint_folder.h: the shard index parser, sharded and single-file folders written
// and read back, replacement of an older layout, and index/shard mismatches.
#include "backend/io/checkpoint_folder.h"

#include <cstring>

#include <gtest/gtest.h>

#include "tests/backend/io/io_test_support.h"

namespace oom::io {
namespace {

namespace fs = std::filesystem;
using testing::expect_input_error;
using testing::read_all;
using testing::ScratchDir;
using testing::write_all;

TEST(ParseShardIndex, ReadsWeightMapTotalSizeAndStringMetadata) {
  const ShardIndex i = parse_shard_index(R"({"metadata": {"total_size": 123, "total_parameters": 61, "format": "pt"},
    "weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}})",
                                         "index.json");
  EXPECT_EQ(i.total_size, 123u);
  EXPECT_EQ(i.metadata_strings, (std::map<std::string, std::string>{{"format", "pt"}}));
  EXPECT_EQ(i.weight_map.at("b"), "model-00002-of-00002.safetensors");
  EXPECT_EQ(parse_shard_index(R"({"metadata": {"total_size": 5e3}, "weight_map": {}})", "i").total_size, 5000u);
  EXPECT_FALSE(parse_shard_index(R"({"weight_map": {}})", "i").total_size.has_value());
}

TEST(ParseShardIndex, BadShardNamesAndFieldsNameTheFieldAndValue) {
  const std::string t = "model.layers.0.mlp.gate.weight";
  for (const std::string bad : {R"("../model-00001-of-00002.safetensors")", R"("/etc/model.safetensors")",
                                R"("sub/model.safetensors")", R"("model.bin")", R"(".safetensors")",
                                R"(".hidden.safetensors")", R"("a\u0000b.safetensors")", "7"}) {
    SCOPED_TRACE(bad);
    expect_input_error([&] { parse_shard_index(R"({"weight_map": {")" + t + R"(": )" + bad + "}}", "idx.json"); },
                       {"idx.json: ", "'weight_map." + t + "'", bad.substr(0, 5)});
  }
  expect_input_error([&] { parse_shard_index(R"({"metadata": {}})", "idx.json"); }, {"'weight_map'", "(missing)"});
  expect_input_error([&] { parse_shard_index(R"({"weight_map": []})", "idx.json"); }, {"'weight_map'", "[]"});
  expect_input_error([&] { parse_shard_index(R"({"metadata": {"total_size": -1}, "weight_map": {}})", "idx.json"); },
                     {"'metadata.total_size'", "-1"});
  expect_input_error([&] { parse_shard_index(R"({"metadata": {"total_size": "9"}, "weight_map": {}})", "idx.json"); },
                     {"'metadata.total_size'", "\"9\""});
  expect_input_error([&] { parse_shard_index("[1]", "idx.json"); }, {"idx.json"});
  expect_input_error([&] { parse_shard_index("{", "idx.json"); }, {"idx.json"});
}

TEST(ShardFileName, FollowsTheHuggingFaceSpelling) {
  EXPECT_EQ(shard_file_name(1, 2), "model-00001-of-00002.safetensors");
  EXPECT_EQ(shard_file_name(12, 130), "model-00012-of-00130.safetensors");
}

// Five BF16 tensors of 1000 bytes each, values 0..499 + 1000·t.
std::vector<TensorToWrite> five_tensors() {
  std::vector<TensorToWrite> out;
  for (int t = 0; t < 5; ++t) {
    out.push_back({"model.layers." + std::to_string(t) + ".w", DType::BF16, {20, 25},
                   [t](std::byte* dst) {
                     std::vector<float> v(500);
                     for (int i = 0; i < 500; ++i) v[i] = static_cast<float>(i + 1000 * t);
                     convert_from_f32(v.data(), 500, DType::BF16, dst);
                   },
                   nullptr});
  }
  return out;
}

void expect_five_tensors(const CheckpointFolder& f) {
  ASSERT_EQ(f.tensor_names().size(), 5u);
  EXPECT_EQ(f.tensor_names().front(), "model.layers.0.w");
  for (int t = 0; t < 5; ++t) {
    const TensorLocation* loc = f.find("model.layers." + std::to_string(t) + ".w");
    ASSERT_NE(loc, nullptr);
    std::vector<float> v(500);
    convert_to_f32(loc->file->bytes(*loc->info), loc->info->dtype, v.data(), loc->info->numel());
    for (int i : {0, 255, 499}) {
      const float exact = static_cast<float>(1000 * t + i);
      std::uint16_t b;
      convert_from_f32(&exact, 1, DType::BF16, reinterpret_cast<std::byte*>(&b));
      EXPECT_EQ(std::bit_cast<std::uint32_t>(v[i]), static_cast<std::uint32_t>(b) << 16) << i;
    }
  }
  EXPECT_EQ(f.find("lm_head.weight"), nullptr);
  EXPECT_EQ(f.total_tensor_bytes(), 5000u);
}

TEST(CheckpointFolder, ShardsWrittenAndReadBackWithIndexAndTotalSize) {
  ScratchDir dir;
  const std::string folder = dir.file("ckpt/sub");  // created
  const nlohmann::json config = {{"model_type", "qwen3_moe"}, {"num_hidden_layers", 5}};
  write_checkpoint_folder(folder, config, five_tensors(), 2500);
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(folder)) names.insert(e.path().filename().string());
  EXPECT_EQ(names, (std::set<std::string>{"config.json", "model.safetensors.index.json", "model-00001-of-00003.safetensors",
                                          "model-00002-of-00003.safetensors", "model-00003-of-00003.safetensors"}));
  const ShardIndex idx = parse_shard_index(read_all(folder + "/model.safetensors.index.json"), "idx");
  EXPECT_EQ(idx.total_size, 5000u);
  EXPECT_EQ(idx.weight_map.at("model.layers.0.w"), "model-00001-of-00003.safetensors");
  EXPECT_EQ(idx.weight_map.at("model.layers.1.w"), "model-00001-of-00003.safetensors");
  EXPECT_EQ(idx.weight_map.at("model.layers.3.w"), "model-00002-of-00003.safetensors");
  EXPECT_EQ(idx.weight_map.at("model.layers.4.w"), "model-00003-of-00003.safetensors");

  const CheckpointFolder f(folder);
  EXPECT_EQ(f.config_json(), config);
  EXPECT_EQ(f.files().size(), 3u);
  ASSERT_TRUE(f.index().has_value());
  expect_five_tensors(f);
  EXPECT_EQ(f.files()[0]->metadata().at("format"), "pt");
}

TEST(CheckpointFolder, SingleFileAndTheOtherLayoutIsReplaced) {
  ScratchDir dir;
  const std::string folder = dir.path().string();
  write_checkpoint_folder(folder, {{"a", 1}}, five_tensors(), 2500);
  write_checkpoint_folder(folder, {{"a", 2}}, five_tensors(), 5000);  // fits one file
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(folder)) names.insert(e.path().filename().string());
  EXPECT_EQ(names, (std::set<std::string>{"config.json", "model.safetensors"}));
  const CheckpointFolder f(folder);
  EXPECT_FALSE(f.index().has_value());
  EXPECT_EQ(f.config_json().at("a"), 2);
  expect_five_tensors(f);

  write_checkpoint_folder(folder, {{"a", 3}}, five_tensors(), 1000);  // one tensor per shard
  names.clear();
  for (const auto& e : fs::directory_iterator(folder)) names.insert(e.path().filename().string());
  EXPECT_EQ(names.size(), 7u);
  EXPECT_FALSE(names.count("model.safetensors"));
  expect_five_tensors(CheckpointFolder(folder));
}

// read_tensor_f32 works through a tensor by chunks of the file (8 MiB) and releases their pages:
// a 10 MiB BF16 and a 12 MiB F16 tensor cross chunk boundaries and read back whole, twice.
TEST(CheckpointFolder, ReadTensorF32ConvertsAcrossChunksAndAfterRelease) {
  ScratchDir dir;
  const std::int64_t n = 5'000'011, m = 6'000'000;
  std::vector<float> values(static_cast<std::size_t>(std::max(n, m)));
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i % 511) - 255.0f;  // exact in BF16 and F16
  write_checkpoint_folder(dir.path().string(), {{"a", 1}},
                          {{"big", DType::BF16, {n}, [&](std::byte* d) { convert_from_f32(values.data(), n, DType::BF16, d); }, nullptr},
                           {"half", DType::F16, {m}, [&](std::byte* d) { convert_from_f32(values.data(), m, DType::F16, d); }, nullptr}},
                          1ull << 40);
  const CheckpointFolder f(dir.path().string());
  for (const auto& [name, count] : {std::pair{"big", n}, std::pair{"half", m}}) {
    std::vector<float> out(static_cast<std::size_t>(count));
    for (int round = 0; round < 2; ++round) {
      std::fill(out.begin(), out.end(), 0.5f);
      read_tensor_f32(*f.find(name), out.data());
      for (std::int64_t i = 0; i < count; ++i) ASSERT_EQ(out[i], values[i]) << name << " " << i;
    }
  }
  std::vector<float> out(4);
  const float one = 1;
  write_safetensors(dir.file("ints.safetensors"), {{"i", DType::I32, {1}, {}, &one}}, {});
  const SafetensorsFile ints(dir.file("ints.safetensors"));
  EXPECT_THROW(read_tensor_f32(TensorLocation{&ints, ints.find("i")}, out.data()), std::invalid_argument);
}

TEST(CheckpointFolder, AFailedWriteLeavesTheFolderAsItWas) {
  ScratchDir dir;
  const std::string folder = dir.path().string();
  write_checkpoint_folder(folder, {{"a", 1}}, five_tensors(), 2500);
  std::map<std::string, std::string> before;
  for (const auto& e : fs::directory_iterator(folder)) before[e.path().filename().string()] = read_all(e.path().string());
  auto tensors = five_tensors();
  tensors[3].fill = [](std::byte*) { throw std::runtime_error("source gone"); };
  EXPECT_THROW(write_checkpoint_folder(folder, {{"a", 2}}, std::move(tensors), 1000), std::runtime_error);
  std::map<std::string, std::string> after;
  for (const auto& e : fs::directory_iterator(folder)) after[e.path().filename().string()] = read_all(e.path().string());
  EXPECT_EQ(after, before);
}

TEST(CheckpointFolder, IndexAndShardsThatDisagreeAreInputErrors) {
  ScratchDir dir;
  const std::string folder = dir.path().string();
  write_checkpoint_folder(folder, {{"a", 1}}, five_tensors(), 2500);
  const std::string index_path = folder + "/model.safetensors.index.json";
  const nlohmann::json index = nlohmann::json::parse(read_all(index_path));
  const std::string s1 = "model-00001-of-00003.safetensors", s2 = "model-00002-of-00003.safetensors";

  nlohmann::json j = index;  // listed, absent from its shard
  j["weight_map"]["model.layers.9.w"] = s1;
  write_all(index_path, j.dump());
  expect_input_error([&] { CheckpointFolder f(folder); },
                     {index_path, "'weight_map.model.layers.9.w'", s1, "no tensor of that name"});

  j = index;  // a tensor of shard 1 listed under shard 2
  j["weight_map"]["model.layers.1.w"] = s2;
  write_all(index_path, j.dump());
  expect_input_error([&] { CheckpointFolder f(folder); }, {"'weight_map.model.layers.1.w'", s2});

  j = index;  // present in a shard the index uses, not listed
  j["weight_map"].erase("model.layers.3.w");
  write_all(index_path, j.dump());
  expect_input_error([&] { CheckpointFolder f(folder); }, {s2, "'model.layers.3.w'", "not listed"});

  j = index;  // a shard file that is not there
  j["weight_map"]["model.layers.4.w"] = "model-00009-of-00009.safetensors";
  write_all(index_path, j.dump());
  expect_input_error([&] { CheckpointFolder f(folder); }, {"model-00009-of-00009.safetensors", "no such file"});

  j = index;
  j["weight_map"]["model.layers.4.w"] = "../model.safetensors";
  write_all(index_path, j.dump());
  expect_input_error([&] { CheckpointFolder f(folder); }, {index_path, "'weight_map.model.layers.4.w'", "../model"});
}

TEST(CheckpointFolder, MissingFolderFilesAndConfigAreInputErrors) {
  ScratchDir dir;
  expect_input_error([&] { CheckpointFolder f(dir.file("nope")); }, {dir.file("nope"), "no such checkpoint folder"});
  expect_input_error([&] { CheckpointFolder f(dir.path().string()); },
                     {dir.path().string(), "neither model.safetensors nor model.safetensors.index.json"});
  write_all(dir.file("plain"), "x");
  expect_input_error([&] { CheckpointFolder f(dir.file("plain")); }, {dir.file("plain"), "not a folder"});
  const float one = 1;
  write_safetensors(dir.file("model.safetensors"), {{"w", DType::F32, {1}, {}, &one}}, {});
  const CheckpointFolder f(dir.path().string());
  expect_input_error([&] { (void)f.config_json(); }, {"config.json"});
  write_all(dir.file("config.json"), "{\"a\": ");
  const CheckpointFolder g(dir.path().string());
  expect_input_error([&] { (void)g.config_json(); }, {"config.json"});
}

}  // namespace
}  // namespace oom::io
