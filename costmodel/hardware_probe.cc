#include "costmodel/hardware_probe.h"

#include <sched.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include <fmt/format.h>

#include "costmodel/config_paths.h"
#include "costmodel/input_error.h"

namespace oom {
namespace {

namespace fs = std::filesystem;

std::string read_text(const fs::path& p) {
  std::ifstream in(p);
  if (!in) return "";
  std::ostringstream s;
  s << in.rdbuf();
  std::string t = s.str();
  while (!t.empty() && std::isspace(static_cast<unsigned char>(t.back()))) t.pop_back();
  return t;
}

// "0-3,8,10-11" -> {0, 1, 2, 3, 8, 10, 11}; malformed pieces are skipped.
std::set<int> parse_cpu_list(const std::string& list) {
  std::set<int> cpus;
  std::stringstream in(list);
  std::string piece;
  while (std::getline(in, piece, ',')) {
    try {
      const auto dash = piece.find('-');
      const int a = std::stoi(piece.substr(0, dash));
      const int b = dash == std::string::npos ? a : std::stoi(piece.substr(dash + 1));
      for (int c = a; c <= b && c - a < 1 << 16; ++c) cpus.insert(c);
    } catch (const std::exception&) {
    }
  }
  return cpus;
}

// The kB value of `key` in a meminfo file ("MemTotal:  24683784 kB" or "Node 0 MemTotal: ..."), 0 if absent.
Bytes meminfo_bytes(const fs::path& file, const std::string& key) {
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) {
    const auto at = line.find(key + ":");
    if (at == std::string::npos) continue;
    std::istringstream rest(line.substr(at + key.size() + 1));
    long long kb = 0;
    if (rest >> kb) return static_cast<Bytes>(kb) * 1024;
  }
  return 0;
}

int link_generation(const std::string& speed) {
  // current_link_speed: "16.0 GT/s PCIe" (older kernels: "16 GT/s").
  double gts = 0;
  try {
    gts = std::stod(speed);
  } catch (const std::exception&) {
    return 0;
  }
  if (gts >= 60) return 6;
  if (gts >= 30) return 5;
  if (gts >= 15) return 4;
  if (gts >= 7.5) return 3;
  if (gts >= 4.5) return 2;
  return gts > 0 ? 1 : 0;
}

// Per-lane raw rate of each PCIe generation, bytes/s (after line coding): 2.5, 5 GT/s with 8b/10b;
// 8, 16, 32 GT/s with 128b/130b; Gen6 64 GT/s PAM4 with FLIT coding (~ twice Gen5).
double pcie_lane_Bps(int generation) {
  static const double kLane[] = {0, 0.25e9, 0.5e9, 0.985e9, 1.969e9, 3.938e9, 7.877e9};
  return kLane[std::clamp(generation, 0, 6)];
}

// Tokens of a GPU name that identify its model: those with a digit that are no memory size
// ("H100", "4090"; not "80GB").
std::set<std::string> model_tokens(const std::string& name) {
  std::set<std::string> out;
  std::istringstream in(name);
  std::string t;
  while (in >> t) {
    const bool digit = std::any_of(t.begin(), t.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
    if (digit && t.size() >= 3 && !t.ends_with("GB")) out.insert(t);
  }
  return out;
}

// The shipped single-node spec whose GPU is the model `device_name` names, if any.
std::optional<HardwareSpec> shipped_spec_of_gpu(const std::string& device_name) {
  const std::set<std::string> wanted = model_tokens(device_name);
  if (wanted.empty()) return std::nullopt;
  try {
    for (const auto& n : config_names("hardware")) {
      HardwareSpec h;
      try {
        h = load_hardware_spec(n);
      } catch (const InputError&) {
        continue;
      }
      if (h.nodes != 1) continue;
      for (const auto& t : model_tokens(h.gpu.name)) {
        if (wanted.contains(t)) return h;
      }
    }
  } catch (const InputError&) {
    // No configs folder: no shipped spec to take the rates from.
  }
  return std::nullopt;
}

}  // namespace

HostFacts read_host_facts(const std::string& root_text) {
  const fs::path root = root_text;
  HostFacts f;
  std::error_code ec;
  // The CPUs this process may run on (under another root: every CPU).
  std::optional<std::set<int>> allowed;
  if (fs::equivalent(root, "/", ec)) {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof(set), &set) == 0) {
      allowed.emplace();
      for (int c = 0; c < CPU_SETSIZE; ++c) {
        if (CPU_ISSET(c, &set)) allowed->insert(c);
      }
    }
  }
  const auto usable = [&](const std::set<int>& cpus) {
    int n = 0;
    for (int c : cpus) n += !allowed || allowed->contains(c) ? 1 : 0;
    return n;
  };
  const std::set<int> online = parse_cpu_list(read_text(root / "sys/devices/system/cpu/online"));

  const fs::path nodes = root / "sys/devices/system/node";
  std::map<int, ProbedNumaNode> by_id;
  for (const auto& e : fs::directory_iterator(nodes, ec)) {
    const std::string dir = e.path().filename().string();
    if (!dir.starts_with("node") || dir.size() == 4 || !std::all_of(dir.begin() + 4, dir.end(), ::isdigit)) continue;
    ProbedNumaNode n;
    n.id = std::stoi(dir.substr(4));
    n.cpus = usable(parse_cpu_list(read_text(e.path() / "cpulist")));
    n.dram_bytes = meminfo_bytes(e.path() / "meminfo", "MemTotal");
    // A memory-only node (CXL, HBM of a CPU) has no CPUs; a CPU-only node no memory: neither is
    // a socket the cost model can use alone.
    if (n.cpus > 0 && n.dram_bytes > 0) by_id[n.id] = n;
  }
  for (const auto& [id, n] : by_id) f.numa.push_back(n);
  if (f.numa.empty()) {
    ProbedNumaNode n;
    n.cpus = usable(online);
    n.dram_bytes = meminfo_bytes(root / "proc/meminfo", "MemTotal");
    if (n.cpus == 0 || n.dram_bytes == 0) {
      throw InputError((root / "proc/meminfo").string(), "MemTotal", std::to_string(n.dram_bytes),
                       fmt::format("cannot read this machine's memory and CPUs ({} usable CPUs)", n.cpus));
    }
    f.numa.push_back(n);
  }
  for (const auto& n : f.numa) f.usable_cpus += n.cpus;

  std::set<std::string> packages;
  for (int c : online) {
    const std::string id = read_text(root / fmt::format("sys/devices/system/cpu/cpu{}/topology/physical_package_id", c));
    if (!id.empty()) packages.insert(id);
  }
  f.sockets = std::max<int>(1, static_cast<int>(packages.size()));
  {
    std::ifstream in(root / "proc/cpuinfo");
    std::string line;
    while (std::getline(in, line)) {
      if (line.starts_with("model name")) {
        const auto colon = line.find(':');
        if (colon != std::string::npos) f.cpu_model = line.substr(line.find_first_not_of(" \t", colon + 1));
        break;
      }
    }
  }

  // NVIDIA GPUs: vendor 0x10de, class 0x0300xx (VGA) or 0x0302xx (3D controller).
  for (const auto& e : fs::directory_iterator(root / "sys/bus/pci/devices", ec)) {
    const std::string vendor = read_text(e.path() / "vendor");
    const std::string cls = read_text(e.path() / "class");
    if (vendor != "0x10de" || !(cls.starts_with("0x0300") || cls.starts_with("0x0302"))) continue;
    ProbedPciGpu g;
    g.address = e.path().filename().string();
    try {
      g.numa_node = std::stoi(read_text(e.path() / "numa_node"));
    } catch (const std::exception&) {
    }
    g.link_generation = link_generation(read_text(e.path() / "current_link_speed"));
    try {
      g.link_width = std::stoi(read_text(e.path() / "current_link_width"));
    } catch (const std::exception&) {
    }
    // The device's path through the bridges: .../<root port>/<switch up>/<switch down>/<gpu>.
    const fs::path real = fs::canonical(e.path(), ec);
    if (!ec && real.has_parent_path() && real.parent_path().has_parent_path()) {
      const std::string up = real.parent_path().parent_path().filename().string();
      if (up.find(':') != std::string::npos && up.find('.') != std::string::npos) g.upstream = up;
    }
    f.pci_gpus.push_back(g);
  }
  std::sort(f.pci_gpus.begin(), f.pci_gpus.end(), [](const auto& a, const auto& b) { return a.address < b.address; });
  return f;
}

