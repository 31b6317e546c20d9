// What a run without --plan executes: the default plan (backend/train/plan_runtime.h default_run_plan,
// the Base Local preset) through the graph runner matches the plain in-memory trainer (autograd
// over the whole model + torch::optim::AdamW) for every model family's layer kinds: the first
// step's loss and gradients within 1e-5 relative, later steps within the bounds measured on two
// instruction sets (tests/backend/drift.h). Also gradient accumulation as the plan's sub-batches,
// BF16 working weights, the update queue and the clipping rule (backend/runtime/runtime.h).
#include "backend/runtime/runtime.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <torch/torch.h>

#include "backend/data/data.h"
#include "backend/model/model.h"
#include "backend/runtime/job_queue.h"
#include "backend/train/plain_trainer.h"
#include "backend/train/plan_runtime.h"
#include "costmodel/input_error.h"
#include "tests/backend/drift.h"
#include "tests/backend/reference_ops.h"

namespace oom::backend {
namespace {

using testing::record_drift;
using testing::rel_diff;

constexpr double kTol = 1e-5;

struct Case {
  const char* model;
  double max_grad_norm;
};

// The plan `oom train` runs without --plan for a batch × seq step on this CPU.
Plan default_plan(const ModelSpec& spec, std::int64_t batch, std::int64_t seq) {
  return default_run_plan(spec, batch, seq, 1, "local-cpu");
}

void expect_default_plan_matches_plain(const Case& c, int steps) {
  const ModelSpec spec = load_model_spec(c.model);
  HostState state(spec);
  state.init_from_seed(21);
  TrainerConfig cfg;
  cfg.adam.lr = 3e-3;
  cfg.max_grad_norm = c.max_grad_norm;
  cfg.model.gdn_chunk_tokens = 8;       // several GDN chunks per sequence: state and conv hand-off
  cfg.model.attention_query_block = 8;  // sliding windows skip key blocks
  PlainTrainer plain(state, cfg);
  PlanTrainer runner(state, cfg, default_plan(spec, 2, 24));
  torch::manual_seed(22);
  for (int s = 0; s < steps; ++s) {
    const auto tokens = torch::randint(0, 256, {2, 24}, torch::kLong);
    const auto targets = torch::randint(0, 256, {2, 24}, torch::kLong);
    const auto a = plain.step(tokens, targets);
    const auto b = runner.step(tokens, targets);
    // After the first update: kLossAfterUpdateTol (1e-3), the bound measured over instruction sets
    // for two exact implementations (tests/backend/drift.h).
    const double tol = s == 0 ? kTol : testing::kLossAfterUpdateTol;
    EXPECT_LE(record_drift(fmt::format("{} loss step {}", c.model, s), b.loss, a.loss), tol) << c.model << " step " << s;
    if (c.max_grad_norm > 0) {
      EXPECT_LE(record_drift(fmt::format("{} grad-norm step {}", c.model, s), b.grad_norm, a.grad_norm), tol)
          << c.model << " step " << s;
    }
  }
  EXPECT_EQ(state.step, steps);
  // Parameters after the steps: AdamW moves a parameter whose gradient is at rounding level by a
  // fraction of lr whichever way the rounding went, so (as in tests/backend/plan_runtime_test.cc)
  // at most one parameter in 10,000 of a block (and at least one) may be more than lr/2 from the
  // plain trainer's, where a missed, doubled or wrong update moves a whole tensor by ~lr or more.
  // The blocks' relative differences are recorded for scripts/measure-drift.sh.
  const auto ref = plain.flat_params();
  double worst = 0;
  for (int b = 0; b < state.blocks(); ++b) {
    const at::Tensor& want = ref[static_cast<std::size_t>(b)];
    worst = std::max(worst, rel_diff(state.master(b), want));
    const auto far = ((state.master(b) - want).abs() > 0.5 * cfg.adam.lr).sum().item<std::int64_t>();
    EXPECT_LE(far, std::max<std::int64_t>(1, want.numel() / 10000))
        << c.model << " block " << b << ": " << far << " of " << want.numel() << " parameters apart by more than lr/2";
    EXPECT_TRUE(at::equal(state.working(b), state.master(b))) << "working copy republished, block " << b;
  }
  record_drift(fmt::format("{} params", c.model), worst);
}

// Gradient scale: AdamW normalizes each element by its own history, so a uniformly scaled gradient
// leaves parameters after Adam almost unchanged. The default plan's host gradients of one step
// are therefore compared directly with autograd over the whole model (same weights, same batch):
// every block within 1e-5 relative, and the clipping norm too.
TEST(DefaultPlan, GradientsOfAStepEqualAutogradOverTheWholeModel) {
  for (const char* model : {"tiny-moe", "tiny-moe-mixtral"}) {
    const ModelSpec spec = load_model_spec(model);
    HostState state(spec);
    state.init_from_seed(41);
    TrainerConfig cfg;
    cfg.adam.lr = 3e-3;
    cfg.model.gdn_chunk_tokens = 8;
    cfg.model.attention_query_block = 8;
    torch::manual_seed(42);
    const auto tokens = torch::randint(0, 256, {2, 24}, torch::kLong);
    const auto targets = torch::randint(0, 256, {2, 24}, torch::kLong);
    const auto ref = testing::reference_gradients(state, tokens, targets, cfg.model);
    cfg.max_grad_norm = 1e9;  // clipping on (the norm is computed) but never binding
    PlanTrainer runner(state, cfg, default_plan(spec, 2, 24));
    std::vector<at::Tensor> sent;
    runner.capture_gradients(&sent);
    const auto got = runner.step(tokens, targets);
    EXPECT_NEAR(got.loss, ref.loss, kTol * std::abs(ref.loss)) << model;
    EXPECT_NEAR(got.grad_norm, ref.norm, kTol * ref.norm) << model;
    ASSERT_EQ(sent.size(), static_cast<std::size_t>(state.blocks()));
    for (int b = 0; b < state.blocks(); ++b) {
      EXPECT_LE(rel_diff(sent[static_cast<std::size_t>(b)], ref.blocks[static_cast<std::size_t>(b)]), kTol)
          << model << " gradient of block " << b;
    }
  }
}

// The update queue runs jobs in submission order on its own thread; a job's exception reaches the
// next wait once, and the jobs after it still run.
TEST(JobQueue, RunsJobsInOrderAndRethrowsTheFirstErrorOnce) {
  JobQueue q;
  std::vector<int> ran;
  const std::thread::id caller = std::this_thread::get_id();
  bool other_thread = true;
  EXPECT_EQ(q.submit([&] { ran.push_back(1); other_thread = std::this_thread::get_id() != caller; }), 1);
  EXPECT_EQ(q.submit([&] { ran.push_back(2); throw std::runtime_error("job 2"); }), 2);
  EXPECT_EQ(q.submit([&] { ran.push_back(3); }), 3);
  EXPECT_THROW(q.wait_all(), std::runtime_error);
  EXPECT_EQ(ran, (std::vector<int>{1, 2, 3}));
  EXPECT_TRUE(other_thread);
  EXPECT_NO_THROW(q.wait_all());
}

TEST(DefaultPlan, MatchesPlainTrainerOnGdnSlidingFullAttentionSharedAndDenseExperts) {
  expect_default_plan_matches_plain({"tiny-moe", 0.0}, 3);
}

TEST(DefaultPlan, MatchesPlainTrainerWithGradientClipping) {
  expect_default_plan_matches_plain({"tiny-moe", 0.05}, 3);
}

// Gemma 4's sandwich norms make a step's gradients ~10× more sensitive to the order of sums than
// the other families' (two exact computations differ by 3–6e-6 relative at the first step against
// 2e-7 for tiny-moe: the size of transformers' own FP32 error on this architecture).
TEST(DefaultPlan, MatchesPlainTrainerOnGemmaTiedEmbeddingsKEqualsVAndSoftcap) {
  expect_default_plan_matches_plain({"tiny-moe-gemma", 1.0}, 2);
}

TEST(DefaultPlan, MatchesPlainTrainerOnMixtralAndQwenHybrid) {
  expect_default_plan_matches_plain({"tiny-moe-mixtral", 0.0}, 2);
  expect_default_plan_matches_plain({"tiny-moe-qwen", 0.0}, 2);
}

TEST(DefaultPlan, Bf16WorkingWeightsTrainAndKeepFp32Masters) {
  const ModelSpec spec = load_model_spec("tiny-moe");
  StateOptions so;
  so.precision = WorkingPrecision::kBFloat16;
  HostState state(spec, so);
  state.init_from_seed(5);
  EXPECT_EQ(state.working(1).scalar_type(), at::kBFloat16);
  EXPECT_EQ(state.master(1).scalar_type(), at::kFloat);
  TrainerConfig cfg;
  cfg.adam.lr = 1e-2;
  PlanTrainer trainer(state, cfg, default_plan(spec, 2, 16));
  ByteCorpus data(std::string(4000, 'a') + std::string(4000, 'b'), 16, "test");
  data.seed(1);
  double first = 0, last = 0;
  for (int s = 0; s < 8; ++s) {
    const auto b = data.next(2);
    const double loss = trainer.step(b.tokens, b.targets).loss;
    if (s == 0) first = loss;
    last = loss;
  }
  EXPECT_LT(last, first * 0.7);  // learns the two-letter text
  EXPECT_TRUE(at::equal(state.working(1), state.master(1).to(at::kBFloat16)));
}

// Gradient accumulation is exact: K = 2 micro-batches of B sequences per step (the default plan
// with sub-batches of B, as `oom train --accumulate 2` runs it) give the loss, the gradient norm
// and every block's summed gradient of K = 1 at 2B (the same sequences) within 1e-5 relative, for
// the graph runner and the plain trainer, with and without clipping; the learning rate
// set before each step is the one AdamW uses. The parameters after 2 steps agree within 1e-5 with
// AdamW's eps at 1e-6; at the default 1e-8 AdamW's m/√v turns rounding-level differences of
// nearly cancelling gradient elements (one GEMM over 2B sequences against two over B) into a
// fraction of an update on those elements: the plain trainer's own autograd shows the same
// (measured ≤ 7.8e-5 relative on tiny-moe-gemma's blocks), so that case is held to 1e-4. The
// figures below were measured with the hand-written streamed schedule this path replaced; the
// graph runner holds the same bounds, and record_drift() logs its own for scripts/measure-drift.sh.
void expect_accumulation_matches_one_batch(const char* model, double max_grad_norm, double eps, double param_tol,
                                           int steps = 2) {
  const ModelSpec spec = load_model_spec(model);
  HostState whole_state(spec), accum_state(spec);
  whole_state.init_from_seed(31);
  accum_state.init_from_seed(31);
  TrainerConfig cfg;
  cfg.adam.lr = 3e-3;
  cfg.adam.eps = eps;
  cfg.max_grad_norm = max_grad_norm;
  cfg.model.gdn_chunk_tokens = 8;
  TrainerConfig acc = cfg;
  acc.accumulate = 2;
  Plan sub_batches = default_plan(spec, 4, 16);
  sub_batches.split.sub_batch_seqs = 2;
  PlanTrainer whole(whole_state, cfg, default_plan(spec, 4, 16)), accumulated(accum_state, cfg, sub_batches);
  std::vector<at::Tensor> whole_grads, accum_grads;
  whole.capture_gradients(&whole_grads);
  accumulated.capture_gradients(&accum_grads);
  PlainTrainer plain_whole(whole_state, cfg), plain_accumulated(whole_state, acc);
  torch::manual_seed(32);
  for (int s = 0; s < steps; ++s) {
    const auto tokens = torch::randint(0, 256, {4, 16}, torch::kLong);
    const auto targets = torch::randint(0, 256, {4, 16}, torch::kLong);
    const double lr = s == 0 ? 3e-3 : 1e-3;
    whole.set_lr(lr);
    accumulated.set_lr(lr);
    plain_whole.set_lr(lr);
    plain_accumulated.set_lr(lr);
    const auto a = whole.step(tokens, targets);
    const auto b = accumulated.step(tokens, targets);
    const auto c = plain_whole.step(tokens, targets);
    const auto d = plain_accumulated.step(tokens, targets);
    // After the first update (tests/backend/drift.h): measured at most 8.6e-8 relative on AVX2 and
    // with the scalar kernels (AMD EPYC); held to kLossAfterUpdateTol (1e-3).
    const double tol = s == 0 ? kTol : testing::kLossAfterUpdateTol;
    EXPECT_LE(record_drift(fmt::format("{} runner-k2-vs-k1 loss step {}", model, s), b.loss, a.loss), tol) << model << " step " << s;
    EXPECT_LE(record_drift(fmt::format("{} plain-k2-vs-k1 loss step {}", model, s), d.loss, c.loss), tol) << model << " step " << s;
    EXPECT_LE(record_drift(fmt::format("{} runner-vs-plain loss step {}", model, s), a.loss, c.loss), tol) << model << " step " << s;
    if (max_grad_norm > 0) {
      EXPECT_LE(record_drift(fmt::format("{} runner-k2-vs-k1 grad-norm step {}", model, s), b.grad_norm, a.grad_norm), tol)
          << model << " step " << s;
      EXPECT_LE(record_drift(fmt::format("{} plain-k2-vs-k1 grad-norm step {}", model, s), d.grad_norm, c.grad_norm), tol)
          << model << " step " << s;
    }
    // The step's gradients as sent to the host: the sums against the one-batch gradients, on the
    // same weights in the first step (1e-5) and on weights one rounding-level update apart in the
    // second (measured 3.8e-5 on AVX2, 1.6e-5 with the scalar kernels, AMD EPYC: held to 2e-4).
    double worst_slot = 0;
    for (int blk = 0; blk < accum_state.blocks(); ++blk) {
      const double d = rel_diff(accum_grads[static_cast<std::size_t>(blk)], whole_grads[static_cast<std::size_t>(blk)]);
      worst_slot = std::max(worst_slot, d);
      EXPECT_LE(d, s == 0 ? kTol : 2e-4) << model << " step " << s << " block " << blk;
    }
    record_drift(fmt::format("{} grad-slots step {}", model, s), worst_slot);
  }
  const auto ref = plain_whole.flat_params(), ref_acc = plain_accumulated.flat_params();
  double worst[3] = {0, 0, 0};
  for (int b = 0; b < accum_state.blocks(); ++b) {
    const double d[3] = {rel_diff(accum_state.master(b), whole_state.master(b)),
                         rel_diff(ref_acc[static_cast<std::size_t>(b)], ref[static_cast<std::size_t>(b)]),
                         rel_diff(whole_state.master(b), ref[static_cast<std::size_t>(b)])};
    EXPECT_LE(d[0], param_tol) << model << " block " << b;
    EXPECT_LE(d[1], param_tol) << model << " block " << b;
    EXPECT_LE(d[2], steps == 1 ? param_tol : kTol) << model << " block " << b;
    for (int i = 0; i < 3; ++i) worst[i] = std::max(worst[i], d[i]);
  }
  record_drift(fmt::format("{} runner-k2-vs-k1 params", model), worst[0]);
  record_drift(fmt::format("{} plain-k2-vs-k1 params", model), worst[1]);
  record_drift(fmt::format("{} runner-vs-plain params", model), worst[2]);
}

TEST(GradientAccumulation, TwoMicroBatchesEqualOneBatchOfTwiceTheSize) {
  // tiny-moe over two steps: the second step's update is taken from gradients on weights one
  // rounding-level update apart (held to 2e-4 above), so the parameters after it are held to 1e-4
  // (measured 1.02e-5 on AVX2, 4.4e-6 with the scalar kernels, AMD EPYC; tests/backend/drift.h).
  expect_accumulation_matches_one_batch("tiny-moe", 0.0, 1e-6, 1e-4);
  // Gemma 4 (with clipping): the first step's losses, norms and summed gradients within 1e-5 as
  // above; its one-step parameters carry AdamW's amplification of the first step's 3–6e-6 gradient
  // differences (see MatchesPlainTrainerOnGemma...): measured 5.0e-4 on AVX2 and 2.1e-4 with the
  // scalar kernels, held to 5e-3, so the second step is not compared.
  expect_accumulation_matches_one_batch("tiny-moe-gemma", 1.0, 1e-8, 5e-3, /*steps=*/1);
}

TEST(GradientAccumulation, ABatchThatDoesNotSplitIsAnInputError) {
  const ModelSpec spec = load_model_spec("tiny-moe");
  HostState state(spec);
  state.init_from_seed(1);
  TrainerConfig cfg;
  cfg.accumulate = 3;
  const auto tokens = torch::zeros({4, 8}, torch::kLong);
  Plan thirds = default_plan(spec, 4, 8);
  thirds.split.sub_batch_seqs = 3;
  EXPECT_THROW(check_plan_for_run(thirds, spec, 4, 8, 1, "plan"), InputError);
  PlainTrainer plain(state, cfg);
  EXPECT_THROW(plain.step(tokens, tokens), InputError);
  EXPECT_EQ(state.step, 0);
}

TEST(ClipCoefficient, FollowsTorchClipGradNorm) {
  EXPECT_DOUBLE_EQ(clip_coefficient(0.5, 1.0), 1.0);
  EXPECT_NEAR(clip_coefficient(4.0, 1.0), 0.25, 1e-6);
}

}  // namespace
}  // namespace oom::backend
