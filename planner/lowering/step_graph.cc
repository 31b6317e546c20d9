#include "planner/lowering/step_graph.h"

#include <unordered_set>

#include <fmt/format.h>

#include "costmodel/input_error.h"

namespace oom {

std::string_view resource_kind_name(ResourceKind k) {
  switch (k) {
    case ResourceKind::kGpuCompute: return "compute";
    case ResourceKind::kH2d: return "h2d";
    case ResourceKind::kD2h: return "d2h";
    case ResourceKind::kExpertGradD2h: return "expert_grad_d2h";
    case ResourceKind::kFabric: return "fabric";
    case ResourceKind::kCpuUpdate: return "cpu_update";
    case ResourceKind::kHostPrep: return "host_prep";
  }
  return "?";
}

std::string gpu_compute_resource_name(int rank) { return fmt::format("gpu{}.compute", rank); }

std::string_view op_kind_name(OpKind k) {
  switch (k) {
    case OpKind::kGemm: return "gemm";
    case OpKind::kExpertGemm: return "expert_gemm";
    case OpKind::kAttention: return "attention";
    case OpKind::kGdn: return "gdn";
    case OpKind::kElementwise: return "elementwise";
    case OpKind::kH2d: return "h2d";
    case OpKind::kD2h: return "d2h";
    case OpKind::kAllToAll: return "all_to_all";
    case OpKind::kAllGather: return "all_gather";
    case OpKind::kReduceScatter: return "reduce_scatter";
    case OpKind::kCpuAdamW: return "cpu_adamw";
    case OpKind::kTorchCpuAdamW: return "torch_cpu_adamw";
    case OpKind::kHostAccumulate: return "host_accumulate";
    case OpKind::kHostPrep: return "host_prep";
    case OpKind::kGpuAdamW: return "gpu_adamw";
    case OpKind::kSync: return "sync";
  }
  return "?";
}

std::string_view memory_use_name(MemoryUse u) {
  switch (u) {
    case MemoryUse::kOther: return "other";
    case MemoryUse::kActivations: return "activations";
    case MemoryUse::kDispatch: return "dispatch";
    case MemoryUse::kVocabulary: return "vocabulary";
    case MemoryUse::kBoundaries: return "boundaries";
    case MemoryUse::kOptimizer: return "optimizer";
  }
  return "?";
}

StepGraphBuilder::StepGraphBuilder(int gpus, int numa_nodes) {
  g_.gpus = gpus;
  g_.numa_nodes = numa_nodes;
  g_.gpu_base_bytes.assign(static_cast<std::size_t>(gpus), 0);
  g_.numa_base_bytes.assign(static_cast<std::size_t>(numa_nodes), 0);
}

ResourceId StepGraphBuilder::add_resource(ResourceKind kind, std::string name, int gpu, int numa) {
  Resource r;
  r.id = static_cast<ResourceId>(g_.resources.size());
  r.kind = kind;
  r.name = std::move(name);
  r.gpu = gpu;
  r.numa = numa;
  g_.resources.push_back(std::move(r));
  return g_.resources.back().id;
}

std::size_t StepGraphBuilder::KeyHash::operator()(const StageKey& k) const {
  std::uint64_t h = 1469598103934665603ull;
  for (const std::int64_t v : {std::int64_t{k.rank}, static_cast<std::int64_t>(k.phase), std::int64_t{k.micro_batch}, std::int64_t{k.decoder},
                               static_cast<std::int64_t>(k.part), std::int64_t{k.sub_batch}, std::int64_t{k.repeat}, std::int64_t{k.chunk},
                               std::int64_t{k.head_group}, std::int64_t{k.ring_step}, std::int64_t{k.bucket}, static_cast<std::int64_t>(k.op),
                               std::int64_t{k.join}}) {
    h = (h ^ static_cast<std::uint64_t>(v)) * 1099511628211ull;
  }
  return static_cast<std::size_t>(h);
}

StageId StepGraphBuilder::add(Stage s) {
  const auto id = static_cast<StageId>(g_.stages.size());
  OOM_ASSERT(s.resource >= 0 && static_cast<std::size_t>(s.resource) < g_.resources.size(), "stage on unknown resource");
  for (const StageId d : s.deps) OOM_ASSERT(d >= 0 && d < id, "dependency on a later or unknown stage");
  s.id = id;
  if (const int seen = repeats_[s.key]++; seen > 0) s.key.repeat = seen;
  s.name = format_stage_key(s.key);
  s.gpu = s.key.rank;
  s.layer = s.key.decoder;
  s.phase = s.key.phase;
  g_.resources[static_cast<std::size_t>(s.resource)].order.push_back(id);
  g_.stages.push_back(std::move(s));
  return id;
}

std::string check_step_graph(const StepGraph& g, bool keys) {
  std::vector<int> seen(g.stages.size(), 0);
  std::unordered_set<std::string> names;
  if (keys) names.reserve(g.stages.size());
  for (std::size_t i = 0; i < g.stages.size(); ++i) {
    const Stage& s = g.stages[i];
    if (s.id != static_cast<StageId>(i)) return fmt::format("stage {} has id {}", i, s.id);
    if (s.resource < 0 || static_cast<std::size_t>(s.resource) >= g.resources.size()) {
      return fmt::format("stage {} ({}) on unknown resource {}", i, s.name, s.resource);
    }
    for (const StageId d : s.deps) {
      if (d < 0 || d >= s.id) return fmt::format("stage {} ({}) depends on {}", i, s.name, d);
    }
    if (s.gpu != s.key.rank || s.layer != s.key.decoder || s.phase != s.key.phase ||
        (keys && s.name != format_stage_key(s.key))) {
      return fmt::format("stage {} ({}) disagrees with its key {}", i, s.name, format_stage_key(s.key));
    }
    if (keys && !names.insert(s.name).second) return fmt::format("stage {} repeats the key {}", i, s.name);
    for (const auto& m : s.memory) {
      const int limit = m.space == MemorySpace::kGpu ? g.gpus : g.numa_nodes;
      if (m.device < 0 || m.device >= limit) return fmt::format("stage {} ({}) has memory on device {}", i, s.name, m.device);
    }
  }
  for (const Resource& r : g.resources) {
    StageId prev = -1;
    for (const StageId id : r.order) {
      if (id < 0 || static_cast<std::size_t>(id) >= g.stages.size()) return fmt::format("resource {} lists stage {}", r.name, id);
      if (id <= prev) return fmt::format("resource {} issues stage {} after {}", r.name, id, prev);
      if (g.stages[static_cast<std::size_t>(id)].resource != r.id) {
        return fmt::format("resource {} lists stage {} of another resource", r.name, id);
      }
      ++seen[static_cast<std::size_t>(id)];
      prev = id;
    }
  }
  for (std::size_t i = 0; i < seen.size(); ++i) {
    if (seen[i] != 1) return fmt::format("stage {} ({}) is issued {} times", i, g.stages[i].name, seen[i]);
  }
  return "";
}

}  // namespace oom
