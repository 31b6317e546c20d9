// The cluster tests' and benchmarks' workloads: `model` on `nodes` DGX H200 nodes (h200-sxm-node),
// `gpus` GPUs (every GPU of the nodes by default), two 4K sequences per GPU, uniform routing
// unless `routing` says otherwise; and an EP plan over it with `resident` resident and `retained`
// retained decoders, FLAT's PipelinedLLEP, SCO and a streamed optimizer when `flat`.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "costmodel/routing.h"
#include "costmodel/workload.h"
#include "planner/plan/plan.h"
#include "planner/search/ep_planner.h"

namespace oom::test_support {

// `model` on `nodes` nodes of `hardware`, `gpus` GPUs, `seqs` sequences of `seq_len` tokens per
// step (fewer sequences than GPUs: each over gpus / seqs GPUs, context parallelism).
inline WorkloadContext node_workload(const std::string& hardware, const std::string& model, int nodes, int gpus, std::int64_t seqs,
                                     std::int64_t seq_len, const nlohmann::json& routing = nullptr) {
  Workload w;
  w.model = model;
  w.hardware = hardware;
  w.nodes = nodes;
  w.gpus = gpus;
  w.global_batch = seqs;
  w.seq_len = seq_len;
  if (!routing.is_null()) w.routing = routing_from_json(routing, "cluster workload", "routing");
  return resolve_workload(w, "cluster workload");
}
// The same on DGX H200 nodes.
inline WorkloadContext h200_workload(const std::string& model, int nodes, int gpus, std::int64_t seqs, std::int64_t seq_len,
                                     const nlohmann::json& routing = nullptr) {
  return node_workload("h200-sxm-node", model, nodes, gpus, seqs, seq_len, routing);
}

inline WorkloadContext cluster_workload(const std::string& model, int nodes, int gpus = 0, const nlohmann::json& routing = nullptr) {
  const int g = gpus > 0 ? gpus : 8 * nodes;
  return h200_workload(model, nodes, g, 2 * g, 4096, routing);
}

inline Plan cluster_ep_plan(const ModelSpec& m, int resident, int retained, bool flat) {
  Plan p;
  p.path = ExpertPath::kEp;
  p.resident_layers = contiguous_resident_set(m.layers, resident);
  p.moe_retained_layers = retained_set(m.layers, retained);
  p.routing_chunk_tokens = 4096;
  if (flat) {
    p.flat.expert_dispatch = ExpertDispatch::kPipelinedLlep;
    p.flat.selective_checkpoint_offload = true;
    p.flat.optimizer_bucket_mib = 64;
  }
  return p;
}

}  // namespace oom::test_support
