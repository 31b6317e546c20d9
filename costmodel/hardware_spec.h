// HardwareSpec: a training node (or several identical nodes) as the cost model sees it.
//
// GPUs (count, HBM, BF16 dense FLOP/s, HBM bandwidth), each GPU's PCIe link to the host (H2D and
// D2H bandwidth, latency) and the CPU socket (= NUMA node) it hangs off, the GPU–GPU fabric
// (NVLink bandwidth per GPU, or PCIe peer-to-peer through the host bridge), the NUMA nodes
// (DRAM capacity and bandwidth, cores, CPU AdamW throughput) and, for multi-node specs, the
// inter-node network. Peak numbers come from datasheets; achieved numbers are estimates until
// calibration replaces them. Every number in a configs/hardware file names its source in the
// file's "sources" object (field path → free text, the one object whose keys are not checked; an
// unknown key anywhere else is an error). Plain value type.
#pragma once

#include <string>
#include <string_view>
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
  // The GPU architecture (e.g. "hopper", "ada"); "" when not stated. GPUs of one architecture run
  // the same kernels on the same SMs, so a calibration fitted on one carries over to the others
  // (planner/calibration/calibration.h, transfer_calibration()).
  std::string architecture;
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

// Where a node's NICs hang: off a CPU socket (traffic to a GPU crosses the socket's bridge and
// the GPU's PCIe link), or behind the PCIe switches of the GPUs (GPUDirect RDMA: a GPU's traffic
// to the NIC of its switch stays below the switch and never reaches the CPU's uplink).
enum class NicAttach { kSocket, kPcieSwitch };

// How the nodes' NICs are switched: one switch for every node; a two-tier leaf–spine (folded
// Clos) with `nodes_per_leaf` nodes under each leaf; or a three-tier fat tree whose pods of
// `leaves_per_pod` leaves meet at core switches.
enum class NetworkTopology { kSingleSwitch, kLeafSpine, kFatTree };

// The inter-node network of a multi-node spec: the NICs of each node and the switches between
// the nodes. A spec without NICs (nics == 0) is a single node that cannot be repeated.
struct NetworkSpec {
  int nics = 0;               // NICs per node carrying training traffic
  BytesPerS nic_Bps = 0;      // achieved per NIC, each direction
  NicAttach nic_attach = NicAttach::kSocket;
  // Rail-optimized: NIC i of every node hangs off the same leaf switch (rail i), so traffic between
  // NICs of the same index never leaves the leaf tier; each leaf count below is per rail.
  bool rail_optimized = false;
  NetworkTopology topology = NetworkTopology::kSingleSwitch;
  int nodes_per_leaf = 0;          // leaf–spine and fat tree
  int leaves_per_pod = 0;          // fat tree
  double oversubscription = 1.0;   // a leaf's downlink : uplink bandwidth (1: non-blocking)
  double core_oversubscription = 1.0;  // fat tree: a pod's downlink : uplink to the core
  Seconds latency_s = 0;           // NIC to NIC through one switch
  Seconds switch_latency_s = 0;    // each further switch on a path

  BytesPerS per_node_Bps() const { return nics * nic_Bps; }
  // The leaf (per rail) and pod of a node; 0 under a single switch.
  int leaf_of_node(int node) const;
  int pod_of_node(int node) const;
  // Switches on the path between the NICs of two nodes: 0 within a node, 1 under one leaf, 3
  // across the spine, 5 across a fat tree's core.
  int switches_between(int node_a, int node_b) const;
  // NIC-to-NIC latency between two nodes: latency_s, plus switch_latency_s per further switch.
  Seconds latency_between(int node_a, int node_b) const;
  // What one node sustains to another when every node sends across the same tier at once: the
  // node's NIC rate divided by the oversubscription of each tier above the leaves that it crosses.
  BytesPerS sustained_Bps(int node_a, int node_b) const;
  bool operator==(const NetworkSpec&) const = default;
};

// Which GPUs a job of fewer ranks than the node's GPUs takes. kSpread: round robin over the
// sockets, lowest GPU index first (each socket's CPU shared by as few ranks as possible). kFill:
// GPUs 0, 1, 2, ... in index order, as a launcher that maps local rank i to device i does
// (torchrun's LOCAL_RANK with torch.cuda.set_device), so a half node sits on the sockets its first
// GPUs hang off.
enum class RankPlacement { kSpread, kFill };

std::string_view nic_attach_name(NicAttach a);
std::string_view network_topology_name(NetworkTopology t);

