// HardwareSpec: shipped node configs load, every number names its source, rank placement.
#include "costmodel/hardware_spec.h"
#include "costmodel/workload.h"

#include <gtest/gtest.h>

#include "costmodel/config_paths.h"
#include "costmodel/input_error.h"
#include "costmodel/json_input.h"

namespace oom {
namespace {

TEST(HardwareSpec, EveryShippedSpecLoadsAndNamesASourceForEveryNumber) {
  const auto names = config_names("hardware");
  ASSERT_GE(names.size(), 4u);
  for (const auto& name : names) {
    const HardwareSpec h = load_hardware_spec(name);
    for (const auto& field : hardware_numeric_fields(h)) {
      ASSERT_TRUE(h.sources.contains(field)) << name << " has no source for " << field;
      EXPECT_FALSE(h.sources[field].get<std::string>().empty()) << name << " " << field;
    }
    EXPECT_TRUE(h.sources.contains("gpu_numa")) << name;
  }
}

TEST(HardwareSpec, H100NodeMatchesThePublishedRuns) {
  const HardwareSpec h = load_hardware_spec("h100-sxm-node");
  EXPECT_EQ(h.gpus_per_node, 8);
  EXPECT_EQ(h.gpu.hbm_bytes, 80 * kGiB);
  EXPECT_DOUBLE_EQ(h.gpu.bf16_flops_per_s, 989.4e12);
  EXPECT_EQ(h.gpu.l2_bytes, 50 * kMiB);
  ASSERT_EQ(h.numa.size(), 2u);
  EXPECT_EQ(h.numa[0].dram_bytes, 1008 * kGiB);
  EXPECT_EQ(h.numa[1].cores, 48);
  EXPECT_EQ(h.fabric.kind, FabricKind::kNvlink);
}

TEST(HardwareSpec, RtxNodeHasNoNvlink) {
  const HardwareSpec h = load_hardware_spec("rtx4090-node");
  EXPECT_EQ(h.gpus_per_node, 4);
  EXPECT_EQ(h.fabric.kind, FabricKind::kPciePeer);
  EXPECT_EQ(h.numa[0].dram_bytes, 503 * kGiB);
}

TEST(HardwareSpec, RanksSpreadOverSocketsSoFourOfEightGpusUseBothSockets) {
  const HardwareSpec h = load_hardware_spec("h100-sxm-node");  // GPUs 0-3 on socket 0, 4-7 on socket 1
  EXPECT_EQ(h.rank_gpus(4), (std::vector<int>{0, 4, 1, 5}));
  EXPECT_EQ(h.ranks_per_numa(4), (std::vector<int>{2, 2}));
  EXPECT_EQ(h.ranks_per_numa(1), (std::vector<int>{1, 0}));
  EXPECT_EQ(h.ranks_per_numa(8), (std::vector<int>{4, 4}));
  EXPECT_EQ(h.numa_of_rank(1, 4), 1);
}

TEST(HardwareSpec, FilledRanksTakeTheFirstGpusAndTheirSocket) {
  HardwareSpec h = load_hardware_spec("h100-sxm-node");
  h.rank_placement = RankPlacement::kFill;  // local rank i on device i (torchrun's LOCAL_RANK)
  EXPECT_EQ(h.rank_gpus(4), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(h.ranks_per_numa(4), (std::vector<int>{4, 0}));
  EXPECT_EQ(h.ranks_per_numa(8), (std::vector<int>{4, 4}));
  EXPECT_EQ(h.numa_of_rank(3, 4), 0);
  // Written and read back.
  const HardwareSpec back = hardware_spec_from_json(hardware_spec_to_json(h), "h.json");
  EXPECT_EQ(back.rank_placement, RankPlacement::kFill);
  EXPECT_EQ(back.socket_link_Bps, h.socket_link_Bps);
  EXPECT_GT(h.socket_link_Bps, 0);  // 4 UPI links at 16 GT/s (sourced in the file)
  EXPECT_EQ(h.node_numa_label(0), "NUMA nodes 0-1");
}

TEST(HardwareSpec, PairsOfGpusShareAPcieSwitchAndRanksFindTheirs) {
  const HardwareSpec h = load_hardware_spec("h100-sxm-node");
  EXPECT_EQ(h.pcie.gpus_per_switch, 2);
  // Ranks 0-3 use GPUs 0, 4, 1, 5: ranks 0 and 2 share switch 0, ranks 1 and 3 switch 2.
  EXPECT_EQ(h.pcie_switch_of_rank(0, 4), 0);
  EXPECT_EQ(h.pcie_switch_of_rank(2, 4), 0);
  EXPECT_EQ(h.pcie_switch_of_rank(1, 4), 2);
  EXPECT_EQ(h.pcie_switch_of_rank(3, 4), 2);
  const HardwareSpec two = load_hardware_spec("h100-sxm-2node");
  EXPECT_EQ(two.global_gpu_of_rank(9, 16), 12);  // rank 9 is the second node's rank 1: its GPU 4
  EXPECT_EQ(two.pcie_switch_of_rank(9, 16), 6);
  EXPECT_EQ(load_hardware_spec("rtx4090-node").pcie.gpus_per_switch, 1);
}

TEST(HardwareSpec, ASwitchMustDivideTheGpusAndStayOnOneSocket) {
  nlohmann::json j = hardware_spec_to_json(load_hardware_spec("h100-sxm-node"));
  j["pcie"]["gpus_per_switch"] = 3;
  try {
    hardware_spec_from_json(j, "hw.json");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()), "hw.json: field 'pcie.gpus_per_switch': value 3: must divide gpu.count 8");
  }
  j["pcie"]["gpus_per_switch"] = 8;  // GPUs 0-3 and 4-7 hang off different sockets
  EXPECT_THROW(hardware_spec_from_json(j, "hw.json"), InputError);
}

TEST(HardwareSpec, MultiNodeSpecNeedsANetwork) {
  nlohmann::json j = hardware_spec_to_json(load_hardware_spec("h100-sxm-2node"));
  EXPECT_EQ(hardware_spec_from_json(j, "x.json").total_gpus(), 16);
  j.erase("network");
  try {
    hardware_spec_from_json(j, "x.json");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()), "x.json: field 'nodes': value 2: a multi-node spec needs a network (network.nic)");
  }
}

