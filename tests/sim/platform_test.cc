// Tests of sim/platform.h: the SimGrid platform built from a HardwareSpec. Each case builds the
// platform in an isolated process (SimGrid allows one engine per process) and reports back JSON.
#include "sim/platform.h"

#include <cstdint>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "costmodel/hardware_spec.h"
#include "sim/isolated_run.h"

namespace oom::sim {
namespace {

using nlohmann::json;

// Runs `f` with a fresh engine and the platform of `h` in an isolated process.
json with_platform(const HardwareSpec& h, const PlatformOptions& options, const std::function<json(Platform&)>& f) {
  return json::parse(run_isolated([&](std::string& out) {
    static int argc = 1;
    static char program[] = "platform_test";
    static char* argv[] = {program, nullptr};
    new sg4::Engine(&argc, argv);  // lives until the isolated process exits
    configure_engine();
    Platform p(h, platform_rates(h), options);
    out = f(p).dump();
  }));
}

json route(const sg4::Host* a, const sg4::Host* b) {
  std::vector<sg4::Link*> links;
  double latency = 0;
  a->route_to(b, links, &latency);
  json names = json::array();
  for (const sg4::Link* l : links) names.push_back(l->get_name());
  return {{"links", names}, {"latency_s", latency}};
}

using Flow = std::tuple<sg4::Host*, sg4::Host*, std::uint64_t>;

// Starts all flows at time 0 and returns each one's finish time.
std::vector<double> finish_times(const std::vector<Flow>& flows) {
  std::vector<double> done(flows.size(), -1);
  sg4::Actor::create("flows", std::get<0>(flows.front()), [&] {
    std::vector<sg4::CommPtr> comms;
    for (const auto& [a, b, bytes] : flows) comms.push_back(sg4::Comm::sendto_async(a, b, bytes));
    for (std::size_t left = comms.size(); left > 0; --left) {
      std::vector<sg4::CommPtr> pending;
      std::vector<std::size_t> index;
      for (std::size_t i = 0; i < comms.size(); ++i) {
        if (done[i] < 0) {
          pending.push_back(comms[i]);
          index.push_back(i);
        }
      }
      const auto k = static_cast<std::size_t>(sg4::Comm::wait_any(pending));
      done[index[k]] = sg4::Engine::get_clock();
    }
  });
  sg4::Engine::get_instance()->run();
  return done;
}

const PlatformOptions kNoLatency{.link_latencies = false};

TEST(PlatformTest, BuildsAHostPerGpuAndSocketAtTheSpecRates) {
  const HardwareSpec h = load_hardware_spec("h100-sxm-node");
  const json r = with_platform(h, {}, [&](Platform& p) {
    return json{{"gpus", p.total_gpus()},
                {"gpu_speed", p.gpu(7)->get_speed()},
                {"h2d", p.h2d_link(3)->get_bandwidth()},
                {"d2h", p.d2h_link(3)->get_bandwidth()},
                {"dram", p.dram_link(0, 1)->get_bandwidth()},
                {"cores", p.socket(0, 1)->get_core_count()},
                {"socket_rate", p.socket(0, 1)->get_speed() * p.socket(0, 1)->get_core_count()},
                {"numa_of_gpu5", p.numa_of_gpu(5)}};
  });
  EXPECT_EQ(r["gpus"], 8);
  EXPECT_DOUBLE_EQ(r["gpu_speed"].get<double>(), 989.4e12);
  EXPECT_DOUBLE_EQ(r["h2d"].get<double>(), 53e9);
  EXPECT_DOUBLE_EQ(r["d2h"].get<double>(), 53e9);
  EXPECT_DOUBLE_EQ(r["dram"].get<double>(), 245e9);
  EXPECT_EQ(r["cores"], 48);
  EXPECT_DOUBLE_EQ(r["socket_rate"].get<double>(), 4e9);
  EXPECT_EQ(r["numa_of_gpu5"], 1);
}

TEST(PlatformTest, HostCopiesCrossDramBridgeAndOnePcieDirection) {
  const HardwareSpec h = load_hardware_spec("h100-sxm-node");
  const json r = with_platform(h, {}, [&](Platform& p) {
    return json{{"h2d", route(p.memory(0, 1), p.gpu(5))},
                {"d2h", route(p.gpu(5), p.memory(0, 1))},
                {"remote_h2d", route(p.memory(0, 0), p.gpu(5))},
                {"cpu", route(p.socket(0, 1), p.memory(0, 1))}};
  });
  // GPU 5 sits behind PCIe switch 2 (GPUs 4 and 5), whose uplink it shares.
  EXPECT_EQ(r["h2d"]["links"], json({"node0.dram1", "node0.bridge1", "pcie_switch2_UP", "gpu5.pcie_UP"}));
  EXPECT_DOUBLE_EQ(r["h2d"]["latency_s"].get<double>(), 1e-5);
  EXPECT_EQ(r["d2h"]["links"], json({"gpu5.pcie_DOWN", "pcie_switch2_DOWN", "node0.bridge1", "node0.dram1"}));
  EXPECT_EQ(r["remote_h2d"]["links"], json({"node0.dram0", "node0.bridge0", "node0.bridge1", "pcie_switch2_UP", "gpu5.pcie_UP"}));
  EXPECT_EQ(r["cpu"]["links"], json({"node0.dram1"}));
}

TEST(PlatformTest, NvlinkPathsMeetAtTheSwitch) {
  const HardwareSpec h = load_hardware_spec("h100-sxm-node");
  const json r = with_platform(h, {}, [&](Platform& p) { return route(p.gpu(0), p.gpu(5)); });
  EXPECT_EQ(r["links"], json({"gpu0.fabric_UP", "node0.nvswitch", "gpu5.fabric_DOWN"}));
  EXPECT_DOUBLE_EQ(r["latency_s"].get<double>(), 3e-6);
}

TEST(PlatformTest, PciePeerPathsCrossBothPcieLinksAndBridges) {
  const HardwareSpec h = load_hardware_spec("rtx4090-node");
  const json r = with_platform(h, {}, [&](Platform& p) {
    return json{{"cross_socket", route(p.gpu(0), p.gpu(2))}, {"same_socket", route(p.gpu(1), p.gpu(0))}};
  });
  EXPECT_EQ(r["cross_socket"]["links"], json({"gpu0.fabric_UP", "gpu0.pcie_DOWN", "node0.bridge0", "node0.peer_path", "node0.bridge1",
                                              "gpu2.pcie_UP", "gpu2.fabric_DOWN"}));
  EXPECT_EQ(r["same_socket"]["links"],
            json({"gpu1.fabric_UP", "gpu1.pcie_DOWN", "node0.bridge0", "node0.peer_path", "gpu0.pcie_UP", "gpu0.fabric_DOWN"}));
  // Both PCIe hops and the peer hop each carry 10 µs.
  EXPECT_NEAR(r["same_socket"]["latency_s"].get<double>(), 3e-5, 1e-15);
}

TEST(PlatformTest, NodesTalkThroughTheirNics) {
  const HardwareSpec h = load_hardware_spec("h100-sxm-2node");
  const json r = with_platform(h, {}, [&](Platform& p) {
    return json{{"gpus", p.total_gpus()},
                {"out", route(p.gpu(1), p.network())},
                {"in", route(p.network(), p.gpu(9))},
                {"h2d", route(p.memory(1, 0), p.gpu(9))}};
  });
  EXPECT_EQ(r["gpus"], 16);
  EXPECT_EQ(r["out"]["links"], json({"gpu1.fabric_UP", "node0.nic_UP"}));
  EXPECT_EQ(r["in"]["links"], json({"node1.nic_DOWN", "gpu9.fabric_DOWN"}));
  // NIC to NIC: half the latency out of one node, half into the other.
  EXPECT_DOUBLE_EQ(r["out"]["latency_s"].get<double>() + r["in"]["latency_s"].get<double>(), 5e-6);
  EXPECT_EQ(r["h2d"]["links"], json({"node1.dram0", "node1.bridge0", "pcie_switch4_UP", "gpu9.pcie_UP"}));
}

TEST(PlatformTest, EachNodeIsAZoneUnderTheCluster) {
  const HardwareSpec h = load_hardware_spec("h100-sxm-2node");
  const json r = with_platform(h, {}, [&](Platform& p) {
    auto zone = [](const sg4::Host* host) {
      const sg4::NetZone* z = host->get_englobing_zone();
      return json{{"zone", z->get_name()}, {"parent", z->get_parent()->get_name()}};
    };
    return json{{"gpu9", zone(p.gpu(9))}, {"mem", zone(p.memory(1, 1))}, {"cpu", zone(p.socket(0, 0))}, {"network", zone(p.network())},
                {"root", sg4::Engine::get_instance()->get_netzone_root()->get_name() == "cluster"}, {"across", route(p.gpu(1), p.gpu(9))}, {"back", route(p.gpu(9), p.gpu(1))}};
  });
  EXPECT_EQ(r["gpu9"], json({{"zone", "node1"}, {"parent", "cluster"}}));
  EXPECT_EQ(r["mem"], json({{"zone", "node1"}, {"parent", "cluster"}}));
  EXPECT_EQ(r["cpu"], json({{"zone", "node0"}, {"parent", "cluster"}}));
  EXPECT_EQ(r["network"], json({{"zone", "switches.network"}, {"parent", "cluster"}}));
  EXPECT_TRUE(r["root"].get<bool>());
  // Any GPU reaches any other: out of its node's NICs and into the other node's.
  EXPECT_EQ(r["across"]["links"], json({"gpu1.fabric_UP", "node0.nic_UP", "node1.nic_DOWN", "gpu9.fabric_DOWN"}));
  EXPECT_EQ(r["back"]["links"], json({"gpu9.fabric_UP", "node1.nic_UP", "node0.nic_DOWN", "gpu1.fabric_DOWN"}));
  EXPECT_DOUBLE_EQ(r["across"]["latency_s"].get<double>(), 5e-6);
}

TEST(PlatformTest, OneNodeIsItsOwnZone) {
  const json r = with_platform(load_hardware_spec("h100-sxm-node"), {}, [&](Platform& p) {
    const sg4::NetZone* z = p.gpu(3)->get_englobing_zone();
    return json{{"zone", z->get_name()}, {"root", sg4::Engine::get_instance()->get_netzone_root() == z}, {"network", p.network() == nullptr}};
  });
  EXPECT_EQ(r["zone"], "node0");
  EXPECT_TRUE(r["root"].get<bool>());
  EXPECT_TRUE(r["network"].get<bool>());
}

TEST(PlatformTest, TrafficBeyondTheLeafCrossesTheNodesShareOfItsUplinks) {
  // Four nodes of the H100 node, two per leaf, 2:1 oversubscribed: beyond the leaf a GPU's flows
  // also cross its node's share of the leaf's uplinks (half the NICs' rate), one more switch each way.
  HardwareSpec h = load_hardware_spec("h100-sxm-2node");
  h.nodes = 4;
  h.network.topology = NetworkTopology::kLeafSpine;
  h.network.nodes_per_leaf = 2;
  h.network.oversubscription = 2;
  h.network.switch_latency_s = 1e-6;
  const json r = with_platform(h, {}, [&](Platform& p) {
    return json{{"leaf", route(p.gpu(1), p.network(1))}, {"out", route(p.gpu(1), p.network(3))}, {"in", route(p.network(3), p.gpu(17))},
                {"same", p.network(5) == p.network(3)}, {"same_leaf", route(p.gpu(1), p.gpu(9))}, {"other_leaf", route(p.gpu(1), p.gpu(17))}};
  });
  EXPECT_EQ(r["same_leaf"]["links"], json({"gpu1.fabric_UP", "node0.nic_UP", "node1.nic_DOWN", "gpu9.fabric_DOWN"}));
  EXPECT_EQ(r["other_leaf"]["links"],
            json({"gpu1.fabric_UP", "node0.nic_UP", "node0.spine_UP", "node2.spine_DOWN", "node2.nic_DOWN", "gpu17.fabric_DOWN"}));
  EXPECT_EQ(r["leaf"]["links"], json({"gpu1.fabric_UP", "node0.nic_UP"}));
  EXPECT_EQ(r["out"]["links"], json({"gpu1.fabric_UP", "node0.nic_UP", "node0.spine_UP"}));
  EXPECT_EQ(r["in"]["links"], json({"node2.spine_DOWN", "node2.nic_DOWN", "gpu17.fabric_DOWN"}));
  EXPECT_NEAR(r["out"]["latency_s"].get<double>() + r["in"]["latency_s"].get<double>(), 5e-6 + 2e-6, 1e-15);
  EXPECT_TRUE(r["same"].get<bool>()) << "no core tier on a leaf-spine";
}

TEST(PlatformTest, LatenciesCanBeLeftOffTheLinks) {
  const HardwareSpec h = load_hardware_spec("h100-sxm-2node");
  const json r = with_platform(h, kNoLatency, [&](Platform& p) {
    return json{{"h2d", route(p.memory(0, 0), p.gpu(0))}, {"net", route(p.gpu(0), p.network())}, {"nv", route(p.gpu(0), p.gpu(1))}};
  });
  EXPECT_EQ(r["h2d"]["latency_s"].get<double>(), 0.0);
  EXPECT_EQ(r["net"]["latency_s"].get<double>(), 0.0);
  EXPECT_EQ(r["nv"]["latency_s"].get<double>(), 0.0);
}

TEST(PlatformTest, OneHostCopyRunsAtItsPcieRate) {
  const HardwareSpec h = load_hardware_spec("h100-sxm-node");
  const json r = with_platform(h, kNoLatency, [&](Platform& p) {
    return json(finish_times({{p.memory(0, 0), p.gpu(0), 53'000'000'000ULL}}));
  });
  EXPECT_NEAR(r[0].get<double>(), 1.0, 1e-9);
}

TEST(PlatformTest, GpusBehindOneSwitchShareItsUplink) {
  // GPUs 0 and 1 share switch 0's uplink: their H2D copies get 26.5 GB/s each; GPU 2's (switch 1)
  // runs at 53 GB/s, and GPU 1's D2H copy uses the uplink's other direction at its full rate.
  const HardwareSpec h = load_hardware_spec("h100-sxm-node");
  const json r = with_platform(h, kNoLatency, [&](Platform& p) {
    return json(finish_times({{p.memory(0, 0), p.gpu(0), 1'000'000'000ULL},
                              {p.memory(0, 0), p.gpu(1), 1'000'000'000ULL},
                              {p.memory(0, 0), p.gpu(2), 1'000'000'000ULL},
                              {p.gpu(3), p.memory(0, 0), 1'000'000'000ULL}}));
  });
  EXPECT_NEAR(r[0].get<double>(), 1e9 / 26.5e9, 1e-9);
  EXPECT_NEAR(r[1].get<double>(), 1e9 / 26.5e9, 1e-9);
  EXPECT_NEAR(r[2].get<double>(), 1e9 / 53e9, 1e-9);
  EXPECT_NEAR(r[3].get<double>(), 1e9 / 53e9, 1e-9);
}

TEST(PlatformTest, CopiesOfOneSocketShareItsDramButNotTheOtherSocketsDram) {
  // GPUs 0-3 hang off socket 0, each with a link of its own here (no shared switch): four H2D and
  // four D2H copies at once want 8 × 53 GB/s, more than the socket's 245 GB/s of DRAM, so each gets
  // 245/8 GB/s. GPU 4's copy on socket 1 is not slowed.
  HardwareSpec h = load_hardware_spec("h100-sxm-node");
  h.pcie.gpus_per_switch = 1;
  const json r = with_platform(h, kNoLatency, [&](Platform& p) {
    std::vector<Flow> flows;
    for (int g = 0; g < 4; ++g) {
      flows.emplace_back(p.memory(0, 0), p.gpu(g), 1'000'000'000ULL);
      flows.emplace_back(p.gpu(g), p.memory(0, 0), 1'000'000'000ULL);
    }
    flows.emplace_back(p.memory(0, 1), p.gpu(4), 1'000'000'000ULL);
    return json(finish_times(flows));
  });
  for (int i = 0; i < 8; ++i) EXPECT_NEAR(r[i].get<double>(), 8e9 / 245e9, 1e-9) << i;
  EXPECT_NEAR(r[8].get<double>(), 1e9 / 53e9, 1e-9);
}

TEST(PlatformTest, FlowsIntoOneGpuShareItsFabricPort) {
  const HardwareSpec h = load_hardware_spec("h100-sxm-node");
  const json r = with_platform(h, kNoLatency, [&](Platform& p) {
    return json(finish_times({{p.gpu(1), p.gpu(0), 38'000'000'000ULL},
                              {p.gpu(2), p.gpu(0), 38'000'000'000ULL},
                              {p.gpu(3), p.gpu(4), 38'000'000'000ULL}}));
  });
  EXPECT_NEAR(r[0].get<double>(), 0.2, 1e-9);  // 76 GB through gpu0's 380 GB/s ingress
  EXPECT_NEAR(r[1].get<double>(), 0.2, 1e-9);
  EXPECT_NEAR(r[2].get<double>(), 0.1, 1e-9);  // the switch does not block
}

TEST(PlatformTest, FlowsBetweenNodesShareTheNics) {
  const HardwareSpec h = load_hardware_spec("h100-sxm-2node");
  const json r = with_platform(h, kNoLatency, [&](Platform& p) {
    return json(finish_times({{p.gpu(0), p.network(), 36'000'000'000ULL},
                              {p.gpu(1), p.network(), 36'000'000'000ULL},
                              {p.network(), p.gpu(9), 18'000'000'000ULL}}));
  });
  EXPECT_NEAR(r[0].get<double>(), 0.2, 1e-9);  // 72 GB over node0's 360 GB/s NIC
  EXPECT_NEAR(r[1].get<double>(), 0.2, 1e-9);
  EXPECT_NEAR(r[2].get<double>(), 0.05, 1e-9);  // node1's NIC, the other way, alone
}

TEST(PlatformTest, ASocketsCoresTogetherRunAtItsAdamwRate) {
  const HardwareSpec h = load_hardware_spec("h100-sxm-node");
  const json r = with_platform(h, kNoLatency, [&](Platform& p) {
    double one = 0;
    double two = 0;
    sg4::Host* cpu = p.socket(0, 0);
    sg4::Actor::create("adamw", cpu, [&] {
      const double per_core = 2e9 / cpu->get_core_count();  // 2 G parameters over all cores
      sg4::Exec::init()->set_host(cpu)->set_flops_amount(per_core)->set_thread_count(cpu->get_core_count())->start()->wait();
      one = sg4::Engine::get_clock();
      auto a = sg4::Exec::init()->set_host(cpu)->set_flops_amount(per_core)->set_thread_count(cpu->get_core_count());
      auto b = sg4::Exec::init()->set_host(cpu)->set_flops_amount(per_core)->set_thread_count(cpu->get_core_count());
      a->start();
      b->start();
      a->wait();
      b->wait();
      two = sg4::Engine::get_clock() - one;
    });
    sg4::Engine::get_instance()->run();
    return json{{"one", one}, {"two", two}};
  });
  EXPECT_NEAR(r["one"].get<double>(), 0.5, 1e-9);  // 2 G params at 4 G params/s
  EXPECT_NEAR(r["two"].get<double>(), 1.0, 1e-9);  // two executors share the socket
}

TEST(PlatformRatesTest, CalibrationReplacesAchievedRates) {
  const HardwareSpec h = load_hardware_spec("h100-sxm-node");
  Calibration c = default_calibration(h);
  c.h2d_Bps = 50e9;
  c.d2h_Bps = 0;  // keep the spec's
  c.fabric_efficiency = 0.5;
  c.cpu_adamw_params_per_s = 3e9;
  const PlatformRates r = platform_rates(h, c);
  EXPECT_DOUBLE_EQ(r.h2d_Bps, 50e9);
  EXPECT_DOUBLE_EQ(r.d2h_Bps, 53e9);
  EXPECT_DOUBLE_EQ(r.fabric_Bps, 190e9);
  EXPECT_EQ(r.socket_params_per_s, (std::vector<double>{3e9, 3e9}));
  EXPECT_EQ(r.dram_Bps, (std::vector<double>{245e9, 245e9}));
  EXPECT_DOUBLE_EQ(platform_rates(h).fabric_Bps, 380e9);
}

}  // namespace
}  // namespace oom::sim
