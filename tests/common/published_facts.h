// Published behaviors of the reference (§3, §4) that every step engine must reproduce, written
// once and checked by each engine's tests with its own step-time function (the analytic engine in
// tests/planner/validation_test.cc, SimGrid in tests/sim/published_facts_test.cc).
#pragma once

#include <functional>

#include <gtest/gtest.h>

#include "costmodel/workload.h"
#include "planner/engine/cost_report.h"
#include "planner/plan/plan.h"

namespace oom::published_facts {

// Step time in seconds of `plan` on workload `w` as one engine predicts it.
using StepTimeFn = std::function<double(const Plan& plan, const Workload& w)>;

// R23 at batch 32 on four H100s: the resident set shortens the step (published 8.48 s → 5.02 s).
inline void expect_resident_layers_shorten_the_batch32_step(const StepTimeFn& step_s) {
  Plan r0 = default_plan();
  r0.resident_layers.clear();
  const double ratio = step_s(r0, default_workload()) / step_s(default_plan(), default_workload());
  EXPECT_GE(ratio, 1.4);
}

// An interleaved resident set beats a contiguous one of the same size.
inline void expect_interleaved_resident_set_beats_contiguous(const StepTimeFn& step_s) {
  Plan interleaved = default_plan();
  interleaved.resident_layers = {0, 1, 3, 7, 11, 15, 19, 22, 26, 30, 34, 38};
  Plan contiguous = default_plan();
  contiguous.resident_layers = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
  EXPECT_LT(step_s(interleaved, default_workload()), step_s(contiguous, default_workload()));
}

// Keeping O/LSE on the host pays at 512K (published 260 s → 200 s) and not at 32K.
inline void expect_keeping_attention_results_helps_at_512k_not_32k(const StepTimeFn& step_s) {
  Plan keep;
  keep.path = ExpertPath::kLocal;
  keep.param_transfer = ParamTransfer::kShard;
  keep.transfer_chunk_mib = 256;
  keep.cpu_grad_slots = 1;
  keep.split = {8, 131072, 262144, 0};
  keep.keep_attention_results = true;
  Plan no_keep = keep;
  no_keep.keep_attention_results = false;
  Workload w = default_workload();
  w.global_batch = 4;
  w.seq_len = 524288;
  w.yarn_factor = 2;
  const double gain_512k = step_s(no_keep, w) / step_s(keep, w) - 1;
  w.seq_len = 32768;
  keep.split = {8, 16384, 32768, 0};
  no_keep.split = keep.split;
  const double gain_32k = step_s(no_keep, w) / step_s(keep, w) - 1;
  EXPECT_GT(gain_512k, 0.10);
  EXPECT_LT(gain_32k, 0.02);
}

}  // namespace oom::published_facts
