// backend/runtime/device_memory.h: the metering allocator counts what is allocated inside an OnDevice
// scope until it is freed; a run that stands a CPU in for a GPU computes exactly what the run that
// does not computes.
#include "backend/runtime/device_memory.h"

#include <cstdio>
#include <optional>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "backend/measure/torch_executor.h"
#include "backend/runtime/state.h"
#include "backend/train/plan_runtime.h"
#include "planner/calibration/calibration.h"
#include "planner/search/plan_search.h"
#include "tests/common/emulated_device_peak.h"

namespace oom::backend {
namespace {

double to_mib(Bytes b) { return static_cast<double>(b) / static_cast<double>(kMiB); }

TEST(DeviceMemory, CountsDeviceScopedAllocationsUntilFreed) {
  const device_memory::Emulation on(true);
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

// Each device allocation is counted under the innermost Tagged use of its thread (other outside
// any) until it is freed or retagged; each use keeps its own peak from reset_use_peaks() on; host
// allocations are no use's; a GEMM's own scratch is other's, its result the caller's.
TEST(DeviceMemory, CountsEachUseApartWithItsOwnPeak) {
  const device_memory::Emulation on(true);
  const auto use = [](MemoryUse u) { return device_memory::use_bytes()[static_cast<std::size_t>(u)]; };
  const auto peak = [](MemoryUse u) { return device_memory::use_peak_bytes()[static_cast<std::size_t>(u)]; };
  device_memory::reset_use_peaks();
  const Bytes other = use(MemoryUse::kOther), vocabulary = use(MemoryUse::kVocabulary), optimizer = use(MemoryUse::kOptimizer);
  device_memory::OnDevice d;
  at::Tensor untagged = at::empty({100}, at::kFloat);
  EXPECT_EQ(use(MemoryUse::kOther), other + 400);
  at::Tensor logits, host;
  {
    device_memory::Tagged v(MemoryUse::kVocabulary);
    logits = at::empty({1000}, at::kFloat);
    {
      device_memory::Tagged g(MemoryUse::kOptimizer);
      at::Tensor grad = at::empty({250}, at::kFloat);
      EXPECT_EQ(use(MemoryUse::kOptimizer), optimizer + 1000);
    }
    device_memory::OnHost h;
    host = at::empty({500}, at::kFloat);
  }
  EXPECT_EQ(use(MemoryUse::kVocabulary), vocabulary + 4000);
  EXPECT_EQ(use(MemoryUse::kOptimizer), optimizer);
  EXPECT_EQ(peak(MemoryUse::kOptimizer), optimizer + 1000);
  device_memory::retag(logits.narrow(0, 10, 10), MemoryUse::kActivations);  // a view: its whole allocation moves
  EXPECT_EQ(use(MemoryUse::kVocabulary), vocabulary);
  EXPECT_EQ(peak(MemoryUse::kVocabulary), vocabulary + 4000);
  device_memory::retag(host, MemoryUse::kOptimizer);  // not the device's: nothing moves
  EXPECT_EQ(use(MemoryUse::kOptimizer), optimizer);
  logits = at::Tensor();
  device_memory::reset_use_peaks();
  EXPECT_EQ(peak(MemoryUse::kVocabulary), vocabulary);
  const at::Tensor a = at::randn({64, 32}).to(at::kBFloat16), b = at::randn({32, 48}).to(at::kBFloat16);
  const at::Tensor expected = at::mm(a, b);
  at::Tensor product;
  {
    device_memory::Tagged v(MemoryUse::kVocabulary);
    product = device_memory::gemm(a, b);
  }
  EXPECT_TRUE(at::equal(product, expected));
  EXPECT_EQ(use(MemoryUse::kVocabulary), vocabulary + 64 * 48 * 2);
  EXPECT_EQ(peak(MemoryUse::kVocabulary), vocabulary + 64 * 48 * 2);
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
  const device_memory::Emulation on(true);
  const auto emulated = run_plan(p, 2);
  EXPECT_EQ(emulated.first, plain.first);
  for (std::size_t b = 0; b < plain.second.size(); ++b) EXPECT_TRUE(at::equal(emulated.second[b], plain.second[b])) << b;
}

// Issue-level check of the budgets (backend/README.md "Device memory"): plans the plan search
// chooses under GPU budgets on the tiny models, with their GPU peaks measured by real short
// executions on this executor and held to the budget, stay within the budget when they run (other
// weights and other tokens than the short executions': the routing, and with it the expert
// batches, differ). Budgets: 100 %, 70 % and 45 % of the unconstrained plan's predicted peak, where
// the memory model alone chooses plans that measure 1.1-2.6x their prediction. A budget no plan
// meets on this executor is reported infeasible with the measured peak (8 of these 18: 4 below
// what the memory model itself needs, 4 where the smallest plans it fits measure over them).
TEST(DeviceMemory, PlansChosenUnderGpuBudgetsStayWithinThemWhenRun) {
  TorchExecutorOptions eo;
  eo.warmup_steps = 0;
  eo.measured_steps = 1;
  eo.device_memory = true;
  eo.use_cuda = false;
  TorchExecutor executor(eo);
  PlanSearchOptions o;
  o.memory = *executor.device_memory_constants();
  EXPECT_EQ(o.memory.gpu_fixed_bytes, 0);
  int chosen = 0, infeasible = 0, model_alone_over = 0;
  for (const char* model : {"tiny-moe", "tiny-moe-mixtral", "tiny-moe-gemma"}) {
    for (const auto& [batch, seq] : {std::pair{2, 16}, std::pair{8, 64}}) {
      Workload w;
      w.model = model;
      w.hardware = "local-cpu";
      w.global_batch = batch;
      w.seq_len = seq;
      const Calibration cal = load_calibration_for(resolve_workload(w, "test").hardware);
      o.compare_executor = nullptr;
      o.hold_measured_gpu_peak = false;
      const Bytes top = search_plan(resolve_workload(w, "test"), cal, o).chosen.gpu_peak_bytes;
      for (const int percent : {100, 70, 45}) {
        const std::string where = fmt::format("{} {}x{} at {}%", model, batch, seq, percent);
        w.gpu_budget_gib = percent / 100.0 * to_gib(top);
        const WorkloadContext ctx = resolve_workload(w, "test");
        o.compare_executor = nullptr;
        o.hold_measured_gpu_peak = false;
        std::optional<Plan> model_choice;
        try {
          model_choice = search_plan(ctx, cal, o).chosen.plan;
        } catch (const InfeasibleWorkload&) {
        }
        o.compare_executor = &executor;
        o.hold_measured_gpu_peak = true;
        PlanSearchResult r;
        try {
          r = search_plan(ctx, cal, o);
        } catch (const InfeasibleWorkload& e) {
          ++infeasible;
          std::printf("%-34s infeasible: %s\n", where.c_str(), e.what());
          EXPECT_NE(std::string(e.what()).find("GPU budget"), std::string::npos) << where << ": " << e.what();
          continue;
        }
        ++chosen;
        const Bytes run = test_support::emulated_device_peak(r.chosen.plan, ctx.model, batch, seq);
        EXPECT_LE(run, ctx.gpu_budget_bytes()) << where << ": measured " << run << " B, short executions " << r.chosen.measured_gpu_peak_bytes
                                               << " B, predicted " << r.chosen.gpu_peak_bytes << " B";
        EXPECT_LE(r.chosen.measured_gpu_peak_bytes, ctx.gpu_budget_bytes()) << where;
        const Bytes alone = model_choice ? test_support::emulated_device_peak(*model_choice, ctx.model, batch, seq) : 0;
        if (alone > ctx.gpu_budget_bytes()) ++model_alone_over;
        std::printf("%-34s budget %7.3f MiB  model's own choice runs at %7.3f MiB  held: predicted %7.3f, short executions %7.3f, "
                    "run %7.3f MiB (%d configurations, %s)\n",
                    where.c_str(), to_mib(ctx.gpu_budget_bytes()), to_mib(alone), to_mib(r.chosen.gpu_peak_bytes),
                    to_mib(r.chosen.measured_gpu_peak_bytes), to_mib(run), r.measured_attempts, std::string(path_name(r.chosen.plan.path)).c_str());
      }
    }
  }
  EXPECT_GE(chosen, 8) << "infeasible " << infeasible;
  EXPECT_GE(model_alone_over, 5) << "the memory model alone no longer under-predicts this executor: the check proves little";
}

}  // namespace
}  // namespace oom::backend
