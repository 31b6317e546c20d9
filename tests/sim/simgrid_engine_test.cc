// Tests of sim/simgrid_engine.h: golden timelines on tiny platforms whose numbers can be checked
// by hand, bandwidth sharing, agreement with the analytic engine where nothing contends, and
// determinism.
#include "sim/simgrid_engine.h"

#include <cmath>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "tests/common/round_numbers.h"

#include "planner/engine/analytic_evaluator.h"
#include "planner/engine/duration_model.h"
#include "planner/engine/step_engine.h"
#include "planner/lowering/step_graph.h"
#include "traces/trace.h"

namespace oom::sim {
namespace {

constexpr Bytes kGB = 1'000'000'000;

// Two GPUs at 100 TFLOP/s with 10 GB/s PCIe each way, 100 GB/s NVLink ports. `sockets` = 1: both
// GPUs on one socket whose DRAM delivers 10 GB/s (one PCIe link's worth); `sockets` = 2: one GPU
// per socket. Each socket: 4 cores, CPU AdamW at 0.25 G params/s (7 GB/s of DRAM at 28 B/param).
HardwareSpec tiny_hardware(int sockets, BytesPerS dram_Bps = 10e9) {
  HardwareSpec h;
  h.name = "tiny-2gpu";
  h.nodes = 1;
  h.gpus_per_node = 2;
  h.gpu = {"tiny", 80 * kGiB, 100e12, 1e12};
  h.gpu_numa = sockets == 1 ? std::vector<int>{0, 0} : std::vector<int>{0, 1};
  h.pcie = {4, 10e9, 10e9, 0.0};
  h.fabric = {FabricKind::kNvlink, 100e9, 0.0};
  h.numa.assign(static_cast<std::size_t>(sockets), NumaSpec{100 * kGiB, dram_Bps, 4, 0.25e9});
  return h;
}

using test_support::RoundNumbers;

struct Rank {
  ResourceId compute, h2d, d2h, fabric, cpu;
};

// Resources of `gpus` ranks; rank r's CPU executor on NUMA node numa_of[r].
std::vector<Rank> add_ranks(StepGraphBuilder& b, int gpus, const std::vector<int>& numa_of) {
  std::vector<Rank> ranks;
  for (int r = 0; r < gpus; ++r) {
    const int n = numa_of[static_cast<std::size_t>(r)];
    ranks.push_back({b.add_resource(ResourceKind::kGpuCompute, fmt::format("gpu{}.compute", r), r, -1),
                     b.add_resource(ResourceKind::kH2d, fmt::format("gpu{}.h2d", r), r, n),
                     b.add_resource(ResourceKind::kD2h, fmt::format("gpu{}.d2h", r), r, n),
                     b.add_resource(ResourceKind::kFabric, fmt::format("gpu{}.fabric", r), r, -1),
                     b.add_resource(ResourceKind::kCpuUpdate, fmt::format("numa{}.cpu_update.r{}", n, r), r, n)});
  }
  return ranks;
}

// A stage keyed by `name` (traces/stage_key.h), which names rank `gpu`'s work.
Stage stage(const std::string& name, OpKind op, ResourceId res, int gpu, std::vector<StageId> deps = {}) {
  Stage s;
  const auto key = parse_stage_key(name);
  EXPECT_TRUE(key.has_value()) << name;
  if (key) s.key = *key;
  EXPECT_EQ(s.key.rank, gpu) << name;
  s.op = op;
  s.resource = res;
  s.deps = std::move(deps);
  return s;
}

// One line per stage: start, end, resource, name (µs resolution).
std::string timeline(const Trace& t) {
  std::string out;
  for (const TraceStage& s : t.stages) out += fmt::format("{:.6f} {:.6f} {} {}\n", s.start_s, s.end_s, s.resource, s.name);
  return out;
}

const TraceStage& find(const Trace& t, const std::string& name) {
  for (const TraceStage& s : t.stages) {
    if (s.name == name) return s;
  }
  throw std::out_of_range(name);
}

// One layer on GPU 0: load 2 GB of weights, a 50 TFLOP GEMM, send 1 GB of gradients back, update
// 0.1 G parameters on the CPU. By hand: 2 GB / 10 GB/s = 0.2 s; 50 TFLOP / 100 TFLOP/s = 0.5 s;
// 1 GB / 10 GB/s = 0.1 s; 0.1 G params / 0.25 G params/s = 0.4 s (its 2.8 GB of DRAM traffic at
// 7 GB/s fits the socket's 10 GB/s).
StepGraph one_layer_graph() {
  StepGraphBuilder b(2, 1);
  const auto r = add_ranks(b, 2, {0, 0});
  Stage h2d = stage("g0.fwd.L0.weights.h2d", OpKind::kH2d, r[0].h2d, 0);
  h2d.bytes = 2 * kGB;
  h2d.memory = {{MemorySpace::kGpu, 0, 2 * kGB, false}};
  const StageId s0 = b.add(h2d);
  Stage gemm = stage("g0.fwd.L0.attn.proj", OpKind::kGemm, r[0].compute, 0, {s0});
  gemm.flops = 50e12;
  gemm.memory = {{MemorySpace::kGpu, 0, 1 * kGB, false}, {MemorySpace::kGpu, 0, -2 * kGB, true}};
  const StageId s1 = b.add(gemm);
  Stage d2h = stage("g0.bwd.L0.layer.grad_d2h", OpKind::kD2h, r[0].d2h, 0, {s1});
  d2h.bytes = 1 * kGB;
  d2h.memory = {{MemorySpace::kGpu, 0, -1 * kGB, true}, {MemorySpace::kHost, 0, 1 * kGB, false}};
  const StageId s2 = b.add(d2h);
  Stage adam = stage("g0.opt.L0.layer.cpu_adamw", OpKind::kCpuAdamW, r[0].cpu, 0, {s2});
  adam.params = 100'000'000;
  adam.memory = {{MemorySpace::kHost, 0, -1 * kGB, true}};
  b.add(adam);
  StepGraph g = b.take();
  g.gpu_base_bytes = {10 * kGB, 10 * kGB};
  g.numa_base_bytes = {50 * kGB};
  return g;
}

TEST(SimGridEngineTest, GoldenOneLayerCopyComputeCopyUpdate) {
  const StepGraph g = one_layer_graph();
  ASSERT_EQ(check_step_graph(g), "");
  const Trace t = SimGridEngine(tiny_hardware(1)).execute(g, RoundNumbers());
  EXPECT_EQ(t.engine, "simgrid");
  EXPECT_EQ(timeline(t),
            "0.000000 0.200000 gpu0.h2d g0.fwd.L0.weights.h2d\n"
            "0.200000 0.700000 gpu0.compute g0.fwd.L0.attn.proj\n"
            "0.700000 0.800000 gpu0.d2h g0.bwd.L0.layer.grad_d2h\n"
            "0.800000 1.200000 numa0.cpu_update.r0 g0.opt.L0.layer.cpu_adamw\n");
  EXPECT_NEAR(t.step_s, 1.2, 1e-9);
  const TraceStage& adam = find(t, "g0.opt.L0.layer.cpu_adamw");
  EXPECT_EQ(adam.kind, "cpu_adamw");
  EXPECT_EQ(adam.layer, 0);
  // GPU 0: 10 GB base, +2 GB weights at 0 (one sample: 12 GB from 0), +1 GB activations at 0.2
  // (peak 13 GB), −2 GB at 0.7, −1 GB at 0.8. NUMA 0: 50 GB base, +1 GB gradients at 0.7, −1 GB at 1.2.
  ASSERT_EQ(t.memory.size(), 3u);
  EXPECT_EQ(t.memory[0].device, "gpu0");
  ASSERT_EQ(t.memory[0].samples.size(), 4u);
  EXPECT_EQ(t.memory[0].samples[0].bytes, 12 * kGB);
  EXPECT_NEAR(t.memory[0].samples[1].time_s, 0.2, 1e-9);
  EXPECT_EQ(t.memory[0].samples[1].bytes, 13 * kGB);
  EXPECT_NEAR(t.memory[0].samples[2].time_s, 0.7, 1e-9);
  EXPECT_EQ(t.memory[0].samples[2].bytes, 11 * kGB);
  EXPECT_EQ(t.memory[0].samples[3].bytes, 10 * kGB);
  EXPECT_EQ(t.gpu_peak_bytes, (std::vector<Bytes>{13 * kGB, 10 * kGB}));
  EXPECT_EQ(t.numa_peak_bytes, (std::vector<Bytes>{51 * kGB}));
  EXPECT_EQ(t.memory[2].device, "numa0");
  EXPECT_NEAR(t.memory[2].samples.back().time_s, 1.2, 1e-9);
}

// `copies` ranks each load 1 GB at time 0.
StepGraph parallel_copies(int copies, const std::vector<int>& numa_of) {
  StepGraphBuilder b(2, numa_of.back() + 1);
  const auto r = add_ranks(b, 2, numa_of);
  for (int i = 0; i < copies; ++i) {
    Stage h2d = stage(fmt::format("g{}.fwd.L0.weights.h2d", i), OpKind::kH2d, r[static_cast<std::size_t>(i)].h2d, i);
    h2d.bytes = 1 * kGB;
    b.add(h2d);
  }
  return b.take();
}

TEST(SimGridEngineTest, TwoCopiesOnOneSocketTakeTwiceAsLongAsOne) {
  // One 1 GB copy: 0.1 s at 10 GB/s. Two at once through one socket's 10 GB/s of DRAM: 5 GB/s
  // each, 0.2 s. With a socket per GPU they do not meet: 0.1 s each. The analytic engine has no
  // contention: 0.1 s in every case.
  const SimGridEngine one_socket(tiny_hardware(1));
  const Trace alone = one_socket.execute(parallel_copies(1, {0, 0}), RoundNumbers());
  EXPECT_NEAR(alone.step_s, 0.1, 1e-9);
  const Trace shared = one_socket.execute(parallel_copies(2, {0, 0}), RoundNumbers());
  EXPECT_NEAR(find(shared, "g0.fwd.L0.weights.h2d").end_s, 0.2, 1e-9);
  EXPECT_NEAR(find(shared, "g1.fwd.L0.weights.h2d").end_s, 0.2, 1e-9);
  const Trace apart = SimGridEngine(tiny_hardware(2)).execute(parallel_copies(2, {0, 1}), RoundNumbers());
  EXPECT_NEAR(apart.step_s, 0.1, 1e-9);
  EXPECT_NEAR(AnalyticEngine().execute(parallel_copies(2, {0, 0}), RoundNumbers()).step_s, 0.1, 1e-12);
}

TEST(SimGridEngineTest, CpuUpdateAndHostCopyShareTheSocketsDram) {
  // At 0: a 1 GB copy (alone 10 GB/s) and an AdamW of 0.1 G params (2.8 GB at up to 7 GB/s; its
  // arithmetic alone takes 0.4 s) meet on 10 GB/s of DRAM: 5 GB/s each. The copy ends at 0.2 s;
  // the update's remaining 1.8 GB then flow at 7 GB/s: 0.2 + 1.8/7 = 0.457143 s.
  StepGraphBuilder b(2, 1);
  const auto r = add_ranks(b, 2, {0, 0});
  Stage h2d = stage("g1.fwd.L1.weights.h2d", OpKind::kH2d, r[1].h2d, 1);
  h2d.bytes = 1 * kGB;
  b.add(h2d);
  Stage adam = stage("g0.opt.L0.layer.cpu_adamw", OpKind::kCpuAdamW, r[0].cpu, 0);
  adam.params = 100'000'000;
  b.add(adam);
  const Trace t = SimGridEngine(tiny_hardware(1)).execute(b.take(), RoundNumbers());
  EXPECT_NEAR(find(t, "g1.fwd.L1.weights.h2d").end_s, 0.2, 1e-9);
  EXPECT_NEAR(find(t, "g0.opt.L0.layer.cpu_adamw").end_s, 0.2 + 1.8 / 7, 1e-9);
}

TEST(SimGridEngineTest, CpuUpdatesOfTwoRanksShareTheSocketsCores) {
  // Two 0.1 G-parameter updates on one 4-core socket: each alone 0.4 s, together 0.8 s (their
  // DRAM traffic, 2 × 2.8 GB at 5 GB/s each, ends at 0.56 s, before the arithmetic).
  StepGraphBuilder b(2, 1);
  const auto r = add_ranks(b, 2, {0, 0});
  for (int i = 0; i < 2; ++i) {
    Stage adam = stage(fmt::format("g{}.opt.L0.layer.cpu_adamw", i), OpKind::kCpuAdamW, r[static_cast<std::size_t>(i)].cpu, i);
    adam.params = 100'000'000;
    b.add(adam);
  }
  const Trace t = SimGridEngine(tiny_hardware(1)).execute(b.take(), RoundNumbers());
  EXPECT_NEAR(find(t, "g0.opt.L0.layer.cpu_adamw").end_s, 0.8, 1e-9);
  EXPECT_NEAR(find(t, "g1.opt.L0.layer.cpu_adamw").end_s, 0.8, 1e-9);
}

TEST(SimGridEngineTest, CollectiveMembersExchangeOverTheirPorts) {
  // A 2-GPU all-to-all of 10 GB per member: each sends to the other over its own egress port at
  // 100 GB/s: 0.1 s. Member 1 depends on member 0's input (a 0.05 s GEMM on GPU 0), so both
  // start at 0.05.
  StepGraphBuilder b(2, 1);
  const auto r = add_ranks(b, 2, {0, 0});
  Stage gemm = stage("g0.fwd.L0.attn.proj", OpKind::kGemm, r[0].compute, 0);
  gemm.flops = 5e12;
  const StageId s0 = b.add(gemm);
  std::vector<StageId> members;
  for (int i = 0; i < 2; ++i) {
    Stage a2a = stage(fmt::format("g{}.fwd.L0.moe.a2a_dispatch", i), OpKind::kAllToAll, r[static_cast<std::size_t>(i)].fabric, i, {s0});
    a2a.bytes = 10 * kGB;
    a2a.peers = {0, 1};
    members.push_back(b.add(a2a));
  }
  const Trace t = SimGridEngine(tiny_hardware(1)).execute(b.take(), RoundNumbers());
  EXPECT_EQ(timeline(t),
            "0.000000 0.050000 gpu0.compute g0.fwd.L0.attn.proj\n"
            "0.050000 0.150000 gpu0.fabric g0.fwd.L0.moe.a2a_dispatch\n"
            "0.050000 0.150000 gpu1.fabric g1.fwd.L0.moe.a2a_dispatch\n");
}

// A two-layer, two-rank step with every kind of resource: weights in, forward, an all-to-all,
// backward, gradients out, CPU updates, with stream order and cross-stream events. Ranks sit on
// separate sockets with ample DRAM, so nothing contends.
StepGraph uncontended_step() {
  StepGraphBuilder b(2, 2);
  const auto r = add_ranks(b, 2, {0, 1});
  for (int layer = 0; layer < 2; ++layer) {
    std::vector<StageId> fwd(2);
    for (int i = 0; i < 2; ++i) {
      const auto& rk = r[static_cast<std::size_t>(i)];
      Stage h2d = stage(fmt::format("g{}.fwd.L{}.weights.h2d", i, layer), OpKind::kH2d, rk.h2d, i);
      h2d.layer = layer;
      h2d.bytes = (layer + 1) * kGB;
      h2d.memory = {{MemorySpace::kGpu, i, h2d.bytes, false}};
      const StageId in = b.add(h2d);
      Stage attn = stage(fmt::format("g{}.fwd.L{}.attn.core", i, layer), OpKind::kAttention, rk.compute, i, {in});
      attn.layer = layer;
      attn.flops = 3e12 * (i + 1);
      attn.shape.head_dim = 128;
      fwd[static_cast<std::size_t>(i)] = b.add(attn);
    }
    std::vector<StageId> a2a(2);
    for (int i = 0; i < 2; ++i) {
      Stage s = stage(fmt::format("g{}.fwd.L{}.moe.a2a_return", i, layer), OpKind::kAllToAll, r[static_cast<std::size_t>(i)].fabric, i, fwd);
      s.layer = layer;
      s.bytes = 4 * kGB;
      s.peers = {0, 1};
      a2a[static_cast<std::size_t>(i)] = b.add(s);
    }
    for (int i = 0; i < 2; ++i) {
      const auto& rk = r[static_cast<std::size_t>(i)];
      Stage bwd = stage(fmt::format("g{}.bwd.L{}.attn.proj_bwd", i, layer), OpKind::kGemm, rk.compute, i, {a2a[static_cast<std::size_t>(i)]});
      bwd.layer = layer;
      bwd.flops = 20e12;
      bwd.shape.tokens = 4096;
      bwd.memory = {{MemorySpace::kGpu, i, -(layer + 1) * kGB, true}};
      const StageId grad = b.add(bwd);
      Stage d2h = stage(fmt::format("g{}.bwd.L{}.layer.grad_d2h", i, layer), OpKind::kD2h, rk.d2h, i, {grad});
      d2h.layer = layer;
      d2h.bytes = kGB / 2;
      d2h.memory = {{MemorySpace::kHost, i, kGB / 2, false}};
      const StageId out = b.add(d2h);
      Stage adam = stage(fmt::format("g{}.opt.L{}.layer.cpu_adamw", i, layer), OpKind::kCpuAdamW, rk.cpu, i, {out});
      adam.layer = layer;
      adam.params = 50'000'000;
      adam.memory = {{MemorySpace::kHost, i, -kGB / 2, true}};
      b.add(adam);
    }
  }
  Stage done = stage("g0.bwd.grads.done", OpKind::kSync, r[0].compute, 0, {});
  for (StageId s = 0; s < static_cast<StageId>(b.graph().stages.size()); ++s) done.deps.push_back(s);
  b.add(done);
  return b.take();
}

TEST(SimGridEngineTest, AgreesWithTheAnalyticEngineWhereNothingContends) {
  const HardwareSpec h = tiny_hardware(2, 1e12);
  const StepGraph g = uncontended_step();
  ASSERT_EQ(check_step_graph(g), "");
  // The project's duration model, with its fixed per-stage costs.
  const CalibratedDurationModel durations(h, default_calibration(h), 2);
  const Trace sim = SimGridEngine().execute(g, durations);
  const Trace ana = AnalyticEngine().execute(g, durations);
  ASSERT_EQ(sim.stages.size(), ana.stages.size());
  for (std::size_t i = 0; i < sim.stages.size(); ++i) {
    const TraceStage& a = find(ana, sim.stages[i].name);
    EXPECT_NEAR(sim.stages[i].start_s, a.start_s, 1e-9) << a.name;
    EXPECT_NEAR(sim.stages[i].end_s, a.end_s, 1e-9) << a.name;
    EXPECT_EQ(sim.stages[i].resource, a.resource);
  }
  EXPECT_NEAR(sim.step_s, ana.step_s, 1e-9);
  EXPECT_GT(sim.step_s, 0.5);
  EXPECT_EQ(sim.gpu_peak_bytes, ana.gpu_peak_bytes);
  EXPECT_EQ(sim.numa_peak_bytes, ana.numa_peak_bytes);
}

// uncontended_step() with both ranks on one socket of 10 GB/s DRAM: copies and updates compete.
StepGraph one_socket_step() {
  StepGraph g = uncontended_step();
  for (Resource& r : g.resources) r.numa = r.numa >= 0 ? 0 : -1;
  for (Stage& s : g.stages) {
    for (MemoryEvent& m : s.memory) m.device = m.space == MemorySpace::kHost ? 0 : m.device;
  }
  g.numa_nodes = 1;
  g.numa_base_bytes = {0};
  return g;
}

TEST(SimGridEngineTest, ASharedSocketLengthensTheStep) {
  const HardwareSpec h = tiny_hardware(1);
  const StepGraph g = one_socket_step();
  ASSERT_EQ(check_step_graph(g), "");
  const CalibratedDurationModel durations(h, default_calibration(h), 2);
  const Trace sim = SimGridEngine().execute(g, durations);
  const Trace ana = AnalyticEngine().execute(g, durations);
  // Copies of both GPUs, and the CPU updates, now meet on one 10 GB/s DRAM link and one socket.
  // The same step with a socket (and its 10 GB/s of DRAM) per rank.
  const HardwareSpec two = tiny_hardware(2);
  const CalibratedDurationModel apart_durations(two, default_calibration(two), 2);
  const StepGraph apart = uncontended_step();
  const Trace sim_apart = SimGridEngine().execute(apart, apart_durations);
  const Trace ana_apart = AnalyticEngine().execute(apart, apart_durations);
  EXPECT_GT(sim.step_s, sim_apart.step_s * 1.01);
  // The analytic engine settles the same sharing (planner/engine/analytic_evaluator.h: HostSharing),
  // and lands close to the simulation. Where DRAM saturates, as here, the engines differ in one
  // thing: the analytic engine draws a CPU stage's DRAM traffic in step with the cores it gets,
  // while SimGrid's flow runs at the stage's alone rate beside its execution (cpu_task), finishing
  // ahead of it. Settled, the analytic step is 2.5 % longer here; the published records, whose
  // DRAM does not saturate, agree within 0.03 % (published_facts_test.cc).
  EXPECT_GT(ana.step_s, ana_apart.step_s * 1.01);
  EXPECT_GE(ana.step_s, sim.step_s * (1 - 1e-3)) << ana.step_s << " analytic vs " << sim.step_s << " simgrid";
  EXPECT_NEAR(ana.step_s / sim.step_s, 1.0, 0.03) << ana.step_s << " analytic vs " << sim.step_s << " simgrid";
}

TEST(SimGridEngineTest, RunsAreBitIdentical) {
  const HardwareSpec h = tiny_hardware(1);
  const StepGraph g = one_socket_step();
  const CalibratedDurationModel durations(h, default_calibration(h), 2);
  const SimGridEngine engine;
  const Trace first = engine.execute(g, durations);
  const Trace second = engine.execute(g, durations);
  EXPECT_TRUE(first == second);
  EXPECT_EQ(trace_to_json(first).dump(), trace_to_json(second).dump());
}

TEST(SimGridEngineTest, TheSimulationServerGivesTheSameStageTimes) {
  // Contended (one socket for two ranks) and on a spec read from its file: both kinds of spec,
  // the one that travels as JSON and the one built in code.
  const HardwareSpec file_spec = load_hardware_spec("h100-sxm-node");
  ASSERT_EQ(hardware_spec_from_json(hardware_spec_to_json(file_spec), "h100"), file_spec);  // it travels to the server
  const HardwareSpec h = tiny_hardware(1);
  const StepGraph g = one_socket_step();
  const CalibratedDurationModel durations(h, default_calibration(h), 2);
  const CalibratedDurationModel file_durations(file_spec, default_calibration(file_spec), 2);
  const SimGridEngine engine;
  const StageTimes in_place = engine.simulate_times(g, durations);
  const StageTimes file_in_place = engine.simulate_times(g, file_durations);
  ASSERT_TRUE(start_simulation_server());
  const StageTimes served = engine.simulate_times(g, durations);
  const StageTimes file_served = engine.simulate_times(g, file_durations);
  EXPECT_EQ(served.start_s, in_place.start_s);
  EXPECT_EQ(served.finish_s, in_place.finish_s);
  EXPECT_EQ(served.step_s, in_place.step_s);
  EXPECT_EQ(file_served.start_s, file_in_place.start_s);
  EXPECT_EQ(file_served.finish_s, file_in_place.finish_s);
  EXPECT_GT(file_served.step_s, 0);
  // A failing simulation still names its stage: two stages of different resources made to wait
  // for each other never run.
  StepGraph stuck = g;
  bool cycled = false;
  for (Stage& v : stuck.stages) {
    for (const StageId u : v.deps) {
      Stage& first = stuck.stages[static_cast<std::size_t>(u)];
      if (!cycled && first.resource != v.resource) {
        first.deps.push_back(v.id);
        cycled = true;
      }
    }
  }
  ASSERT_TRUE(cycled);
  try {
    engine.simulate_times(stuck, durations);
    FAIL() << "no exception";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("never ran"), std::string::npos) << e.what();
  }
}

TEST(SimGridEngineTest, RegistersAsSimgrid) {
  const auto engine = make_simgrid_engine();
  ASSERT_NE(engine, nullptr);
  EXPECT_EQ(engine->name(), "simgrid");
}

TEST(SimGridEngineTest, NeedsHardwareAndEnoughGpus) {
  EXPECT_THROW(SimGridEngine().execute(one_layer_graph(), RoundNumbers()), std::invalid_argument);
  StepGraphBuilder b(3, 1);
  add_ranks(b, 3, {0, 0, 0});
  EXPECT_THROW(SimGridEngine(tiny_hardware(1)).execute(b.take(), RoundNumbers()), std::invalid_argument);
  // A rank whose host side is on a NUMA node the hardware does not have.
  EXPECT_THROW(SimGridEngine(tiny_hardware(1)).execute(uncontended_step(), RoundNumbers()), std::invalid_argument);
}

TEST(SimGridEngineTest, RanksBeyondANodeRunOnTheNextNode) {
  HardwareSpec h = tiny_hardware(2);
  h.nodes = 2;
  h.network.nics = 1;
  h.network.nic_Bps = 50e9;
  EXPECT_EQ(rank_global_gpus(h, 4), (std::vector<int>{0, 1, 2, 3}));
  h.gpu_numa = {1, 0};
  EXPECT_EQ(rank_global_gpus(h, 4), (std::vector<int>{1, 0, 3, 2}));
}

TEST(SimGridEngineTest, EachNodesRanksCopyThroughTheirOwnNodesDram) {
  // Two nodes of tiny_hardware(1): ranks 0-1 on node 0 (host NUMA node 0), ranks 2-3 on node 1
  // (host NUMA node 1, numbered over the cluster). A 1 GB copy of rank 0 and one of rank 2 at once
  // meet no shared DRAM: 0.1 s each, as one alone; two ranks of one node take 0.2 s.
  HardwareSpec h = tiny_hardware(1);
  h.nodes = 2;
  h.network.nics = 1;
  h.network.nic_Bps = 50e9;
  ASSERT_EQ(h.ranks_per_numa(4), (std::vector<int>{2, 2}));
  auto copies = [](const std::vector<int>& ranks) {
    StepGraphBuilder b(4, 2);
    const auto r = add_ranks(b, 4, {0, 0, 1, 1});
    for (const int i : ranks) {
      Stage h2d = stage(fmt::format("g{}.fwd.L0.weights.h2d", i), OpKind::kH2d, r[static_cast<std::size_t>(i)].h2d, i);
      h2d.bytes = 1 * kGB;
      b.add(h2d);
    }
    return b.take();
  };
  const SimGridEngine engine(h);
  EXPECT_NEAR(engine.execute(copies({0, 2}), RoundNumbers()).step_s, 0.1, 1e-9);
  EXPECT_NEAR(engine.execute(copies({2, 3}), RoundNumbers()).step_s, 0.2, 1e-9);
}

// `nodes` nodes of two GPUs (100 GB/s ports), a 40 GB/s NIC link per node: each rank's
// all-gather of `gather` bytes and all-to-all of `a2a` bytes, simulated and priced analytically.
struct CrossNodeSteps {
  double gather_sim, gather_ana, a2a_sim, a2a_ana;
};
CrossNodeSteps cross_node_collectives(int nodes, Bytes gather, Bytes a2a, const NetworkSpec* network = nullptr) {
  HardwareSpec h = tiny_hardware(1, 1e12);
  h.nodes = nodes;
  if (network != nullptr) h.network = *network;
  h.network.nics = 1;
  h.network.nic_Bps = 40e9;
  Calibration c = default_calibration(h);
  c.fabric_efficiency = 1.0;
  c.collective_overhead_s = 0;
  const int P = 2 * nodes;
  const CalibratedDurationModel durations(h, c, P);
  std::vector<int> numa, peers;
  for (int i = 0; i < P; ++i) {
    numa.push_back(i / 2);
    peers.push_back(i);
  }
  CrossNodeSteps out{};
  for (const OpKind op : {OpKind::kAllGather, OpKind::kAllToAll}) {
    StepGraphBuilder b(P, nodes);
    const auto r = add_ranks(b, P, numa);
    for (int i = 0; i < P; ++i) {
      Stage st = stage(fmt::format("g{}.fwd.L0.moe.a2a_dispatch", i), op, r[static_cast<std::size_t>(i)].fabric, i);
      st.bytes = op == OpKind::kAllGather ? gather : a2a;
      st.peers = peers;
      b.add(st);
    }
    const StepGraph g = b.take();
    const double sim = SimGridEngine(h).execute(g, durations).step_s;
    const double ana = AnalyticEngine().execute(g, durations).step_s;
    (op == OpKind::kAllGather ? out.gather_sim : out.a2a_sim) = sim;
    (op == OpKind::kAllGather ? out.gather_ana : out.a2a_ana) = ana;
  }
  return out;
}

TEST(SimGridEngineTest, CollectivesAcrossNodesAgreeWithTheDurationModel) {
  // Two nodes: each of the four ranks all-gathers 2 GB as a ring: every node's NICs carry what one
  // member sends, 2 GB at 40 GB/s; an all-to-all of 3 GB sends 2 GB of each member to the other
  // node, 4 GB per node: 0.1 s.
  const CrossNodeSteps two = cross_node_collectives(2, 2 * kGB, 3 * kGB);
  EXPECT_NEAR(two.gather_ana, 0.05, 1e-9);
  EXPECT_NEAR(two.a2a_ana, 0.1, 1e-9);
  EXPECT_NEAR(two.gather_sim, two.gather_ana, 0.01 * two.gather_ana);
  EXPECT_NEAR(two.a2a_sim, two.a2a_ana, 0.01 * two.a2a_ana);
  // Four nodes: a member's shares for its node go as a pairwise chain over the fabric, those for
  // the other nodes as one flow each way through its node's NICs, so the all-to-all takes what the
  // node's NICs need for all its off-node bytes: 3 GB of each member to the six members off its
  // node, 6 GB per node: 0.15 s.
  const CrossNodeSteps four = cross_node_collectives(4, 2 * kGB, 7 * kGB / 2);
  EXPECT_NEAR(four.a2a_ana, 0.15, 1e-9);
  EXPECT_NEAR(four.gather_sim, four.gather_ana, 0.02 * four.gather_ana);
  EXPECT_NEAR(four.a2a_sim, four.a2a_ana, 0.02 * four.a2a_ana);
}

TEST(SimGridEngineTest, OversubscribedTiersSlowCollectivesInBothEngines) {
  // Four nodes, two per leaf, leaf uplinks 2:1 oversubscribed: a member's off-node shares reach
  // the node beyond the spine, so both engines send them at half the NICs' rate (0.3 s for the
  // all-to-all above). Eight nodes on a fat tree (two per leaf, two leaves per pod, the pods' core
  // uplinks 3:2 oversubscribed too): a third of that again.
  NetworkSpec spine;
  spine.topology = NetworkTopology::kLeafSpine;
  spine.nodes_per_leaf = 2;
  spine.oversubscription = 2;
  const CrossNodeSteps four = cross_node_collectives(4, 2 * kGB, 7 * kGB / 2, &spine);
  EXPECT_NEAR(four.a2a_ana, 0.3, 1e-9);
  EXPECT_NEAR(four.a2a_sim, four.a2a_ana, 0.02 * four.a2a_ana);
  EXPECT_NEAR(four.gather_sim, four.gather_ana, 0.02 * four.gather_ana);
  NetworkSpec tree = spine;
  tree.topology = NetworkTopology::kFatTree;
  tree.leaves_per_pod = 2;
  tree.core_oversubscription = 1.5;
  const CrossNodeSteps eight = cross_node_collectives(8, 2 * kGB, 15 * kGB / 2, &tree);
  // 7 GB of each member's 7.5 GB leave the node (14 of 15 peers), 14 GB per node at 40/3 GB/s.
  EXPECT_NEAR(eight.a2a_ana, 14.0 / (40.0 / 3), 1e-9);
  EXPECT_NEAR(eight.a2a_sim, eight.a2a_ana, 0.02 * eight.a2a_ana);
  EXPECT_NEAR(eight.gather_sim, eight.gather_ana, 0.02 * eight.gather_ana);
}

}  // namespace
}  // namespace oom::sim
