// HardwareSpec: shipped node configs load, every number names its source, rank placement.
#include "costmodel/hardware_spec.h"

#include <gtest/gtest.h>

#include "costmodel/config_paths.h"
#include "costmodel/input_error.h"

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
  j["network"]["per_node_Bps"] = 0;
  EXPECT_THROW(hardware_spec_from_json(j, "x.json"), InputError);
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

}  // namespace
}  // namespace oom
