#include "backend/optim/adamw.h"

#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

#include <ATen/Parallel.h>
#include <immintrin.h>

namespace oom::backend {
namespace {

inline float bf16_to_float(std::uint16_t b) {
  const std::uint32_t bits = std::uint32_t{b} << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// The scalar loop is also the tail of the vector kernels. Operation order follows LibTorch's
// mul_/add_/addcmul_/sqrt/div/add_/addcdiv_ sequence.
template <typename LoadGrad>
inline void adamw_scalar(float* p, float* m, float* v, std::int64_t begin, std::int64_t end, const AdamWScalars& s,
                         LoadGrad grad) {
  for (std::int64_t i = begin; i < end; ++i) {
    const float g = grad(i) * s.grad_scale;
    const float pi = p[i] * s.decay;
    const float mi = m[i] * s.beta1 + s.one_minus_beta1 * g;
    const float vi = v[i] * s.beta2 + s.one_minus_beta2 * g * g;
    const float denom = std::sqrt(vi) / s.bc2_sqrt + s.eps;
    m[i] = mi;
    v[i] = vi;
    p[i] = pi + (-s.step_size * mi) / denom;
  }
}

#if defined(__x86_64__) || defined(_M_X64)
#define OOM_ADAMW_X86 1

// Elements [begin, n) that a vector loop left over, with FP32 or BF16 gradients.
template <bool kBf16>
inline void adamw_tail(float* p, const void* grad, float* m, float* v, std::int64_t begin, std::int64_t n,
                       const AdamWScalars& s) {
  if constexpr (kBf16) {
    const auto* gb = static_cast<const std::uint16_t*>(grad);
    adamw_scalar(p, m, v, begin, n, s, [gb](std::int64_t j) { return bf16_to_float(gb[j]); });
  } else {
    const auto* gf = static_cast<const float*>(grad);
    adamw_scalar(p, m, v, begin, n, s, [gf](std::int64_t j) { return gf[j]; });
  }
}

__attribute__((target("avx2,fma"))) inline __m256 load8_bf16(const std::uint16_t* g) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(g));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

template <bool kBf16>
__attribute__((target("avx2,fma"))) void adamw_avx2(float* p, const void* grad, float* m, float* v, std::int64_t n,
                                                     const AdamWScalars& s) {
  const __m256 decay = _mm256_set1_ps(s.decay), b1 = _mm256_set1_ps(s.beta1), omb1 = _mm256_set1_ps(s.one_minus_beta1);
  const __m256 b2 = _mm256_set1_ps(s.beta2), omb2 = _mm256_set1_ps(s.one_minus_beta2);
  const __m256 neg_step = _mm256_set1_ps(-s.step_size), bc2 = _mm256_set1_ps(s.bc2_sqrt), eps = _mm256_set1_ps(s.eps);
  const __m256 scale = _mm256_set1_ps(s.grad_scale);
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 g = kBf16 ? load8_bf16(static_cast<const std::uint16_t*>(grad) + i)
                     : _mm256_loadu_ps(static_cast<const float*>(grad) + i);
    g = _mm256_mul_ps(g, scale);
    const __m256 pi = _mm256_mul_ps(_mm256_loadu_ps(p + i), decay);
    const __m256 mi = _mm256_fmadd_ps(g, omb1, _mm256_mul_ps(_mm256_loadu_ps(m + i), b1));
    const __m256 vi = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(v + i), b2), _mm256_mul_ps(_mm256_mul_ps(omb2, g), g));
    const __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vi), bc2), eps);
    _mm256_storeu_ps(m + i, mi);
    _mm256_storeu_ps(v + i, vi);
    _mm256_storeu_ps(p + i, _mm256_add_ps(pi, _mm256_div_ps(_mm256_mul_ps(neg_step, mi), denom)));
  }
  adamw_tail<kBf16>(p, grad, m, v, i, n, s);
}

__attribute__((target("avx512f"))) inline __m512 load16_bf16(const std::uint16_t* g) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

