// Hugging Face checkpoint tensors ↔ the backend's flat per-block layout (backend/model/layout.h).
//
// Reads the tensor names of the transformers implementations of every architecture the backend
// trains — Qwen3.5/Qwen3.6 MoE (split in_proj_qkv/z/b/a), Qwen3-Next (in_proj_qkvz and in_proj_ba
// interleaved per key head), Qwen3-MoE, Mixtral, Gemma 4 (its sandwich norms, router scales and
// layer_scalar buffer, experts fused) and DeepSeek-V3 / Kimi-K2 (self_attn.q_a_proj, q_a_layernorm,
// q_b_proj or q_proj, kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj; mlp.gate.weight and
// the mlp.gate.e_score_correction_bias buffer; mlp.shared_experts.*; the dense first layers'
// mlp.gate_proj/up_proj/down_proj) — under "model." or, for multimodal checkpoints,
// "model.language_model.", with the routed experts either per expert
// (`mlp.experts.N.gate_proj.weight`, Mixtral's `block_sparse_moe.experts.N.w1.weight`) or fused
// (`mlp.experts.gate_up_proj` [E, 2I, h], `mlp.experts.down_proj` [E, h, I]). Writes the names
// transformers' save_pretrained writes (per expert; fused for Gemma 4). Tensors may be FP32, BF16
// or F16; they are converted while copied into the FP32 block buffers.
// Pure functions; thread-compatible.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include "backend/model/layout.h"
#include "costmodel/model_spec.h"

namespace oom::backend {

// A checkpoint's tensors by name: a CPU tensor (typically a view of a memory-mapped file), or
// nullopt when the checkpoint has no tensor of that name.
using HfTensorSource = std::function<std::optional<at::Tensor>(const std::string& name)>;

// Whether the backend reads and writes Hugging Face checkpoints of this model's architecture;
// throws InputError naming `origin` and model_type otherwise.
void check_hf_architecture(const ModelSpec& spec, const std::string& origin);

// Copies every weight of the layout from `source` into `blocks` (one FP32 flat buffer per layout
// block, as HostState's masters). First checks that every tensor exists with the shape the config
// implies — InputError "ORIGIN: tensor 'NAME' has shape [..], the config asks for [..]" or
// "... has no tensor 'NAME'" — and only then copies, so a bad checkpoint changes nothing.
// Returns the names that were read (to report tensors of the checkpoint that the model ignores).
// `loaded(name)` is called for each tensor once its block is copied (to drop its pages).
std::vector<std::string> load_hf_blocks(const ModelSpec& spec, const ModelLayout& layout, const HfTensorSource& source,
                                        std::vector<at::Tensor>& blocks, const std::string& origin,
                                        const std::function<void(const std::string&)>& loaded = {});

// The Hugging Face tensors of one block (block 0 = outer, 1 + l = layer l) under the names
// save_pretrained writes, as FP32 tensors (views of `flat` where the layout allows).
std::vector<std::pair<std::string, at::Tensor>> hf_tensors_of_block(const ModelSpec& spec, const ModelLayout& layout,
                                                                    int block, const at::Tensor& flat);

}  // namespace oom::backend
