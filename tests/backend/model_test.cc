// backend/model/model.h: each layer kernel against a plain reference (reference_ops.h), forward and
// gradients, with the tolerance stated per test (FP32 rounding of differently ordered sums).
#include "backend/model/model.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "backend/runtime/state.h"
#include "tests/backend/reference_ops.h"

namespace oom::backend {
namespace {

using testing::rel_diff;

constexpr double kTol = 1e-5;  // FP32: sums reordered by blocking and chunking

struct Weights {
  std::unique_ptr<BlockLayout> layout;  // owned here so the views' layout pointer stays valid
  at::Tensor flat;
  BlockWeights views;
};

Weights layer_weights(const ModelSpec& spec, int layer, std::uint64_t seed = 7) {
  HostState st(spec);
  st.init_from_seed(seed);
  auto flat = st.master(1 + layer).clone().requires_grad_(true);
  auto layout = std::make_unique<BlockLayout>(st.layout().blocks[static_cast<std::size_t>(1 + layer)]);
  auto views = block_views(*layout, flat);
  return {std::move(layout), flat, std::move(views)};
}

std::vector<at::Tensor> grads_of(const at::Tensor& y, const std::vector<at::Tensor>& inputs, const at::Tensor& probe) {
  return torch::autograd::grad({(y * probe).sum()}, inputs);
}

// The decoder input's norm in a backward keeps its output and 1/rms, not the input: its values are
// model_norm's bit for bit, its gradients model_norm's to rounding, and its backward runs after the
// input's memory is gone (the graph runner releases a checkpoint boundary there).
TEST(ModelNorm, KeepingItsOutputMatchesTheNormAndNeedsNotItsInput) {
  for (const char* name : {"tiny-moe", "tiny-moe-gemma", "tiny-moe-qwen"}) {
    const ModelSpec spec = load_model_spec(name);
    torch::manual_seed(5);
    // A trained-looking scale: around 1 (or around 0 under the zero-centered (1 + w) form), not 1.
    const auto w0 = (spec.zero_centered_norm() ? 0.0 : 1.0) + 0.3 * torch::randn({spec.hidden});
    const auto x0 = 2.0 * torch::randn({3, 5, spec.hidden});
    const auto probe = torch::randn({3, 5, spec.hidden});
    auto w_ref = w0.clone().requires_grad_(true), x_ref = x0.clone().requires_grad_(true);
    const auto ref = model_norm(x_ref, w_ref, spec);
    const auto g_ref = grads_of(ref, {x_ref, w_ref}, probe);

    auto w = w0.clone().requires_grad_(true), x = x0.clone().requires_grad_(true);
    const auto got = model_norm_keeping_output(x, w, spec);
    EXPECT_TRUE(torch::equal(got, ref)) << name;
    x.storage().unsafeGetStorageImpl()->reset();  // the input's memory goes before the backward
    ASSERT_EQ(x.storage().nbytes(), 0u);
    const auto g = grads_of(got, {x, w}, probe);
    EXPECT_LE(rel_diff(g[0], g_ref[0]), kTol) << name << " input gradient";
    EXPECT_LE(rel_diff(g[1], g_ref[1]), kTol) << name << " scale gradient";
  }
}

TEST(AttentionCore, MatchesDenseSoftmaxWithLseFullAndSlidingAcrossQueryBlocks) {
  torch::manual_seed(1);
  for (std::int64_t window : {0, 8, 20}) {
    auto q = torch::randn({2, 4, 37, 16}).requires_grad_(true);
    auto k = torch::randn({2, 2, 37, 16}).requires_grad_(true);
    auto v = torch::randn({2, 2, 37, 16}).requires_grad_(true);
    const auto got = attention_core(q, k, v, window, /*query_block=*/16);
    const auto ref = testing::reference_attention(q, k, v, window);
    EXPECT_LE(rel_diff(got.out, ref.out), kTol) << "window " << window;
    EXPECT_LE(rel_diff(got.lse, ref.lse), kTol) << "window " << window;
    const auto probe = torch::randn_like(ref.out);
    const auto g1 = grads_of(got.out, {q, k, v}, probe);
    const auto g2 = grads_of(ref.out, {q, k, v}, probe);
    for (std::size_t i = 0; i < 3; ++i) EXPECT_LE(rel_diff(g1[i], g2[i]), kTol) << "grad " << i << " window " << window;
  }
}

TEST(AttentionCore, SlidingWindowIgnoresKeysOutsideTheWindow) {
  torch::manual_seed(2);
  auto q = torch::randn({1, 2, 30, 8}), k = torch::randn({1, 2, 30, 8}), v = torch::randn({1, 2, 30, 8});
  const auto a = attention_core(q, k, v, 4, 8);
  k.narrow(2, 0, 10).normal_();  // keys 0..9 are outside every window of queries ≥ 13
  v.narrow(2, 0, 10).normal_();
  const auto b = attention_core(q, k, v, 4, 8);
  EXPECT_TRUE(at::equal(a.out.narrow(2, 13, 17), b.out.narrow(2, 13, 17)));
  EXPECT_FALSE(at::equal(a.out.narrow(2, 0, 10), b.out.narrow(2, 0, 10)));
}

TEST(GdnChunk, WyFormMatchesTokenByTokenRecurrenceAndHandsStateAcrossChunks) {
  torch::manual_seed(3);
  const std::int64_t B = 2, H = 3, C = 20, dk = 8, dv = 6;
  auto q = torch::nn::functional::normalize(torch::randn({B, H, C, dk}), torch::nn::functional::NormalizeFuncOptions().dim(-1)) / std::sqrt(8.0);
  auto k = torch::nn::functional::normalize(torch::randn({B, H, C, dk}), torch::nn::functional::NormalizeFuncOptions().dim(-1));
  auto v = torch::randn({B, H, C, dv});
  auto g = -torch::softplus(torch::randn({B, H, C}));
  auto beta = torch::sigmoid(torch::randn({B, H, C}));
  const auto s0 = torch::randn({B, H, dk, dv});

  auto s_ref = s0.clone();
  const auto o_ref = testing::reference_gdn_recurrent(q, k, v, g, beta, s_ref);
  auto s_whole = s0.clone();
  const auto o_whole = gdn_chunk(q, k, v, g, beta, s_whole);
  EXPECT_LE(rel_diff(o_whole, o_ref), kTol);
  EXPECT_LE(rel_diff(s_whole, s_ref), kTol);

  auto s_split = s0.clone();
  const auto o1 = gdn_chunk(q.narrow(2, 0, 7), k.narrow(2, 0, 7), v.narrow(2, 0, 7), g.narrow(2, 0, 7), beta.narrow(2, 0, 7), s_split);
  const auto o2 = gdn_chunk(q.narrow(2, 7, 13), k.narrow(2, 7, 13), v.narrow(2, 7, 13), g.narrow(2, 7, 13), beta.narrow(2, 7, 13), s_split);
  EXPECT_LE(rel_diff(torch::cat({o1, o2}, 2), o_ref), kTol);
  EXPECT_LE(rel_diff(s_split, s_ref), kTol);
}

TEST(GdnMixing, MatchesRecurrentReferenceForEverySequenceChunking) {
  const ModelSpec spec = load_model_spec("tiny-moe");
  ASSERT_EQ(spec.layer_kinds[0], LayerKind::kLinearAttention);
  auto w = layer_weights(spec, 0);
  torch::manual_seed(4);
  auto x = torch::randn({2, 23, spec.hidden}).requires_grad_(true);
  const auto ref = testing::reference_gdn_mixing(x, w.views, spec);
  const auto probe = torch::randn_like(ref);
  const auto g_ref = grads_of(ref, {x, w.flat}, probe);
  for (std::int64_t chunk : {1, 5, 8, 64}) {
    ModelOptions opt;
    opt.gdn_chunk_tokens = chunk;
    const auto got = gdn_mixing(x, w.views, spec, opt);
    EXPECT_LE(rel_diff(got, ref), kTol) << "chunk " << chunk;
    const auto g = grads_of(got, {x, w.flat}, probe);
    EXPECT_LE(rel_diff(g[0], g_ref[0]), kTol) << "input grad, chunk " << chunk;
    EXPECT_LE(rel_diff(g[1], g_ref[1]), kTol) << "weight grad, chunk " << chunk;
  }
}

// Gemma 4's feed-forward half (ffn_half: sandwich norms, scaled router) is held against transformers
// in tests/backend/hf_parity_test.cc.
TEST(MoeFfn, RoutedSharedAndDenseExpertsMatchDenseComputationForEachFamily) {
  for (const char* name : {"tiny-moe", "tiny-moe-mixtral", "tiny-moe-qwen"}) {
    const ModelSpec spec = load_model_spec(name);
    auto w = layer_weights(spec, 0);
    torch::manual_seed(5);
    auto x = torch::randn({2, 19, spec.hidden}).requires_grad_(true);
    const auto got = moe_ffn(x, w.views, spec);
    const auto ref = testing::reference_moe(x, w.views, spec);
    EXPECT_LE(rel_diff(got, ref), kTol) << name;
    const auto probe = torch::randn_like(ref);
    const auto g1 = grads_of(got, {x, w.flat}, probe);
    const auto g2 = grads_of(ref, {x, w.flat}, probe);
    EXPECT_LE(rel_diff(g1[0], g2[0]), kTol) << name;
    EXPECT_LE(rel_diff(g1[1], g2[1]), kTol) << name;
  }
}

TEST(Route, PicksTheLargestProbabilitiesAndRenormalizes) {
  const ModelSpec spec = load_model_spec("tiny-moe");
  torch::manual_seed(6);
  const auto x = torch::randn({11, spec.hidden});
  const auto router = torch::randn({spec.moe.experts, spec.hidden});
  const auto r = route(x, router, spec.moe);
  EXPECT_TRUE(torch::allclose(r.weights.sum(-1), torch::ones({11}), 1e-6, 1e-6));
  const auto probs = torch::softmax(torch::linear(x, router), -1);
  const auto kth = std::get<0>(probs.sort(-1, true)).select(1, spec.moe.top_k - 1);
  const auto chosen = probs.gather(1, r.expert_ids);
  EXPECT_TRUE((std::get<0>(chosen.min(1)) >= kth).all().item<bool>());
}

// DeepSeek-V3's router on one token with chosen scores: 8 experts in 4 groups of 2, the best 2
// groups, 3 experts. The bias moves the choice but not the weights.
TEST(Route, SigmoidRoutingChoosesWithinTheBestGroupsByBiasedScoresAndWeighsByTheScores) {
  MoeSpec moe;
  moe.experts = 8;
  moe.top_k = 3;
  moe.scoring = "sigmoid";
  moe.groups = 4;
  moe.topk_groups = 2;
  moe.norm_topk_prob = true;
  moe.routed_scaling = 2.5;
  const auto scores = torch::tensor({0.90, 0.05, 0.60, 0.55, 0.70, 0.10, 0.50, 0.48}, torch::kFloat);
  // Scores σ(x·Wᵀ) with W = I and x = logit(scores).
  const auto x = torch::log(scores / (1 - scores)).view({1, 8});
  const auto eye = torch::eye(8);
  const auto sorted_ids = [](const Routing& r) {
    const auto ids = std::get<0>(r.expert_ids.sort(-1)).flatten().contiguous();
    return std::vector<std::int64_t>(ids.data_ptr<std::int64_t>(), ids.data_ptr<std::int64_t>() + ids.numel());
  };
  // Groups' sums of their two best: 0.95, 1.15, 0.80, 0.98: groups 1 and 3, experts 2, 3, 6 (the
  // best score, expert 0's, is in a group left out).
  auto r = route(x, eye, moe);
  EXPECT_EQ(sorted_ids(r), (std::vector<std::int64_t>{2, 3, 6}));
  EXPECT_NEAR(r.weights.sum().item<double>(), 2.5, 1e-5);
  EXPECT_NEAR(r.weights.max().item<double>(), 2.5 * 0.60 / (0.60 + 0.55 + 0.50), 1e-5);
  // A bias of 0.6 on expert 1 lifts group 0 (1.55) first: experts 0, 1 (0.05 + 0.6), 2, expert 1
  // weighed by its unbiased score.
  const auto bias = torch::tensor({0.0, 0.6, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0}, torch::kFloat);
  r = route(x, eye, moe, bias);
  EXPECT_EQ(sorted_ids(r), (std::vector<std::int64_t>{0, 1, 2}));
  EXPECT_NEAR(r.weights.min().item<double>(), 2.5 * 0.05 / (0.90 + 0.05 + 0.60), 1e-5);
}

TEST(Rope, PartialRotationKeepsTheRestAndDependsOnlyOnRelativePosition) {
  torch::manual_seed(7);
  const auto x = torch::randn({1, 12, 2, 16});
  const auto r = apply_rope(x, 8, 10000.0);
  EXPECT_TRUE(at::equal(r.narrow(-1, 8, 8), x.narrow(-1, 8, 8)));
  EXPECT_FALSE(at::equal(r.narrow(-1, 0, 8).narrow(1, 1, 11), x.narrow(-1, 0, 8).narrow(1, 1, 11)));
  // Same vectors q, k at every position: q_i·k_j depends only on i − j.
  const auto q = torch::randn({16}), k = torch::randn({16});
  const auto rq = apply_rope(q.view({1, 1, 1, 16}).expand({1, 12, 1, 16}).contiguous(), 16, 10000.0).view({12, 16});
  const auto rk = apply_rope(k.view({1, 1, 1, 16}).expand({1, 12, 1, 16}).contiguous(), 16, 10000.0).view({12, 16});
  const double d1 = (rq[5] * rk[2]).sum().item<double>(), d2 = (rq[9] * rk[6]).sum().item<double>();
  EXPECT_NEAR(d1, d2, 1e-4);
}

// Gemma 4's "proportional" RoPE on global layers: of the head_dim/2 pairs (i, i + head_dim/2), the
// first ⌊0.25·head_dim/2⌋ rotate at θ^(−2i/head_dim) and the rest stay as they are; sliding layers
// rotate the whole head.
TEST(Rope, Gemma4ProportionalRotatesTheFirstPairsOfEachHalfAndKeepsTheRest) {
  const ModelSpec spec = load_model_spec("tiny-moe-gemma");
  const std::int64_t d = spec.full_attention.head_dim;  // 32: 4 rotating pairs of 16
  torch::manual_seed(8);
  const auto x = torch::randn({1, 10, 2, d});
  const auto r = attention_rope(x, spec, LayerKind::kFullAttention);
  const std::int64_t angles = d / 8;
  for (const std::int64_t half : {std::int64_t{0}, d / 2}) {
    EXPECT_TRUE(at::equal(r.narrow(-1, half + angles, d / 2 - angles), x.narrow(-1, half + angles, d / 2 - angles)));
  }
  // Pair 1 at position 3 turns by 3·θ^(−2/d).
  const double angle = 3 * std::pow(spec.full_attention.rope_theta, -2.0 / static_cast<double>(d));
  const double a = x[0][3][0][1].item<double>(), b = x[0][3][0][1 + d / 2].item<double>();
  EXPECT_NEAR(r[0][3][0][1].item<double>(), a * std::cos(angle) - b * std::sin(angle), 1e-5);
  EXPECT_NEAR(r[0][3][0][1 + d / 2].item<double>(), b * std::cos(angle) + a * std::sin(angle), 1e-5);
  const auto s = attention_rope(x.narrow(-1, 0, spec.sliding_attention.head_dim).contiguous(), spec,
                                LayerKind::kSlidingAttention);
  EXPECT_TRUE(at::allclose(s, apply_rope(x.narrow(-1, 0, spec.sliding_attention.head_dim).contiguous(),
                                         spec.sliding_attention.head_dim, spec.sliding_attention.rope_theta)));
}

TEST(AttentionMixing, ReturnsLsePerQueryHeadAndHandlesKEqualsVAndOutputGate) {
  for (const char* name : {"tiny-moe-gemma", "tiny-moe"}) {
    const ModelSpec spec = load_model_spec(name);
    for (int l = 0; l < spec.layers; ++l) {
      if (spec.layer_kinds[static_cast<std::size_t>(l)] == LayerKind::kLinearAttention) continue;
      auto w = layer_weights(spec, l);
      const auto x = torch::randn({2, 21, spec.hidden});
      at::Tensor lse;
      const auto y = attention_mixing(x, w.views, spec, spec.layer_kinds[static_cast<std::size_t>(l)], {}, &lse);
      EXPECT_EQ(y.sizes(), x.sizes());
      EXPECT_EQ(lse.sizes(), (std::vector<std::int64_t>{2, spec.attention(spec.layer_kinds[static_cast<std::size_t>(l)]).heads, 21}));
      EXPECT_TRUE(torch::isfinite(y).all().item<bool>());
    }
  }
}

// The token-chunked vocabulary projection and loss against the full-logits cross-entropy: the loss
// and the gradients of the hidden states and the head, with and without a softcap, for chunks that
// do not divide the tokens and for one chunk holding them all.
TEST(ChunkedCrossEntropy, EqualsFullLogitsCrossEntropyWithAndWithoutSoftcap) {
  torch::manual_seed(5);
  const auto x = torch::randn({20, 16}, torch::kDouble).to(at::kFloat);
  const auto head = (torch::randn({50, 16}, torch::kDouble) * 0.5).to(at::kFloat);
  const auto targets = torch::randint(0, 50, {20}, torch::kLong);
  for (const double cap : {0.0, 3.0}) {
    auto xr = x.clone().requires_grad_(true), hr = head.clone().requires_grad_(true);
    auto logits = at::linear(xr, hr);
    if (cap > 0) logits = at::tanh(logits / cap) * cap;
    const auto ref = at::cross_entropy_loss(logits, targets);
    ref.backward();
    for (const std::int64_t chunk : {7, 20, 1000}) {
      auto xc = x.clone().requires_grad_(true), hc = head.clone().requires_grad_(true);
      const auto got = chunked_cross_entropy(xc, hc, targets, cap, chunk);
      got.backward();
      EXPECT_NEAR(got.item<double>(), ref.item<double>(), 1e-6 * ref.item<double>()) << "cap " << cap << " chunk " << chunk;
      EXPECT_LE(rel_diff(xc.grad(), xr.grad()), 1e-5) << "cap " << cap << " chunk " << chunk;
      EXPECT_LE(rel_diff(hc.grad(), hr.grad()), 1e-5) << "cap " << cap << " chunk " << chunk;
    }
  }
}

TEST(ModelLoss, EveryFamilyStartsNearUniformAndGivesEveryWeightAGradient) {
  for (const char* name : {"tiny-moe", "tiny-moe-gemma", "tiny-moe-mixtral", "tiny-moe-qwen"}) {
    const ModelSpec spec = load_model_spec(name);
    HostState st(spec);
    st.init_from_seed(3);
    std::vector<at::Tensor> flats;
    std::vector<BlockWeights> weights;
    for (int b = 0; b < st.blocks(); ++b) flats.push_back(st.master(b).clone().requires_grad_(true));
    for (int b = 0; b < st.blocks(); ++b) weights.push_back(block_views(st.layout().blocks[static_cast<std::size_t>(b)], flats[static_cast<std::size_t>(b)]));
    const auto tokens = torch::randint(0, 256, {2, 20}, torch::kLong);
    const auto targets = torch::randint(0, 256, {2, 20}, torch::kLong);
    const auto loss = model_loss(tokens, targets, weights, spec, {});
    EXPECT_NEAR(loss.item<double>(), std::log(256.0), 0.5) << name;
    loss.backward();
    for (int b = 0; b < st.blocks(); ++b) {
      for (const auto& e : st.layout().blocks[static_cast<std::size_t>(b)].entries) {
        const auto g = flats[static_cast<std::size_t>(b)].grad().narrow(0, e.offset, e.numel());
        if (e.name == "layer_scalar") {  // Gemma 4's layer scalar is a buffer in transformers: no gradient
          EXPECT_EQ(g.abs().sum().item<double>(), 0.0) << name << " " << e.name;
          continue;
        }
        EXPECT_GT(g.abs().sum().item<double>(), 0.0) << name << " " << e.name;
      }
    }
  }
}

}  // namespace
}  // namespace oom::backend
