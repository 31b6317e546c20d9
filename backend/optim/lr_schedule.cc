#include "backend/optim/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "costmodel/input_error.h"

namespace oom::backend {

double lr_at(const LrSchedule& s, std::int64_t step) {
  if (s.kind == "constant") return s.lr;
  if (step <= s.warmup_steps) return s.lr * static_cast<double>(step) / static_cast<double>(s.warmup_steps);
  const double span = static_cast<double>(std::max<std::int64_t>(1, s.decay_steps - s.warmup_steps));
  const double p = std::min(1.0, static_cast<double>(step - s.warmup_steps) / span);
  return s.min_lr + 0.5 * (s.lr - s.min_lr) * (1.0 + std::cos(std::numbers::pi * p));
}

LrSchedule resolve_lr_schedule(const std::string& kind, double lr, double min_lr, std::int64_t warmup_steps,
                               std::int64_t decay_steps, std::int64_t last_step) {
  if (!kind.empty() && kind != "constant" && kind != "cosine") {
    throw InputError("", "--lr-schedule", kind, "must be constant or cosine");
  }
  if (warmup_steps < 0) throw InputError("", "--warmup", std::to_string(warmup_steps), "must be ≥ 0");
  if (decay_steps < 0) throw InputError("", "--decay-steps", std::to_string(decay_steps), "must be ≥ 0");
  LrSchedule s;
  s.kind = !kind.empty() ? kind : (warmup_steps > 0 || decay_steps > 0) ? "cosine" : "constant";
  s.lr = lr;
  s.min_lr = min_lr < 0 ? 0.1 * lr : min_lr;
  if (s.min_lr > lr) throw InputError("", "--min-lr", std::to_string(min_lr), "must be ≤ --lr");
  if (s.kind == "constant") {
    if (warmup_steps > 0) throw InputError("", "--warmup", std::to_string(warmup_steps), "needs --lr-schedule cosine");
    if (decay_steps > 0) throw InputError("", "--decay-steps", std::to_string(decay_steps), "needs --lr-schedule cosine");
    s.min_lr = s.lr;
    return s;
  }
  s.warmup_steps = warmup_steps;
  s.decay_steps = decay_steps > 0 ? decay_steps : last_step;
  if (s.decay_steps < s.warmup_steps) {
    throw InputError("", "--decay-steps", std::to_string(s.decay_steps), "must be ≥ --warmup " + std::to_string(warmup_steps));
  }
  return s;
}

nlohmann::json lr_schedule_to_json(const LrSchedule& s) {
  return {{"kind", s.kind}, {"lr", s.lr}, {"min_lr", s.min_lr}, {"warmup_steps", s.warmup_steps},
          {"decay_steps", s.decay_steps}};
}

}  // namespace oom::backend
