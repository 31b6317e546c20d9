// AdamW over flat FP32 buffers: the CPU kernel that updates host-resident optimizer state and a
// device-side variant for state that stays resident on the accelerator.
//
// Math (the same as torch::optim::AdamW): with g' = grad_scale · g,
//   p ← p · (1 − lr·wd);  m ← β1·m + (1 − β1)·g';  v ← β2·v + (1 − β2)·g'²;
//   p ← p − (lr / (1 − β1^t)) · m / (√v / √(1 − β2^t) + ε),
// t the 1-based step. Moments and masters are FP32; gradients FP32 or BF16. Per step the kernel
// reads p, g, m, v and writes p, m, v: 28 bytes per parameter with FP32 gradients (24 with BF16),
// so it is bound by DRAM bandwidth. The CPU kernel is vectorized (AVX-512 or AVX2+FMA, chosen at
// run time from the CPU's features; a scalar loop otherwise) and split over threads in chunks.
// Thread-safety: concurrent calls on disjoint buffers are safe.
#pragma once

#include <cstdint>
#include <string>

#include <ATen/ATen.h>

namespace oom::backend {

struct AdamWConfig {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
};

// The per-step scalars of one update, computed in double and rounded to float like LibTorch.
struct AdamWScalars {
  float decay;      // 1 − lr·wd
  float beta1, one_minus_beta1, beta2, one_minus_beta2;
  float step_size;  // lr / (1 − β1^t)
  float bc2_sqrt;   // √(1 − β2^t)
  float eps;
  float grad_scale;
};
AdamWScalars adamw_scalars(const AdamWConfig& cfg, std::int64_t step, double grad_scale = 1.0);

// Which vector kernel the CPU path uses on this machine: "avx512", "avx2" or "scalar".
std::string cpu_adamw_isa();

// Raw kernels over [0, n): single-threaded, vectorized. `grad_bf16` holds BF16 bit patterns.
void adamw_kernel_f32(float* p, const float* grad, float* m, float* v, std::int64_t n, const AdamWScalars& s);
void adamw_kernel_bf16(float* p, const std::uint16_t* grad_bf16, float* m, float* v, std::int64_t n,
                       const AdamWScalars& s);

// One AdamW step on contiguous CPU tensors: p, m, v FP32 of equal numel, grad FP32 or BF16 of the
// same numel. `step` is the 1-based step count after this update. Splits the work over `threads`
// threads of its own (0 = LibTorch's intra-op thread count). Throws c10::Error on mismatched tensors.
void cpu_adamw_step(at::Tensor& p, const at::Tensor& grad, at::Tensor& m, at::Tensor& v, const AdamWConfig& cfg,
                    std::int64_t step, double grad_scale = 1.0, int threads = 0);

// The same update with tensor operations on the tensors' own device (GPU-resident state).
void device_adamw_step(at::Tensor& p, const at::Tensor& grad, at::Tensor& m, at::Tensor& v, const AdamWConfig& cfg,
                       std::int64_t step, double grad_scale = 1.0);

}  // namespace oom::backend
