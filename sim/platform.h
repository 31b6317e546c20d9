// Platform: the SimGrid platform of a HardwareSpec, built in code (no XML).
//
// Zones: one full routing zone per node ("node<n>", explicit routes between its hosts); a
// multi-node spec puts them under a "cluster" zone that holds the network: the NICs, the uplinks
// and a zone per tier of switches ("switches.network", "switches.spine", "switches.core", each
// holding the host of that name). A node zone reaches the cluster through its router
// "node<n>.gateway" (each GPU: [port UP] to it, [port DOWN] from it); the cluster routes every
// node to every tier and to every other node. Netpoints are found by SimGrid's hierarchical
// routing, so a route's links are the node part and the cluster part in order.
//
// What it models (explicit routes):
//   - a host per GPU ("gpu<g>", g the global GPU index node·gpus_per_node + local), one core at
//     the BF16 dense peak (FLOP/s);
//   - per GPU a split-duplex PCIe link "gpu<g>.pcie": UP is host-to-device at the H2D rate, DOWN
//     is device-to-host at the D2H rate;
//   - per NUMA node (socket) of every node a host bridge "node<n>.bridge<s>" (a FATPIPE link: it
//     caps no flow below the socket's DRAM rate, it is where the socket's PCIe links meet) and a
//     DRAM link "node<n>.dram<s>" (SHARED) that every DMA transfer of the socket's GPUs and every
//     CPU task of the socket crosses, so host copies and CPU AdamW compete for memory bandwidth;
//   - per NUMA node a memory endpoint host "node<n>.mem<s>" (where pinned host buffers live; it
//     never computes) and a CPU socket host "node<n>.cpu<s>" with one core per socket core, each
//     core running at socket_params_per_s / cores ("flops" of a CPU host are parameter updates);
//   - the GPU–GPU fabric: per GPU a split-duplex port "gpu<g>.fabric" (UP egress, DOWN ingress) at
//     the fabric rate; for NVLink the ports meet at a non-blocking switch "node<n>.nvswitch"
//     (FATPIPE); for PCIe peer-to-peer the path also crosses both GPUs' PCIe links, their
//     sockets' bridges and a "peer_path" hop carrying the peer latency, so peer traffic competes
//     with host copies ("node<n>.peer_path");
//   - for multi-node specs a split-duplex NIC link "node<n>.nic" per node (UP send, DOWN receive)
//     at the node's NIC rate (NetworkSpec::per_node_Bps: its NICs as one link) and a "network"
//     host beyond them standing for the switches: a GPU sends to the other nodes as a flow to the
//     network [port UP, nic UP] and receives as a flow from it [nic DOWN, port DOWN], so a
//     collective has a flow per member and direction instead of one per pair of nodes. Leaf–spine
//     and fat-tree specs whose nodes span several leaves (pods) add per node a "node<n>.spine"
//     (and "node<n>.core") link, the node's share of its leaf's (pod's) uplinks at the NIC rate
//     over each tier's oversubscription, and a "spine" ("core") host beyond it. No link is shared
//     between nodes. The graph's
//     host NUMA nodes count over the cluster (node·numa_per_node + socket): memory(node, socket)
//     takes the socket within the node.
// Routes: mem(n,s) → gpu: [dram, bridge, pcie UP]; gpu → mem(n,s): [pcie DOWN, bridge, dram]
// (a buffer on another socket of the node also crosses the GPU's own socket's bridge);
// cpu(n,s) → mem(n,s): [dram]; gpu a → gpu b of the same node as above; gpu ↔ network. Latencies
// add along a route.
//
// Units: bytes/s for links, FLOP/s for GPU hosts, parameters/s for CPU cores, seconds.
// Assumptions: each GPU's host traffic uses the DRAM of the socket its PCIe link hangs off; the
// inter-socket link of a PCIe peer path is not a bottleneck; the network model must be CM02
// without cross-traffic (configure_engine() sets it) so links deliver their nominal bandwidth.
// Thread-safety: SimGrid keeps one global engine per process; build a Platform once, in the
// process (or forked child, see sim/isolated_run.h) that runs the simulation.
#pragma once

#include <vector>

#include <simgrid/s4u.hpp>

#include "costmodel/hardware_spec.h"
#include "costmodel/units.h"
#include "planner/calibration/calibration.h"

