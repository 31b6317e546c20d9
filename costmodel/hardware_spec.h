// HardwareSpec: a training node (or several identical nodes) as the cost model sees it.
//
// GPUs (count, HBM, BF16 dense FLOP/s, HBM bandwidth), each GPU's PCIe link to the host (H2D and
// D2H bandwidth, latency) and the CPU socket (= NUMA node) it hangs off, the GPU–GPU fabric
// (NVLink bandwidth per GPU, or PCIe peer-to-peer through the host bridge), the NUMA nodes
// (DRAM capacity and bandwidth, cores, CPU AdamW throughput) and, for multi-node specs, the
// inter-node network. Peak numbers come from datasheets; achieved numbers are estimates until
// calibration replaces them. Every number in a configs/hardware file names its source in the
// file's "sources" object. Plain value type.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "costmodel/units.h"

namespace oom {

struct GpuSpec {
  std::string name;
  Bytes hbm_bytes = 0;
  FlopsPerS bf16_flops_per_s = 0;  // dense BF16 tensor peak
  BytesPerS hbm_Bps = 0;
  // Last-level (L2) cache shared by the SMs; 0 when the spec does not state it (then kernels that
  // re-read operands are taken to find them in L2, see planner/engine/duration_model.h).
  Bytes l2_bytes = 0;
  // Rows at which a GEMM reaches half its large-GEMM rate, when measured (a device probed by
  // `oom calibrate --backend`); 0 when not stated: the calibration's GPU tile-fill estimates apply
  // (Calibration::gemm_half_rows, expert_half_rows).
  double gemm_half_rows = 0;
  bool operator==(const GpuSpec&) const = default;
};

struct PcieSpec {
  int generation = 0;
  BytesPerS h2d_Bps = 0;  // achieved host-to-device, pinned memory
  BytesPerS d2h_Bps = 0;
  Seconds latency_s = 0;
  // GPUs behind one PCIe switch, sharing its single x16 uplink to the CPU (1: a link per GPU).
  // The GPUs of a switch are consecutive and hang off one socket.
  int gpus_per_switch = 1;
  bool operator==(const PcieSpec&) const = default;
};

enum class FabricKind { kNvlink, kPciePeer };

struct FabricSpec {
  FabricKind kind = FabricKind::kPciePeer;
  BytesPerS per_gpu_Bps = 0;  // one direction per GPU (NVLink), or the peer path's PCIe rate
  Seconds latency_s = 0;
  bool operator==(const FabricSpec&) const = default;
};

struct NumaSpec {
  Bytes dram_bytes = 0;
  BytesPerS dram_Bps = 0;            // achievable DRAM bandwidth (STREAM-like)
  int cores = 0;
  double adamw_params_per_s = 0;     // CPU AdamW throughput of the whole socket
  double amx_bf16_flops_per_s = 0;   // AMX BF16 matrix peak of the whole socket (KT-FT's CPU experts); 0 = none
  bool operator==(const NumaSpec&) const = default;
};

struct NetworkSpec {
  BytesPerS per_node_Bps = 0;  // 0 for a single node
  Seconds latency_s = 0;
  bool operator==(const NetworkSpec&) const = default;
};

struct HardwareSpec {
  std::string name;
  std::string description;
  int nodes = 1;
  int gpus_per_node = 0;
  GpuSpec gpu;
  std::vector<int> gpu_numa;  // per GPU of a node: the NUMA node (socket) its PCIe link hangs off
  PcieSpec pcie;
  FabricSpec fabric;
  std::vector<NumaSpec> numa;  // per node
  NetworkSpec network;
  nlohmann::json sources;      // field path → source ("NVIDIA H100 datasheet", "estimate: ...")

  int total_gpus() const { return nodes * gpus_per_node; }
  // NUMA node of the node-local GPU index `gpu` (0-based within a node).
  int numa_of_gpu(int gpu) const { return gpu_numa.at(static_cast<std::size_t>(gpu % gpus_per_node)); }
  // The node-local GPUs that `ranks` training ranks use: spread evenly over the NUMA nodes
  // (round robin over sockets, lowest GPU index first), so that each rank's CPU work runs on its
  // own socket and a partial node uses every socket. Ranks beyond one node wrap to the next node.
  std::vector<int> rank_gpus(int ranks) const;
  // The GPU (global index over all nodes) of training rank r under rank_gpus().
  int global_gpu_of_rank(int rank, int ranks) const;
  // The PCIe switch (global index over all nodes) whose uplink carries the host copies of rank r.
  int pcie_switch_of_rank(int rank, int ranks) const { return global_gpu_of_rank(rank, ranks) / pcie.gpus_per_switch; }
  // NUMA node of training rank r under rank_gpus().
  int numa_of_rank(int rank, int ranks) const;
  // Ranks per NUMA node (of the first node) for `ranks` ranks.
  std::vector<int> ranks_per_numa(int ranks) const;
  bool operator==(const HardwareSpec&) const = default;
};

// Parses a hardware JSON object. Throws InputError naming the field.
HardwareSpec hardware_spec_from_json(const nlohmann::json& j, const std::string& file);
nlohmann::json hardware_spec_to_json(const HardwareSpec& h);
// Loads configs/hardware/NAME.json or a path. Throws InputError for unknown names or bad files.
HardwareSpec load_hardware_spec(const std::string& name_or_path);
// Field paths of the numeric fields that the "sources" object must name.
std::vector<std::string> hardware_numeric_fields(const HardwareSpec& h);

}  // namespace oom
