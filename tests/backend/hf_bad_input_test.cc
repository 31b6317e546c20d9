// Bad Hugging Face checkpoints and token files given to `oom train` and `oom eval`: one line on
// stderr naming the file, the field and the value, exit code 2, and nothing written (the
// --save-weights folder is not created). Each row starts from the tiny Qwen3.6-style fixture of
// tests/backend/hf_reference.py ($OOM_HF_FIXTURES), or its Gemma 4 or DeepSeek-V3 fixture, and
// breaks one thing.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "backend/io/safetensors.h"
#include "backend/io/token_file.h"
#include "cli/cli.h"

namespace oom::backend {
namespace {

namespace fs = std::filesystem;

fs::path fixture() {
  const char* dir = std::getenv("OOM_HF_FIXTURES");
  return (dir != nullptr ? fs::path(dir) : fs::path(OOM_HF_FIXTURES_DIR)) / "qwen3_5_moe";
}

void write(const fs::path& p, const std::string& text) { std::ofstream(p, std::ios::binary | std::ios::trunc) << text; }

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

struct Row {
  std::string name;
  std::function<void(const fs::path& ckpt, const fs::path& tokens)> breakit;
  std::string command;                 // "train" or "eval"
  std::vector<std::string> must_name;  // substrings of the error line ({ckpt}, {tokens} replaced)
};

std::vector<Row> rows() {
  const auto rewrite = [](const fs::path& ckpt, const std::function<void(std::map<std::string, at::Tensor>&)>& edit) {
    auto t = read_safetensors((ckpt / "model.safetensors").string());
    edit(t);
    write_safetensors((ckpt / "model.safetensors").string(), t);
  };
  // Replaces the checkpoint by the Gemma 4 fixture with its config.json edited.
  const auto gemma4 = [](const fs::path& ckpt, const std::function<void(nlohmann::json&)>& edit) {
    fs::remove_all(ckpt);
    fs::copy(fixture().parent_path() / "gemma4", ckpt);
    auto config = nlohmann::json::parse(slurp(ckpt / "config.json"));
    edit(config);
    write(ckpt / "config.json", config.dump(1));
  };
  return {
      {"missing config", [](const fs::path& c, const fs::path&) { fs::remove(c / "config.json"); }, "train",
       {"config.json", "missing"}},
      {"broken config", [](const fs::path& c, const fs::path&) { write(c / "config.json", "{\"hidden_size\": 64,"); },
       "train", {"config.json"}},
      {"unsupported architecture",
       [](const fs::path& c, const fs::path&) {
         auto text = slurp(c / "config.json");
         text.replace(text.find("qwen3_5_moe_text"), 16, "olmoe");
         write(c / "config.json", text);
       },
       "eval", {"config.json", "model_type", "olmoe"}},
      // Gemma 4 features that no MoE checkpoint here uses are refused by name (the Gemma 4 fixture).
      {"gemma4 per-layer inputs",
       [gemma4](const fs::path& c, const fs::path&) { gemma4(c, [](auto& j) { j.erase("hidden_size_per_layer_input"); }); },
       "eval", {"config.json", "hidden_size_per_layer_input", "256"}},
      {"gemma4 kv sharing",
       [gemma4](const fs::path& c, const fs::path&) { gemma4(c, [](auto& j) { j["num_kv_shared_layers"] = 2; }); },
       "train", {"config.json", "num_kv_shared_layers", "2"}},
      {"gemma4 without the MoE block",
       [gemma4](const fs::path& c, const fs::path&) { gemma4(c, [](auto& j) { j["enable_moe_block"] = false; }); },
       "eval", {"config.json", "enable_moe_block", "false"}},
      {"gemma4 attention bias",
       [gemma4](const fs::path& c, const fs::path&) { gemma4(c, [](auto& j) { j["attention_bias"] = true; }); },
       "eval", {"config.json", "attention_bias", "true"}},
      {"gemma4 bidirectional attention",
       [gemma4](const fs::path& c, const fs::path&) { gemma4(c, [](auto& j) { j["use_bidirectional_attention"] = "all"; }); },
       "eval", {"config.json", "use_bidirectional_attention", "all"}},
      {"gemma4 yarn rope on global layers",
       [gemma4](const fs::path& c, const fs::path&) {
         gemma4(c, [](auto& j) { j["rope_parameters"]["full_attention"]["rope_type"] = "yarn"; });
       },
       "eval", {"config.json", "rope_parameters.full_attention.rope_type", "yarn"}},
      {"deepseek rope without interleaved pairs",
       [](const fs::path& c, const fs::path&) {
         fs::remove_all(c);
         fs::copy(fixture().parent_path() / "deepseek_v3", c);
         auto config = nlohmann::json::parse(slurp(c / "config.json"));
         config["rope_interleave"] = false;
         write(c / "config.json", config.dump(1));
       },
       "eval", {"config.json", "rope_interleave", "false"}},
      // DeepSeek-V3's FP8 checkpoints (F8_E4M3 weights with 128 × 128 block scales weight_scale_inv)
      // are refused, naming the tensor and its dtype; a BF16 or FP32 copy of the weights is read.
      {"fp8 weights",
       [](const fs::path& c, const fs::path&) {
         fs::remove_all(c);
         fs::copy(fixture().parent_path() / "deepseek_v3", c);
         auto t = read_safetensors((c / "model.safetensors").string());
         const std::string fp8 = "model.layers.1.self_attn.q_b_proj.weight";
         nlohmann::json header;
         std::string data;
         for (const auto& [name, tensor] : t) {
           const bool q = name == fp8;
           const auto bytes = q ? tensor.numel() : tensor.numel() * 4;
           header[name] = {{"dtype", q ? "F8_E4M3" : "F32"}, {"shape", tensor.sizes().vec()}, {"data_offsets", {data.size(), data.size() + bytes}}};
           data += q ? std::string(static_cast<std::size_t>(bytes), '\x38')
                     : std::string(static_cast<const char*>(tensor.contiguous().data_ptr()), static_cast<std::size_t>(bytes));
         }
         header[fp8 + "_scale_inv"] = {{"dtype", "F32"}, {"shape", {1, 1}}, {"data_offsets", {data.size(), data.size() + 4}}};
         data += std::string(4, '\0');
         const std::string text = header.dump();
         std::string file(8, '\0');
         for (int i = 0; i < 8; ++i) file[static_cast<std::size_t>(i)] = static_cast<char>((text.size() >> (8 * i)) & 0xff);
         write(c / "model.safetensors", file + text + data);
       },
       "eval", {"{ckpt}", "model.layers.1.self_attn.q_b_proj.weight", "F8_E4M3"}},
      {"missing tensor",
       [rewrite](const fs::path& c, const fs::path&) {
         rewrite(c, [](auto& t) { t.erase("model.layers.1.linear_attn.in_proj_z.weight"); });
       },
       "train", {"{ckpt}", "model.layers.1.linear_attn.in_proj_z.weight", "missing"}},
      {"tensor of another shape",
       [rewrite](const fs::path& c, const fs::path&) {
         rewrite(c, [](auto& t) { t["model.layers.2.mlp.gate.weight"] = at::zeros({7, 64}); });
       },
       "train", {"{ckpt}", "model.layers.2.mlp.gate.weight", "[7, 64]", "[8, 64]"}},
      {"safetensors header larger than the file",
       [](const fs::path& c, const fs::path&) {
         auto bytes = slurp(c / "model.safetensors");
         bytes[5] = '\x7f';
         write(c / "model.safetensors", bytes);
       },
       "eval", {"model.safetensors"}},
      {"index naming a shard outside the folder",
       [](const fs::path& c, const fs::path&) {
         fs::rename(c / "model.safetensors", c / "model-00001-of-00001.safetensors");
         write(c / "model.safetensors.index.json",
               R"({"metadata": {}, "weight_map": {"lm_head.weight": "../model-00001-of-00001.safetensors"}})");
       },
       "train", {"model.safetensors.index.json", "weight_map.lm_head.weight", "../model-00001-of-00001.safetensors"}},
      {"token file with another magic",
       [](const fs::path&, const fs::path& t) {
         auto bytes = slurp(t);
         bytes[0] = 'x';
         write(t, bytes);
       },
       "eval", {"{tokens}", "magic"}},  // (oom train reads a file without the magic as text)
      {"truncated token file",
       [](const fs::path&, const fs::path& t) { fs::resize_file(t, fs::file_size(t) - 3); }, "eval",
       {"{tokens}", "token count"}},
      {"token outside the vocabulary",
       [](const fs::path&, const fs::path& t) {
         std::vector<std::uint32_t> ids(200, 5);
         ids[123] = 96;
         io::write_token_file(t.string(), ids, 1);
       },
       "eval", {"{tokens}", "123", "96"}},
  };
}

void PrintTo(const Row& r, std::ostream* os) { *os << r.name; }

class HfBadInput : public ::testing::TestWithParam<Row> {};

TEST_P(HfBadInput, OneLineNamingFileFieldValueExit2NothingWritten) {
  const Row& row = GetParam();
  ASSERT_TRUE(fs::exists(fixture() / "config.json")) << "no fixture in " << fixture();
  const fs::path dir = fs::temp_directory_path() / ("oom_hf_bad_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const fs::path ckpt = dir / "ckpt", tokens = dir / "tokens.bin", out = dir / "saved";
  fs::copy(fixture(), ckpt);
  std::vector<std::uint32_t> ids(400);
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::uint32_t>((i * 7) % 96);
  io::write_token_file(tokens.string(), ids, 1);
  row.breakit(ckpt, tokens);

  std::vector<std::string> args = {row.command, "--weights", ckpt.string(), "--data", tokens.string(), "--seq", "16",
                                   "--device", "cpu"};
  if (row.command == "train") {
    for (const char* a : {"--steps", "1", "--batch", "1", "--save-weights"}) args.emplace_back(a);
    args.push_back(out.string());
  }
  std::ostringstream o, e;
  const int rc = cli::run(args, {o, e});
  const std::string err = e.str();
  EXPECT_EQ(rc, cli::kExitBadInput) << err;
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
  for (std::string s : row.must_name) {
    if (s == "{ckpt}") s = ckpt.string();
    if (s == "{tokens}") s = tokens.string();
    EXPECT_NE(err.find(s), std::string::npos) << "the error does not name " << s << ": " << err;
  }
  EXPECT_EQ(o.str(), "");
  EXPECT_FALSE(fs::exists(out)) << "nothing is written";
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Rows, HfBadInput, ::testing::ValuesIn(rows()),
                         [](const ::testing::TestParamInfo<Row>& i) {
                           std::string n;
                           for (char c : i.param.name) n += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
                           return n;
                         });

}  // namespace
}  // namespace oom::backend
