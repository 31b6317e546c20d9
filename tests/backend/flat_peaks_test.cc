// Issue-level check of FLAT's bounded peaks on the CPU backend (backend/README.md "Device memory by
// use"): a CPU stands in for a GPU (backend/runtime/device_memory.h), BF16 working weights as the memory
// model assumes, and each allocation is counted under the memory model's use. For each schedule the
// peak it bounds — the vocabulary's under logits blocks and under Ring-DTP over two ranks, the
// boundaries' under SCO, the optimizer's under OffloadStreamAdamW's buckets — is measured over two
// steps and set beside the memory model's prediction for the same plan and workload (the step's
// graph, the analytic schedule): within 10 %. The dispatch peak (PipelinedLLEP) depends on the
// routing the tokens took, so each step's is set beside the model lowered with that routing.
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "backend/dist/rank_train.h"
#include "backend/runtime/device_memory.h"
#include "backend/runtime/state.h"
#include "backend/train/plan_runtime.h"
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

WorkloadContext workload(const std::string& model, int gpus, std::int64_t batch = kBatch, const RoutingSpec& routing = {}) {
  Workload w;
  w.model = model;
  w.hardware = "h100-sxm-node";
  w.gpus = gpus;
  w.global_batch = batch;
  w.seq_len = kSeq;
  w.routing = routing;
  return resolve_workload(w, "test workload");
}

// When each stage of a run started and ended, by name (a traced step).
using Executed = std::map<std::string, std::pair<Seconds, Seconds>>;

// The memory model's own peak of each use for `plan`: the step's graph at the analytic schedule,
// or, given a run's stage times, at the schedule the run executed (the CPU backend runs a GPU's
// stages one after another, where the analytic schedule overlaps copies with compute).
UsePeaks predicted(const Plan& plan, const WorkloadContext& ctx, const Executed* run = nullptr) {
  validate_plan(plan, ctx.model, ctx.workload, "test plan");
  const PlanPricer pricer(ctx, load_calibration_for(ctx.hardware));
  const StepGraph g = pricer.lower_plan(plan);
  std::vector<Seconds> d(g.stages.size());
  for (const Stage& s : g.stages) d[static_cast<std::size_t>(s.id)] = pricer.durations().duration_s(s, g);
  StageTimes t = analytic_times(g, d);
  if (run != nullptr) {
    for (const Stage& s : g.stages) {
      const auto it = run->find(s.name);
      if (it == run->end()) {
        // Only stages without device memory may be missing (the host's work is not all traced).
        bool gpu = false;
        for (const MemoryEvent& m : s.memory) gpu = gpu || m.space == MemorySpace::kGpu;
        EXPECT_FALSE(gpu) << s.name << " is not in the run's trace";
        continue;
      }
      t.start_s[static_cast<std::size_t>(s.id)] = it->second.first;
      t.finish_s[static_cast<std::size_t>(s.id)] = it->second.second;
    }
  }
  return use_peaks(g, t);
}

struct Measured {
  UsePeaks peaks{};  // each use's own peak, the most in any step (on any rank)
  Executed stages;   // the last step's stages
  std::vector<UsePeaks> steps;        // over ranks: each step's
  std::vector<RoutingSpec> routing;   // over ranks (EP): each step's routing histogram
};

// Two BF16 steps of `plan` in this process (one rank), the second traced.
Measured measured(const Plan& plan, const WorkloadContext& ctx) {
  device_memory::Emulation on(true);
  HostState state(ctx.model, {WorkingPrecision::kBFloat16, {}});
  state.init_from_seed(6);
  PlanTrainer t(state, TrainerConfig{}, plan);
  torch::manual_seed(10);
  Measured m;
  for (int s = 0; s < 2; ++s) {
    t.set_tracing(s == 1);
    const auto tokens = torch::randint(0, 256, {ctx.workload.global_batch, kSeq}, torch::kLong);
    t.step(tokens, tokens.roll(1, 1));
    const UsePeaks u = t.last_use_peaks();
    for (std::size_t i = 0; i < u.size(); ++i) m.peaks[i] = std::max(m.peaks[i], u[i]);
  }
  for (const TraceStage& s : t.last_trace().stages) m.stages[s.name] = {s.start_s, s.end_s};
  return m;
}

