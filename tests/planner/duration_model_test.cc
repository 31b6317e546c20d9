// Tests of planner/engine/duration_model.h: each operator kind is priced from the hardware peak and the
// calibration constants as documented, sockets are shared fairly between the ranks on them.
#include "planner/engine/duration_model.h"

#include <algorithm>
#include <utility>

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

// `nodes` of two_socket_node(), each with 2 NICs of 25 GB/s, 5 µs NIC to NIC under one switch.
HardwareSpec two_socket_nodes(int nodes) {
  HardwareSpec h = two_socket_node();
  h.nodes = nodes;
  h.network.nics = 2;
  h.network.nic_Bps = 25e9;
  h.network.latency_s = 5e-6;
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

// A window shorter than the sequence runs the windowed kernel, forward at its own efficiency and
// backward slower than the flash backward by the same factor; a window that covers the sequence,
// or none, runs the flash kernel; past head dim 256 the memory-efficient kernel, window or not.
TEST(CalibratedDurationModel, AWindowShorterThanItsSequenceRunsTheWindowedKernel) {
  const Fixture f = fixture();
  Calibration c = round_calibration(two_socket_node());
  c.windowed_attention_efficiency = 0.25;
  c.attention_half_keys = 0;  // no key-span ramp: the efficiencies alone
  const CalibratedDurationModel m(two_socket_node(), c, 4);
  Stage s;
  s.resource = f.compute;
  s.op = OpKind::kAttention;
  s.flops = 500e12;
  s.shape.head_dim = 256;
  s.shape.seq_len = 4096;
  s.shape.window = 4096;
  EXPECT_NEAR(m.duration_s(s, f.g), 1e-3 + 1.0, 1e-12);  // flash at 50 %
  s.shape.window = 0;
  EXPECT_NEAR(m.duration_s(s, f.g), 1e-3 + 1.0, 1e-12);
  s.shape.window = 1024;
  EXPECT_NEAR(m.duration_s(s, f.g), 1e-3 + 2.0, 1e-12);  // windowed at 25 %
  s.phase = Phase::kBackward;
  EXPECT_NEAR(m.duration_s(s, f.g), 1e-3 + 2.5, 1e-12);  // 40 % · 25 / 50
  s.phase = Phase::kForward;
  s.shape.head_dim = 512;
  EXPECT_NEAR(m.duration_s(s, f.g), 1e-3 + 5.0, 1e-12);  // memory-efficient at 10 %
}

// Each operator a compute stage dispatches (Stage::ops) adds operator_overhead_s to its fixed
// cost; at the default 0 (a GPU's host runs ahead of its stream) the count changes nothing.
TEST(CalibratedDurationModel, ChargesDispatchPerOperator) {
  const Fixture f = fixture();
  Calibration c = round_calibration(two_socket_node());
  Stage s;
  s.resource = f.compute;
  s.op = OpKind::kGemm;
  s.flops = 500e12;
  s.shape.tokens = 4096;
  s.ops = 300;
  EXPECT_NEAR(CalibratedDurationModel(two_socket_node(), c, 4).duration_s(s, f.g), 1e-3 + 1.0, 1e-12);
  c.operator_overhead_s = 2e-6;
  const CalibratedDurationModel m(two_socket_node(), c, 4);
  EXPECT_NEAR(m.duration_s(s, f.g), 1e-3 + 300 * 2e-6 + 1.0, 1e-12);
  s.op = OpKind::kElementwise;
  s.flops = 0;
  s.bytes = 0;
  s.ops = 10;
  EXPECT_NEAR(m.duration_s(s, f.g), 1e-3 + 10 * 2e-6, 1e-12);
}

TEST(CalibratedDurationModel, MemoryEfficientAttentionRereadsKAndVPastL2) {
  OpShape shape;
  shape.heads = 16;
  shape.head_dim = 512;
  shape.seqs = 2;
  const Bytes l2 = 50 * kMiB;
  const double kv_row = 2.0 * 512 * 2;  // K and V, BF16
  shape.seq_len = 16384;                // one head's K and V: 32 MiB, within L2
  EXPECT_EQ(memory_efficient_attention_hbm_rereads(shape, l2), 0);
  shape.seq_len = 65536;  // 128 MiB: 1 − 50/128 of the re-reads miss
  const double tiles = 65536.0 / kMemoryEfficientAttentionQueriesPerTile;
  EXPECT_NEAR(static_cast<double>(memory_efficient_attention_hbm_rereads(shape, l2)),
              16 * 2 * tiles * (65536.0 / 2) * kv_row * (1 - 50.0 / 128), 1e3);
  EXPECT_EQ(memory_efficient_attention_hbm_rereads(shape, 0), 0);  // no L2 stated
  shape.window = 4096;  // a window short enough for L2 again
  EXPECT_EQ(memory_efficient_attention_hbm_rereads(shape, l2), 0);
}

TEST(CalibratedDurationModel, WideAttentionForwardSlowsPerFlopAsItsKeysOutgrowL2) {
  const Fixture f = fixture();
  HardwareSpec h = two_socket_node();
  h.gpu.l2_bytes = 50 * kMiB;
  Calibration c = round_calibration(h);
  c.compute_overhead_s = 0;
  c.attention_half_keys = 0;
  const CalibratedDurationModel m(h, c, 4);
  Stage s;
  s.resource = f.compute;
  s.op = OpKind::kAttention;
  s.shape.heads = 16;
  s.shape.head_dim = 512;
  s.shape.seqs = 1;
  auto seconds_per_flop = [&](std::int64_t L, Phase phase) {
    s.shape.seq_len = L;
    s.phase = phase;
    s.flops = 2.0 * static_cast<double>(L) * static_cast<double>(L) * 512 * 16;  // causal forward
    return m.duration_s(s, f.g) / s.flops;
  };
  const double arithmetic = 1 / (1000e12 * 0.1);
  EXPECT_NEAR(seconds_per_flop(16384, Phase::kForward), arithmetic, 1e-9 * arithmetic);  // K, V in L2
  const double at_64k = seconds_per_flop(65536, Phase::kForward), at_256k = seconds_per_flop(262144, Phase::kForward);
  EXPECT_GT(at_64k, 1.05 * arithmetic);
  EXPECT_GT(at_256k, 1.05 * at_64k);
  EXPECT_NEAR(seconds_per_flop(262144, Phase::kRecompute), at_256k, 1e-9 * at_256k);  // the same kernel
  EXPECT_NEAR(seconds_per_flop(262144, Phase::kBackward), arithmetic, 1e-9 * arithmetic);  // not modelled
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

TEST(CalibratedDurationModel, ASocketsSpilledStateRunsAtTheSocketLinksRate) {
  Fixture f = fixture();
  HardwareSpec h = two_socket_node();  // 1,000 GiB per socket, 4 G params/s
  h.socket_link_Bps = 28e9;            // 2 G params/s of AdamW's 14 B each way
  const CalibratedDurationModel m(h, round_calibration(h), 2);  // one rank per socket
  Stage s;
  s.resource = f.cpu;
  s.op = OpKind::kCpuAdamW;
  s.params = 4'000'000'000;
  // A state that fits its socket stays local: the socket's rate.
  f.g.numa_base_bytes = {800 * kGiB, 0};
  EXPECT_NEAR(m.duration_s(s, f.g), 1.0, 1e-12);
  // 1,250 GiB: a fifth of it spills to socket 1 and runs at the links' 2 G/s.
  f.g.numa_base_bytes = {1250 * kGiB, 0};
  EXPECT_DOUBLE_EQ(spilled_state_fraction(h, f.g, 0), 0.2);
  EXPECT_NEAR(m.duration_s(s, f.g), 0.8 * 1.0 + 0.2 * 2.0, 1e-12);
  EXPECT_NEAR(m.cost(s, f.g).exclusive_rate, 4e9 / 1.2, 1e-3);
  // Links faster than the cores: a remote parameter costs what a local one does.
  h.socket_link_Bps = 128e9;
  EXPECT_NEAR(CalibratedDurationModel(h, round_calibration(h), 2).duration_s(s, f.g), 1.0, 1e-12);
  // Links not stated: nothing is priced as remote.
  h.socket_link_Bps = 0;
  EXPECT_EQ(spilled_state_fraction(h, f.g, 0), 0.0);
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

TEST(CalibratedDurationModel, MembersOnOtherNodesAreReachedThroughTheNics) {
  // Two nodes of two_socket_node(), each with 2 NICs of 25 GB/s (50 GB/s per node) behind one
  // leaf, 5 µs NIC to NIC. Rank 0's collective over ranks 0-7: 3 peers on its node, 4 beyond it.
  HardwareSpec h = two_socket_nodes(2);
  StepGraphBuilder b(8, 4);
  const ResourceId fabric = b.add_resource(ResourceKind::kFabric, "gpu0.fabric", 0, -1);
  const StepGraph g = b.take();
  Calibration c = round_calibration(h);
  c.collective_overhead_s = 1e-4;
  c.fabric_efficiency = 0.5;  // 200 GB/s
  const CalibratedDurationModel m(h, c, 8);
  Stage s;
  s.resource = fabric;
  s.gpu = 0;
  s.op = OpKind::kAllToAll;
  s.bytes = 7'000'000'000;
  s.peers = {0, 1, 2, 3, 4, 5, 6, 7};
  // All-to-all: 4/7 of the bytes (4 GB) leave the node on its NICs, shared by its 4 members
  // (12.5 GB/s each): 0.32 s; the fabric's 3 GB at 200 GB/s finish first.
  const Seconds fixed = 1e-4 + 3 * 2e-6 + 4 * 5e-6;
  EXPECT_NEAR(m.duration_s(s, g), fixed + 4e9 / 12.5e9, 1e-12);
  // A ring all-gather (a channel per NIC): the node's inter-node hops carry, over all channels,
  // what one member sends: 7 GB at the node's 50 GB/s.
  s.op = OpKind::kAllGather;
  EXPECT_NEAR(m.duration_s(s, g), fixed + 7e9 / 50e9, 1e-12);
  // Alone on its port (what the SimGrid engine starts from) the member runs at the fabric's rate.
  EXPECT_DOUBLE_EQ(m.cost(s, g).exclusive_rate, 200e9);
  // Across a 2:1 oversubscribed spine (one node per leaf) the NICs deliver half.
  h.network.topology = NetworkTopology::kLeafSpine;
  h.network.nodes_per_leaf = 1;
  h.network.oversubscription = 2;
  h.network.switch_latency_s = 1e-6;
  const CalibratedDurationModel spine(h, c, 8);
  EXPECT_NEAR(spine.duration_s(s, g), 1e-4 + 3 * 2e-6 + 4 * 7e-6 + 7e9 / 25e9, 1e-12);
  // A ring with one member on the node (an expert shard's replicas over EP groups) runs beside the
  // node's other three rings: its share of the NICs is a quarter, 12.5 GB/s.
  s.peers = {0, 4};
  EXPECT_NEAR(m.duration_s(s, g), 1e-4 + 5e-6 + 7e9 / 12.5e9, 1e-12);
  s.peers = {0, 1, 4, 5};  // two members on the node: half
  EXPECT_NEAR(m.duration_s(s, g), 1e-4 + 2e-6 + 2 * 5e-6 + 7e9 / 25e9, 1e-12);
}

TEST(CalibratedDurationModel, ConsecutiveMembersArePricedAsAnyOtherOrderOfThem) {
  // Eight nodes of four GPUs on a fat tree (two nodes per leaf, two leaves per pod, oversubscribed
  // tiers): a collective over consecutive ranks is counted per node; listing the same members in
  // another order takes the member-by-member count. Both give the same duration for every member
  // and every run of members.
  HardwareSpec h = two_socket_nodes(8);
  h.network.switch_latency_s = 1e-6;
  h.network.topology = NetworkTopology::kFatTree;
  h.network.nodes_per_leaf = 2;
  h.network.leaves_per_pod = 2;
  h.network.oversubscription = 2;
  h.network.core_oversubscription = 1.5;
  StepGraphBuilder b(32, 16);
  const ResourceId fabric = b.add_resource(ResourceKind::kFabric, "gpu0.fabric", 0, -1);
  const StepGraph g = b.take();
  const CalibratedDurationModel m(h, default_calibration(h), 32);
  for (const auto& [first, last] : {std::pair{0, 31}, {4, 27}, {13, 18}, {8, 11}, {6, 9}}) {
    for (int gpu = first; gpu <= last; ++gpu) {
      for (const OpKind op : {OpKind::kAllToAll, OpKind::kAllGather}) {
        Stage s;
        s.resource = fabric;
        s.gpu = gpu;
        s.op = op;
        s.bytes = 1'000'000'000;
        std::vector<int> peers;
        for (int q = first; q <= last; ++q) peers.push_back(q);
        s.peers = peers;
        const Seconds consecutive = m.duration_s(s, g);
        std::reverse(peers.begin(), peers.end());
        s.peers = peers;
        EXPECT_DOUBLE_EQ(m.duration_s(s, g), consecutive) << first << "-" << last << " gpu " << gpu;
      }
    }
  }
}

}  // namespace
}  // namespace oom
