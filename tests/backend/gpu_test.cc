// GPU exactness of the backend (scripts/gpu-check.sh, stage `exactness`): the same plans through the
// graph runner on a CUDA device against the same plans on the CPU, from the same weights and batches. Compared are the
// losses, the gradient norms and every block's gradient of a step (AdamW would hide a uniformly
// scaled gradient), and the parameters after steps. TF32 is off, so the differences are float
// summation order: 1e-4 relative on gradients and norms, 1e-3 on parameters after Adam.
//
// Not a CTest suite: CI machines have no GPU. The program fails at start, with one line saying why,
// when LibTorch sees no CUDA device, so a GPU check never passes by skipping.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ATen/cuda/CUDAContext.h>

#include "backend/optim/adamw.h"
#include "backend/runtime/runtime.h"
#include "backend/runtime/state.h"
#include "backend/train/checkpoint.h"
#include "backend/train/plan_runtime.h"
#include "backend/train/train.h"
#include "costmodel/input_error.h"
#include "tests/backend/reference_ops.h"

namespace oom::backend {
namespace {

using testing::rel_diff;

constexpr double kGradTol = 1e-4;
constexpr double kParamTol = 1e-3;

const at::Device kGpu(at::kCUDA, 0);

TrainerConfig config(double clip) {
  TrainerConfig cfg;
  cfg.adam.lr = 3e-3;
  cfg.max_grad_norm = clip;
  cfg.model.gdn_chunk_tokens = 8;
  cfg.model.attention_query_block = 8;
  return cfg;
}

std::pair<at::Tensor, at::Tensor> batch(int seed) {
  torch::manual_seed(seed);
  return {torch::randint(0, 256, {4, 32}, torch::kLong), torch::randint(0, 256, {4, 32}, torch::kLong)};
}

// Runs `steps` steps of `plan` (a function of the model) on CPU and on the GPU; compares as
// described above.
template <typename MakePlan>
void expect_gpu_matches_cpu(const char* model, const TrainerConfig& cfg, MakePlan make_plan, int steps, const char* what) {
  const ModelSpec spec = load_model_spec(model);
  HostState cpu_state(spec), gpu_state(spec);
  cpu_state.init_from_seed(61);
  gpu_state.init_from_seed(61);
  const Plan plan = make_plan(spec);
  auto cpu = std::make_unique<PlanTrainer>(cpu_state, cfg, plan, at::Device(at::kCPU));
  auto gpu = std::make_unique<PlanTrainer>(gpu_state, cfg, plan, kGpu);
  // The runner's gradients go through its own host buffers: read what it sends.
  std::vector<at::Tensor> cpu_sent, gpu_sent;
  cpu->capture_gradients(&cpu_sent);
  gpu->capture_gradients(&gpu_sent);
  for (int s = 0; s < steps; ++s) {
    const auto [tokens, targets] = batch(62 + s);
    const auto a = cpu->step(tokens, targets);
    const auto b = gpu->step(tokens, targets);
    EXPECT_NEAR(b.loss, a.loss, kGradTol * std::abs(a.loss)) << what << " " << model << " step " << s;
    EXPECT_NEAR(b.grad_norm, a.grad_norm, kGradTol * a.grad_norm) << what << " " << model << " step " << s;
    if (s == 0) {
      for (int blk = 0; blk < cpu_state.blocks(); ++blk) {
        const at::Tensor g = gpu_sent.at(static_cast<std::size_t>(blk));
        const at::Tensor c = cpu_sent.at(static_cast<std::size_t>(blk));
        EXPECT_LE(rel_diff(g, c), kGradTol) << what << " " << model << " gradient of block " << blk;
      }
      cpu->capture_gradients(nullptr);
      gpu->capture_gradients(nullptr);
    }
  }
  for (int blk = 0; blk < cpu_state.blocks(); ++blk) {
    EXPECT_LE(rel_diff(gpu_state.master(blk), cpu_state.master(blk)), kParamTol) << what << " " << model << " block " << blk;
  }
}

// The plan `oom train` runs without --plan (Base Local; its hardware only names GPUs per node).
Plan default_plan(const ModelSpec& spec) { return default_run_plan(spec, 4, 32, 1, "local-cpu"); }

TEST(Gpu, DefaultPlanMatchesTheCpu) {
  for (const char* model : {"tiny-moe", "tiny-moe-gemma", "tiny-moe-mixtral", "tiny-moe-qwen"}) {
    expect_gpu_matches_cpu(model, config(1e9), default_plan, 3, "default plan");
  }
}

// Gradient accumulation on the GPU (`oom train --accumulate 2`): the default plan's two sub-batches
// summed into the FP32 host buffers.
TEST(Gpu, DefaultPlanAccumulatingSubBatchesMatchesTheCpu) {
  for (double clip : {1e9, 0.0}) {
    expect_gpu_matches_cpu("tiny-moe", config(clip), [](const ModelSpec& spec) {
      Plan p = default_plan(spec);
      p.split.sub_batch_seqs = 2;
      return p;
    }, 2, "default plan, 2 sub-batches");
  }
}

// `oom train` on a GPU: BF16 working weights unless --fp32 (recorded in the checkpoint), and an
// MFU on every step when configs/hardware knows the GPU by its name.
TEST(Gpu, TrainDefaultsToBf16WorkingWeightsAndReportsMfu) {
  const auto dir = std::filesystem::temp_directory_path() / ("oom-gpu-train-" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  TrainOptions o;
  o.steps = 2;
  o.seq = 32;
  o.batch = 2;
  o.device = "cuda";
  o.checkpoint_dir = dir.string();
  std::vector<double> mfu;
  train(o, [&](const StepReport& r) { mfu.push_back(r.mfu); });
  HostState state(load_model_spec(o.model));
  EXPECT_EQ(load_checkpoint(dir.string(), state)["bf16"], true);
  const std::string name = at::cuda::getDeviceProperties(0)->name;
  std::cout << "GPU \"" << name << "\": peak " << device_peak_flops(0, name) / 1e12 << " TFLOP/s, MFU " << mfu.back() << "\n";
  if (device_peak_flops(0, name) > 0) EXPECT_GT(mfu.back(), 0.0);
  o.fp32 = true;
  o.resume_dir = dir.string();
  EXPECT_THROW(train(o), InputError);  // the checkpoint ran BF16: run.bf16 differs
  std::filesystem::remove_all(dir);
}

TEST(Gpu, PlanTrainerWithEverySplitMatchesTheCpu) {
  Plan plan;
  plan.path = ExpertPath::kLocal;
  plan.split.attention_head_group = 1;
  plan.split.gdn_chunk_tokens = 16;
  plan.split.moe_chunk_tokens = 32;
  plan.split.sub_batch_seqs = 2;
  plan.keep_attention_results = true;
  for (const char* model : {"tiny-moe", "tiny-moe-qwen"}) {
    expect_gpu_matches_cpu(model, config(1e9), [&](const ModelSpec&) { return plan; }, 2, "plan");
  }
}

// The device AdamW on CUDA tensors against the CPU vector kernel, over steps, with a gradient scale.
TEST(Gpu, DeviceAdamWMatchesTheCpuKernel) {
  torch::manual_seed(63);
  AdamWConfig c{1e-2, 0.9, 0.999, 1e-8, 0.05};
  const std::int64_t n = (1 << 20) + 7;
  auto p = torch::randn({n}), m = torch::zeros({n}), v = torch::zeros({n});
  auto pg = p.to(kGpu), mg = m.to(kGpu), vg = v.to(kGpu);
  for (int s = 1; s <= 4; ++s) {
    const auto g = torch::randn({n});
    const auto gg = g.to(kGpu);
    cpu_adamw_step(p, g, m, v, c, s, 0.5);
    device_adamw_step(pg, gg, mg, vg, c, s, 0.5);
  }
  EXPECT_LE(rel_diff(pg.cpu(), p), 1e-6);
  EXPECT_LE(rel_diff(vg.cpu(), v), 1e-6);
}

// An EP plan on one rank on a GPU: the masters and the streamed expert shard updated on the host,
// the resident shard (decoder 0's; its gradient stays on the device) by the device AdamW.
TEST(Gpu, EpPlanOnOneRankWithAResidentShardMatchesTheCpu) {
  Plan plan;
  plan.path = ExpertPath::kEp;
  plan.resident_layers = {0};
  plan.cpu_grad_slots = 1;
  expect_gpu_matches_cpu("tiny-moe", config(1e9), [&](const ModelSpec&) { return plan; }, 2, "EP plan");
}

}  // namespace
}  // namespace oom::backend

int main(int argc, char** argv) {
  if (!torch::cuda::is_available() || torch::cuda::device_count() < 1) {
    std::cerr << "oom_gpu_tests: no CUDA device is visible to LibTorch; these checks need a GPU\n";
    return 1;
  }
  at::globalContext().setAllowTF32CuBLAS(false);
  at::globalContext().setAllowTF32CuDNN(false);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
