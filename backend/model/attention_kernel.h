// The causal softmax attention core as PyTorch's fused kernels run it, the kernels the cost model
// prices (costmodel/ attention: FlashAttention-class, O(S) memory, the log-sum-exp kept):
//   - on CUDA, BF16: the flash kernel (at::_scaled_dot_product_flash_attention) where a call's
//     mask is the plain causal one, the memory-efficient kernel with an additive mask
//     (at::_scaled_dot_product_efficient_attention) where a window or the queries' offset in the
//     sequence cut it otherwise;
//   - elsewhere (the CPU the tests run on), FP32: the flash kernel's CPU form
//     (at::_scaled_dot_product_flash_attention_for_cpu), with the same mask where one is needed.
// A call covers queries at sequence places [q0, q0 + n) and keys at [k0, k0 + m); query i sees key
// j where j ≤ i and, with a window, i − j < window. Every call's queries see at least their own key.
// K/V have as many heads as Q here (GQA is expanded by the caller: none of these kernels takes
// grouped heads). Stateless; thread-compatible.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include <ATen/ATen.h>

namespace oom::backend::attention_kernel {

// The dtype the kernels compute in for tensors on q's device: BF16 on CUDA, FP32 elsewhere.
at::ScalarType compute_dtype(const at::Tensor& q);

// The calls that cover S queries at places query0 … query0 + S − 1 (rows 0 … S − 1 of q) over keys
// from place 0: one causal call over the whole sequence where there is no window and query0 = 0;
// otherwise one per query block of `query_block` rows, over the keys its window allows.
struct Call {
  std::int64_t q_begin = 0, q_end = 0;  // query rows (q0 = query0 + q_begin)
  std::int64_t k_begin = 0, k_end = 0;  // key places (rows of k, v)
};
std::vector<Call> plan_calls(std::int64_t S, std::int64_t query0, std::int64_t window, std::int64_t query_block);

// One call: q [B, H, n, d], k, v [B, H, m, d] in compute_dtype → out [B, H, n, d] (compute dtype)
// and lse [B, H, n] FP32 (log Σ_j exp(q·k_j·scale) over the keys each query sees). Differentiable
// in q, k, v through the kernel's own backward; lse carries no gradient.
struct Result {
  at::Tensor out, lse;
};
Result forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, std::int64_t q0, std::int64_t k0,
               std::int64_t window, double scale);
// The kernel's backward of one call from its kept out and lse (as forward returned them):
// dq, dk, dv in the compute dtype.
std::array<at::Tensor, 3> backward(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   const at::Tensor& out, const at::Tensor& lse, std::int64_t q0, std::int64_t k0,
                                   std::int64_t window, double scale);

}  // namespace oom::backend::attention_kernel