struct HardwareSpec {
  std::string name;
  std::string description;
  int nodes = 1;
  int gpus_per_node = 0;
  GpuSpec gpu;
  std::vector<int> gpu_numa;  // per GPU of a node: the NUMA node (socket) its PCIe link hangs off
  RankPlacement rank_placement = RankPlacement::kSpread;
  // What the links between a node's sockets (Intel UPI, AMD xGMI) carry per direction in all, the
  // path of every access a socket's cores make to another socket's DRAM; 0 when not stated (then
  // a remote byte is taken to cost what a local one does).
  BytesPerS socket_link_Bps = 0;
  PcieSpec pcie;
  FabricSpec fabric;
  std::vector<NumaSpec> numa;  // per node
  NetworkSpec network;
  // The node spec a cluster spec repeats ("node" in its file), else the spec's own name: the
  // calibration of that node applies to every cluster of it (planner/calibration/calibration.h).
  std::string node_name;
  nlohmann::json sources;      // field path → source ("NVIDIA H100 datasheet", "estimate: ...")

  int total_gpus() const { return nodes * gpus_per_node; }
  // NUMA node of the node-local GPU index `gpu` (0-based within a node).
  int numa_of_gpu(int gpu) const { return gpu_numa.at(static_cast<std::size_t>(gpu % gpus_per_node)); }
  // The node-local GPUs that `ranks` training ranks use, by rank_placement: spread evenly over the
  // NUMA nodes (round robin over sockets, lowest GPU index first), so that a partial node uses
  // every socket; or the first GPUs in index order. Ranks beyond one node wrap to the next node.
  std::vector<int> rank_gpus(int ranks) const;
  // The GPU (global index over all nodes) of training rank r under rank_gpus().
  int global_gpu_of_rank(int rank, int ranks) const;
  // The PCIe switch (global index over all nodes) whose uplink carries the host copies of rank r.
  int pcie_switch_of_rank(int rank, int ranks) const { return global_gpu_of_rank(rank, ranks) / pcie.gpus_per_switch; }
  // Host NUMA nodes are numbered over the whole cluster, node-major: node·numa.size() + socket.
  // The nodes that `ranks` training ranks occupy (ranks fill node 0 first), at least 1.
  int nodes_used(int ranks) const;
  // The host NUMA nodes of the nodes that `ranks` ranks occupy.
  int host_numa_count(int ranks) const { return nodes_used(ranks) * static_cast<int>(numa.size()); }
  // The spec of host NUMA node n, and the node it belongs to.
  const NumaSpec& numa_spec(int n) const { return numa.at(static_cast<std::size_t>(n) % numa.size()); }
  int node_of_numa(int n) const { return n / static_cast<int>(numa.size()); }
  // "NUMA node 1" on a single node; "node 3 NUMA node 1" on a cluster.
  std::string numa_label(int n) const;
  // A node's sockets together, whose DRAM its host memory fills before it runs out
  // (costmodel/host_placement.h): "NUMA nodes 0-1", "node 3 NUMA nodes 0-1".
  std::string node_numa_label(int node) const;
  // Host NUMA node (cluster-wide) of training rank r under rank_gpus().
  int numa_of_rank(int rank, int ranks) const;
  // Ranks per host NUMA node, host_numa_count(ranks) entries.
  std::vector<int> ranks_per_numa(int ranks) const;
  bool operator==(const HardwareSpec&) const = default;
};

// Parses a hardware JSON object. Throws InputError naming the field. A cluster spec names the
// node it repeats ("node": a name or path): the node's file is read first (its own errors name it)
// and this object's fields are merged over it (JSON merge patch: "nodes", "network", "sources").
HardwareSpec hardware_spec_from_json(const nlohmann::json& j, const std::string& file);
nlohmann::json hardware_spec_to_json(const HardwareSpec& h);
// Loads configs/hardware/NAME.json or a path. Throws InputError for unknown names or bad files.
HardwareSpec load_hardware_spec(const std::string& name_or_path);
// `h` repeated over `nodes` identical nodes on its network (the `--nodes` override and the
// workload's "nodes"). Throws InputError naming `file` and `field` when nodes > 1 and the spec has
// no network (network.nic).
HardwareSpec with_nodes(HardwareSpec h, int nodes, const std::string& file, const std::string& field);
// `h` with only the first `gpus` GPUs of each node in use (a workload's "gpus_per_node", e.g.
// torchrun's --nproc-per-node below a node's GPUs): ranks fill `gpus` per node, node after node.
// Throws InputError naming `file` and `field` unless 1 ≤ gpus ≤ the node's GPUs and the GPUs fill
// whole PCIe switches.
HardwareSpec with_gpus_per_node(HardwareSpec h, int gpus, const std::string& file, const std::string& field);
// Field paths of the numeric fields that the "sources" object must name.
std::vector<std::string> hardware_numeric_fields(const HardwareSpec& h);

}  // namespace oom
