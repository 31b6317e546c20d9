// Issue-level check of FLAT's bounded peaks on the CPU backend (backend/README.md "Device memory by
// use"): a CPU stands in for a GPU (backend/device_memory.h), BF16 working weights as the memory
// model assumes, and each allocation is counted under the memory model's use. For each schedule the
// peak it bounds — the vocabulary's under logits blocks and under Ring-DTP over two ranks, the
// boundaries' under SCO, the optimizer's under OffloadStreamAdamW's buckets — is measured over two
// steps and set beside the memory model's prediction for the same plan and workload (the step's
// graph, the analytic schedule): within 10 %. The dispatch peak (PipelinedLLEP) is measured and
// printed beside its prediction; the executor's MoE holds more than the model's fused kernels there,
// as it does for the mixing activations (backend/README.md), so it is not held to 10 %.
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "backend/device_memory.h"
#include "backend/dist/rank_train.h"
#include "backend/plan_runtime.h"
#include "backend/state.h"
#include "planner/calibration/calibration.h"
#include "planner/engine/analytic_evaluator.h"
#include "planner/engine/peak_composition.h"
#include "planner/plan/plan.h"
#include "planner/search/plan_pricing.h"

namespace oom::backend {
namespace {

namespace fs = std::filesystem;
using UsePeaks = std::array<Bytes, kMemoryUses>;

constexpr double kTolerance = 0.10;
constexpr std::int64_t kBatch = 8, kSeq = 64;

double to_mib(Bytes b) { return static_cast<double>(b) / static_cast<double>(kMiB); }
Bytes of(const UsePeaks& p, MemoryUse u) { return p[static_cast<std::size_t>(u)]; }

WorkloadContext workload(const std::string& model, int gpus, std::int64_t batch = kBatch) {
  Workload w;
  w.model = model;
  w.hardware = "h100-sxm-node";
  w.gpus = gpus;
  w.global_batch = batch;
  w.seq_len = kSeq;
  return resolve_workload(w, "test workload");
}

// The memory model's own peak of each use for `plan`: the step's graph at the analytic schedule.
UsePeaks predicted(const Plan& plan, const WorkloadContext& ctx) {
  validate_plan(plan, ctx.model, ctx.workload, "test plan");
  const PlanPricer pricer(ctx, load_calibration_for(ctx.hardware));
  const StepGraph g = pricer.lower_plan(plan);
  std::vector<Seconds> d(g.stages.size());
  for (const Stage& s : g.stages) d[static_cast<std::size_t>(s.id)] = pricer.durations().duration_s(s, g);
  return use_peaks(g, analytic_times(g, d));
}

// Each use's own peak over two BF16 steps of `plan` in this process (one rank).
UsePeaks measured(const Plan& plan, const WorkloadContext& ctx) {
  device_memory::Emulation on(true);
  HostState state(ctx.model, {WorkingPrecision::kBFloat16, {}});
  state.init_from_seed(6);
  PlanTrainer t(state, TrainerConfig{}, plan);
  torch::manual_seed(10);
  UsePeaks most{};
  for (int s = 0; s < 2; ++s) {
    const auto tokens = torch::randint(0, 256, {ctx.workload.global_batch, kSeq}, torch::kLong);
    t.step(tokens, tokens.roll(1, 1));
    const UsePeaks u = t.last_use_peaks();
    for (std::size_t i = 0; i < u.size(); ++i) most[i] = std::max(most[i], u[i]);
  }
  return most;
}

// The same over `ranks` rank processes (the most of each use on any rank).
UsePeaks measured_over_ranks(const Plan& plan, const WorkloadContext& ctx, int ranks, const std::string& tag) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("oom-flat-peaks-{}-{}", tag, getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  TrainOptions o;
  o.model = ctx.model.name;
  o.steps = 2;
  o.seq = kSeq;
  o.batch = static_cast<int>(ctx.workload.global_batch);
  o.seed = 6;
  o.bf16 = true;
  o.device_memory = true;
  o.plan = (dir / "plan.json").string();
  std::ofstream(o.plan) << plan_to_json(plan).dump(2);
  dist::RanksOptions r;
  r.ranks = ranks;
  dist::apply_ep_plan(o, r);
  r.worker_program = OOM_BINARY;
  r.timeout_s = 60;
  r.deadline_s = 180;
  const dist::RanksResult res = dist::train_ranks(o, r);
  fs::remove_all(dir);
  UsePeaks out{};
  EXPECT_EQ(res.train.device_use_peak_bytes.size(), out.size());
  for (std::size_t i = 0; i < out.size() && i < res.train.device_use_peak_bytes.size(); ++i) out[i] = res.train.device_use_peak_bytes[i];
  return out;
}

// Prints the measured and predicted peak of `use` and returns measured / predicted.
double ratio(const UsePeaks& m, const UsePeaks& p, MemoryUse use, const std::string& where) {
  const double r = static_cast<double>(of(m, use)) / static_cast<double>(std::max<Bytes>(1, of(p, use)));
  std::printf("%-44s %-10s measured %8.4f MiB  predicted %8.4f MiB  (%.3fx)\n", where.c_str(),
              std::string(memory_use_name(use)).c_str(), to_mib(of(m, use)), to_mib(of(p, use)), r);
  return r;
}

void expect_within(const UsePeaks& m, const UsePeaks& p, MemoryUse use, const std::string& where) {
  EXPECT_GT(of(p, use), 0) << where;
  EXPECT_NEAR(ratio(m, p, use, where), 1.0, kTolerance) << where << " " << memory_use_name(use);
}

Plan plan_of(ExpertPath path) {
  Plan p;
  p.path = path;
  return p;
}

// The vocabulary projection in logits blocks (vocab_chunk_tokens): one block's logits in BF16 while
// they are cast, one FP32 buffer for the softmax and its gradient; with Gemma's softcap too.
TEST(FlatPeaks, LogitsBlocksMeasuredAsPredicted) {
  for (const char* model : {"tiny-moe", "tiny-moe-gemma"}) {
    const WorkloadContext ctx = workload(model, 1);
    for (const std::int64_t block : {std::int64_t{0}, std::int64_t{64}}) {
      for (const ExpertPath path : {ExpertPath::kLocal, ExpertPath::kEp}) {
        Plan p = plan_of(path);
        p.flat.vocab_chunk_tokens = block;
        expect_within(measured(p, ctx), predicted(p, ctx), MemoryUse::kVocabulary,
                      fmt::format("{} {} logits block {}", model, path_name(path), block));
      }
    }
  }
}

// SCO: every boundary on the host, the next one loaded while the current decoder's backward runs
// (two boundaries on the device); without it one buffer.
TEST(FlatPeaks, ScoBoundariesMeasuredAsPredicted) {
  for (const char* model : {"tiny-moe", "tiny-moe-gemma"}) {
    const WorkloadContext ctx = workload(model, 1);
    for (const bool sco : {false, true}) {
      for (const ExpertPath path : {ExpertPath::kLocal, ExpertPath::kEp}) {
        Plan p = plan_of(path);
        p.flat.selective_checkpoint_offload = sco;
        const UsePeaks m = measured(p, ctx), pr = predicted(p, ctx);
        expect_within(m, pr, MemoryUse::kBoundaries, fmt::format("{} {} sco {}", model, path_name(path), sco));
        if (sco) EXPECT_EQ(of(m, MemoryUse::kBoundaries), 2 * boundary_bytes(1, kBatch, kSeq, ctx.model.hidden)) << model;
      }
    }
  }
}

// OffloadStreamAdamW: gradients leave in buckets; the device holds a decoder's gradient until its
// last bucket left, the LM head's and the embeddings' until theirs.
TEST(FlatPeaks, OptimizerGradientsMeasuredAsPredicted) {
  for (const char* model : {"tiny-moe", "tiny-moe-gemma"}) {
    const WorkloadContext ctx = workload(model, 1);
    for (const std::int64_t bucket : {std::int64_t{0}, std::int64_t{1}}) {
      Plan p = plan_of(ExpertPath::kLocal);
      p.flat.optimizer_bucket_mib = bucket;
      expect_within(measured(p, ctx), predicted(p, ctx), MemoryUse::kOptimizer, fmt::format("{} local buckets {} MiB", model, bucket));
    }
  }
}

// Over two rank processes (BF16, each rank standing in for a GPU), the vocabulary peak on every
// rank: logits blocks of 64 tokens, and Ring-DTP with head shards circulating (256 tokens per rank,
// 128 head rows per shard) and with hidden-state blocks circulating (64 tokens per rank). The
// dispatch peak with and without PipelinedLLEP is printed beside its prediction.
TEST(FlatPeaks, OverTwoRanksVocabularyMeasuredAsPredicted) {
  const WorkloadContext ctx = workload("tiny-moe", 2);
  Plan p = plan_of(ExpertPath::kEp);
  p.flat.vocab_chunk_tokens = 64;
  p.routing_chunk_tokens = 64;
  const UsePeaks blocks = measured_over_ranks(p, ctx, 2, "blocks");
  expect_within(blocks, predicted(p, ctx), MemoryUse::kVocabulary, "tiny-moe ep 2 ranks, logits blocks of 64");
  Plan ring = p;
  ring.flat.vocab_projection = VocabProjection::kRingDtp;
  ASSERT_TRUE(ring_dtp_hops(ctx.model, ctx.workload.tokens_per_gpu(), 2).weights_move);
  expect_within(measured_over_ranks(ring, ctx, 2, "ring"), predicted(ring, ctx), MemoryUse::kVocabulary,
                "tiny-moe ep 2 ranks, Ring-DTP, shards move");
  const WorkloadContext few = workload("tiny-moe", 2, 2);
  ASSERT_FALSE(ring_dtp_hops(few.model, few.workload.tokens_per_gpu(), 2).weights_move);
  expect_within(measured_over_ranks(ring, few, 2, "ring-hidden"), predicted(ring, few), MemoryUse::kVocabulary,
                "tiny-moe ep 2 ranks, Ring-DTP, hidden blocks move");
  EXPECT_GT(of(blocks, MemoryUse::kDispatch), 0);
  ratio(blocks, predicted(p, ctx), MemoryUse::kDispatch, "tiny-moe ep 2 ranks, dispatch rounds of 64");
  Plan llep = p;
  llep.flat.expert_dispatch = ExpertDispatch::kPipelinedLlep;
  ratio(measured_over_ranks(llep, ctx, 2, "llep"), predicted(llep, ctx), MemoryUse::kDispatch, "tiny-moe ep 2 ranks, PipelinedLLEP");
}

}  // namespace
}  // namespace oom::backend
