#include "costmodel/hardware_spec.h"

#include <algorithm>
#include <filesystem>

#include <fmt/format.h>

#include "costmodel/config_paths.h"
#include "costmodel/input_error.h"
#include "costmodel/input_limits.h"
#include "costmodel/json_input.h"

namespace oom {
namespace {

constexpr double kMaxRate = 1e18;
constexpr double kMaxGib = 1 << 20;  // 1 PiB per GPU or NUMA node: kMaxNumaPerNode of them sum to 2^60 B, inside Bytes
constexpr int kMaxNodeDepth = 4;      // "node" chains: a cluster of a cluster of ...

HardwareSpec parse_hardware(const nlohmann::json& j, const std::string& file);

void read_network(const JsonReader& n, HardwareSpec& h) {
  n.reject_unknown_keys({"nic", "rail_optimized", "topology", "latency_s", "switch_latency_s"});
  NetworkSpec& net = h.network;
  const JsonReader nic = n.object("nic");
  nic.reject_unknown_keys({"count", "Bps", "attach"});
  net.nics = static_cast<int>(nic.integer("count", 1, 1024));
  net.nic_Bps = nic.number("Bps", 1e6, kMaxRate);
  net.nic_attach = nic.one_of("attach", {"socket", "pcie_switch"}) == "socket" ? NicAttach::kSocket : NicAttach::kPcieSwitch;
  if (net.nic_attach == NicAttach::kPcieSwitch) {
    const int switches = h.gpus_per_node / h.pcie.gpus_per_switch;
    if (net.nics % switches != 0) {
      nic.fail("count", fmt::format("must be a multiple of the node's {} PCIe switches (pcie.gpus_per_switch) to hang behind them", switches));
    }
  }
  net.rail_optimized = n.boolean_or("rail_optimized", false);
  net.latency_s = n.number("latency_s", 0.0, 1.0);
  net.switch_latency_s = n.number_or("switch_latency_s", 0.0, 0.0, 1.0);
  if (n.has("topology")) {
    const JsonReader t = n.object("topology");
    t.reject_unknown_keys({"kind", "nodes_per_leaf", "leaves_per_pod", "oversubscription", "core_oversubscription"});
    const std::string kind = t.one_of("kind", {"single_switch", "leaf_spine", "fat_tree"});
    net.topology = kind == "single_switch" ? NetworkTopology::kSingleSwitch
                   : kind == "leaf_spine"  ? NetworkTopology::kLeafSpine
                                           : NetworkTopology::kFatTree;
    if (net.topology != NetworkTopology::kSingleSwitch) {
      net.nodes_per_leaf = static_cast<int>(t.integer("nodes_per_leaf", 1, 65536));
      net.oversubscription = t.number_or("oversubscription", 1.0, 1.0, 64.0);
    }
    if (net.topology == NetworkTopology::kFatTree) {
      net.leaves_per_pod = static_cast<int>(t.integer("leaves_per_pod", 1, 65536));
      net.core_oversubscription = t.number_or("core_oversubscription", 1.0, 1.0, 64.0);
    }
  }
}

nlohmann::json network_to_json(const NetworkSpec& n) {
  nlohmann::json j = {{"nic", {{"count", n.nics}, {"Bps", n.nic_Bps}, {"attach", nic_attach_name(n.nic_attach)}}},
                      {"rail_optimized", n.rail_optimized},
                      {"latency_s", n.latency_s},
                      {"switch_latency_s", n.switch_latency_s}};
  nlohmann::json t = {{"kind", network_topology_name(n.topology)}};
  if (n.topology != NetworkTopology::kSingleSwitch) {
    t["nodes_per_leaf"] = n.nodes_per_leaf;
    t["oversubscription"] = n.oversubscription;
  }
  if (n.topology == NetworkTopology::kFatTree) {
    t["leaves_per_pod"] = n.leaves_per_pod;
    t["core_oversubscription"] = n.core_oversubscription;
  }
  j["topology"] = t;
  return j;
}

// `j` with the node spec it names ("node") merged under it, recursively; "node" itself removed.
nlohmann::json merged_with_node(const nlohmann::json& j, const std::string& file, int depth) {
  if (!j.is_object() || !j.contains("node")) return j;
  const JsonReader r(j, file);
  const std::string node = r.string("node");
  if (depth >= kMaxNodeDepth) r.fail("node", fmt::format("nests more than {} node specs", kMaxNodeDepth));
  const auto path = resolve_config("hardware", node);
  if (!path) r.fail("node", "unknown hardware (known: " + known_config_names("hardware") + ")");
  nlohmann::json base = merged_with_node(read_json_file(*path), *path, depth + 1);
  parse_hardware(base, *path);  // the node's own errors name its file
  if (!base.contains("node_name")) base["node_name"] = base.value("name", node);
  nlohmann::json patch = j;
  patch.erase("node");
  base.merge_patch(patch);
  return base;
}

}  // namespace

std::string_view nic_attach_name(NicAttach a) { return a == NicAttach::kSocket ? "socket" : "pcie_switch"; }

std::string_view network_topology_name(NetworkTopology t) {
  switch (t) {
    case NetworkTopology::kSingleSwitch: return "single_switch";
    case NetworkTopology::kLeafSpine: return "leaf_spine";
    case NetworkTopology::kFatTree: return "fat_tree";
  }
  return "?";
}

int NetworkSpec::leaf_of_node(int node) const {
  return topology == NetworkTopology::kSingleSwitch || nodes_per_leaf <= 0 ? 0 : node / nodes_per_leaf;
}

int NetworkSpec::pod_of_node(int node) const {
  return topology != NetworkTopology::kFatTree || leaves_per_pod <= 0 ? 0 : leaf_of_node(node) / leaves_per_pod;
}

int NetworkSpec::switches_between(int node_a, int node_b) const {
  if (node_a == node_b) return 0;
  if (leaf_of_node(node_a) == leaf_of_node(node_b)) return 1;
  if (pod_of_node(node_a) == pod_of_node(node_b)) return 3;
  return 5;
}

Seconds NetworkSpec::latency_between(int node_a, int node_b) const {
  const int switches = switches_between(node_a, node_b);
  return switches == 0 ? 0.0 : latency_s + (switches - 1) * switch_latency_s;
}

BytesPerS NetworkSpec::sustained_Bps(int node_a, int node_b) const {
  const int switches = switches_between(node_a, node_b);
  if (switches == 0) return 0.0;
  double rate = per_node_Bps();
  if (switches >= 3) rate /= oversubscription;
  if (switches >= 5) rate /= core_oversubscription;
  return rate;
}

namespace {

// The spec of one JSON object with no "node" to merge.
HardwareSpec parse_hardware(const nlohmann::json& j, const std::string& file) {
  const JsonReader r(j, file);
  r.reject_unknown_keys({"name", "description", "nodes", "node_name", "gpu", "gpu_numa", "rank_placement", "socket_link_Bps", "pcie", "fabric", "numa",
                       "network", "sources", "provenance"});
  HardwareSpec h;
  h.name = r.string("name");
  h.description = r.string_or("description", "");
  h.nodes = static_cast<int>(r.integer_or("nodes", 1, 1, kMaxNodes));

  const JsonReader g = r.object("gpu");
  g.reject_unknown_keys({"name", "count", "hbm_gib", "bf16_flops", "hbm_Bps", "l2_mib", "gemm_half_rows", "architecture"});
  h.gpu.name = g.string("name");
  h.gpus_per_node = static_cast<int>(g.integer("count", 1, kMaxGpusPerNode));
  h.gpu.hbm_bytes = input_bytes(g.number("hbm_gib", 0.001, kMaxGib), kGiB, file, g.field("hbm_gib"));
  h.gpu.bf16_flops_per_s = g.number("bf16_flops", 1e9, kMaxRate);
  h.gpu.hbm_Bps = g.number("hbm_Bps", 1e6, kMaxRate);
  h.gpu.l2_bytes = input_bytes(g.optional_number("l2_mib", 0, 1 << 20).value_or(0.0), kMiB, file, g.field("l2_mib"));
  h.gpu.gemm_half_rows = g.optional_number("gemm_half_rows", 0, 1e6).value_or(0.0);
  h.gpu.architecture = g.string_or("architecture", "");
  if (g.has("architecture") && (h.gpu.architecture.empty() || !std::all_of(h.gpu.architecture.begin(), h.gpu.architecture.end(), [](char ch) {
                                  return (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '-';
                                }))) {
    g.fail("architecture", "expected a lower-case name such as \"hopper\" (letters, digits, '-')");
  }

  const JsonReader p = r.object("pcie");
  p.reject_unknown_keys({"generation", "h2d_Bps", "d2h_Bps", "latency_s", "gpus_per_switch"});
  h.pcie.generation = static_cast<int>(p.integer("generation", 1, 16));
  h.pcie.h2d_Bps = p.number("h2d_Bps", 1e6, kMaxRate);
  h.pcie.d2h_Bps = p.number("d2h_Bps", 1e6, kMaxRate);
  h.pcie.latency_s = p.number("latency_s", 0.0, 1.0);
  h.pcie.gpus_per_switch = static_cast<int>(p.integer_or("gpus_per_switch", 1, 1, 1024));
  if (h.gpus_per_node % h.pcie.gpus_per_switch != 0) {
    p.fail("gpus_per_switch", fmt::format("must divide gpu.count {}", h.gpus_per_node));
  }

  const JsonReader f = r.object("fabric");
  f.reject_unknown_keys({"kind", "per_gpu_Bps", "latency_s"});
  h.fabric.kind = f.one_of("kind", {"nvlink", "pcie_peer"}) == "nvlink" ? FabricKind::kNvlink : FabricKind::kPciePeer;
  h.fabric.per_gpu_Bps = f.number("per_gpu_Bps", 1e6, kMaxRate);
  h.fabric.latency_s = f.number("latency_s", 0.0, 1.0);

  if (!r.has("numa") || !r.raw()["numa"].is_array() || r.raw()["numa"].empty()) {
    r.fail("numa", "expected a non-empty list of NUMA nodes");
  }
  if (r.raw()["numa"].size() > static_cast<std::size_t>(kMaxNumaPerNode)) {
    r.fail("numa", fmt::format("lists {} NUMA nodes, more than the {} a node may have", r.raw()["numa"].size(), kMaxNumaPerNode));
  }
  const auto& numa = r.raw()["numa"];
  for (std::size_t i = 0; i < numa.size(); ++i) {
    const JsonReader n(numa[i], file, fmt::format("numa[{}]", i));
    n.reject_unknown_keys({"dram_gib", "dram_Bps", "cores", "adamw_params_per_s", "amx_bf16_flops_per_s"});
    NumaSpec s;
    s.dram_bytes = input_bytes(n.number("dram_gib", 0.001, kMaxGib), kGiB, file, n.field("dram_gib"));
    s.dram_Bps = n.number("dram_Bps", 1e6, kMaxRate);
    s.cores = static_cast<int>(n.integer("cores", 1, 65536));
    s.adamw_params_per_s = n.number("adamw_params_per_s", 1e3, kMaxRate);
    s.amx_bf16_flops_per_s = n.optional_number("amx_bf16_flops_per_s", 0, kMaxRate).value_or(0.0);
    h.numa.push_back(s);
  }

  const auto numa_count = static_cast<std::int64_t>(h.numa.size());
  const auto gpu_numa = r.integer_list("gpu_numa", 0, numa_count - 1);
  if (static_cast<int>(gpu_numa.size()) != h.gpus_per_node) {
    r.fail("gpu_numa", fmt::format("has {} entries, gpu.count is {}", gpu_numa.size(), h.gpus_per_node));
  }
  for (auto n : gpu_numa) h.gpu_numa.push_back(static_cast<int>(n));
  if (r.has("rank_placement")) {
    h.rank_placement = r.one_of("rank_placement", {"spread", "fill"}) == "fill" ? RankPlacement::kFill : RankPlacement::kSpread;
  }
  h.socket_link_Bps = r.optional_number("socket_link_Bps", 0, kMaxRate).value_or(0.0);
  for (int g = 0; g < h.gpus_per_node; ++g) {
    if (h.gpu_numa[static_cast<std::size_t>(g)] != h.gpu_numa[static_cast<std::size_t>(g - g % h.pcie.gpus_per_switch)]) {
      p.fail("gpus_per_switch", fmt::format("puts GPU {} behind one switch with GPUs of another NUMA node (gpu_numa)", g));
    }
  }

  if (r.has("network")) read_network(r.object("network"), h);
  if (h.nodes > 1 && h.network.nics == 0) r.fail("nodes", "a multi-node spec needs a network (network.nic)");
  h.node_name = r.string_or("node_name", h.name);
  h.sources = r.has("sources") ? r.raw()["sources"] : nlohmann::json::object();
  if (!h.sources.is_object()) r.fail("sources", "expected an object of field → source");
  if (r.has("provenance")) {
    // Field path -> "measured" | "assumed", as `oom hardware probe` writes it
    // (costmodel/hardware_probe.h): only the spec's own fields. Checked, and read no further: it
    // tells a reader of the file which numbers are this machine's, the cost model uses them alike.
    const JsonReader pr = r.object("provenance");
    std::vector<std::string> fields = hardware_numeric_fields(h);
    for (const char* f : {"gpu.name", "gpu.count", "gpu.architecture", "gpu_numa", "pcie.generation", "fabric.kind"}) fields.push_back(f);
    std::vector<const char*> known;
    for (const auto& f : fields) known.push_back(f.c_str());
    pr.reject_unknown_keys(std::span<const char* const>(known.data(), known.size()));
    for (const auto& [key, value] : pr.raw().items()) pr.one_of(key, {"measured", "assumed"});
  }
  return h;
}

}  // namespace

HardwareSpec hardware_spec_from_json(const nlohmann::json& j, const std::string& file) {
  return parse_hardware(merged_with_node(j, file, 0), file);
}

HardwareSpec with_nodes(HardwareSpec h, int nodes, const std::string& file, const std::string& field) {
  checked_node_count(nodes, file, field);
  if (nodes > 1 && h.network.nics == 0) {
    throw InputError(file, field, std::to_string(nodes),
                     fmt::format("hardware {} has no network (network.nic) to join {} nodes", h.name, nodes));
  }
  h.nodes = nodes;
  return h;
}

HardwareSpec with_gpus_per_node(HardwareSpec h, int gpus, const std::string& file, const std::string& field) {
  if (gpus < 1 || gpus > h.gpus_per_node) {
    throw InputError(file, field, std::to_string(gpus), fmt::format("must be 1 to the {} GPUs of a {} node", h.gpus_per_node, h.name));
  }
  if (gpus == h.gpus_per_node) return h;
  // The node's first GPUs (torchrun's LOCAL_RANK 0 to gpus − 1 on CUDA devices 0 to gpus − 1): their
  // sockets and their switches as the full node has them; a switch with fewer of them in use is
  // shared by fewer.
  const int per_switch = std::min(h.pcie.gpus_per_switch, gpus);
  if (gpus % per_switch != 0) {
    throw InputError(file, field, std::to_string(gpus),
                     fmt::format("must fill whole PCIe switches of {} GPUs on a {} node", h.pcie.gpus_per_switch, h.name));
  }
  h.gpus_per_node = gpus;
  h.pcie.gpus_per_switch = per_switch;
  h.gpu_numa.resize(static_cast<std::size_t>(gpus));
  return h;
}

nlohmann::json hardware_spec_to_json(const HardwareSpec& h) {
  nlohmann::json j;
  j["name"] = h.name;
  j["description"] = h.description;
  j["nodes"] = h.nodes;
  j["gpu"] = {{"name", h.gpu.name}, {"count", h.gpus_per_node}, {"hbm_gib", to_gib(h.gpu.hbm_bytes)},
              {"bf16_flops", h.gpu.bf16_flops_per_s}, {"hbm_Bps", h.gpu.hbm_Bps}};
  if (h.gpu.l2_bytes > 0) j["gpu"]["l2_mib"] = static_cast<double>(h.gpu.l2_bytes) / static_cast<double>(kMiB);
  if (h.gpu.gemm_half_rows > 0) j["gpu"]["gemm_half_rows"] = h.gpu.gemm_half_rows;
  if (!h.gpu.architecture.empty()) j["gpu"]["architecture"] = h.gpu.architecture;
  j["gpu_numa"] = h.gpu_numa;
  if (h.rank_placement == RankPlacement::kFill) j["rank_placement"] = "fill";
  if (h.socket_link_Bps > 0) j["socket_link_Bps"] = h.socket_link_Bps;
  j["pcie"] = {{"generation", h.pcie.generation}, {"h2d_Bps", h.pcie.h2d_Bps}, {"d2h_Bps", h.pcie.d2h_Bps},
               {"latency_s", h.pcie.latency_s}};
  if (h.pcie.gpus_per_switch != 1) j["pcie"]["gpus_per_switch"] = h.pcie.gpus_per_switch;
  j["fabric"] = {{"kind", h.fabric.kind == FabricKind::kNvlink ? "nvlink" : "pcie_peer"},
                 {"per_gpu_Bps", h.fabric.per_gpu_Bps}, {"latency_s", h.fabric.latency_s}};
  auto& numa = j["numa"] = nlohmann::json::array();
  for (const auto& n : h.numa) {
    numa.push_back({{"dram_gib", to_gib(n.dram_bytes)}, {"dram_Bps", n.dram_Bps}, {"cores", n.cores},
                    {"adamw_params_per_s", n.adamw_params_per_s}});
    if (n.amx_bf16_flops_per_s > 0) numa.back()["amx_bf16_flops_per_s"] = n.amx_bf16_flops_per_s;
  }
  if (h.network.nics > 0) j["network"] = network_to_json(h.network);
  if (h.node_name != h.name) j["node_name"] = h.node_name;
  j["sources"] = h.sources;
  return j;
}

std::vector<int> HardwareSpec::rank_gpus(int ranks) const {
  if (rank_placement == RankPlacement::kFill) {
    std::vector<int> out;
    for (int r = 0; r < ranks; ++r) out.push_back(r % gpus_per_node);
    return out;
  }
  std::vector<std::vector<int>> by_numa(numa.size());
  for (int g = 0; g < gpus_per_node; ++g) by_numa[static_cast<std::size_t>(gpu_numa[g])].push_back(g);
  std::vector<int> order;  // round robin over sockets
  for (std::size_t i = 0; order.size() < static_cast<std::size_t>(gpus_per_node); ++i) {
    for (const auto& gpus : by_numa) {
      if (i < gpus.size()) order.push_back(gpus[i]);
    }
  }
  std::vector<int> out;
  for (int r = 0; r < ranks; ++r) out.push_back(order[static_cast<std::size_t>(r % gpus_per_node)]);
  return out;
}

int HardwareSpec::global_gpu_of_rank(int rank, int ranks) const {
  return (rank / gpus_per_node) * gpus_per_node + rank_gpus(ranks).at(static_cast<std::size_t>(rank));
}

int HardwareSpec::nodes_used(int ranks) const { return std::max(1, (ranks + gpus_per_node - 1) / gpus_per_node); }

std::string HardwareSpec::numa_label(int n) const {
  const int per_node = static_cast<int>(numa.size());
  if (nodes <= 1) return fmt::format("NUMA node {}", n);
  return fmt::format("node {} NUMA node {}", n / per_node, n % per_node);
}

std::string HardwareSpec::node_numa_label(int node) const {
  const int per_node = static_cast<int>(numa.size());
  const std::string sockets = per_node <= 1 ? "NUMA node 0" : fmt::format("NUMA nodes 0-{}", per_node - 1);
  if (nodes <= 1) return sockets;
  return fmt::format("node {} {}", node, sockets);
}

int HardwareSpec::numa_of_rank(int rank, int ranks) const {
  return (rank / gpus_per_node) * static_cast<int>(numa.size()) + numa_of_gpu(rank_gpus(ranks).at(static_cast<std::size_t>(rank)));
}

std::vector<int> HardwareSpec::ranks_per_numa(int ranks) const {
  std::vector<int> count(static_cast<std::size_t>(host_numa_count(ranks)), 0);
  const std::vector<int> gpus = rank_gpus(ranks);
  for (int r = 0; r < ranks; ++r) {
    ++count[static_cast<std::size_t>((r / gpus_per_node) * static_cast<int>(numa.size()) + numa_of_gpu(gpus[static_cast<std::size_t>(r)]))];
  }
  return count;
}

HardwareSpec load_hardware_spec(const std::string& name_or_path) {
  const auto path = resolve_config("hardware", name_or_path);
  if (!path) {
    throw InputError("", "hardware", "\"" + name_or_path + "\"",
                     "unknown hardware (known: " + known_config_names("hardware") + ")");
  }
  return hardware_spec_from_json(read_json_file(*path), *path);
}

std::vector<std::string> hardware_numeric_fields(const HardwareSpec& h) {
  std::vector<std::string> f = {"gpu.hbm_gib",     "gpu.bf16_flops",     "gpu.hbm_Bps",       "pcie.h2d_Bps",
                                "pcie.d2h_Bps",    "pcie.latency_s",     "fabric.per_gpu_Bps", "fabric.latency_s",
                                "numa.dram_gib",   "numa.dram_Bps",      "numa.cores",         "numa.adamw_params_per_s"};
  if (std::any_of(h.numa.begin(), h.numa.end(), [](const NumaSpec& n) { return n.amx_bf16_flops_per_s > 0; })) {
    f.push_back("numa.amx_bf16_flops_per_s");
  }
  if (h.pcie.gpus_per_switch != 1) f.push_back("pcie.gpus_per_switch");
  if (h.socket_link_Bps > 0) f.push_back("socket_link_Bps");
  if (h.gpu.l2_bytes > 0) f.push_back("gpu.l2_mib");
  if (h.gpu.gemm_half_rows > 0) f.push_back("gpu.gemm_half_rows");
  if (h.network.nics > 0) {
    for (const char* n : {"network.nic.count", "network.nic.Bps", "network.latency_s"}) f.push_back(n);
    if (h.network.topology != NetworkTopology::kSingleSwitch) {
      for (const char* n : {"network.switch_latency_s", "network.topology.nodes_per_leaf", "network.topology.oversubscription"}) f.push_back(n);
    }
    if (h.network.topology == NetworkTopology::kFatTree) {
      f.push_back("network.topology.leaves_per_pod");
      f.push_back("network.topology.core_oversubscription");
    }
  }
  return f;
}

}  // namespace oom
