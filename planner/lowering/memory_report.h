// Static memory of a plan: the Eq. 2 terms per GPU and the host footprint per NUMA node.
//
// "Static" means from the equations alone, before a StepGraph exists: the GPU peak is
// M_0 + M_state + M_keep + max over sublayers of M_work + ε, where M_keep counts every retained
// tensor alive at the start of backward and M_work the largest workset of one decoder
// (parameter window, gradient buffer, recompute activations, dispatch buffers, logits chunk).
// The simulator's memory timeline refines this with the real allocation order.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "costmodel/memory.h"
#include "costmodel/workload.h"
#include "planner/plan/plan.h"

namespace oom {

// One named line of a breakdown.
struct MemoryItem {
  std::string name;
  Bytes bytes = 0;
  // Held only part of the step: the lowering's stages allocate and free it themselves (host-kept
  // boundaries, kept O/LSE), so it is not part of a StepGraph's base bytes.
  bool per_step = false;
};

struct GpuMemoryReport {
  GpuPeakTerms eq2;
  std::vector<MemoryItem> state;  // components of M_state
  std::vector<MemoryItem> keep;   // components of M_keep
  std::vector<MemoryItem> work;   // components of M_work at its largest
  std::string work_peak_at;       // where the workset peaks, e.g. "decoder 3 (full_attention) backward"
};

struct HostNumaReport {
  int numa = 0;                   // host NUMA node over the cluster (HardwareSpec::numa_of_rank)
  std::string label;              // "NUMA node 1", or "node 3 NUMA node 1" on a cluster
  int ranks = 0;                  // GPUs whose CPU work runs on this node
  std::vector<MemoryItem> items;  // canonical state, pinned pools, boundaries, O/LSE, process
  Bytes total() const;
  Bytes capacity = 0;
  // Of total(), what lands in the DRAM of the node's other sockets (costmodel/host_placement.h).
  Bytes spilled = 0;
};

struct MemoryReport {
  GpuMemoryReport gpu;            // the largest GPU (all GPUs are alike in these plans)
  std::vector<HostNumaReport> host;
  Bytes host_total() const;
};

MemoryReport static_memory(const WorkloadContext& ctx, const Plan& plan, const MemoryConstants& constants = {});

nlohmann::json memory_report_to_json(const MemoryReport& r);
// A human-readable table in GiB.
std::string memory_report_text(const MemoryReport& r);

}  // namespace oom
