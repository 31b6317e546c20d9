#include "costmodel/workload.h"

#include <algorithm>

#include <fmt/format.h>

#include "costmodel/config_paths.h"
#include "costmodel/input_error.h"
#include "costmodel/input_limits.h"
#include "costmodel/json_input.h"

namespace oom {
namespace {

// Tensors of one GPU's step may total at most 2^50 bytes (1 PiB), so that byte counts derived
// from tokens and widths stay far inside int64.
constexpr double kMaxStepBytes = 1125899906842624.0;  // 2^50

// An upper bound of the bytes per token of one GPU's step in floating point (cannot overflow):
// 16 B per element of every per-token width (hidden, attention, GDN, router, experts, logits)
// plus the GDN states, which are at most one per token.
double bytes_per_token_bound(const ModelSpec& m) {
  double attention = 0;
  for (const AttentionSpec* a : {&m.full_attention, &m.sliding_attention, &m.latent_attention}) {
    attention = std::max(attention, 4.0 * (static_cast<double>(a->heads) + a->kv_heads) * (a->head_dim + a->value_dim()) +
                                        4.0 * a->heads + 4.0 * (a->q_lora_rank + a->kv_lora_rank + a->rope_head_dim));
  }
  const GdnSpec& g = m.gdn;
  const double gdn = 4.0 * (g.key_dim() + g.value_dim() + g.value_heads) +
                     static_cast<double>(g.value_heads) * g.key_head_dim * g.value_head_dim;
  const MoeSpec& e = m.moe;
  const double moe = static_cast<double>(m.hidden) * (e.top_k + 4) + e.experts + 3.0 * e.top_k * e.expert_intermediate +
                     3.0 * (static_cast<double>(e.shared_expert_intermediate) + e.dense_intermediate +
                            m.dense_layer.dense_intermediate) + e.top_k;
  return 16.0 * (static_cast<double>(m.vocab) + static_cast<double>(m.layers) * (attention + gdn + moe));
}

// The host memory of one node: the DRAM of its NUMA nodes.
Bytes node_host_bytes(const HardwareSpec& h) {
  Bytes total = 0;
  for (const NumaSpec& n : h.numa) total += n.dram_bytes;
  return total;
}

}  // namespace

Workload workload_from_json(const nlohmann::json& j, const std::string& file, const std::string& path) {
  const JsonReader r(j, file, path);
  r.reject_unknown_keys({"model", "hardware", "gpus", "global_batch", "seq_len", "gpu_budget_gib",
                         "host_budget_gib", "yarn_factor", "routing", "nodes", "gpus_per_node"});
  Workload w;
  w.model = r.string("model");
  w.hardware = r.string("hardware");
  w.gpus = static_cast<int>(r.integer("gpus", 1, kMaxWorkloadGpus));
  w.global_batch = r.integer("global_batch", 1, std::int64_t{1} << 32);
  w.seq_len = r.integer("seq_len", 1, std::int64_t{1} << 32);
  w.gpu_budget_gib = r.optional_number("gpu_budget_gib", 0.001, 1e6);
  w.host_budget_gib = r.optional_number("host_budget_gib", 0.001, 1e9);
  w.yarn_factor = r.number_or("yarn_factor", 1.0, 1.0, 1024.0);
  if (const auto n = r.optional_integer("nodes", 1, kMaxNodes)) w.nodes = static_cast<int>(*n);
  if (const auto g = r.optional_integer("gpus_per_node", 1, kMaxGpusPerNode)) w.gpus_per_node = static_cast<int>(*g);
  if (r.has("routing")) w.routing = routing_from_json(r.object("routing").raw(), file, r.field("routing"));
  if (w.global_batch % w.gpus != 0 && w.gpus % w.global_batch != 0) {
    r.fail("global_batch", fmt::format("must be a multiple of gpus = {} (whole sequences per GPU) or divide it (each "
                                       "sequence split over gpus / global_batch GPUs)", w.gpus));
  }
  if (w.seq_len % w.gpus_per_seq() != 0) {
    r.fail("seq_len", fmt::format("must split evenly over the {} GPUs of each sequence (gpus / global_batch)", w.gpus_per_seq()));
  }
  return w;
}

nlohmann::json workload_to_json(const Workload& w) {
  nlohmann::json j = {{"model", w.model}, {"hardware", w.hardware}, {"gpus", w.gpus},
                      {"global_batch", w.global_batch}, {"seq_len", w.seq_len}};
  j["gpu_budget_gib"] = w.gpu_budget_gib ? nlohmann::json(*w.gpu_budget_gib) : nlohmann::json();
  j["host_budget_gib"] = w.host_budget_gib ? nlohmann::json(*w.host_budget_gib) : nlohmann::json();
  j["yarn_factor"] = w.yarn_factor;
  if (!w.routing.uniform()) j["routing"] = routing_to_json(w.routing);
  if (w.nodes) j["nodes"] = *w.nodes;
  if (w.gpus_per_node) j["gpus_per_node"] = *w.gpus_per_node;
  return j;
}

Workload load_workload(const std::string& path) { return workload_from_json(read_json_file(path), path); }

Bytes WorkloadContext::gpu_budget_bytes() const {
  return workload.gpu_budget_gib ? input_bytes(*workload.gpu_budget_gib, kGiB, "", "gpu_budget_gib") : hardware.gpu.hbm_bytes;
}

Bytes WorkloadContext::host_budget_bytes() const {
  return workload.host_budget_gib ? input_bytes(*workload.host_budget_gib, kGiB, "", "host_budget_gib")
                                  : node_host_bytes(hardware);
}

std::vector<Bytes> WorkloadContext::host_budget_bytes_per_numa() const {
  const Bytes capacity = node_host_bytes(hardware);
  std::vector<Bytes> out;
  for (int n = 0; n < hardware.host_numa_count(workload.gpus); ++n) {
    const Bytes dram = hardware.numa_spec(n).dram_bytes;
    if (!workload.host_budget_gib) {
      out.push_back(dram);
    } else {
      const double share = capacity > 0 ? static_cast<double>(dram) / static_cast<double>(capacity) : 0.0;
      out.push_back(static_cast<Bytes>(static_cast<double>(host_budget_bytes()) * share));
    }
  }
  return out;
}

void check_budgets(const WorkloadContext& c, const std::string& file, const std::string& gpu_field,
                   const std::string& host_field) {
  const HardwareSpec& h = c.hardware;
  const auto check = [&](const std::optional<double>& gib, const std::string& field, Bytes capacity, const std::string& what) {
    if (!gib) return;
    if (!(*gib > 0)) throw InputError(file, field, fmt::format("{}", *gib), "a budget must be a positive number of GiB");
    const Bytes bytes = input_bytes(*gib, kGiB, file, field);
    if (bytes > capacity) {
      throw InputError(file, field, fmt::format("{}", *gib),
                       fmt::format("above the {:.4g} GiB of {} of {}: no budget can exceed it (leave the budget out to use "
                                   "it all)", to_gib(capacity), what, h.name));
    }
  };
  check(c.workload.gpu_budget_gib, gpu_field, h.gpu.hbm_bytes, "HBM per GPU");
  check(c.workload.host_budget_gib, host_field, node_host_bytes(h), "host memory per node");
}

WorkloadContext resolve_workload(const Workload& w, const std::string& file) {
  WorkloadContext c{w, {}, {}};
  const nlohmann::json j = workload_to_json(w);
  const JsonReader r(j, file);
  // An unknown name is the workload's error; a broken config file names that file.
  if (!resolve_config("models", w.model)) r.fail("model", "unknown model (known: " + known_config_names("models") + ")");
  if (!resolve_config("hardware", w.hardware)) {
    r.fail("hardware", "unknown hardware (known: " + known_config_names("hardware") + ")");
  }
  c.model = load_model_spec(w.model);
  c.hardware = load_hardware_spec(w.hardware);
  if (w.nodes) c.hardware = with_nodes(std::move(c.hardware), *w.nodes, file, r.field("nodes"));
  if (w.gpus_per_node) c.hardware = with_gpus_per_node(std::move(c.hardware), *w.gpus_per_node, file, r.field("gpus_per_node"));
  if (w.gpus > c.hardware.total_gpus()) {
    r.fail("gpus", fmt::format("hardware {} has {} GPUs", c.hardware.name, c.hardware.total_gpus()));
  }
  const double max_len = static_cast<double>(c.model.max_position) * w.yarn_factor;
  if (c.model.max_position > 0 && static_cast<double>(w.seq_len) > max_len) {
    r.fail("seq_len", fmt::format("exceeds max_position_embeddings {} × yarn_factor {} of {}", c.model.max_position,
                                  w.yarn_factor, c.model.name));
  }
  check_budgets(c, file, r.field("gpu_budget_gib"), r.field("host_budget_gib"));
  check_routing(w.routing, c.model.moe.experts, c.model.layers, file, "routing");
  const double tokens_per_gpu = static_cast<double>(w.global_batch) / w.gpus * static_cast<double>(w.seq_len);
  if (const double bytes = tokens_per_gpu * bytes_per_token_bound(c.model); bytes > kMaxStepBytes) {
    r.fail("global_batch", fmt::format("{} tokens per GPU of {} need up to {:.3g} bytes per step, more than the {:.3g} "
                                       "supported", tokens_per_gpu, c.model.name, bytes, kMaxStepBytes));
  }
  return c;
}

}  // namespace oom
