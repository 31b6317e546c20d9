// The device peak of a plan run by the CPU backend standing in for a GPU (backend/runtime/device_memory.h):
// the most the device side holds over two BF16 steps of seeded random tokens. Shared by the
// backend's memory tests and its memory benchmark (both link LibTorch).
#pragma once

#include <algorithm>
#include <cstdint>

#include <torch/torch.h>

#include "backend/runtime/device_memory.h"
#include "backend/runtime/state.h"
#include "backend/train/plan_runtime.h"

namespace oom::test_support {

inline Bytes emulated_device_peak(const Plan& plan, const ModelSpec& model, std::int64_t batch, std::int64_t seq) {
  const backend::device_memory::Emulation on(true);  // ends after the runner it meters
  Bytes peak = 0;
  backend::HostState state(model, {backend::WorkingPrecision::kBFloat16, {}});
  state.init_from_seed(6);
  backend::PlanTrainer t(state, backend::TrainerConfig{}, plan);
  torch::manual_seed(10);
  for (int s = 0; s < 2; ++s) {
    const auto tokens = torch::randint(0, 256, {batch, seq}, torch::kLong);
    t.step(tokens, tokens.roll(1, 1));
    peak = std::max(peak, backend::device_memory::peak_bytes());
  }
  return peak;
}

}  // namespace oom::test_support