template <bool kBf16>
__attribute__((target("avx512f"))) void adamw_avx512(float* p, const void* grad, float* m, float* v, std::int64_t n,
                                                      const AdamWScalars& s) {
  const __m512 decay = _mm512_set1_ps(s.decay), b1 = _mm512_set1_ps(s.beta1), omb1 = _mm512_set1_ps(s.one_minus_beta1);
  const __m512 b2 = _mm512_set1_ps(s.beta2), omb2 = _mm512_set1_ps(s.one_minus_beta2);
  const __m512 neg_step = _mm512_set1_ps(-s.step_size), bc2 = _mm512_set1_ps(s.bc2_sqrt), eps = _mm512_set1_ps(s.eps);
  const __m512 scale = _mm512_set1_ps(s.grad_scale);
  std::int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 g = kBf16 ? load16_bf16(static_cast<const std::uint16_t*>(grad) + i)
                     : _mm512_loadu_ps(static_cast<const float*>(grad) + i);
    g = _mm512_mul_ps(g, scale);
    const __m512 pi = _mm512_mul_ps(_mm512_loadu_ps(p + i), decay);
    const __m512 mi = _mm512_fmadd_ps(g, omb1, _mm512_mul_ps(_mm512_loadu_ps(m + i), b1));
    const __m512 vi = _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(v + i), b2), _mm512_mul_ps(_mm512_mul_ps(omb2, g), g));
    const __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(vi), bc2), eps);
    _mm512_storeu_ps(m + i, mi);
    _mm512_storeu_ps(v + i, vi);
    _mm512_storeu_ps(p + i, _mm512_add_ps(pi, _mm512_div_ps(_mm512_mul_ps(neg_step, mi), denom)));
  }
  adamw_tail<kBf16>(p, grad, m, v, i, n, s);
}

enum class Isa { kScalar, kAvx2, kAvx512 };
Isa detect_isa() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return Isa::kAvx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Isa::kAvx2;
  return Isa::kScalar;
}
#else
enum class Isa { kScalar };
Isa detect_isa() { return Isa::kScalar; }
#endif

const Isa kIsa = detect_isa();

}  // namespace