TEST(HardwareSpec, AClusterSpecRepeatsItsNodeOnItsNetwork) {
  const HardwareSpec node = load_hardware_spec("h200-sxm-node");
  const HardwareSpec c = load_hardware_spec("h200-sxm-12node");
  EXPECT_EQ(c.nodes, 12);
  EXPECT_EQ(c.total_gpus(), 96);
  EXPECT_EQ(c.node_name, "h200-sxm-node");
  EXPECT_EQ(node.node_name, "h200-sxm-node");
  EXPECT_EQ(c.gpu, node.gpu);
  EXPECT_EQ(c.numa, node.numa);
  EXPECT_EQ(c.network, node.network);
  EXPECT_EQ(c.network.nics, 8);
  EXPECT_EQ(c.network.nic_attach, NicAttach::kPcieSwitch);
  EXPECT_TRUE(c.network.rail_optimized);
  EXPECT_DOUBLE_EQ(c.network.per_node_Bps(), 8 * 45e9);
  EXPECT_EQ(with_nodes(node, 12, "w.json", "nodes"), [&] {
    HardwareSpec h = c;
    h.name = node.name;
    h.description = node.description;
    return h;
  }());
  EXPECT_EQ(load_hardware_spec("h100-sxm-2node").node_name, "h100-sxm-node");
}