// The same over `ranks` rank processes (the most of each use on any rank; every rank's stages).
Measured measured_over_ranks(const Plan& plan, const WorkloadContext& ctx, int ranks, const std::string& tag) {
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
  o.trace = (dir / "trace.json").string();
  std::ofstream(o.plan) << plan_to_json(plan).dump(2);
  dist::RanksOptions r;
  r.ranks = ranks;
  r.worker_program = OOM_BINARY;
  r.timeout_s = 60;
  r.deadline_s = 180;
  const dist::RanksResult res = dist::train_ranks(o, r);
  Measured out;
  EXPECT_EQ(res.train.device_use_peak_bytes.size(), out.peaks.size());
  for (std::size_t i = 0; i < out.peaks.size() && i < res.train.device_use_peak_bytes.size(); ++i) {
    out.peaks[i] = res.train.device_use_peak_bytes[i];
  }
  EXPECT_EQ(res.step_use_peaks.size(), static_cast<std::size_t>(o.steps));
  for (const auto& step : res.step_use_peaks) {
    UsePeaks u{};
    EXPECT_EQ(step.size(), u.size());
    for (std::size_t i = 0; i < u.size() && i < step.size(); ++i) u[i] = step[i];
    out.steps.push_back(u);
  }
  out.routing = res.step_routing;
  EXPECT_EQ(out.routing.size(), static_cast<std::size_t>(o.steps));
  std::ifstream in(o.trace);
  const auto chrome = nlohmann::json::parse(in);
  for (const auto& e : chrome["traceEvents"]) {
    if (e["ph"] != "X") continue;
    const double start = e["ts"].get<double>() * 1e-6;
    out.stages[e["name"].get<std::string>()] = {start, start + e["dur"].get<double>() * 1e-6};
  }
  fs::remove_all(dir);
  return out;
}

// Prints the measured and predicted peak of `use` and returns measured / predicted.
double ratio(const UsePeaks& m, const UsePeaks& p, MemoryUse use, const std::string& where) {
  const double r = static_cast<double>(of(m, use)) / static_cast<double>(std::max<Bytes>(1, of(p, use)));
  std::printf("%-44s %-10s measured %8.4f MiB  predicted %8.4f MiB  (%.3fx)\n", where.c_str(),
              std::string(memory_use_name(use)).c_str(), to_mib(of(m, use)), to_mib(of(p, use)), r);
  return r;
}

// The measured peak of `use` within 10 % of the model's at the schedule the run executed (printed
// beside the analytic schedule's too).
void expect_within(const Measured& m, const Plan& plan, const WorkloadContext& ctx, MemoryUse use, const std::string& where) {
  const UsePeaks at_run = predicted(plan, ctx, &m.stages);
  EXPECT_GT(of(at_run, use), 0) << where;
  EXPECT_NEAR(ratio(m.peaks, at_run, use, where + ", as run"), 1.0, kTolerance) << where << " " << memory_use_name(use);
  ratio(m.peaks, predicted(plan, ctx), use, where + ", analytic");
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
        expect_within(measured(p, ctx), p, ctx, MemoryUse::kVocabulary, fmt::format("{} {} logits block {}", model, path_name(path), block));
      }
    }
  }
}

// SCO: every boundary on the host, the next one loaded while the current decoder's backward runs
// (two boundaries on the device); without it one buffer, the decoder's own released by its replay.
TEST(FlatPeaks, ScoBoundariesMeasuredAsPredicted) {
  for (const char* model : {"tiny-moe", "tiny-moe-gemma"}) {
    const WorkloadContext ctx = workload(model, 1);
    for (const bool sco : {false, true}) {
      for (const ExpertPath path : {ExpertPath::kLocal, ExpertPath::kEp}) {
        Plan p = plan_of(path);
        p.flat.selective_checkpoint_offload = sco;
        const Measured m = measured(p, ctx);
        expect_within(m, p, ctx, MemoryUse::kBoundaries, fmt::format("{} {} sco {}", model, path_name(path), sco));
        // Without SCO one: a decoder's input goes once its replay has read it, before the MoE
        // backward after which the input below it loads.
        EXPECT_EQ(of(m.peaks, MemoryUse::kBoundaries), (sco ? 2 : 1) * boundary_bytes(1, kBatch, kSeq, ctx.model.hidden)) << model;
      }
    }
  }
}

