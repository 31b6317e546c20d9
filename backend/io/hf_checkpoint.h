// Hugging Face checkpoint folders in and out of the host state: `oom train --weights DIR`,
// `--save-weights DIR` and `oom eval --weights DIR`.
//
// Reading maps the folder's safetensors files (backend/io/checkpoint_folder.h) and copies each
// tensor straight from the mapping into the FP32 masters (backend/io/hf_weights.h names them),
// dropping each tensor's pages once its block is copied, so the host state is the only full copy
// in memory. Writing produces what transformers' from_pretrained reads: config.json and
// model.safetensors, or shards with model.safetensors.index.json. Not thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/runtime/state.h"
#include "costmodel/model_spec.h"

namespace oom::backend {

// Whether `path` is a folder (a Hugging Face checkpoint) rather than a file.
bool is_hf_checkpoint_dir(const std::string& path);

// The model of the checkpoint in `dir` (its config.json), named after the folder. Throws
// InputError naming the file for a missing or bad config, or an architecture without HF support
// (latent attention with rope_interleave false included).
ModelSpec hf_checkpoint_spec(const std::string& dir);

// Loads the checkpoint in `dir` into the masters of `state` (and republishes the working copies).
// Throws InputError naming the file, the tensor and both shapes when a tensor is missing or has
// another shape than state's model asks for; `state` is unchanged then. Returns the checkpoint's
// tensors the model does not use (e.g. a multimodal checkpoint's vision tower).
std::vector<std::string> load_hf_checkpoint(const std::string& dir, HostState& state);

struct SaveHfOptions {
  bool bf16 = false;                                  // BF16 tensors (else FP32); DeepSeek-V3's router
                                                      // and selection bias stay FP32, as transformers keeps them
  std::uint64_t max_shard_bytes = 5ull << 30;         // as save_pretrained's default "5GB"
};

// Writes the masters of `state` to `dir` under transformers' names, with `config` as config.json
// (the config the model was read from; model_spec_to_hf_config when empty). Atomic per file; the
// folder's previous checkpoint stays intact when writing fails.
void save_hf_checkpoint(const std::string& dir, const HostState& state, nlohmann::json config,
                        const SaveHfOptions& options = {});

// What a training run does with --weights and --save-weights, shared by every trainer.
// The run's model: the config.json of a checkpoint folder given as `weights`, else `model`.
ModelSpec run_model_spec(const std::string& model, const std::string& weights);
// The initial weights: a checkpoint folder, a safetensors file in the backend's names, or (empty)
// the seeded initialization.
void load_initial_weights(HostState& state, const std::string& weights, std::uint64_t seed);
// Checks before any work that `path` can be written as the run's final weights (a folder needs an
// architecture with Hugging Face names).
void check_final_weights(const ModelSpec& spec, const std::string& path);
// The final weights: `path` ending in ".safetensors" is one file in the backend's names; any other
// path is a Hugging Face checkpoint folder whose config.json is the run's source config (the
// checkpoint's, or the project's models/NAME.json), BF16 or FP32.
void save_final_weights(const HostState& state, const std::string& path, const std::string& model,
                        const std::string& weights, bool bf16);

}  // namespace oom::backend
