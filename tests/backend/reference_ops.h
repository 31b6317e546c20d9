// Plain references for the backend's layer kernels, written for clarity, not speed: dense masked
// softmax attention, token-by-token Gated DeltaNet (recurrent form, direct causal conv), and a
// dense mixture of experts (every expert on every token, weighted by a dense gate matrix).
#pragma once

#include <ATen/ATen.h>

#include <filesystem>
#include <string>
#include <vector>

#include "backend/model/model.h"
#include "backend/runtime/state.h"

namespace oom::backend::testing {

// Dense softmax over all keys with a causal (and optional window) mask; lse [B, H, S].
AttentionOutput reference_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, std::int64_t window);

// The gated delta rule one token at a time: S ← S·exp(g_t); S ← S + k_t ⊗ β_t(v_t − Sᵀk_t); o_t = Sᵀq_t.
at::Tensor reference_gdn_recurrent(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
                                   const at::Tensor& beta, at::Tensor& state);

// GDN token mixing with a direct causal convolution and the recurrent rule.
at::Tensor reference_gdn_mixing(const at::Tensor& x, const BlockWeights& w, const ModelSpec& spec);

// Routed experts computed densely + shared expert + dense MLP.
at::Tensor reference_moe(const at::Tensor& x, const BlockWeights& w, const ModelSpec& spec);

// Relative difference max|a − b| / max(max|b|, tiny).
double rel_diff(const at::Tensor& a, const at::Tensor& b);
// ‖a − b‖₂ / ‖b‖₂ in double precision.
double rel_l2(const at::Tensor& a, const at::Tensor& b);
// An empty folder <temp>/<prefix>-<tag>-<pid> (emptied when it exists).
std::filesystem::path scratch_dir(const std::string& prefix, const std::string& tag);

// One step's loss and gradients by autograd over the whole model (the plain trainer's arithmetic)
// from the masters of `state`: the reference the trainers' gradients are compared with.
struct ReferenceGradients {
  double loss = 0.0;
  double norm = 0.0;                // global L2 norm of the gradients
  std::vector<at::Tensor> blocks;  // per block, flat, in layout order
};
ReferenceGradients reference_gradients(const HostState& state, const at::Tensor& tokens, const at::Tensor& targets,
                                       const ModelOptions& options);

}  // namespace oom::backend::testing
