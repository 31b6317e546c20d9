// Configure-then-Compare: choose between configured paths by short executions (reference §5).
//
// Decoder layers repeat, so a path's step time is a fixed cost plus a per-unit cost. Short
// executions through an Executor (planner/engine/executor.h: the analytic or SimGrid engine now, the
// LibTorch backend later) run one and two repeating units (4 and 8 decoders for a 3 GDN + 1
// attention model) of the plan with its per-layer choices as in the first decoders. An EP plan
// runs its unit executions streamed (no resident or retained layer) and then two units once more
// with its resident/retained share (r = round(2u·R/L) interleaved resident, k = round(2u·K/L)
// retained at the end), whose saving is scaled by (R + K)/(r + k). The extrapolation:
// T = F + U·c (+ (R + K)/(r + k)·(T_share − T_2) for EP), with U = layers / unit and F, c from
// the one- and two-unit runs. The path with the smaller extrapolated step wins. Models of at most two units
// run at full depth. Units: seconds, bytes. Not thread-safe (the Executor is not).
#pragma once

#include <string>
#include <vector>

#include "costmodel/workload.h"
#include "planner/engine/executor.h"
#include "planner/plan/plan.h"

namespace oom {

struct ShortExecutionEstimate {
  int unit_layers = 0;
  Seconds one_unit_s = 0;
  Seconds two_units_s = 0;
  Seconds share_units_s = 0;    // EP: two units with the plan's resident/retained share (0 when not run)
  Seconds step_s = 0;           // extrapolated to full depth
  Bytes gpu_peak_bytes = 0;     // the largest GPU peak the short executions read
  int executions = 0;
  bool full_depth = false;      // a model of at most two units: one execution of the whole model
};

// Short executions of `plan` and their extrapolation. Precondition: validate_plan() accepts it.
ShortExecutionEstimate estimate_by_short_executions(Executor& executor, const Plan& plan, const WorkloadContext& ctx);

struct CompareResult {
  std::vector<ShortExecutionEstimate> estimates;  // one per configured plan, same order
  std::size_t winner = 0;                          // index of the smallest extrapolated step
};

// Compares configured plans (at least one). Ties go to the earlier plan.
CompareResult configure_then_compare(Executor& executor, const std::vector<Plan>& configured, const WorkloadContext& ctx);

}  // namespace oom
