// backend/device_memory.h: the metering allocator counts what is allocated inside an OnDevice
// scope until it is freed; a run that stands a CPU in for a GPU computes exactly what the run that
// does not computes.
#include "backend/device_memory.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "backend/plan_runtime.h"
#include "backend/state.h"
#include "planner/calibration/calibration.h"
#include "planner/search/plan_search.h"

namespace oom::backend {
namespace {

// Emulation on for a test's lifetime.
struct Emulated {
  Emulated() { device_memory::set_emulated(true); }
  ~Emulated() { device_memory::set_emulated(false); }
};

TEST(DeviceMemory, CountsDeviceScopedAllocationsUntilFreed) {
  Emulated on;
  const Bytes before = device_memory::current_bytes();
  device_memory::reset_peak();
  at::Tensor host = at::empty({1000}, at::kFloat);  // outside a scope: the host's
  EXPECT_EQ(device_memory::current_bytes(), before);
  {
    device_memory::OnDevice d;
    at::Tensor a = at::empty({1000}, at::kFloat);
    EXPECT_EQ(device_memory::current_bytes(), before + 4000);
    {
      device_memory::OnHost h;
      at::Tensor b = at::empty({500}, at::kFloat);
      EXPECT_EQ(device_memory::current_bytes(), before + 4000);
    }
    at::Tensor c = at::empty({250}, at::kDouble);
    EXPECT_EQ(device_memory::current_bytes(), before + 6000);
    a = at::Tensor();
    EXPECT_EQ(device_memory::current_bytes(), before + 2000);
  }
  EXPECT_EQ(device_memory::current_bytes(), before);
  EXPECT_EQ(device_memory::peak_bytes(), before + 6000);
  // A device copy of a host tensor is a device allocation of its own.
  const at::Tensor copy = device_memory::to_device(host, at::kCPU);
  EXPECT_NE(copy.data_ptr(), host.data_ptr());
  EXPECT_EQ(device_memory::current_bytes(), before + 4000);
}

TEST(DeviceMemory, WithoutEmulationNothingIsCountedOrCopied) {
  const Bytes before = device_memory::current_bytes();
  device_memory::OnDevice d;
  at::Tensor a = at::empty({1000}, at::kFloat);
  EXPECT_EQ(device_memory::current_bytes(), before);
  EXPECT_EQ(device_memory::to_device(a, at::kCPU).data_ptr(), a.data_ptr());
}

Plan local_plan() {
  Plan p;
  p.path = ExpertPath::kLocal;
  return p;
}

// Losses of `steps` steps of `plan` on tiny-moe, and the working weights after them.
std::pair<std::vector<double>, std::vector<at::Tensor>> run_plan(const Plan& plan, int steps) {
  const ModelSpec spec = load_model_spec("tiny-moe");
  HostState state(spec);
  state.init_from_seed(4);
  TrainerConfig cfg;
  cfg.model.gdn_chunk_tokens = 8;
  cfg.model.attention_query_block = 8;
  PlanTrainer t(state, cfg, plan);
  torch::manual_seed(9);
  std::vector<double> losses;
  for (int s = 0; s < steps; ++s) {
    const auto tokens = torch::randint(0, 256, {4, 24}, torch::kLong);
    losses.push_back(t.step(tokens, tokens.roll(1, 1)).loss);
  }
  std::vector<at::Tensor> w;
  for (int b = 0; b < state.blocks(); ++b) w.push_back(state.working(b).clone());
  return {losses, w};
}

TEST(DeviceMemory, AnEmulatedDeviceRunComputesWhatTheAdoptingRunComputes) {
  Plan p = local_plan();
  p.keep_attention_results = true;
  p.boundaries.host_kept_all = false;
  p.boundaries.host_kept = {0, 2};
  p.boundaries.gpu_held = {1};
  p.split = {2, 8, 48, 2};
  const auto plain = run_plan(p, 2);
  Emulated on;
  const auto emulated = run_plan(p, 2);
  EXPECT_EQ(emulated.first, plain.first);
  for (std::size_t b = 0; b < plain.second.size(); ++b) EXPECT_TRUE(at::equal(emulated.second[b], plain.second[b])) << b;
}

}  // namespace
}  // namespace oom::backend
