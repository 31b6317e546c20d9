// backend/io/safetensors.h: round trip, BF16 reading, and one clear error per kind of bad file.
#include "backend/io/safetensors.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>

#include "backend/runtime/state.h"
#include "costmodel/input_error.h"

namespace oom::backend {
namespace {

namespace fs = std::filesystem;

fs::path temp_dir(const std::string& name) {
  auto d = fs::temp_directory_path() / ("oom_backend_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

void write_raw(const fs::path& p, const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[static_cast<std::size_t>(i)] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  std::ofstream(p, std::ios::binary) << out << header << data;
}

TEST(Safetensors, RoundTripsTensorsAndReadsBf16) {
  const auto dir = temp_dir("st");
  torch::manual_seed(1);
  std::map<std::string, at::Tensor> t{{"a", torch::randn({3, 4})}, {"b.c", torch::randn({5})}};
  write_safetensors((dir / "x.safetensors").string(), t);
  const auto back = read_safetensors((dir / "x.safetensors").string());
  ASSERT_EQ(back.size(), 2u);
  EXPECT_TRUE(at::equal(back.at("a"), t["a"]));
  EXPECT_TRUE(at::equal(back.at("b.c"), t["b.c"]));

  const auto bf = torch::tensor({1.5f, -2.0f}).to(torch::kBFloat16);
  write_raw(dir / "bf.safetensors", R"({"w":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]},"__metadata__":{"k":"v"}})",
            std::string(static_cast<const char*>(bf.data_ptr()), 4));
  const auto w = read_safetensors((dir / "bf.safetensors").string()).at("w");
  EXPECT_EQ(w.scalar_type(), at::kBFloat16);
  EXPECT_EQ(w.to(at::kFloat)[1].item<float>(), -2.0f);
}

TEST(Safetensors, BadFilesRaiseInputErrorNamingTheField) {
  const auto dir = temp_dir("st_bad");
  const auto p = (dir / "bad.safetensors").string();
  write_raw(p, R"({"w":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})", std::string(8, '\0'));
  try {
    read_safetensors(p);
    FAIL() << "F64 accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("w.dtype"), std::string::npos) << e.what();
  }
  write_raw(p, R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", std::string(8, '\0'));
  EXPECT_THROW(read_safetensors(p), InputError);  // 3 floats need 12 bytes
  write_raw(p, R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,16]}})", std::string(8, '\0'));
  EXPECT_THROW(read_safetensors(p), InputError);  // past the end
  std::ofstream(p, std::ios::binary) << "abc";
  EXPECT_THROW(read_safetensors(p), InputError);
  EXPECT_THROW(read_safetensors((dir / "missing").string()), InputError);
}

TEST(HostStateWeights, LoadsWhatItSavedAndRejectsAMissingTensor) {
  const auto dir = temp_dir("st_state");
  const ModelSpec spec = load_model_spec("tiny-moe");
  HostState a(spec);
  a.init_from_seed(3);
  const auto path = (dir / "w.safetensors").string();
  a.save_safetensors(path);
  HostState b(spec);
  b.init_from_seed(4);
  b.load_safetensors(path);
  for (int i = 0; i < a.blocks(); ++i) {
    EXPECT_TRUE(at::equal(a.master(i), b.master(i)));
    EXPECT_TRUE(at::equal(b.working(i), b.master(i)));
  }
  auto t = read_safetensors(path);
  t.erase("layers.2.router");
  write_safetensors(path, t);
  HostState c(spec);
  c.init_from_seed(4);
  const auto before = c.master(3).clone();
  try {
    c.load_safetensors(path);
    FAIL() << "missing tensor accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("layers.2.router"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(at::equal(c.master(3), before));
}

}  // namespace
}  // namespace oom::backend