TEST(HardwareSpec, LeafSpineAndFatTreePathsCountTheirSwitches) {
  const NetworkSpec n = load_hardware_spec("h200-sxm-96node").network;  // 32 nodes per leaf
  EXPECT_EQ(n.switches_between(3, 3), 0);
  EXPECT_EQ(n.switches_between(0, 31), 1);
  EXPECT_EQ(n.switches_between(31, 32), 3);
  EXPECT_DOUBLE_EQ(n.latency_between(0, 31), 5e-6);
  EXPECT_DOUBLE_EQ(n.latency_between(0, 95), 5e-6 + 2 * 6e-7);
  EXPECT_DOUBLE_EQ(n.sustained_Bps(0, 95), n.per_node_Bps());  // non-blocking
  NetworkSpec f = n;
  f.topology = NetworkTopology::kFatTree;
  f.nodes_per_leaf = 4;
  f.leaves_per_pod = 2;
  f.oversubscription = 2;
  f.core_oversubscription = 4;
  EXPECT_EQ(f.pod_of_node(7), 0);
  EXPECT_EQ(f.pod_of_node(8), 1);
  EXPECT_EQ(f.switches_between(0, 3), 1);
  EXPECT_EQ(f.switches_between(0, 4), 3);
  EXPECT_EQ(f.switches_between(0, 8), 5);
  EXPECT_DOUBLE_EQ(f.sustained_Bps(0, 3), f.per_node_Bps());
  EXPECT_DOUBLE_EQ(f.sustained_Bps(0, 4), f.per_node_Bps() / 2);
  EXPECT_DOUBLE_EQ(f.sustained_Bps(0, 8), f.per_node_Bps() / 8);
  EXPECT_DOUBLE_EQ(f.latency_between(0, 8), 5e-6 + 4 * 6e-7);
}

TEST(HardwareSpec, NodesOverrideNeedsANetwork) {
  const HardwareSpec h = with_nodes(load_hardware_spec("h100-sxm-node"), 3, "w.json", "nodes");
  EXPECT_EQ(h.total_gpus(), 24);
  try {
    with_nodes(load_hardware_spec("rtx4090-node"), 2, "w.json", "nodes");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()), "w.json: field 'nodes': value 2: hardware rtx4090-node has no network (network.nic) to join 2 nodes");
  }
}

// torchrun's --nproc-per-node 2 on an HGX H100 node runs on CUDA devices 0 and 1: both on socket 0,
// behind one PCIe switch; two such nodes hold four ranks, two on each node's socket 0.
TEST(HardwareSpec, GpusPerNodeKeepsEachNodesFirstGpus) {
  const HardwareSpec full = with_nodes(load_hardware_spec("h100-sxm-node"), 2, "w.json", "nodes");
  const HardwareSpec h = with_gpus_per_node(full, 2, "w.json", "gpus_per_node");
  EXPECT_EQ(h.gpus_per_node, 2);
  EXPECT_EQ(h.total_gpus(), 4);
  EXPECT_EQ(h.gpu_numa, (std::vector<int>{0, 0}));
  EXPECT_EQ(h.pcie.gpus_per_switch, 2);
  EXPECT_EQ(h.nodes_used(4), 2);
  EXPECT_EQ(h.ranks_per_numa(4), (std::vector<int>{2, 0, 2, 0}));
  EXPECT_EQ(h.numa_of_rank(3, 4), 2);  // node 1's socket 0
  EXPECT_EQ(with_gpus_per_node(full, 1, "w.json", "gpus_per_node").pcie.gpus_per_switch, 1);
  EXPECT_EQ(with_gpus_per_node(full, 8, "w.json", "gpus_per_node"), full);
  const auto error = [&](int gpus) {
    try {
      with_gpus_per_node(full, gpus, "w.json", "gpus_per_node");
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(error(9), "w.json: field 'gpus_per_node': value 9: must be 1 to the 8 GPUs of a h100-sxm-node node");
  EXPECT_EQ(error(3), "w.json: field 'gpus_per_node': value 3: must fill whole PCIe switches of 2 GPUs on a h100-sxm-node node");
  Workload w;
  w.model = "qwen3.6-35b-a3b";
  w.hardware = "h100-sxm-node";
  w.gpus = 6;
  w.global_batch = 6;
  w.seq_len = 4096;
  w.nodes = 2;
  w.gpus_per_node = 2;
  EXPECT_EQ(workload_from_json(workload_to_json(w), "w.json"), w);
  try {
    resolve_workload(w, "w.json");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()), "w.json: field 'gpus': value 6: hardware h100-sxm-node has 4 GPUs");
  }
}

