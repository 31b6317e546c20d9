#include "costmodel/hardware_spec.h"

#include <algorithm>
#include <filesystem>

#include <fmt/format.h>

#include "costmodel/config_paths.h"
#include "costmodel/input_error.h"
#include "costmodel/json_input.h"

namespace oom {
namespace {

constexpr double kMaxRate = 1e18;
constexpr double kMaxGib = 1 << 24;  // 16 PiB

}  // namespace

HardwareSpec hardware_spec_from_json(const nlohmann::json& j, const std::string& file) {
  const JsonReader r(j, file);
  HardwareSpec h;
  h.name = r.string("name");
  h.description = r.string_or("description", "");
  h.nodes = static_cast<int>(r.integer_or("nodes", 1, 1, 65536));

  const JsonReader g = r.object("gpu");
  h.gpu.name = g.string("name");
  h.gpus_per_node = static_cast<int>(g.integer("count", 1, 1024));
  h.gpu.hbm_bytes = from_gib(g.number("hbm_gib", 0.001, kMaxGib));
  h.gpu.bf16_flops_per_s = g.number("bf16_flops", 1e9, kMaxRate);
  h.gpu.hbm_Bps = g.number("hbm_Bps", 1e6, kMaxRate);
  h.gpu.l2_bytes = static_cast<Bytes>(g.optional_number("l2_mib", 0, 1 << 20).value_or(0.0) * static_cast<double>(kMiB));
  h.gpu.gemm_half_rows = g.optional_number("gemm_half_rows", 0, 1e6).value_or(0.0);

  const JsonReader p = r.object("pcie");
  h.pcie.generation = static_cast<int>(p.integer("generation", 1, 16));
  h.pcie.h2d_Bps = p.number("h2d_Bps", 1e6, kMaxRate);
  h.pcie.d2h_Bps = p.number("d2h_Bps", 1e6, kMaxRate);
  h.pcie.latency_s = p.number("latency_s", 0.0, 1.0);
  h.pcie.gpus_per_switch = static_cast<int>(p.integer_or("gpus_per_switch", 1, 1, 1024));
  if (h.gpus_per_node % h.pcie.gpus_per_switch != 0) {
    p.fail("gpus_per_switch", fmt::format("must divide gpu.count {}", h.gpus_per_node));
  }

  const JsonReader f = r.object("fabric");
  h.fabric.kind = f.one_of("kind", {"nvlink", "pcie_peer"}) == "nvlink" ? FabricKind::kNvlink : FabricKind::kPciePeer;
  h.fabric.per_gpu_Bps = f.number("per_gpu_Bps", 1e6, kMaxRate);
  h.fabric.latency_s = f.number("latency_s", 0.0, 1.0);

  if (!r.has("numa") || !r.raw()["numa"].is_array() || r.raw()["numa"].empty()) {
    r.fail("numa", "expected a non-empty list of NUMA nodes");
  }
  const auto& numa = r.raw()["numa"];
  for (std::size_t i = 0; i < numa.size(); ++i) {
    const JsonReader n(numa[i], file, fmt::format("numa[{}]", i));
    NumaSpec s;
    s.dram_bytes = from_gib(n.number("dram_gib", 0.001, kMaxGib));
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
  for (int g = 0; g < h.gpus_per_node; ++g) {
    if (h.gpu_numa[static_cast<std::size_t>(g)] != h.gpu_numa[static_cast<std::size_t>(g - g % h.pcie.gpus_per_switch)]) {
      p.fail("gpus_per_switch", fmt::format("puts GPU {} behind one switch with GPUs of another NUMA node (gpu_numa)", g));
    }
  }

  if (r.has("network")) {
    const JsonReader n = r.object("network");
    h.network.per_node_Bps = n.number("per_node_Bps", 0.0, kMaxRate);
    h.network.latency_s = n.number("latency_s", 0.0, 1.0);
  }
  if (h.nodes > 1 && h.network.per_node_Bps <= 0) {
    r.fail("network", "a multi-node spec needs network.per_node_Bps > 0");
  }
  h.sources = r.has("sources") ? r.raw()["sources"] : nlohmann::json::object();
  if (!h.sources.is_object()) r.fail("sources", "expected an object of field → source");
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
  j["gpu_numa"] = h.gpu_numa;
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
  j["network"] = {{"per_node_Bps", h.network.per_node_Bps}, {"latency_s", h.network.latency_s}};
  j["sources"] = h.sources;
  return j;
}

std::vector<int> HardwareSpec::rank_gpus(int ranks) const {
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

int HardwareSpec::numa_of_rank(int rank, int ranks) const { return numa_of_gpu(rank_gpus(ranks).at(static_cast<std::size_t>(rank))); }

std::vector<int> HardwareSpec::ranks_per_numa(int ranks) const {
  std::vector<int> count(numa.size(), 0);
  const auto gpus = rank_gpus(std::min(ranks, gpus_per_node));
  for (int g : gpus) ++count[static_cast<std::size_t>(numa_of_gpu(g))];
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
  if (h.gpu.l2_bytes > 0) f.push_back("gpu.l2_mib");
  if (h.gpu.gemm_half_rows > 0) f.push_back("gpu.gemm_half_rows");
  if (h.nodes > 1) {
    f.push_back("network.per_node_Bps");
    f.push_back("network.latency_s");
  }
  return f;
}

}  // namespace oom
