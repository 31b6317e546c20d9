// backend/optim/adamw.h: the vectorized, multithreaded CPU AdamW and the device AdamW against
// torch::optim::AdamW on the same buffers (float tolerance: the kernels may fuse a multiply-add).
#include "backend/optim/adamw.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "tests/backend/reference_ops.h"

namespace oom::backend {
namespace {

using testing::rel_diff;

constexpr double kTol = 1e-6;

struct AdamWRun {
  torch::Tensor p, m, v;
};

// `steps` updates with torch::optim::AdamW; grads[i] is the gradient of step i.
AdamWRun torch_adamw(const torch::Tensor& p0, const std::vector<torch::Tensor>& grads, const AdamWConfig& c) {
  auto p = p0.clone().set_requires_grad(true);
  torch::optim::AdamW opt({p}, torch::optim::AdamWOptions(c.lr).betas({c.beta1, c.beta2}).eps(c.eps).weight_decay(c.weight_decay));
  for (const auto& g : grads) {
    p.mutable_grad() = g.clone();
    opt.step();
  }
  auto& st = static_cast<torch::optim::AdamWParamState&>(*opt.state().begin()->second);
  return {p.detach(), st.exp_avg(), st.exp_avg_sq()};
}

std::vector<torch::Tensor> random_grads(std::int64_t n, int steps) {
  std::vector<torch::Tensor> g;
  for (int i = 0; i < steps; ++i) g.push_back(torch::randn({n}) * (i + 1) * 1e-2);
  return g;
}

TEST(CpuAdamW, MatchesTorchAdamWOverStepsForOddSizesAndThreadCounts) {
  torch::manual_seed(11);
  AdamWConfig c{3e-3, 0.9, 0.95, 1e-8, 0.1};
  for (std::int64_t n : {1, 37, 100'003}) {
    for (int threads : {0, 1, 3}) {
      const auto p0 = torch::randn({n});
      const auto grads = random_grads(n, 4);
      const AdamWRun ref = torch_adamw(p0, grads, c);
      auto p = p0.clone(), m = torch::zeros({n}), v = torch::zeros({n});
      for (std::size_t s = 0; s < grads.size(); ++s) cpu_adamw_step(p, grads[s], m, v, c, static_cast<std::int64_t>(s + 1), 1.0, threads);
      EXPECT_LE(rel_diff(p, ref.p), kTol) << "n " << n << " threads " << threads;
      EXPECT_LE(rel_diff(m, ref.m), kTol);
      EXPECT_LE(rel_diff(v, ref.v), kTol);
      EXPECT_GT(rel_diff(p, p0), 1e-4);  // it did move
    }
  }
}

TEST(CpuAdamW, Bf16GradientsMatchTorchOnTheSameRoundedGradients) {
  torch::manual_seed(12);
  AdamWConfig c;
  const std::int64_t n = 4099;
  const auto p0 = torch::randn({n});
  std::vector<torch::Tensor> bf16, as_float;
  for (const auto& g : random_grads(n, 3)) {
    bf16.push_back(g.to(torch::kBFloat16));
    as_float.push_back(bf16.back().to(torch::kFloat));
  }
  const AdamWRun ref = torch_adamw(p0, as_float, c);
  auto p = p0.clone(), m = torch::zeros({n}), v = torch::zeros({n});
  for (std::size_t s = 0; s < bf16.size(); ++s) cpu_adamw_step(p, bf16[s], m, v, c, static_cast<std::int64_t>(s + 1));
  EXPECT_LE(rel_diff(p, ref.p), kTol);
  EXPECT_LE(rel_diff(v, ref.v), kTol);
}

TEST(CpuAdamW, GradScaleEqualsScaledGradients) {
  torch::manual_seed(13);
  AdamWConfig c;
  const std::int64_t n = 1000;
  const auto p0 = torch::randn({n});
  const auto grads = random_grads(n, 2);
  std::vector<torch::Tensor> scaled;
  for (const auto& g : grads) scaled.push_back(g * 0.25f);
  const AdamWRun ref = torch_adamw(p0, scaled, c);
  auto p = p0.clone(), m = torch::zeros({n}), v = torch::zeros({n});
  for (std::size_t s = 0; s < grads.size(); ++s) cpu_adamw_step(p, grads[s], m, v, c, static_cast<std::int64_t>(s + 1), 0.25);
  EXPECT_LE(rel_diff(p, ref.p), kTol);
  EXPECT_LE(rel_diff(m, ref.m), kTol);
}

TEST(CpuAdamW, VectorKernelAgreesWithScalarTailElementwise) {
  // The first n − n%8 elements go through the vector loop, the rest through the scalar loop;
  // with identical inputs in both halves the results must agree to float rounding.
  AdamWConfig c;
  const auto s = adamw_scalars(c, 1);
  std::vector<float> p(35, 0.5f), g(35, 0.01f), m(35, 0.0f), v(35, 0.0f);
  adamw_kernel_f32(p.data(), g.data(), m.data(), v.data(), 35, s);
  for (int i = 1; i < 35; ++i) EXPECT_NEAR(p[i], p[0], 1e-7f);
  EXPECT_LT(p[0], 0.5f);
  SUCCEED() << "isa " << cpu_adamw_isa();
}

TEST(CpuAdamW, RejectsMismatchedTensors) {
  auto p = torch::zeros({8}), m = torch::zeros({8}), v = torch::zeros({7});
  EXPECT_THROW(cpu_adamw_step(p, torch::zeros({8}), m, v, {}, 1), c10::Error);
  auto v8 = torch::zeros({8});
  EXPECT_THROW(cpu_adamw_step(p, torch::zeros({8}, torch::kDouble), m, v8, {}, 1), c10::Error);
  EXPECT_THROW(cpu_adamw_step(p, torch::zeros({8}), m, v8, {}, 0), c10::Error);
}

TEST(DeviceAdamW, MatchesTorchAdamW) {
  torch::manual_seed(14);
  AdamWConfig c{1e-2, 0.8, 0.99, 1e-6, 0.05};
  const std::int64_t n = 513;
  const auto p0 = torch::randn({n});
  const auto grads = random_grads(n, 3);
  const AdamWRun ref = torch_adamw(p0, grads, c);
  auto p = p0.clone(), m = torch::zeros({n}), v = torch::zeros({n});
  for (std::size_t s = 0; s < grads.size(); ++s) device_adamw_step(p, grads[s], m, v, c, static_cast<std::int64_t>(s + 1));
  EXPECT_LE(rel_diff(p, ref.p), kTol);
  EXPECT_LE(rel_diff(v, ref.v), kTol);
}

}  // namespace
}  // namespace oom::backend