TEST(HardwareSpec, HostNumaNodesAreNumberedOverTheCluster) {
  const HardwareSpec h = load_hardware_spec("h100-sxm-2node");
  EXPECT_EQ(h.host_numa_count(4), 2);
  EXPECT_EQ(h.host_numa_count(12), 4);
  EXPECT_EQ(h.ranks_per_numa(4), (std::vector<int>{2, 2}));
  EXPECT_EQ(h.ranks_per_numa(12), (std::vector<int>{4, 4, 2, 2}));
  EXPECT_EQ(h.ranks_per_numa(16), (std::vector<int>{4, 4, 4, 4}));
  // Rank 9 is node 1's rank 1: GPU 4 of that node, on its socket 1.
  EXPECT_EQ(h.numa_of_rank(9, 16), 3);
  EXPECT_EQ(h.numa_of_rank(8, 16), 2);
  EXPECT_EQ(h.node_of_numa(3), 1);
  EXPECT_EQ(h.numa_label(3), "node 1 NUMA node 1");
  EXPECT_EQ(load_hardware_spec("h100-sxm-node").numa_label(1), "NUMA node 1");
  EXPECT_EQ(h.numa_spec(3), h.numa[1]);
}

TEST(HardwareSpec, NicsBehindSwitchesMustSpreadEvenly) {
  nlohmann::json j = hardware_spec_to_json(load_hardware_spec("h200-sxm-node"));
  j["network"]["nic"]["count"] = 6;
  try {
    hardware_spec_from_json(j, "hw.json");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()),
              "hw.json: field 'network.nic.count': value 6: must be a multiple of the node's 4 PCIe switches (pcie.gpus_per_switch) to hang behind them");
  }
  j["network"]["nic"]["attach"] = "socket";
  EXPECT_EQ(hardware_spec_from_json(j, "hw.json").network.nics, 6);
  j["network"]["topology"]["kind"] = "torus";
  EXPECT_THROW(hardware_spec_from_json(j, "hw.json"), InputError);
}

TEST(HardwareSpec, AClusterOfAnUnknownNodeNamesTheField) {
  const nlohmann::json j = {{"name", "c"}, {"node", "no-such-node"}, {"nodes", 2}};
  try {
    hardware_spec_from_json(j, "c.json");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("c.json: field 'node': value \"no-such-node\": unknown hardware (known: ", 0), 0u) << e.what();
  }
  const nlohmann::json typo = {{"name", "c"}, {"node", "h200-sxm-node"}, {"nodes", 2}, {"netwrok", 1}};
  EXPECT_THROW(hardware_spec_from_json(typo, "c.json"), InputError);
}

TEST(HardwareSpec, JsonRoundTripIsExact) {
  for (const auto& name : config_names("hardware")) {
    const HardwareSpec h = load_hardware_spec(name);
    EXPECT_EQ(hardware_spec_from_json(hardware_spec_to_json(h), "rt"), h) << name;
  }
}

TEST(HardwareSpec, GpuNumaOutOfRangeNamesTheEntry) {
  nlohmann::json j = hardware_spec_to_json(load_hardware_spec("rtx4090-node"));
  j["gpu_numa"][3] = 5;
  try {
    hardware_spec_from_json(j, "hw.json");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()), "hw.json: field 'gpu_numa[3]': value 5: out of range 0..1");
  }
}

// "provenance" (oom hardware probe): each key a field of the spec, each value measured or assumed;
// the spec is the same with or without it, and anything else is one error naming the field.
TEST(HardwareSpec, ProvenanceMarksFieldsMeasuredOrAssumed) {
  nlohmann::json j = read_json_file(*resolve_config("hardware", "local-cpu"));
  const HardwareSpec plain = hardware_spec_from_json(j, "hw.json");
  j["provenance"] = {{"numa.cores", "measured"}, {"gpu.bf16_flops", "assumed"}, {"gpu_numa", "assumed"}};
  EXPECT_EQ(hardware_spec_from_json(j, "hw.json"), plain);
  const auto error = [](const nlohmann::json& spec) {
    try {
      hardware_spec_from_json(spec, "hw.json");
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  nlohmann::json bad = j;
  bad["provenance"]["numa.cores"] = "guessed";
  EXPECT_EQ(error(bad), "hw.json: field 'provenance.numa.cores': value \"guessed\": expected one of measured, assumed");
  bad = j;
  bad["provenance"]["gpu.warp_size"] = "measured";
  EXPECT_EQ(error(bad), "hw.json: field 'provenance.gpu.warp_size': value \"measured\": unknown field");
  bad = j;
  bad["provenance"] = "measured";
  EXPECT_NE(error(bad).find("field 'provenance'"), std::string::npos) << error(bad);
}

}  // namespace
}  // namespace oom
