// A small reader (and writer) of the safetensors format: an 8-byte little-endian header length N,
// N bytes of JSON mapping each tensor name to {"dtype", "shape", "data_offsets": [begin, end]}
// (offsets into the data section that follows; an optional "__metadata__" object of strings),
// then the raw little-endian tensor bytes. Supported dtypes: F32, F16, BF16 (read), F32 (written).
//
// Used to load model weights (named as in backend/model/layout.h: "embed", "final_norm", "lm_head",
// "layers.L.<entry>") instead of the seeded initialization. Stateless; thread-safe.
#pragma once

#include <map>
#include <string>

#include <ATen/ATen.h>

namespace oom::backend {

// Reads every tensor of `path` as a CPU tensor of its stored dtype. Throws InputError naming the
// file, the field and the value for a missing file, a bad header, an unknown dtype, or offsets
// that do not match the shape or lie outside the file.
std::map<std::string, at::Tensor> read_safetensors(const std::string& path);

// Writes FP32 copies of `tensors` to `path` atomically.
void write_safetensors(const std::string& path, const std::map<std::string, at::Tensor>& tensors);

}  // namespace oom::backend
