#include "backend/io/hf_checkpoint.h"

#include <filesystem>
#include <map>
#include <set>

#include <torch/torch.h>

#include "backend/io/checkpoint_folder.h"
#include "backend/io/hf_weights.h"
#include "costmodel/config_paths.h"
#include "costmodel/input_error.h"
#include "costmodel/json_input.h"

namespace oom::backend {
namespace {

namespace fs = std::filesystem;

at::ScalarType torch_dtype(io::DType d) {
  switch (d) {
    case io::DType::F32: return at::kFloat;
    case io::DType::BF16: return at::kBFloat16;
    case io::DType::F16: return at::kHalf;
    case io::DType::F64: return at::kDouble;
    case io::DType::I64: return at::kLong;
    case io::DType::I32: return at::kInt;
    case io::DType::I16: return at::kShort;
    case io::DType::I8: return at::kChar;
    case io::DType::U8: return at::kByte;
    case io::DType::BOOL: return at::kBool;
  }
  return at::kFloat;
}

// A read-only tensor over the mapped bytes of `t` (never written: the loader only copies from it).
at::Tensor mapped_tensor(const io::TensorLocation& t) {
  const auto bytes = t.file->bytes(*t.info);
  return at::from_blob(const_cast<std::byte*>(bytes.data()), t.info->shape,
                       at::TensorOptions().dtype(torch_dtype(t.info->dtype)));
}

}  // namespace

bool is_hf_checkpoint_dir(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec);
}

ModelSpec hf_checkpoint_spec(const std::string& dir) {
  const std::string config = (fs::path(dir) / "config.json").string();
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw InputError(dir, "", "", "is not a checkpoint folder");
  if (!fs::is_regular_file(config, ec)) throw InputError(config, "", "", "missing: a checkpoint folder needs its config.json");
  const nlohmann::json json = read_json_file(config);
  const ModelSpec spec = model_spec_from_hf_config(json, config, fs::path(dir).lexically_normal().filename().string());
  check_hf_architecture(spec, config);
  // Latent attention's RoPE reads its pairs interleaved (transformers' default rope_interleave).
  const auto interleave = json.find("rope_interleave");
  if (spec.count(LayerKind::kLatentAttention) > 0 && interleave != json.end() && interleave->is_boolean() && !interleave->get<bool>()) {
    throw InputError(config, "rope_interleave", "false", "latent attention is implemented with interleaved RoPE pairs only");
  }
  return spec;
}

std::vector<std::string> load_hf_checkpoint(const std::string& dir, HostState& state) {
  const io::CheckpointFolder folder(dir);
  const HfTensorSource source = [&](const std::string& name) -> std::optional<at::Tensor> {
    const auto* t = folder.find(name);
    if (t == nullptr) return std::nullopt;
    return mapped_tensor(*t);
  };
  // load_hf_blocks checks every tensor before it copies any: a bad one leaves the state unchanged.
  std::vector<at::Tensor> blocks;
  for (int b = 0; b < state.blocks(); ++b) blocks.push_back(state.master(b));
  const auto release = [&](const std::string& name) {
    if (const auto* t = folder.find(name)) t->file->release(t->info->begin, t->info->end);
  };
  const auto used = load_hf_blocks(state.spec(), state.layout(), source, blocks, dir, release);
  for (int b = 0; b < state.blocks(); ++b) state.publish(b);
  const std::set<std::string> read(used.begin(), used.end());
  std::vector<std::string> unused;
  for (const auto& n : folder.tensor_names()) {
    if (!read.count(n)) unused.push_back(n);
  }
  return unused;
}

namespace {

// DeepSeek-V3's router weight and selection bias, which transformers keeps in FP32
// (_keep_in_fp32_modules_strict) whatever the checkpoint's dtype.
bool keeps_fp32(const ModelSpec& spec, const std::string& name) {
  const auto ends_with = [&](const std::string& tail) {
    return name.size() >= tail.size() && name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
  };
  return spec.moe.scoring == "sigmoid" && (ends_with(".mlp.gate.weight") || ends_with(".mlp.gate.e_score_correction_bias"));
}

}  // namespace

void save_hf_checkpoint(const std::string& dir, const HostState& state, nlohmann::json config,
                        const SaveHfOptions& options) {
  const ModelSpec& spec = state.spec();
  if (config.is_null() || config.empty()) config = model_spec_to_hf_config(spec);
  const io::DType dtype = options.bf16 ? io::DType::BF16 : io::DType::F32;
  if (config.is_object()) config["torch_dtype"] = options.bf16 ? "bfloat16" : "float32";
  std::vector<io::TensorToWrite> tensors;
  for (int b = 0; b < state.blocks(); ++b) {
    for (auto& [name, t] : hf_tensors_of_block(spec, state.layout(), b, state.master(b))) {
      io::TensorToWrite w;
      w.name = name;
      w.dtype = keeps_fp32(spec, name) ? io::DType::F32 : dtype;
      w.shape = t.sizes().vec();
      w.fill = [t = t, dtype = w.dtype](std::byte* dst) {
        const auto c = t.to(at::kFloat).contiguous();
        io::convert_from_f32(c.data_ptr<float>(), c.numel(), dtype, dst);
      };
      tensors.push_back(std::move(w));
    }
  }
  io::write_checkpoint_folder(dir, config, std::move(tensors), options.max_shard_bytes);
}

namespace {

bool ends_with_safetensors(const std::string& p) {
  const std::string ext = ".safetensors";
  return p.size() >= ext.size() && p.compare(p.size() - ext.size(), ext.size(), ext) == 0;
}

}  // namespace

ModelSpec run_model_spec(const std::string& model, const std::string& weights) {
  return !weights.empty() && is_hf_checkpoint_dir(weights) ? hf_checkpoint_spec(weights) : load_model_spec(model);
}

void load_initial_weights(HostState& state, const std::string& weights, std::uint64_t seed) {
  if (weights.empty()) {
    state.init_from_seed(seed);
  } else if (is_hf_checkpoint_dir(weights)) {
    load_hf_checkpoint(weights, state);
  } else {
    state.load_safetensors(weights);
  }
}

void check_final_weights(const ModelSpec& spec, const std::string& path) {
  if (path.empty() || ends_with_safetensors(path)) return;
  std::error_code ec;
  if (fs::exists(path, ec) && !fs::is_directory(path, ec)) {
    throw InputError("", "--save-weights", path, "is a file; a checkpoint folder (or a .safetensors file) is written there");
  }
  check_hf_architecture(spec, "--save-weights " + path);
}

void save_final_weights(const HostState& state, const std::string& path, const std::string& model,
                        const std::string& weights, bool bf16) {
  if (ends_with_safetensors(path)) {
    state.save_safetensors(path);
    return;
  }
  nlohmann::json config;
  if (!weights.empty() && is_hf_checkpoint_dir(weights)) {
    config = read_json_file((fs::path(weights) / "config.json").string());
  } else if (const auto file = resolve_config("models", model)) {
    config = read_json_file(*file);
  }
  save_hf_checkpoint(path, state, config, SaveHfOptions{bf16});
}

}  // namespace oom::backend
