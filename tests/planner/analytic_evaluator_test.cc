// Tests of planner/engine/analytic_evaluator.h: golden timelines on a tiny 2-GPU graph whose numbers a
// reader can check by hand, stream order, memory peaks, and Eq. 3 against a plain reference
// (longest path by repeated relaxation) on random graphs.
#include "planner/engine/analytic_evaluator.h"

#include <algorithm>
#include <random>

#include <gtest/gtest.h>

#include "tests/common/round_numbers.h"

#include "planner/lowering/step_graph.h"

namespace oom {
namespace {

using test_support::RoundNumbers;

constexpr Bytes kGB = 1'000'000'000;

struct Tiny {
  StepGraph g;
  StageId h2d, compute, d2h, update;
};

// One layer on GPU 0: H2D of 1 GB → 10 TFLOP of compute → D2H of 1 GB → CPU AdamW of 0.25 G params.
Tiny one_layer() {
  StepGraphBuilder b(2, 1);
  const ResourceId compute = b.add_resource(ResourceKind::kGpuCompute, "gpu0.compute", 0, -1);
  const ResourceId h2d = b.add_resource(ResourceKind::kH2d, "gpu0.h2d", 0, 0);
  const ResourceId d2h = b.add_resource(ResourceKind::kD2h, "gpu0.d2h", 0, 0);
  const ResourceId cpu = b.add_resource(ResourceKind::kCpuUpdate, "numa0.cpu_update.r0", 0, 0);
  Tiny t;
  Stage s;
  s.key = *parse_stage_key("g0.fwd.L0.weights.h2d");
  s.op = OpKind::kH2d;
  s.resource = h2d;
  s.bytes = kGB;
  s.memory = {{MemorySpace::kGpu, 0, kGB, false}};
  t.h2d = b.add(s);
  s = {};
  s.key = *parse_stage_key("g0.fwd.L0.attn.proj");
  s.op = OpKind::kGemm;
  s.resource = compute;
  s.flops = 10e12;
  s.deps = {t.h2d};
  s.memory = {{MemorySpace::kGpu, 0, 2 * kGB, false}, {MemorySpace::kGpu, 0, -kGB, true}};
  t.compute = b.add(s);
  s = {};
  s.key = *parse_stage_key("g0.bwd.L0.layer.grad_d2h");
  s.op = OpKind::kD2h;
  s.resource = d2h;
  s.bytes = kGB;
  s.deps = {t.compute};
  s.memory = {{MemorySpace::kGpu, 0, -2 * kGB, true}, {MemorySpace::kHost, 0, kGB, true}};
  t.d2h = b.add(s);
  s = {};
  s.key = *parse_stage_key("g0.opt.L0.layer.cpu_adamw");
  s.op = OpKind::kCpuAdamW;
  s.resource = cpu;
  s.params = 250'000'000;
  s.deps = {t.d2h};
  s.memory = {{MemorySpace::kHost, 0, -kGB, true}};
  t.update = b.add(s);
  t.g = b.take();
  t.g.gpu_base_bytes = {5 * kGB, 7 * kGB};
  t.g.numa_base_bytes = {100 * kGB};
  return t;
}

TEST(AnalyticEvaluator, OneLayerGoldenTimelineMatchesHandComputation) {
  const Tiny t = one_layer();
  const Trace trace = AnalyticEngine().execute(t.g, RoundNumbers());
  ASSERT_EQ(trace.stages.size(), 4u);
  // H2D 1 GB at 10 GB/s = 0.1 s; 10 TFLOP at 100 TFLOP/s = 0.1 s; D2H 0.1 s; 0.25 G params at 0.25 G/s = 1 s.
  const double expected[4][2] = {{0.0, 0.1}, {0.1, 0.2}, {0.2, 0.3}, {0.3, 1.3}};
  for (std::size_t i = 0; i < 4; ++i) {
    EXPECT_NEAR(trace.stages[i].start_s, expected[i][0], 1e-12) << trace.stages[i].name;
    EXPECT_NEAR(trace.stages[i].end_s, expected[i][1], 1e-12) << trace.stages[i].name;
  }
  EXPECT_NEAR(trace.step_s, 1.3, 1e-12);
  EXPECT_EQ(trace.stages[1].kind, "gemm");
  EXPECT_EQ(trace.stages[3].resource, "numa0.cpu_update.r0");
}

TEST(AnalyticEvaluator, MemoryPeaksFollowAllocationEvents) {
  const Tiny t = one_layer();
  const Trace trace = AnalyticEngine().execute(t.g, RoundNumbers());
  // GPU 0: 5 GB base + 1 GB weights + 2 GB while computing = 8 GB; GPU 1 never allocates.
  ASSERT_EQ(trace.gpu_peak_bytes.size(), 2u);
  EXPECT_EQ(trace.gpu_peak_bytes[0], 8 * kGB);
  EXPECT_EQ(trace.gpu_peak_bytes[1], 7 * kGB);
  EXPECT_EQ(trace.numa_peak_bytes.at(0), 101 * kGB);
  // The timeline ends where it started: every allocation is freed.
  ASSERT_EQ(trace.memory.size(), 3u);
  EXPECT_EQ(trace.memory[0].device, "gpu0");
  EXPECT_EQ(trace.memory[0].samples.back().bytes, 5 * kGB);
  EXPECT_EQ(trace.memory[2].device, "numa0");
  EXPECT_EQ(trace.memory[2].samples.back().bytes, 100 * kGB);
}

TEST(AnalyticEvaluator, HeadroomFractionIsAddedToGpuPeaks) {
  Tiny t = one_layer();
  t.g.gpu_headroom_fraction = 0.5;
  const Trace trace = AnalyticEngine().execute(t.g, RoundNumbers());
  EXPECT_EQ(trace.gpu_peak_bytes[0], 12 * kGB);
}

TEST(AnalyticEvaluator, TwoCopiesOnOneEngineTakeTwiceAsLongAsOne) {
  StepGraphBuilder b(2, 1);
  const ResourceId e0 = b.add_resource(ResourceKind::kH2d, "gpu0.h2d", 0, 0);
  const ResourceId e1 = b.add_resource(ResourceKind::kH2d, "gpu1.h2d", 1, 0);
  Stage s;
  s.op = OpKind::kH2d;
  s.bytes = kGB;
  s.resource = e0;
  s.key = *parse_stage_key("g0.fwd.L0.weights.h2d");
  b.add(s);
  s.key = *parse_stage_key("g0.fwd.L1.weights.h2d");
  b.add(s);
  s.key = *parse_stage_key("g1.fwd.L0.weights.h2d");
  s.resource = e1;
  b.add(s);
  const StepGraph g = b.take();
  const Trace trace = AnalyticEngine().execute(g, RoundNumbers());
  auto end_of = [&](const std::string& name) {
    for (const auto& st : trace.stages) {
      if (st.name == name) return st.end_s;
    }
    return -1.0;
  };
  EXPECT_NEAR(end_of("g0.fwd.L0.weights.h2d"), 0.1, 1e-12);
  EXPECT_NEAR(end_of("g0.fwd.L1.weights.h2d"), 0.2, 1e-12);  // stream order: after the first on the same copy engine
  EXPECT_NEAR(end_of("g1.fwd.L0.weights.h2d"), 0.1, 1e-12);  // another GPU's link: no contention in the analytic engine
}

TEST(AnalyticEvaluator, MatchesLongestPathReferenceOnRandomGraphs) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 20; ++trial) {
    StepGraphBuilder b(1, 1);
    const int resources = 1 + static_cast<int>(rng() % 4);
    for (int r = 0; r < resources; ++r) b.add_resource(ResourceKind::kGpuCompute, "r" + std::to_string(r), 0, -1);
    const int n = 1 + static_cast<int>(rng() % 60);
    std::vector<Seconds> d;
    for (int v = 0; v < n; ++v) {
      Stage s;
      s.key.chunk = v;  // distinct keys
      s.resource = static_cast<ResourceId>(rng() % static_cast<unsigned>(resources));
      for (int u = 0; u < v; ++u) {
        if (rng() % 5 == 0) s.deps.push_back(u);
      }
      b.add(s);
      d.push_back(static_cast<double>(rng() % 1000) / 100.0);
    }
    const StepGraph g = b.take();
    const StageTimes t = analytic_times(g, d);
    // Reference: relax every edge (data and stream order) until nothing changes.
    std::vector<Seconds> finish(static_cast<std::size_t>(n), 0.0);
    for (bool changed = true; changed;) {
      changed = false;
      for (int v = 0; v < n; ++v) {
        Seconds start = 0;
        for (const StageId u : g.stages[static_cast<std::size_t>(v)].deps) start = std::max(start, finish[static_cast<std::size_t>(u)]);
        const auto& order = g.resource(g.stages[static_cast<std::size_t>(v)].resource).order;
        const auto it = std::find(order.begin(), order.end(), v);
        if (it != order.begin()) start = std::max(start, finish[static_cast<std::size_t>(*(it - 1))]);
        const Seconds f = start + d[static_cast<std::size_t>(v)];
        if (f != finish[static_cast<std::size_t>(v)]) {
          finish[static_cast<std::size_t>(v)] = f;
          changed = true;
        }
      }
    }
    for (int v = 0; v < n; ++v) EXPECT_DOUBLE_EQ(t.finish_s[static_cast<std::size_t>(v)], finish[static_cast<std::size_t>(v)]);
    EXPECT_DOUBLE_EQ(t.step_s, *std::max_element(finish.begin(), finish.end()));
  }
}

}  // namespace
}  // namespace oom