namespace oom::sim {

namespace sg4 = simgrid::s4u;

// The achieved rates the platform's elements run at.
struct PlatformRates {
  FlopsPerS gpu_flops_per_s = 0;   // per GPU host
  BytesPerS h2d_Bps = 0;           // per GPU PCIe link, host to device
  BytesPerS d2h_Bps = 0;           // per GPU PCIe link, device to host
  BytesPerS fabric_Bps = 0;        // per GPU fabric port, each direction
  BytesPerS network_Bps = 0;       // per node NIC, each direction (multi-node specs)
  std::vector<BytesPerS> dram_Bps;             // per NUMA node of a node
  std::vector<double> socket_params_per_s;     // CPU AdamW throughput per NUMA node of a node
};

// The spec's rates with a calibration's achieved ones where it has them: H2D/D2H (when > 0),
// the fabric at per_gpu_Bps · fabric_efficiency, CPU AdamW (when > 0). Pure.
PlatformRates platform_rates(const HardwareSpec& h, const Calibration& c);
// The spec's rates as they are (fabric at its per_gpu_Bps). Pure.
PlatformRates platform_rates(const HardwareSpec& h);

struct PlatformOptions {
  // Put the spec's latencies on the links (PCIe, fabric, network). An executor whose stage costs
  // already carry the latencies in their fixed part turns this off so they are not paid twice.
  bool link_latencies = true;
};

// Sets the engine options the platform assumes (CM02, no cross-traffic; configuration changes
// are not logged). Call once, after the s4u::Engine exists and before the platform is built.
void configure_engine();

class Platform {
 public:
  // Builds the platform of `h` at `rates` into the current engine and seals it.
  // Preconditions: an s4u::Engine exists, configure_engine() was called, no platform is loaded,
  // and `rates` has one DRAM and socket rate per NUMA node of `h`. OOM_ASSERTs otherwise.
  Platform(const HardwareSpec& h, const PlatformRates& rates, const PlatformOptions& options = {});

  int nodes() const { return nodes_; }
  int gpus_per_node() const { return gpus_per_node_; }
  int numa_per_node() const { return numa_per_node_; }
  int total_gpus() const { return nodes_ * gpus_per_node_; }

  // Global GPU g = node·gpus_per_node + local index.
  sg4::Host* gpu(int g) const;
  // The node of global GPU g, and the NUMA node its PCIe link hangs off.
  int node_of_gpu(int g) const { return g / gpus_per_node_; }
  int numa_of_gpu(int g) const;
  sg4::Host* memory(int node, int numa) const;
  sg4::Host* socket(int node, int numa) const;
  // Multi-node specs: the host beyond every node's NICs that traffic crossing `switches` switches
  // (NetworkSpec::switches_between: 1 under one leaf, 3 across the spine, 5 across a fat tree's
  // core) reaches; nullptr on one node.
  sg4::Host* network(int switches = 1) const;
  // The links (for tests and reports).
  const sg4::Link* dram_link(int node, int numa) const;
  const sg4::Link* h2d_link(int g) const;  // the UP direction of gpu<g>.pcie
  const sg4::Link* d2h_link(int g) const;  // the DOWN direction

 private:
  using NetPoint = simgrid::kernel::routing::NetPoint;
  // Builds node n's hosts, links and routes into `zone`; returns its gateway (nullptr on one node).
  NetPoint* build_node(sg4::NetZone* zone, int n, const HardwareSpec& h, const PlatformRates& rates, const PlatformOptions& options);
  // Builds the NICs, uplinks, tier zones and zone routes into the cluster zone.
  void build_network(sg4::NetZone* cluster, const std::vector<sg4::NetZone*>& node_zones, const std::vector<NetPoint*>& gateways,
                     const HardwareSpec& h, const PlatformRates& rates, const PlatformOptions& options);

  int nodes_ = 1;
  int gpus_per_node_ = 0;
  int numa_per_node_ = 0;
  std::vector<int> gpu_numa_;
  std::vector<sg4::Host*> gpus_;
  std::vector<sg4::Host*> memories_;  // node-major
  std::vector<sg4::Host*> sockets_;
  std::vector<sg4::Host*> networks_;  // beyond the NICs; beyond the spine links; beyond the core links
  std::vector<const sg4::Link*> dram_;
  std::vector<sg4::SplitDuplexLink*> pcie_;
  std::vector<sg4::SplitDuplexLink*> ports_;  // per GPU, its fabric port
};

}  // namespace oom::sim
