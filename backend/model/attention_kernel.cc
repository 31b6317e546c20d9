#include "backend/model/attention_kernel.h"

#include <algorithm>
#include <limits>

#include "costmodel/input_error.h"

namespace oom::backend::attention_kernel {

namespace {

// The memory-efficient CUDA kernel reads its additive mask with rows aligned to 16 elements
// (PyTorch's scaled_dot_product_attention pads the mask the same way before calling it).
constexpr std::int64_t kCudaMaskAlign = 16;
// Its log-sum-exp has rows padded to a multiple of 32 queries.
constexpr std::int64_t kCudaLseAlign = 32;

std::int64_t round_up(std::int64_t n, std::int64_t to) { return (n + to - 1) / to * to; }

// The plain causal mask is all a call needs: its queries and keys are the same places and no
// window cuts inside it.
bool causal_only(const at::Tensor& q, const at::Tensor& k, std::int64_t q0, std::int64_t k0, std::int64_t window) {
  const auto n = q.size(2), m = k.size(2);
  return q0 == k0 && n == m && (window <= 0 || window >= n);
}

// The call's additive mask [n, m] in `dtype`: 0 where query q0 + i sees key k0 + j, −∞ elsewhere;
// its rows `align`-element aligned in a wider buffer.
at::Tensor additive_mask(std::int64_t q0, std::int64_t n, std::int64_t k0, std::int64_t m, std::int64_t window,
                         const at::TensorOptions& options, std::int64_t align) {
  const auto idx = options.dtype(at::kLong);
  const auto qi = at::arange(q0, q0 + n, idx).unsqueeze(1);
  const auto kj = at::arange(k0, k0 + m, idx).unsqueeze(0);
  auto hidden = kj > qi;
  if (window > 0) hidden = hidden | (qi - kj >= window);
  return at::zeros({n, round_up(m, align)}, options)
      .narrow(1, 0, m)
      .masked_fill_(hidden, -std::numeric_limits<double>::infinity());
}

at::Tensor cuda_bias(const at::Tensor& q, const at::Tensor& k, std::int64_t q0, std::int64_t k0, std::int64_t window) {
  const auto B = q.size(0), H = q.size(1), n = q.size(2), m = k.size(2);
  return additive_mask(q0, n, k0, m, window, q.options(), kCudaMaskAlign).view({1, 1, n, m}).expand({B, H, n, m});
}

// The kernels' random-number state where dropout is 0: read by none of them.
at::Tensor no_rng_state() { return at::zeros({}, at::TensorOptions().dtype(at::kLong)); }

}  // namespace

at::ScalarType compute_dtype(const at::Tensor& q) { return q.is_cuda() ? at::kBFloat16 : at::kFloat; }

std::vector<Call> plan_calls(std::int64_t S, std::int64_t query0, std::int64_t window, std::int64_t query_block) {
  if (window <= 0 && query0 == 0) return {Call{0, S, 0, S}};
  const auto block = std::max<std::int64_t>(1, query_block);
  std::vector<Call> calls;
  for (std::int64_t b0 = 0; b0 < S; b0 += block) {
    const auto b1 = std::min(S, b0 + block);
    const auto s0 = query0 + b0, s1 = query0 + b1;  // the block's places in the sequence
    calls.push_back({b0, b1, window > 0 ? std::max<std::int64_t>(0, s0 - window + 1) : 0, s1});
  }
  return calls;
}

namespace {

// The kernels on V as wide as Q and K.
Result forward_same_width(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, std::int64_t q0, std::int64_t k0,
                          std::int64_t window, double scale) {
  OOM_ASSERT(q.scalar_type() == compute_dtype(q) && k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type(),
             "attention kernel inputs in the kernel's dtype");
  const bool causal = causal_only(q, k, q0, k0, window);
  if (q.is_cuda()) {
    if (causal) {
      const auto r = at::_scaled_dot_product_flash_attention(q, k, v, 0.0, /*is_causal=*/true, /*return_debug_mask=*/false, scale);
      return {std::get<0>(r), std::get<1>(r)};
    }
    const auto r = at::_scaled_dot_product_efficient_attention(q, k, v, cuda_bias(q, k, q0, k0, window), /*compute_log_sumexp=*/true,
                                                               0.0, /*is_causal=*/false, scale);
    return {std::get<0>(r), std::get<1>(r).narrow(2, 0, q.size(2))};
  }
  const auto mask = causal ? std::optional<at::Tensor>() : additive_mask(q0, q.size(2), k0, k.size(2), window, q.options(), 1);
  const auto r = at::_scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, mask, scale);
  return {std::get<0>(r), std::get<1>(r)};
}

std::array<at::Tensor, 3> backward_same_width(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                              const at::Tensor& out, const at::Tensor& lse, std::int64_t q0, std::int64_t k0,
                                              std::int64_t window, double scale) {
  const bool causal = causal_only(q, k, q0, k0, window);
  if (q.is_cuda()) {
    if (causal) {
      const auto none = no_rng_state();
      const auto g = at::_scaled_dot_product_flash_attention_backward(dout, q, k, v, out, lse.contiguous(), at::Tensor(), at::Tensor(),
                                                                      q.size(2), k.size(2), 0.0, /*is_causal=*/true, none, none, scale);
      return {std::get<0>(g), std::get<1>(g), std::get<2>(g)};
    }
    const auto n = q.size(2);
    const auto lse_rows = at::constant_pad_nd(lse, {0, round_up(n, kCudaLseAlign) - n}, 0.0).contiguous();
    const auto none = no_rng_state();
    const auto g = at::_scaled_dot_product_efficient_attention_backward(dout, q, k, v, cuda_bias(q, k, q0, k0, window), out, lse_rows,
                                                                        none, none, 0.0, {true, true, true, false},
                                                                        /*is_causal=*/false, scale);
    return {std::get<0>(g), std::get<1>(g), std::get<2>(g)};
  }
  const auto mask = causal ? std::optional<at::Tensor>() : additive_mask(q0, q.size(2), k0, k.size(2), window, q.options(), 1);
  const auto g = at::_scaled_dot_product_flash_attention_for_cpu_backward(dout, q, k, v, out, lse, 0.0, causal, mask, scale);
  return {std::get<0>(g), std::get<1>(g), std::get<2>(g)};
}

// The columns that widen x [.., dv] to d with zeros (latent attention's V is narrower than its Q
// and K; none of the kernels takes that): zero columns of V give zero columns of O and change no
// gradient of Q, K or V's own columns.
at::Tensor widened(const at::Tensor& x, std::int64_t d) {
  return x.size(-1) == d ? x : at::constant_pad_nd(x, {0, d - x.size(-1)}, 0.0);
}

}  // namespace

Result forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, std::int64_t q0, std::int64_t k0,
               std::int64_t window, double scale) {
  const auto d = q.size(3), dv = v.size(3);
  Result r = forward_same_width(q, k, widened(v, d), q0, k0, window, scale);
  if (dv != d) r.out = r.out.narrow(3, 0, dv);
  return r;
}

std::array<at::Tensor, 3> backward(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   const at::Tensor& out, const at::Tensor& lse, std::int64_t q0, std::int64_t k0,
                                   std::int64_t window, double scale) {
  const auto d = q.size(3), dv = v.size(3);
  auto g = backward_same_width(widened(dout, d), q, k, widened(v, d), widened(out, d), lse, q0, k0, window, scale);
  if (dv != d) g[2] = g[2].narrow(3, 0, dv);
  return g;
}

}  // namespace oom::backend::attention_kernel