AdamWScalars adamw_scalars(const AdamWConfig& c, std::int64_t step, double grad_scale) {
  const double bc1 = 1.0 - std::pow(c.beta1, static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(c.beta2, static_cast<double>(step));
  return {static_cast<float>(1.0 - c.lr * c.weight_decay), static_cast<float>(c.beta1), static_cast<float>(1.0 - c.beta1),
          static_cast<float>(c.beta2), static_cast<float>(1.0 - c.beta2), static_cast<float>(c.lr / bc1),
          static_cast<float>(std::sqrt(bc2)), static_cast<float>(c.eps), static_cast<float>(grad_scale)};
}

std::string cpu_adamw_isa() {
#ifdef OOM_ADAMW_X86
  if (kIsa == Isa::kAvx512) return "avx512";
  if (kIsa == Isa::kAvx2) return "avx2";
#endif
  return "scalar";
}

void adamw_kernel_f32(float* p, const float* grad, float* m, float* v, std::int64_t n, const AdamWScalars& s) {
#ifdef OOM_ADAMW_X86
  if (kIsa == Isa::kAvx512) return adamw_avx512<false>(p, grad, m, v, n, s);
  if (kIsa == Isa::kAvx2) return adamw_avx2<false>(p, grad, m, v, n, s);
#endif
  adamw_scalar(p, m, v, 0, n, s, [grad](std::int64_t j) { return grad[j]; });
}

void adamw_kernel_bf16(float* p, const std::uint16_t* grad, float* m, float* v, std::int64_t n, const AdamWScalars& s) {
#ifdef OOM_ADAMW_X86
  if (kIsa == Isa::kAvx512) return adamw_avx512<true>(p, grad, m, v, n, s);
  if (kIsa == Isa::kAvx2) return adamw_avx2<true>(p, grad, m, v, n, s);
#endif
  adamw_scalar(p, m, v, 0, n, s, [grad](std::int64_t j) { return bf16_to_float(grad[j]); });
}

void cpu_adamw_step(at::Tensor& p, const at::Tensor& grad, at::Tensor& m, at::Tensor& v, const AdamWConfig& cfg,
                    std::int64_t step, double grad_scale, int threads) {
  TORCH_CHECK(p.device().is_cpu() && grad.device().is_cpu() && m.device().is_cpu() && v.device().is_cpu(),
              "cpu_adamw_step: tensors must be on the CPU");
  TORCH_CHECK(p.scalar_type() == at::kFloat && m.scalar_type() == at::kFloat && v.scalar_type() == at::kFloat,
              "cpu_adamw_step: parameters and moments must be FP32");
  TORCH_CHECK(grad.scalar_type() == at::kFloat || grad.scalar_type() == at::kBFloat16,
              "cpu_adamw_step: gradients must be FP32 or BF16");
  TORCH_CHECK(p.is_contiguous() && grad.is_contiguous() && m.is_contiguous() && v.is_contiguous(),
              "cpu_adamw_step: tensors must be contiguous");
  const auto n = p.numel();
  TORCH_CHECK(grad.numel() == n && m.numel() == n && v.numel() == n, "cpu_adamw_step: sizes differ");
  TORCH_CHECK(step >= 1, "cpu_adamw_step: step must be ≥ 1");
  const AdamWScalars s = adamw_scalars(cfg, step, grad_scale);
  float* pp = p.data_ptr<float>();
  float* mp = m.data_ptr<float>();
  float* vp = v.data_ptr<float>();
  const bool bf16 = grad.scalar_type() == at::kBFloat16;
  const void* gp = grad.data_ptr();
  auto run = [&](std::int64_t b, std::int64_t e) {
    if (bf16) {
      adamw_kernel_bf16(pp + b, static_cast<const std::uint16_t*>(gp) + b, mp + b, vp + b, e - b, s);
    } else {
      adamw_kernel_f32(pp + b, static_cast<const float*>(gp) + b, mp + b, vp + b, e - b, s);
    }
  };
  constexpr std::int64_t kGrain = 1 << 15;  // 32 Ki elements: ~900 KB of traffic per chunk
  // Our own threads, not at::parallel_for: PyPI's LibTorch parallelizes with OpenMP pragmas inlined
  // from its headers, which run serially in translation units built without -fopenmp.
  if (threads <= 0) threads = at::get_num_threads();
  const std::int64_t parts = std::max<std::int64_t>(1, std::min<std::int64_t>(threads, (n + kGrain - 1) / kGrain));
  if (parts == 1) return run(0, n);
  const std::int64_t per = ((n + parts - 1) / parts + 15) / 16 * 16;
  std::vector<std::thread> pool;
  for (std::int64_t t = 1; t < parts; ++t) {
    const auto b = std::min(n, t * per), e = std::min(n, (t + 1) * per);
    if (b < e) pool.emplace_back(run, b, e);
  }
  run(0, std::min(n, per));
  for (auto& t : pool) t.join();
}

void device_adamw_step(at::Tensor& p, const at::Tensor& grad, at::Tensor& m, at::Tensor& v, const AdamWConfig& cfg,
                       std::int64_t step, double grad_scale) {
  TORCH_CHECK(step >= 1, "device_adamw_step: step must be ≥ 1");
  const AdamWScalars s = adamw_scalars(cfg, step, grad_scale);
  at::NoGradGuard no_grad;
  const auto g = grad_scale == 1.0 ? grad.to(at::kFloat) : grad.to(at::kFloat) * s.grad_scale;
  p.mul_(s.decay);
  m.mul_(s.beta1).add_(g, s.one_minus_beta1);
  v.mul_(s.beta2).addcmul_(g, g, s.one_minus_beta2);
  const auto denom = (v.sqrt() / s.bc2_sqrt).add_(s.eps);
  p.addcdiv_(m, denom, -s.step_size);
}

}  // namespace oom::backend
