// The learning-rate schedule of a training run: linear warm-up from 0, then cosine decay to a floor.
//
//   step t (1-based, the global optimizer step about to run), peak lr, floor min_lr, warm-up W,
//   decay end D (counted from step 1, warm-up included):
//     constant  lr
//     cosine    lr · t / W                                    for t ≤ W
//               min_lr + ½ (lr − min_lr) (1 + cos(π p)),      p = min(1, (t − W) / max(1, D − W))
//   so the first step after warm-up runs at lr (p = 1/(D − W) ≈ 0) … the step D at min_lr, and
//   every later step at min_lr (nanoGPT's get_lr with lr_decay_iters = D).
// The position comes from the global step alone, so a resumed run continues the schedule exactly.
// Pure functions; no LibTorch.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace oom::backend {

struct LrSchedule {
  std::string kind = "constant";   // "constant" or "cosine"
  double lr = 1e-3;                // peak
  double min_lr = 1e-4;            // cosine floor
  std::int64_t warmup_steps = 0;
  std::int64_t decay_steps = 0;    // D: the step at which the decay reaches min_lr
  bool operator==(const LrSchedule&) const = default;
};

// The learning rate of global step `step` (1-based).
double lr_at(const LrSchedule& schedule, std::int64_t step);

// The schedule a run's options give: `kind` "" means cosine when warm-up or decay steps are given
// and constant otherwise; min_lr < 0 means 0.1 × lr; decay_steps 0 means `last_step` (the run's
// last global step). Throws InputError naming the option (--lr-schedule, --warmup, --decay-steps,
// --min-lr) for a bad value.
LrSchedule resolve_lr_schedule(const std::string& kind, double lr, double min_lr, std::int64_t warmup_steps,
                               std::int64_t decay_steps, std::int64_t last_step);

nlohmann::json lr_schedule_to_json(const LrSchedule& s);

}  // namespace oom::backend
