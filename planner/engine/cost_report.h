// Static cost of a plan per GPU and step: work and traffic by resource, and the time each
// resource needs at its rated speed (reference Eq. 1, Eq. 6, §3–§5).
//
// Before a StepGraph orders the work, the step cannot be shorter than the busiest resource
// (`lower_bound_s`, perfect overlap) nor, with no overlap at all, longer than the sum
// (`serial_s`). Compute is priced at the GPU's BF16 peak, transfers at the spec's achieved
// bandwidths, CPU AdamW at the NUMA node's update rate. The StepGraph issue refines this with
// dependencies and calibration.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "costmodel/params.h"
#include "costmodel/units.h"
#include "costmodel/workload.h"
#include "planner/plan/plan.h"

namespace oom {

struct StaticCost {
  Flops forward_flops = 0;     // the original forward
  Flops recompute_flops = 0;   // replay of checkpointed decoders, boundary regeneration, the loss's logits
  Flops backward_flops = 0;
  Flops eq1_linear_flops = 0;  // Eq. 1 split of the forward (a·B·S and b·B·S² terms)
  Flops eq1_quadratic_flops = 0;
  Bytes h2d_bytes = 0;         // BF16 weights over PCIe (forward and backward passes)
  Bytes d2h_bytes = 0;         // BF16 gradients over PCIe
  Bytes a2a_bytes = 0;         // EP dispatch + return over the fabric (Eq. 6 per MoE pass)
  Bytes allgather_bytes = 0;   // all-gathers over the fabric: Local shard delivery, EP replicas, ring attention
  Bytes activation_offload_bytes = 0;  // boundaries and O/LSE moved between GPU and host
  ParamCount cpu_updated_params = 0;   // parameters this GPU's rank updates with CPU AdamW
  ParamCount gpu_updated_params = 0;   // resident parameters updated with GPU AdamW

  Seconds compute_s = 0;
  Seconds h2d_s = 0;
  Seconds d2h_s = 0;
  Seconds fabric_s = 0;
  Seconds cpu_update_s = 0;
  Seconds lower_bound_s() const;
  Seconds serial_s() const;
};

StaticCost static_cost(const WorkloadContext& ctx, const Plan& plan);
nlohmann::json static_cost_to_json(const StaticCost& c);
std::string static_cost_text(const StaticCost& c, const WorkloadContext& ctx);

// The default workload of the project's main job: Qwen3.6-35B-A3B on four H100s, global batch
// 32, 4K context, with the published R23 EP plan (interleaved resident set, 64K routing chunk).
Workload default_workload();
Plan default_plan();

}  // namespace oom
