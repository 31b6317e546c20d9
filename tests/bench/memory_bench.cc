// The device memory of plans the plan search chooses under GPU budgets, measured against the
// prediction: tiny models on a CPU standing in for the GPU (backend/runtime/device_memory.h), BF16 working
// weights as the memory model assumes, no CUDA context and no caching allocator (M_0 = 0, ε = 0),
// so the budget bounds the bytes the device's tensors hold. Each benchmark chooses the plan for a
// budget of `percent` % of the unconstrained plan's predicted peak (FLAT's schedules offered: on one
// GPU those are SCO and OffloadStreamAdamW, which the backend runs), runs two steps and reports
// the predicted and measured peaks (MiB) and their ratio, with the plan's path and its retained
// decoders. The figures show how far this executor's kernels hold more than the memory model's
// fused kernels; nothing is asserted here.
#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include "backend/runtime/device_memory.h"
#include "backend/runtime/state.h"
#include "backend/train/plan_runtime.h"
#include "planner/calibration/calibration.h"
#include "planner/search/plan_search.h"
#include "tests/common/emulated_device_peak.h"

namespace {

using namespace oom;
using namespace oom::backend;

const char* const kModels[] = {"tiny-moe", "tiny-moe-mixtral", "tiny-moe-gemma"};

PlanSearchOptions cpu_device_options() {
  PlanSearchOptions o;
  o.memory.gpu_fixed_bytes = 0;
  o.memory.gpu_headroom_fraction = 0;
  return o;
}

Bytes measured_peak(const Plan& plan, const WorkloadContext& ctx) {
  return test_support::emulated_device_peak(plan, ctx.model, ctx.workload.global_batch, ctx.workload.seq_len);
}

// Args: model index, global batch, sequence length, budget in % of the unconstrained peak.
void BM_MeasuredVsPredictedPeak(benchmark::State& st) {
  Workload w;
  w.model = kModels[st.range(0)];
  w.hardware = "local-cpu";
  w.global_batch = st.range(1);
  w.seq_len = st.range(2);
  const PlanSearchOptions o = cpu_device_options();
  const Calibration cal = load_calibration_for(resolve_workload(w, "bench").hardware);
  const Bytes top = search_plan(resolve_workload(w, "bench"), cal, o).chosen.gpu_peak_bytes;
  w.gpu_budget_gib = static_cast<double>(st.range(3)) / 100.0 * static_cast<double>(top) / static_cast<double>(kGiB);
  const WorkloadContext ctx = resolve_workload(w, "bench");
  PlanChoice c;
  try {
    c = search_plan(ctx, cal, o).chosen;
  } catch (const InfeasibleWorkload& e) {
    st.SkipWithError(e.what());
    return;
  }
  Bytes measured = 0;
  for (auto _ : st) measured = measured_peak(c.plan, ctx);
  const auto mib = [](Bytes b) { return static_cast<double>(b) / static_cast<double>(kMiB); };
  st.counters["budget_mib"] = mib(ctx.gpu_budget_bytes());
  st.counters["predicted_mib"] = mib(c.gpu_peak_bytes);
  st.counters["measured_mib"] = mib(measured);
  st.counters["measured_over_predicted"] = static_cast<double>(measured) / static_cast<double>(c.gpu_peak_bytes);
  st.counters["retained"] = static_cast<double>(c.plan.moe_retained_layers.size());
  st.SetLabel(std::string(path_name(c.plan.path)));
}

void Args(benchmark::internal::Benchmark* b) {
  for (int model = 0; model < 3; ++model) {
    for (const auto& [batch, seq] : {std::pair{2, 16}, std::pair{8, 128}}) {
      for (const int percent : {100, 80, 60, 40}) b->Args({model, batch, seq, percent});
    }
  }
}

BENCHMARK(BM_MeasuredVsPredictedPeak)->Apply(Args)->Iterations(1)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
