// backend/model/recompute.h (recomputed, LeanKernels): a kernel that keeps only its inputs
// computes the values and gradients of its operators recorded directly, bit for bit, and holds
// fewer bytes between its forward and its backward.
#include "backend/model/recompute.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "backend/model/model.h"
#include "backend/model/plan_ops.h"
#include "backend/runtime/device_memory.h"
#include "backend/runtime/state.h"
#include "costmodel/model_spec.h"

namespace oom::backend {
namespace {

std::vector<at::Tensor> grads(const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& seeds,
                              const std::vector<at::Tensor>& inputs) {
  return torch::autograd::grad(outputs, inputs, seeds, /*retain_graph=*/false, /*create_graph=*/false, /*allow_unused=*/true);
}

// Two outputs from three inputs, one of which needs no gradient, with FP32 intermediates.
std::vector<at::Tensor> kernel(const std::vector<at::Tensor>& x) {
  const auto h = at::tanh(x[0].matmul(x[1])) * x[2];
  return {h.exp().sum(-1), h.pow(2)};
}

TEST(Recompute, ValuesAndGradientsAreTheOperatorsOwn) {
  torch::manual_seed(4);
  auto a = torch::randn({6, 5}).requires_grad_(true), b = torch::randn({5, 7}).requires_grad_(true);
  const auto c = torch::randn({6, 7});
  const auto plain = kernel({a, b, c});
  const auto lean = recomputed(kernel, {a, b, c});
  ASSERT_EQ(lean.size(), 2u);
  for (std::size_t i = 0; i < 2; ++i) EXPECT_TRUE(at::equal(plain[i], lean[i])) << "output " << i;
  const std::vector<at::Tensor> seeds{torch::randn({6}), torch::randn({6, 7})};
  const auto gp = grads(plain, seeds, {a, b});
  const auto gl = grads(lean, seeds, {a, b});
  for (std::size_t i = 0; i < 2; ++i) EXPECT_TRUE(at::equal(gp[i], gl[i])) << "gradient " << i;
  // Only one output seeded: the other's gradient is absent, not zero-filled into a wrong sum.
  const auto one = grads({recomputed(kernel, {a, b, c})[1]}, {seeds[1]}, {a, b});
  const auto ref = grads({kernel({a, b, c})[1]}, {seeds[1]}, {a, b});
  for (std::size_t i = 0; i < 2; ++i) EXPECT_TRUE(at::equal(one[i], ref[i])) << "gradient " << i;
}

// Bytes the device holds after `forward` ran in an OnDevice scope, its graph alive, beyond before.
template <class F>
Bytes held_by(F forward) {
  const Bytes before = device_memory::current_bytes();
  device_memory::OnDevice d;
  const auto kept = forward();
  return device_memory::current_bytes() - before;
}

TEST(Recompute, KeepsOnlyItsInputsBetweenForwardAndBackward) {
  const device_memory::Emulation on(true);
  auto a = torch::randn({64, 64}).requires_grad_(true), b = torch::randn({64, 64}).requires_grad_(true);
  const auto c = torch::randn({64, 64});
  const Bytes plain = held_by([&] { return kernel({a, b, c}); });
  const Bytes lean = held_by([&] { return recomputed(kernel, {a, b, c}); });
  const Bytes outputs = (64 + 64 * 64) * 4;
  EXPECT_EQ(lean, outputs);
  EXPECT_GE(plain, outputs + 3 * 64 * 64 * 4);  // matmul, tanh and product kept for the backward
}

// Runs `forward` without and with LeanKernels and differentiates `scalar` of its outputs with
// respect to `leaves`: outputs and gradients the same bit for bit. Returns the bytes the plain and
// the lean graph hold between the forward and the backward.
template <class Forward, class Scalar>
std::pair<Bytes, Bytes> same_arithmetic_held(Forward forward, Scalar scalar, const std::vector<at::Tensor>& leaves) {
  std::vector<at::Tensor> results[2];
  Bytes held[2] = {0, 0};
  for (const int lean : {0, 1}) {
    const LeanKernels mode(lean == 1);
    std::vector<at::Tensor> out;
    held[lean] = held_by([&] {
      out = forward();
      return out;
    });
    results[lean] = grads({scalar(out)}, {}, leaves);
    results[lean].insert(results[lean].end(), out.begin(), out.end());
  }
  for (std::size_t i = 0; i < results[0].size(); ++i) EXPECT_TRUE(at::equal(results[0][i], results[1][i])) << "tensor " << i;
  return {held[0], held[1]};
}

// The same, the lean graph holding less than half the plain graph's bytes.
template <class Forward, class Scalar>
void expect_same_arithmetic_holding_less(Forward forward, Scalar scalar, const std::vector<at::Tensor>& leaves) {
  const auto [plain, lean] = same_arithmetic_held(forward, scalar, leaves);
  EXPECT_LT(lean * 2, plain) << "lean " << lean << " B, plain " << plain << " B";
}

TEST(LeanKernels, AttentionCoreAndNormsAreTheSameArithmeticHoldingLess) {
  const device_memory::Emulation on(true);
  torch::manual_seed(5);
  auto q = torch::randn({2, 4, 64, 16}).requires_grad_(true);
  auto k = torch::randn({2, 2, 64, 16}).requires_grad_(true);
  auto v = torch::randn({2, 2, 64, 16}).requires_grad_(true);
  auto w = torch::randn({16}).requires_grad_(true);
  const auto probe = torch::randn({2, 4, 64, 16});
  expect_same_arithmetic_holding_less(
      [&] { return std::vector<at::Tensor>{rms_norm(attention_core(rms_norm(q, w), k, v, /*window=*/0, /*query_block=*/32).out, w)}; },
      [&](const std::vector<at::Tensor>& out) { return (out[0] * probe).sum(); }, {q, k, v, w});
}

TEST(LeanKernels, GdnChunksAreTheSameArithmeticHoldingLess) {
  const device_memory::Emulation on(true);
  torch::manual_seed(6);
  const ModelSpec spec = load_model_spec("tiny-moe");
  const GdnSpec& g = spec.gdn;
  const std::int64_t B = 2, S = 48, conv = 2 * g.key_dim() + g.value_dim();
  plan_ops::GdnInputs in{torch::randn({B, conv, S}).requires_grad_(true), at::Tensor(),
                         torch::rand({B, g.value_heads, S}).requires_grad_(true),
                         (-torch::rand({B, g.value_heads, S})).requires_grad_(true)};
  HostState st(spec);  // decoder 0 of tiny-moe is a GDN layer
  st.init_from_seed(7);
  const auto flat = st.master(1).clone().requires_grad_(true);
  const BlockLayout layout = st.layout().blocks[1];
  const BlockWeights w = block_views(layout, flat);
  const auto probe = torch::randn({B, g.value_heads, S, g.value_head_dim});
  expect_same_arithmetic_holding_less(
      [&] {
        auto state = at::zeros({B, g.value_heads, g.key_head_dim, g.value_head_dim});
        auto out = plan_ops::gdn_core(in, 0, S, w, spec, /*kernel_chunk=*/16, state);
        return std::vector<at::Tensor>{out, state};
      },
      [&](const std::vector<at::Tensor>& out) { return (out[0] * probe).sum() + out[1].sum(); }, {in.qkv, in.beta, in.g, flat});
}

// Routed experts: a gated activation keeps its two inputs (not the activation too), and adding an
// expert's weighted rows into the output keeps no copy of them; the expert outputs the weighting
// keeps stay, as the memory model prices them (costmodel/memory.h, moe_assignment_bytes).
TEST(LeanKernels, RoutedExpertsKeepNeitherTheActivationNorTheWeightedRows) {
  const device_memory::Emulation on(true);
  torch::manual_seed(8);
  const ModelSpec spec = load_model_spec("tiny-moe");
  HostState st(spec);
  st.init_from_seed(9);
  const auto flat = st.master(1).clone().requires_grad_(true);
  const BlockWeights w = block_views(st.layout().blocks[1], flat);
  const std::int64_t T = 96, A = T * spec.moe.top_k;
  auto x = torch::randn({T, spec.hidden}).requires_grad_(true);
  const auto probe = torch::randn({T, spec.hidden});
  const auto [plain, lean] = same_arithmetic_held(
      [&] { return std::vector<at::Tensor>{routed_experts(x, route(x, w["router"], spec.moe), w, spec)}; },
      [&](const std::vector<at::Tensor>& out) { return (out[0] * probe).sum(); }, {x, flat});
  const Bytes activation = A * spec.moe.expert_intermediate * 4, weighted_rows = A * spec.hidden * 4;
  EXPECT_EQ(plain - lean, activation + weighted_rows) << "plain " << plain << " B, lean " << lean << " B";
}

}  // namespace
}  // namespace oom::backend