// The gradients awaiting their update, with and without OffloadStreamAdamW's buckets: a decoder's
// until its last bucket left (on the EP path its experts' apart), the LM head's and the
// embeddings' until theirs; within 10 % on tiny-moe in one process, over two ranks (where the
// decoders' gradients, common part and half the experts, fall below the LM head's, which the loss
// adds into its buffer), and on tiny-moe-gemma (the tied table's one gradient, held from the
// head's backward to the embeddings' D2H).
TEST(FlatPeaks, OptimizerGradientsMeasuredAsPredicted) {
  for (const std::int64_t bucket : {std::int64_t{0}, std::int64_t{1}}) {
    const WorkloadContext one = workload("tiny-moe", 1);
    for (const ExpertPath path : {ExpertPath::kLocal, ExpertPath::kEp}) {
      Plan p = plan_of(path);
      p.flat.optimizer_bucket_mib = bucket;
      expect_within(measured(p, one), p, one, MemoryUse::kOptimizer, fmt::format("tiny-moe {} buckets {} MiB", path_name(path), bucket));
    }
  }
  Plan p = plan_of(ExpertPath::kEp);
  p.flat.optimizer_bucket_mib = 1;
  const WorkloadContext two = workload("tiny-moe", 2);
  expect_within(measured_over_ranks(p, two, 2, "optimizer"), p, two, MemoryUse::kOptimizer, "tiny-moe ep 2 ranks buckets 1 MiB");
  const WorkloadContext gemma = workload("tiny-moe-gemma", 1);
  expect_within(measured(p, gemma), p, gemma, MemoryUse::kOptimizer, "tiny-moe-gemma ep buckets 1 MiB");
  // Over several logits blocks the head's gradient is summed in FP32 first (4 B per element).
  p.flat.vocab_chunk_tokens = 64;
  expect_within(measured_over_ranks(p, two, 2, "optimizer-blocks"), p, two, MemoryUse::kOptimizer,
                "tiny-moe ep 2 ranks buckets 1 MiB, logits blocks of 64");
}

// Over two rank processes (BF16, each rank standing in for a GPU), the vocabulary peak on every
// rank: logits blocks of 64 tokens, and Ring-DTP with head shards circulating (256 tokens per rank,
// 128 head rows per shard) and with hidden-state blocks circulating (64 tokens per rank). The
// dispatch peak with and without PipelinedLLEP, per step, within 10 % of the model lowered with the
// step's routing.
TEST(FlatPeaks, OverTwoRanksVocabularyMeasuredAsPredicted) {
  const WorkloadContext ctx = workload("tiny-moe", 2);
  Plan p = plan_of(ExpertPath::kEp);
  p.flat.vocab_chunk_tokens = 64;
  p.routing_chunk_tokens = 64;
  const Measured blocks = measured_over_ranks(p, ctx, 2, "blocks");
  expect_within(blocks, p, ctx, MemoryUse::kVocabulary, "tiny-moe ep 2 ranks, logits blocks of 64");
  Plan ring = p;
  ring.flat.vocab_projection = VocabProjection::kRingDtp;
  ASSERT_TRUE(ring_dtp_hops(ctx.model, ctx.workload.tokens_per_gpu(), 2).weights_move);
  expect_within(measured_over_ranks(ring, ctx, 2, "ring"), ring, ctx, MemoryUse::kVocabulary, "tiny-moe ep 2 ranks, Ring-DTP, shards move");
  const WorkloadContext few = workload("tiny-moe", 2, 2);
  ASSERT_FALSE(ring_dtp_hops(few.model, few.workload.tokens_per_gpu(), 2).weights_move);
  expect_within(measured_over_ranks(ring, few, 2, "ring-hidden"), ring, few, MemoryUse::kVocabulary,
                "tiny-moe ep 2 ranks, Ring-DTP, hidden blocks move");
  // The dispatch peak of each step against the model lowered with the routing that step had (the
  // assignments each rank received, its receive buffers and its experts' activations follow it).
  for (std::size_t k = 0; k < blocks.steps.size() && k < blocks.routing.size(); ++k) {
    const WorkloadContext routed = workload("tiny-moe", 2, kBatch, blocks.routing[k]);
    EXPECT_NEAR(ratio(blocks.steps[k], predicted(p, routed), MemoryUse::kDispatch, fmt::format("tiny-moe ep 2 ranks, rounds of 64, step {}", k + 1)),
                1.0, kTolerance);
  }
  // PipelinedLLEP places a step's fetched experts by the previous step's routing (the first step,
  // with none, fetches nothing): the second step against the model lowered with the first step's
  // routing, which places the same experts; what each rank then received followed the second
  // step's own routing, so the prediction carries the drift between two batches.
  Plan llep = p;
  llep.flat.expert_dispatch = ExpertDispatch::kPipelinedLlep;
  const Measured balanced = measured_over_ranks(llep, ctx, 2, "llep");
  ASSERT_EQ(balanced.steps.size(), 2u);
  ASSERT_EQ(balanced.routing.size(), 2u);
  const WorkloadContext placed = workload("tiny-moe", 2, kBatch, balanced.routing[0]);
  EXPECT_NEAR(ratio(balanced.steps[1], predicted(llep, placed), MemoryUse::kDispatch, "tiny-moe ep 2 ranks, PipelinedLLEP, step 2"), 1.0,
              kTolerance);
}

}  // namespace
}  // namespace oom::backend