nlohmann::json probed_hardware_json(const HostFacts& host, const std::vector<ProbedDevice>& devices, const std::string& name) {
  nlohmann::json j, provenance, sources;
  const auto mark = [&](const std::string& field, bool measured, const std::string& source) {
    provenance[field] = measured ? "measured" : "assumed";
    sources[field] = source;
  };
  const int sockets_numa = static_cast<int>(host.numa.size());
  Bytes total_dram = 0;
  for (const auto& n : host.numa) total_dram += n.dram_bytes;

  j["name"] = name;
  j["nodes"] = 1;
  auto& numa = j["numa"] = nlohmann::json::array();
  for (const auto& n : host.numa) {
    numa.push_back({{"cores", n.cpus},
                    {"dram_gib", to_gib(n.dram_bytes)},
                    {"dram_Bps", kAssumedCpuCopyBpsPerSocket},
                    {"adamw_params_per_s", n.cpus * kAssumedAdamwParamsPerCorePerS}});
  }
  mark("numa.cores", true, "the node's cpulist (/sys/devices/system/node) within this process's CPU affinity");
  mark("numa.dram_gib", true, "MemTotal of /sys/devices/system/node/nodeN/meminfo (one node: /proc/meminfo)");
  mark("numa.dram_Bps", false, "estimate: kAssumedCpuCopyBpsPerSocket (costmodel/hardware_probe.h)");
  mark("numa.adamw_params_per_s", false, "estimate: cores x kAssumedAdamwParamsPerCorePerS (costmodel/hardware_probe.h)");

  if (devices.empty()) {
    // CPU-only: the host CPU stands in for one GPU (configs/hardware/local-cpu.json).
    j["description"] = fmt::format("this machine probed by oom hardware probe: {} socket(s), {} NUMA node(s), {} CPUs ({}), no GPU "
                                   "the backend sees: the host CPU stands in for one",
                                   host.sockets, sockets_numa, host.usable_cpus, host.cpu_model.empty() ? "model unknown" : host.cpu_model);
    j["gpu"] = {{"name", "host CPU (FP32)"},
                {"count", 1},
                {"hbm_gib", to_gib(total_dram)},
                {"bf16_flops", host.usable_cpus * kAssumedCpuFlopsPerCore},
                {"hbm_Bps", kAssumedCpuCopyBpsPerSocket}};
    mark("gpu.name", true, "no GPU found (backend absent or no device): the host CPU");
    mark("gpu.count", true, "no GPU found: one compute device, the CPU");
    mark("gpu.hbm_gib", true, "MemTotal: the CPU device uses host memory");
    mark("gpu.bf16_flops", false, "estimate: CPUs x kAssumedCpuFlopsPerCore (costmodel/hardware_probe.h)");
    mark("gpu.hbm_Bps", false, "estimate: kAssumedCpuCopyBpsPerSocket (costmodel/hardware_probe.h)");
    j["gpu_numa"] = {0};
    mark("gpu_numa", false, "the CPU device on NUMA node 0");
    const double copy_Bps = kAssumedCpuCopyBpsPerSocket / 2;
    j["pcie"] = {{"generation", 1}, {"h2d_Bps", copy_Bps}, {"d2h_Bps", copy_Bps}, {"latency_s", 1e-6}};
    mark("pcie.generation", false, "no PCIe link: the CPU device reads host memory (1 is the loader's minimum)");
    mark("pcie.h2d_Bps", false, "estimate: half the copy rate (a CPU transfer is a copy)");
    mark("pcie.d2h_Bps", false, "estimate: half the copy rate (a CPU transfer is a copy)");
    mark("pcie.latency_s", false, "estimate: 1 us per copy");
    j["fabric"] = {{"kind", "pcie_peer"}, {"per_gpu_Bps", copy_Bps}, {"latency_s", 1e-5}};
    mark("fabric.per_gpu_Bps", false, "estimate: as the link (one device)");
    mark("fabric.latency_s", false, "estimate: 10 us");
  } else {
    const ProbedDevice& d = devices.front();
    const int count = static_cast<int>(devices.size());
    const std::optional<HardwareSpec> like = shipped_spec_of_gpu(d.name);
    const std::string like_text = like ? fmt::format("as the shipped {} (configs/hardware)", like->name) : std::string("a generic estimate");
    j["description"] = fmt::format("this machine probed by oom hardware probe: {} socket(s), {} NUMA node(s), {} CPUs ({}), {} x {}",
                                   host.sockets, sockets_numa, host.usable_cpus, host.cpu_model.empty() ? "model unknown" : host.cpu_model,
                                   count, d.name);
    j["gpu"] = {{"name", d.name},
                {"count", count},
                {"hbm_gib", to_gib(d.memory_bytes)},
                {"bf16_flops", like ? like->gpu.bf16_flops_per_s : 1e14},
                {"hbm_Bps", like ? like->gpu.hbm_Bps : 1e12}};
    if (like && like->gpu.l2_bytes > 0) j["gpu"]["l2_mib"] = static_cast<double>(like->gpu.l2_bytes) / static_cast<double>(kMiB);
    if (like && !like->gpu.architecture.empty()) j["gpu"]["architecture"] = like->gpu.architecture;
    mark("gpu.name", true, "the LibTorch backend's device properties");
    mark("gpu.count", true, "the LibTorch backend's device count");
    mark("gpu.hbm_gib", true, "the LibTorch backend's device properties (total memory)");
    mark("gpu.bf16_flops", false, "datasheet " + like_text);
    mark("gpu.hbm_Bps", false, "datasheet " + like_text);
    if (j["gpu"].contains("l2_mib")) mark("gpu.l2_mib", false, "datasheet " + like_text);
    // GPUs on the PCI bus in address order are CUDA's default (PCI bus) order.
    const bool pci_matches = static_cast<int>(host.pci_gpus.size()) == count;
    std::vector<int> gpu_numa(static_cast<std::size_t>(count), 0);
    std::map<int, int> numa_index;  // OS NUMA id -> index in "numa"
    for (std::size_t i = 0; i < host.numa.size(); ++i) numa_index[host.numa[i].id] = static_cast<int>(i);
    bool numa_known = pci_matches;
    for (int g = 0; pci_matches && g < count; ++g) {
      const auto it = numa_index.find(host.pci_gpus[static_cast<std::size_t>(g)].numa_node);
      if (it == numa_index.end()) {
        numa_known = false;
      } else {
        gpu_numa[static_cast<std::size_t>(g)] = it->second;
      }
    }
    if (!numa_known) std::fill(gpu_numa.begin(), gpu_numa.end(), 0);
    j["gpu_numa"] = gpu_numa;
    mark("gpu_numa", numa_known, numa_known ? "each GPU's numa_node (/sys/bus/pci/devices)" : "not reported: every GPU on NUMA node 0");
    // PCIe: the link generation and width as the bus reports them; the payload rate an estimate.
    const int gen = pci_matches && host.pci_gpus.front().link_generation > 0 ? host.pci_gpus.front().link_generation
                                                                             : (like ? like->pcie.generation : 4);
    const int width = pci_matches && host.pci_gpus.front().link_width > 0 ? host.pci_gpus.front().link_width : 16;
    const double link_Bps = like && !(pci_matches && host.pci_gpus.front().link_generation > 0)
                                ? like->pcie.h2d_Bps
                                : pcie_lane_Bps(gen) * width * kPcieEfficiency;
    j["pcie"] = {{"generation", gen}, {"h2d_Bps", link_Bps}, {"d2h_Bps", link_Bps}, {"latency_s", like ? like->pcie.latency_s : 1e-5}};
    mark("pcie.generation", pci_matches && host.pci_gpus.front().link_generation > 0, "current_link_speed of the first GPU (/sys/bus/pci/devices)");
    mark("pcie.h2d_Bps", false, fmt::format("estimate: Gen{} x{} at kPcieEfficiency of the raw rate", gen, width));
    mark("pcie.d2h_Bps", false, fmt::format("estimate: Gen{} x{} at kPcieEfficiency of the raw rate", gen, width));
    mark("pcie.latency_s", false, "estimate " + like_text);
    // GPUs sharing a switch: the same upstream port, in equal groups within one NUMA node.
    if (pci_matches && count > 1) {
      std::map<std::string, std::vector<int>> groups;
      for (int g = 0; g < count; ++g) groups[host.pci_gpus[static_cast<std::size_t>(g)].upstream].push_back(g);
      const std::size_t size = groups.begin()->second.size();
      bool even = !groups.contains("") && size > 1;
      for (const auto& [up, members] : groups) {
        even = even && members.size() == size;
        for (int g : members) even = even && gpu_numa[static_cast<std::size_t>(g)] == gpu_numa[static_cast<std::size_t>(members.front())];
        // Consecutive GPUs: the spec's gpus_per_switch groups GPUs g, g+1, ...
        for (std::size_t k = 1; k < members.size(); ++k) even = even && members[k] == members[k - 1] + 1;
      }
      if (even && count % static_cast<int>(size) == 0) {
        j["pcie"]["gpus_per_switch"] = static_cast<int>(size);
        mark("pcie.gpus_per_switch", true, "GPUs under one upstream PCIe port (/sys/bus/pci/devices)");
      }
    }
    const bool nvlink = like && like->fabric.kind == FabricKind::kNvlink;
    j["fabric"] = {{"kind", nvlink ? "nvlink" : "pcie_peer"},
                   {"per_gpu_Bps", like ? like->fabric.per_gpu_Bps : link_Bps},
                   {"latency_s", like ? like->fabric.latency_s : 1e-5}};
    mark("fabric.per_gpu_Bps", false, "datasheet " + like_text);
    mark("fabric.latency_s", false, "estimate " + like_text);
  }
  j["sources"] = sources;
  j["provenance"] = provenance;
  return j;
}

}  // namespace oom
