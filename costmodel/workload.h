// Workload: what to train and where: model, hardware, GPUs, global batch, context, budgets.
//
// JSON form (DESIGN.md): {"model": "qwen3.6-35b-a3b", "hardware": "h100-sxm-node", "gpus": 4,
// "global_batch": 32, "seq_len": 4096, "gpu_budget_gib": null, "host_budget_gib": null,
// "yarn_factor": 1, "routing": {"kind": "zipf", "skew": 1.2}} ("routing" optional, default
// uniform; costmodel/routing.h). A null budget means "the hardware's capacity". The global batch is split
// evenly over the GPUs (whole sequences per GPU; no gradient accumulation), or, with fewer sequences
// than GPUs, each sequence over gpus / global_batch GPUs (context parallelism). Plain value type.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "costmodel/hardware_spec.h"
#include "costmodel/model_spec.h"
#include "costmodel/routing.h"
#include "costmodel/units.h"

namespace oom {

struct Workload {
  std::string model;     // name in configs/models or a path to a config.json
  std::string hardware;  // name in configs/hardware or a path
  int gpus = 1;
  std::int64_t global_batch = 1;  // sequences per step over all GPUs
  std::int64_t seq_len = 1;       // tokens per sequence
  std::optional<double> gpu_budget_gib;   // per GPU
  std::optional<double> host_budget_gib;  // per node (split over its NUMA nodes by capacity)
  // Nodes of the hardware's node spec (its network joins them); unset: the hardware's own count.
  std::optional<int> nodes;
  // GPUs in use per node, the node's first ones (torchrun's --nproc-per-node); unset: all of them.
  std::optional<int> gpus_per_node;
  double yarn_factor = 1.0;               // context extension factor over max_position_embeddings
  RoutingSpec routing;                    // how tokens spread over experts (default: uniform)

  // Fewer sequences than GPUs split each sequence over gpus / global_batch consecutive GPUs
  // (context parallelism, Plan::context_parallel_gpus): each GPU then holds one piece of one
  // sequence, local_seq_len() tokens long.
  int gpus_per_seq() const { return global_batch < gpus ? static_cast<int>(gpus / global_batch) : 1; }
  std::int64_t seqs_per_gpu() const { return global_batch < gpus ? 1 : global_batch / gpus; }
  std::int64_t local_seq_len() const { return seq_len / gpus_per_seq(); }
  std::int64_t tokens_per_gpu() const { return seqs_per_gpu() * local_seq_len(); }
  bool operator==(const Workload&) const = default;
};

// Parses the JSON object (type and range checks only). Throws InputError naming the field;
// `path` is where the object sits in its file ("workload" inside a recorded measurement).
Workload workload_from_json(const nlohmann::json& j, const std::string& file, const std::string& path = "");
nlohmann::json workload_to_json(const Workload& w);
Workload load_workload(const std::string& path);

// A workload with its model and hardware loaded and checked against each other.
struct WorkloadContext {
  Workload workload;
  ModelSpec model;
  HardwareSpec hardware;

  // Budgets in bytes: per GPU the given budget, else the GPU's HBM; per node the given budget,
  // else the node's DRAM.
  Bytes gpu_budget_bytes() const;
  Bytes host_budget_bytes() const;
  // Per host NUMA node of the nodes the ranks occupy (HardwareSpec::ranks_per_numa's numbering):
  // the NUMA node's DRAM, or with a workload budget each node's budget split over its NUMA nodes
  // in proportion to their DRAM.
  std::vector<Bytes> host_budget_bytes_per_numa() const;
};

// Loads the model and hardware the workload names (repeated over `nodes` when set, `gpus_per_node`
// of each node in use when set) and checks:
// gpus ≤ GPUs of the hardware, budgets within its capacity (check_budgets, costmodel/input_limits.h),
// global_batch a multiple of gpus or dividing it (then seq_len a multiple of gpus / global_batch), seq_len ≤ max_position_embeddings · yarn_factor.
// Errors name `file` and the workload field (model, hardware, gpus, ...).
WorkloadContext resolve_workload(const Workload& w, const std::string& file);

}  // namespace oom
