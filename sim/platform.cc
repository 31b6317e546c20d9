#include "sim/platform.h"

#include <algorithm>
#include <string>

#include <fmt/format.h>
#include <xbt/log.h>

#include "costmodel/input_error.h"

namespace oom::sim {
namespace {

using Direction = sg4::LinkInRoute::Direction;
using NetPoint = simgrid::kernel::routing::NetPoint;

std::size_t at(int i) { return static_cast<std::size_t>(i); }

}  // namespace

PlatformRates platform_rates(const HardwareSpec& h) {
  PlatformRates r;
  r.gpu_flops_per_s = h.gpu.bf16_flops_per_s;
  r.h2d_Bps = h.pcie.h2d_Bps;
  r.d2h_Bps = h.pcie.d2h_Bps;
  r.fabric_Bps = h.fabric.per_gpu_Bps;
  r.network_Bps = h.network.per_node_Bps();
  for (const NumaSpec& n : h.numa) {
    r.dram_Bps.push_back(n.dram_Bps);
    r.socket_params_per_s.push_back(n.adamw_params_per_s);
  }
  return r;
}

PlatformRates platform_rates(const HardwareSpec& h, const Calibration& c) {
  PlatformRates r = platform_rates(h);
  if (c.h2d_Bps > 0) r.h2d_Bps = c.h2d_Bps;
  if (c.d2h_Bps > 0) r.d2h_Bps = c.d2h_Bps;
  r.fabric_Bps = h.fabric.per_gpu_Bps * c.fabric_efficiency;
  if (c.cpu_adamw_params_per_s > 0) std::fill(r.socket_params_per_s.begin(), r.socket_params_per_s.end(), c.cpu_adamw_params_per_s);
  return r;
}

void configure_engine() {
  xbt_log_control_set("xbt_cfg.thresh:warning");
  // The default LV08 model scales bandwidth by 0.97, latency by 13 and adds reverse cross-traffic;
  // CM02 without cross-traffic delivers a link's nominal bandwidth (SIMGRID-3.32 notes).
  sg4::Engine::set_config("network/model:CM02");
  sg4::Engine::set_config("network/crosstraffic:0");
}

Platform::Platform(const HardwareSpec& h, const PlatformRates& rates, const PlatformOptions& options)
    : nodes_(std::max(1, h.nodes)),
      gpus_per_node_(h.gpus_per_node),
      numa_per_node_(static_cast<int>(h.numa.size())),
      gpu_numa_(h.gpu_numa) {
  OOM_ASSERT(gpus_per_node_ > 0 && numa_per_node_ > 0, "a platform needs GPUs and NUMA nodes");
  OOM_ASSERT(static_cast<int>(gpu_numa_.size()) == gpus_per_node_, "one NUMA node per GPU");
  OOM_ASSERT(rates.dram_Bps.size() == h.numa.size() && rates.socket_params_per_s.size() == h.numa.size(),
             "one DRAM and socket rate per NUMA node");
  OOM_ASSERT(rates.gpu_flops_per_s > 0 && rates.h2d_Bps > 0 && rates.d2h_Bps > 0 && rates.fabric_Bps > 0,
             "positive GPU, PCIe and fabric rates");
  OOM_ASSERT(nodes_ == 1 || rates.network_Bps > 0, "a multi-node platform needs a network rate");
  // A cluster is a zone above one zone per node; one node is its own (root) zone.
  sg4::NetZone* cluster = nodes_ > 1 ? sg4::create_full_zone("cluster") : nullptr;
  std::vector<sg4::NetZone*> node_zones;
  std::vector<NetPoint*> gateways;
  for (int n = 0; n < nodes_; ++n) {
    sg4::NetZone* zone = sg4::create_full_zone(fmt::format("node{}", n));
    if (cluster != nullptr) zone->set_parent(cluster);
    NetPoint* gateway = build_node(zone, n, h, rates, options);
    zone->seal();
    node_zones.push_back(zone);
    gateways.push_back(gateway);
  }
  if (cluster != nullptr) {
    build_network(cluster, node_zones, gateways, h, rates, options);
    cluster->seal();
  }
}

NetPoint* Platform::build_node(sg4::NetZone* zone, int n, const HardwareSpec& h, const PlatformRates& rates,
                               const PlatformOptions& options) {
  const bool lat = options.link_latencies;
  auto route = [&](NetPoint* a, NetPoint* b, const std::vector<sg4::LinkInRoute>& links) {
    zone->add_route(a, b, nullptr, nullptr, links, false);
  };
  // Hosts and per-socket links.
  std::vector<const sg4::Link*> bridges;
  for (int s = 0; s < numa_per_node_; ++s) {
    const NumaSpec& numa = h.numa[at(s)];
    const int cores = std::max(1, numa.cores);
    OOM_ASSERT(rates.dram_Bps[at(s)] > 0 && rates.socket_params_per_s[at(s)] > 0, "positive DRAM and CPU rates");
    memories_.push_back(zone->create_host(fmt::format("node{}.mem{}", n, s), 1.0)->seal());
    sockets_.push_back(zone->create_host(fmt::format("node{}.cpu{}", n, s), rates.socket_params_per_s[at(s)] / cores)
                           ->set_core_count(cores)
                           ->seal());
    dram_.push_back(zone->create_link(fmt::format("node{}.dram{}", n, s), rates.dram_Bps[at(s)])->seal());
    bridges.push_back(zone->create_link(fmt::format("node{}.bridge{}", n, s), rates.dram_Bps[at(s)])
                          ->set_sharing_policy(sg4::Link::SharingPolicy::FATPIPE)
                          ->seal());
  }
  // GPUs, their PCIe links and fabric ports.
  const int first = n * gpus_per_node_;
  for (int g = first; g < first + gpus_per_node_; ++g) {
    gpus_.push_back(zone->create_host(fmt::format("gpu{}", g), rates.gpu_flops_per_s)->seal());
    auto* pcie = zone->create_split_duplex_link(fmt::format("gpu{}.pcie", g), rates.h2d_Bps);
    pcie->get_link_down()->set_bandwidth(rates.d2h_Bps);
    if (lat) pcie->set_latency(h.pcie.latency_s);
    pcie->seal();
    pcie_.push_back(pcie);
    auto* port = zone->create_split_duplex_link(fmt::format("gpu{}.fabric", g), rates.fabric_Bps);
    port->seal();
    ports_.push_back(port);
  }
  // PCIe switches shared by several GPUs: one uplink to the CPU per switch, at one link's rate
  // (numbered over the cluster).
  std::vector<sg4::SplitDuplexLink*> uplinks;
  const int per_switch = std::max(1, h.pcie.gpus_per_switch);
  if (per_switch > 1) {
    for (int k = first / per_switch; k < (first + gpus_per_node_) / per_switch; ++k) {
      auto* up = zone->create_split_duplex_link(fmt::format("pcie_switch{}", k), rates.h2d_Bps);
      up->get_link_down()->set_bandwidth(rates.d2h_Bps);
      up->seal();
      uplinks.push_back(up);
    }
  }
  auto uplink_of = [&](int g) { return uplinks[at((g - first) / per_switch)]; };
  const sg4::Link* nvswitch = nullptr;
  if (h.fabric.kind == FabricKind::kNvlink) {
    nvswitch = zone->create_link(fmt::format("node{}.nvswitch", n), rates.fabric_Bps)
                   ->set_sharing_policy(sg4::Link::SharingPolicy::FATPIPE)
                   ->set_latency(lat ? h.fabric.latency_s : 0.0)
                   ->seal();
  }
  const sg4::Link* peer_hop = nullptr;  // carries the PCIe peer path's own latency (beyond both PCIe links)
  if (h.fabric.kind == FabricKind::kPciePeer) {
    peer_hop = zone->create_link(fmt::format("node{}.peer_path", n), rates.fabric_Bps)
                   ->set_sharing_policy(sg4::Link::SharingPolicy::FATPIPE)
                   ->set_latency(lat ? h.fabric.latency_s : 0.0)
                   ->seal();
  }

  // Routes.
  const std::size_t base = at(n * numa_per_node_);
  for (int s = 0; s < numa_per_node_; ++s) {
    const std::size_t ns = base + at(s);
    route(sockets_[ns]->get_netpoint(), memories_[ns]->get_netpoint(), {sg4::LinkInRoute(dram_[ns])});
    route(memories_[ns]->get_netpoint(), sockets_[ns]->get_netpoint(), {sg4::LinkInRoute(dram_[ns])});
  }
  for (int g = first; g < first + gpus_per_node_; ++g) {
    const std::size_t own = at(numa_of_gpu(g));
    for (int s = 0; s < numa_per_node_; ++s) {
      // Host buffers on another socket of the node reach the GPU through both sockets' bridges.
      const std::size_t ns = base + at(s);
      std::vector<sg4::LinkInRoute> down{sg4::LinkInRoute(dram_[ns]), sg4::LinkInRoute(bridges[at(s)])};
      if (at(s) != own) down.emplace_back(bridges[own]);
      if (!uplinks.empty()) down.emplace_back(uplink_of(g), Direction::UP);
      down.emplace_back(pcie_[at(g)], Direction::UP);
      route(memories_[ns]->get_netpoint(), gpus_[at(g)]->get_netpoint(), down);
      std::vector<sg4::LinkInRoute> up{sg4::LinkInRoute(pcie_[at(g)], Direction::DOWN)};
      if (!uplinks.empty()) up.emplace_back(uplink_of(g), Direction::DOWN);
      up.emplace_back(bridges[own]);
      if (at(s) != own) up.emplace_back(bridges[at(s)]);
      up.emplace_back(dram_[ns]);
      route(gpus_[at(g)]->get_netpoint(), memories_[ns]->get_netpoint(), up);
    }
  }
  for (int a = first; a < first + gpus_per_node_; ++a) {
    for (int b = first; b < first + gpus_per_node_; ++b) {
      if (a == b) continue;
      std::vector<sg4::LinkInRoute> links{sg4::LinkInRoute(ports_[at(a)], Direction::UP)};
      if (nvswitch != nullptr) {
        links.emplace_back(nvswitch);
      } else {
        const std::size_t sa = at(numa_of_gpu(a)), sb = at(numa_of_gpu(b));
        links.emplace_back(pcie_[at(a)], Direction::DOWN);
        links.emplace_back(bridges[sa]);
        links.emplace_back(peer_hop);
        if (sb != sa) links.emplace_back(bridges[sb]);
        links.emplace_back(pcie_[at(b)], Direction::UP);
      }
      links.emplace_back(ports_[at(b)], Direction::DOWN);
      route(gpus_[at(a)]->get_netpoint(), gpus_[at(b)]->get_netpoint(), links);
    }
  }
  if (nodes_ == 1) return nullptr;
  // The node's way out: its GPUs reach the gateway through their fabric ports (the NICs hang off
  // the node's PCIe switches beside the GPUs, GPUDirect RDMA: the fabric port stands for the
  // GPU's own egress and ingress).
  NetPoint* gateway = zone->create_router(fmt::format("node{}.gateway", n));
  for (int g = first; g < first + gpus_per_node_; ++g) {
    route(gpus_[at(g)]->get_netpoint(), gateway, {sg4::LinkInRoute(ports_[at(g)], Direction::UP)});
    route(gateway, gpus_[at(g)]->get_netpoint(), {sg4::LinkInRoute(ports_[at(g)], Direction::DOWN)});
  }
  return gateway;
}

// The network above the nodes, in the cluster zone: every node's NICs as one link, the node's
// shares of its leaf's (pod's) uplinks, and a zone per tier of switches holding the host that
// stands for them. Traffic that leaves the node's leaf also crosses the node's share of its
// leaf's uplinks, and traffic that leaves its pod the node's share of the pod's uplinks to the
// core: with every node sending across a tier at once, each gets the NICs' rate over the
// oversubscription of each tier it crosses (NetworkSpec::sustained_Bps), and no link is shared
// between nodes. Routes: each node to each tier (and back), and each node to each other node
// (the cluster is fully routed; the engine sends through the tiers, sim/simgrid_engine.cc).
void Platform::build_network(sg4::NetZone* cluster, const std::vector<sg4::NetZone*>& node_zones,
                             const std::vector<NetPoint*>& gateways, const HardwareSpec& h, const PlatformRates& rates,
                             const PlatformOptions& options) {
  const bool lat = options.link_latencies;
  const NetworkSpec& net = h.network;
  std::vector<sg4::SplitDuplexLink*> nics;
  for (int n = 0; n < nodes_; ++n) {
    auto* nic = cluster->create_split_duplex_link(fmt::format("node{}.nic", n), rates.network_Bps);
    if (lat) nic->set_latency(net.latency_s / 2);
    nic->seal();
    nics.push_back(nic);
  }
  int tiers = 1;
  if (net.topology != NetworkTopology::kSingleSwitch && net.leaf_of_node(nodes_ - 1) != net.leaf_of_node(0)) tiers = 2;
  if (net.topology == NetworkTopology::kFatTree && net.pod_of_node(nodes_ - 1) != net.pod_of_node(0)) tiers = 3;
  std::vector<std::vector<sg4::SplitDuplexLink*>> uplinks(static_cast<std::size_t>(tiers));
  double rate = rates.network_Bps;
  for (int t = 1; t < tiers; ++t) {
    rate /= t == 1 ? std::max(1.0, net.oversubscription) : std::max(1.0, net.core_oversubscription);
    for (int n = 0; n < nodes_; ++n) {
      auto* up = cluster->create_split_duplex_link(fmt::format("node{}.{}", n, t == 1 ? "spine" : "core"), rate);
      if (lat) up->set_latency(net.switch_latency_s);  // two more switches per tier, one each way
      up->seal();
      uplinks[at(t)].push_back(up);
    }
  }
  auto zone_route = [&](sg4::NetZone* a, sg4::NetZone* b, NetPoint* gw_a, NetPoint* gw_b, const std::vector<sg4::LinkInRoute>& links) {
    cluster->add_route(a->get_netpoint(), b->get_netpoint(), gw_a, gw_b, links, false);
  };
  // Out of node n up to tier t (its NIC, then its shares of the uplinks), and back down.
  auto out_of = [&](int n, int t, std::vector<sg4::LinkInRoute>& links) {
    links.emplace_back(nics[at(n)], Direction::UP);
    for (int u = 1; u <= t; ++u) links.emplace_back(uplinks[at(u)][at(n)], Direction::UP);
  };
  auto into = [&](int n, int t, std::vector<sg4::LinkInRoute>& links) {
    for (int u = t; u >= 1; --u) links.emplace_back(uplinks[at(u)][at(n)], Direction::DOWN);
    links.emplace_back(nics[at(n)], Direction::DOWN);
  };
  static constexpr const char* kTierNames[] = {"network", "spine", "core"};
  for (int t = 0; t < tiers; ++t) {
    sg4::NetZone* tier = sg4::create_full_zone(fmt::format("switches.{}", kTierNames[t]));
    tier->set_parent(cluster);
    sg4::Host* beyond = tier->create_host(kTierNames[t], 1.0)->seal();
    tier->seal();
    networks_.push_back(beyond);
    for (int n = 0; n < nodes_; ++n) {
      std::vector<sg4::LinkInRoute> out, in;
      out_of(n, t, out);
      into(n, t, in);
      zone_route(node_zones[at(n)], tier, gateways[at(n)], beyond->get_netpoint(), out);
      zone_route(tier, node_zones[at(n)], beyond->get_netpoint(), gateways[at(n)], in);
    }
  }
  for (int a = 0; a < nodes_; ++a) {
    for (int b = 0; b < nodes_; ++b) {
      if (a == b) continue;
      const int t = std::min(tiers - 1, (net.switches_between(a, b) - 1) / 2);
      std::vector<sg4::LinkInRoute> links;
      out_of(a, t, links);
      into(b, t, links);
      zone_route(node_zones[at(a)], node_zones[at(b)], gateways[at(a)], gateways[at(b)], links);
    }
  }
}

int Platform::numa_of_gpu(int g) const { return gpu_numa_.at(at(g % gpus_per_node_)); }

sg4::Host* Platform::gpu(int g) const { return gpus_.at(at(g)); }

sg4::Host* Platform::network(int switches) const {
  if (networks_.empty()) return nullptr;
  const int tier = switches >= 5 ? 2 : switches >= 3 ? 1 : 0;
  return networks_.at(at(std::min(tier, static_cast<int>(networks_.size()) - 1)));
}

sg4::Host* Platform::memory(int node, int numa) const { return memories_.at(at(node * numa_per_node_ + numa)); }

sg4::Host* Platform::socket(int node, int numa) const { return sockets_.at(at(node * numa_per_node_ + numa)); }

const sg4::Link* Platform::dram_link(int node, int numa) const { return dram_.at(at(node * numa_per_node_ + numa)); }

const sg4::Link* Platform::h2d_link(int g) const { return pcie_.at(at(g))->get_link_up(); }

const sg4::Link* Platform::d2h_link(int g) const { return pcie_.at(at(g))->get_link_down(); }

}  // namespace oom::sim
