// Tests of planner/engine/duration_model.h: each operator kind is priced from the hardware peak and the
// calibration constants as documented, sockets are shared fairly between the ranks on them.
#include "planner/engine/duration_model.h"

#include <gtest/gtest.h>

namespace oom {
namespace {

HardwareSpec two_socket_node() {
  HardwareSpec h;
  h.name = "test-node";
  h.gpus_per_node = 4;
  h.gpu = {"test", 80 * kGiB, 1000e12, 2e12};
  h.gpu_numa = {0, 0, 1, 1};
  h.pcie = {5, 50e9, 40e9, 1e-5};
  h.fabric = {FabricKind::kNvlink, 400e9, 2e-6};
  h.numa.assign(2, NumaSpec{1000 * kGiB, 200e9, 48, 4e9});
  return h;
}

struct Fixture {
  StepGraph g;
  ResourceId compute, h2d, cpu;
};

Fixture fixture() {
  StepGraphBuilder b(4, 2);
  Fixture f;
  f.compute = b.add_resource(ResourceKind::kGpuCompute, "gpu0.compute", 0, -1);
  f.h2d = b.add_resource(ResourceKind::kH2d, "gpu0.h2d", 0, 0);
  f.cpu = b.add_resource(ResourceKind::kCpuUpdate, "numa0.cpu_update.r0", 0, 0);
  f.g = b.take();
  return f;
}

Calibration round_calibration(const HardwareSpec& h) {
  Calibration c = default_calibration(h);
  c.gemm_efficiency = 0.5;
  c.gemm_half_rows = 0;
  c.expert_gemm_efficiency = 0.25;
  c.expert_half_rows = 0;
  c.attention_efficiency = 0.5;
  c.attention_backward_efficiency = 0.4;
  c.wide_attention_efficiency = 0.1;
  c.compute_overhead_s = 1e-3;
  c.expert_overhead_s = 1e-4;
  c.transfer_overhead_s = 0;
  c.cpu_task_overhead_s = 0;
  return c;
}

TEST(CalibratedDurationModel, PricesComputeAtCalibratedEfficiency) {
  const Fixture f = fixture();
  const CalibratedDurationModel m(two_socket_node(), round_calibration(two_socket_node()), 4);
  Stage s;
  s.resource = f.compute;
  s.op = OpKind::kGemm;
  s.flops = 500e12;
  s.shape.tokens = 4096;
  EXPECT_NEAR(m.duration_s(s, f.g), 1e-3 + 1.0, 1e-12);  // 500 TFLOP at 50% of 1000 TFLOP/s
  s.op = OpKind::kAttention;
  s.shape.head_dim = 256;
  EXPECT_NEAR(m.duration_s(s, f.g), 1e-3 + 1.0, 1e-12);
  s.phase = Phase::kBackward;
  EXPECT_NEAR(m.duration_s(s, f.g), 1e-3 + 1.25, 1e-12);  // backward kernel at 40%
  s.shape.head_dim = 512;
  EXPECT_NEAR(m.duration_s(s, f.g), 1e-3 + 5.0, 1e-12);   // memory-efficient kernel at 10%
  s.op = OpKind::kExpertGemm;
  s.shape.experts = 64;
  s.shape.tokens = 65536;
  EXPECT_NEAR(m.duration_s(s, f.g), 1e-3 + 64 * 1e-4 + 2.0, 1e-12);
}

TEST(CalibratedDurationModel, SmallGemmsReachLessOfThePeak) {
  const Fixture f = fixture();
  Calibration c = round_calibration(two_socket_node());
  c.gemm_half_rows = 1024;
  c.compute_overhead_s = 0;
  const CalibratedDurationModel m(two_socket_node(), c, 4);
  Stage s;
  s.resource = f.compute;
  s.op = OpKind::kGemm;
  s.flops = 500e12;
  s.shape.tokens = 1024;  // half of gemm_efficiency
  EXPECT_NEAR(m.duration_s(s, f.g), 2.0, 1e-12);
}

TEST(CalibratedDurationModel, CopiesUseAchievedLinkRatesPlusLatency) {
  const Fixture f = fixture();
  const CalibratedDurationModel m(two_socket_node(), round_calibration(two_socket_node()), 4);
  Stage s;
  s.resource = f.h2d;
  s.op = OpKind::kH2d;
  s.bytes = 50'000'000'000;
  EXPECT_NEAR(m.duration_s(s, f.g), 1.0 + 1e-5, 1e-12);
  s.op = OpKind::kD2h;
  EXPECT_NEAR(m.duration_s(s, f.g), 1.25 + 1e-5, 1e-12);
}

TEST(CalibratedDurationModel, RanksOnOneSocketShareItsCpuUpdateRate) {
  const Fixture f = fixture();
  const CalibratedDurationModel four_ranks(two_socket_node(), round_calibration(two_socket_node()), 4);
  const CalibratedDurationModel two_ranks(two_socket_node(), round_calibration(two_socket_node()), 2);
  Stage s;
  s.resource = f.cpu;
  s.op = OpKind::kCpuAdamW;
  s.params = 4'000'000'000;
  // Four ranks: two per socket, each gets half of 4 G params/s; two ranks: one per socket.
  EXPECT_NEAR(four_ranks.duration_s(s, f.g), 2.0, 1e-12);
  EXPECT_NEAR(two_ranks.duration_s(s, f.g), 1.0, 1e-12);
  const StageCost c = four_ranks.cost(s, f.g);
  EXPECT_DOUBLE_EQ(c.exclusive_rate, 4e9);
  EXPECT_DOUBLE_EQ(c.rate, 2e9);
}

TEST(CalibratedDurationModel, EachSeparateCopyOfATransferPaysTheLatency) {
  const Fixture f = fixture();
  Calibration c = round_calibration(two_socket_node());
  c.transfer_overhead_s = 1e-5;
  c.h2d_Bps = 25e9;
  const CalibratedDurationModel m(two_socket_node(), c, 4);
  Stage s;
  s.resource = f.h2d;
  s.op = OpKind::kH2d;
  s.bytes = 1'000'000'000;
  // One copy: 10 µs overhead + 10 µs PCIe latency + 1 GB at 25 GB/s; eight copies: eight times the fixed part.
  EXPECT_NEAR(m.duration_s(s, f.g), 2e-5 + 0.04, 1e-12);
  s.transfers = 8;
  EXPECT_NEAR(m.duration_s(s, f.g), 8 * 2e-5 + 0.04, 1e-12);
}

TEST(CalibratedDurationModel, SyncStagesCostNothing) {
  const Fixture f = fixture();
  const CalibratedDurationModel m(two_socket_node(), round_calibration(two_socket_node()), 4);
  Stage s;
  s.resource = f.compute;
  s.op = OpKind::kSync;
  EXPECT_EQ(m.duration_s(s, f.g), 0.0);
}

TEST(CalibratedDurationModel, MemoryBoundKernelsOfAComputeStageRunAtTheHbmRate) {
  const Fixture f = fixture();
  Calibration c = round_calibration(two_socket_node());
  c.hbm_efficiency = 0.5;  // 1 TB/s of the 2 TB/s HBM
  const CalibratedDurationModel m(two_socket_node(), c, 4);
  Stage s;
  s.resource = f.compute;
  s.op = OpKind::kGemm;
  s.flops = 500e12;
  s.shape.tokens = 4096;
  s.bytes = 250'000'000'000;  // 0.25 s of norms, activations and permutations
  EXPECT_NEAR(m.duration_s(s, f.g), 1e-3 + 1.0 + 0.25, 1e-12);
  const StageCost cost = m.cost(s, f.g);
  EXPECT_DOUBLE_EQ(cost.work, 500e12);  // one piece of work at one effective rate, for SimGrid too
  EXPECT_NEAR(cost.exclusive_rate, 500e12 / 1.25, 1.0);
  s.flops = 0;  // bytes only: priced like an element-wise stage
  EXPECT_NEAR(m.duration_s(s, f.g), 1e-3 + 0.25, 1e-12);
}

TEST(CalibratedDurationModel, CollectivesPayAFabricLatencyPerPeer) {
  StepGraphBuilder b(4, 2);
  const ResourceId fabric = b.add_resource(ResourceKind::kFabric, "gpu0.fabric", 0, -1);
  const StepGraph g = b.take();
  Calibration c = round_calibration(two_socket_node());
  c.collective_overhead_s = 1e-4;
  c.fabric_efficiency = 0.5;
  const CalibratedDurationModel m(two_socket_node(), c, 4);
  Stage s;
  s.resource = fabric;
  s.op = OpKind::kAllToAll;
  s.bytes = 200'000'000'000;  // 1 s at half of 400 GB/s
  s.peers = {0, 1};
  EXPECT_NEAR(m.duration_s(s, g), 1e-4 + 1 * 2e-6 + 1.0, 1e-12);
  s.peers = {0, 1, 2, 3};
  EXPECT_NEAR(m.duration_s(s, g), 1e-4 + 3 * 2e-6 + 1.0, 1e-12);
}

}  // namespace
}  // namespace oom
