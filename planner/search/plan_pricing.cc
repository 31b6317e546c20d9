#include "planner/search/plan_pricing.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "costmodel/host_placement.h"
#include "costmodel/input_error.h"
#include "planner/engine/analytic_evaluator.h"
#include "planner/engine/work_counts.h"
#include "planner/lowering/graph_size_estimate.h"
#include "planner/lowering/step_graph.h"

namespace oom {

Budgets workload_budgets(const WorkloadContext& ctx) {
  Budgets b;
  b.gpu_bytes = ctx.gpu_budget_bytes();
  b.numa_bytes = ctx.host_budget_bytes_per_numa();
  for (std::size_t n = 0; n < b.numa_bytes.size(); ++n) b.numa_names.push_back("host " + ctx.hardware.numa_label(static_cast<int>(n)));
  b.numa_per_node = std::max<int>(1, static_cast<int>(ctx.hardware.numa.size()));
  for (int node = 0; node < ctx.hardware.nodes_used(ctx.workload.gpus); ++node) {
    b.node_names.push_back("host " + ctx.hardware.node_numa_label(node));
  }
  return b;
}

std::string Budgets::numa_name(std::size_t n) const {
  return n < numa_names.size() ? numa_names[n] : fmt::format("host NUMA node {}", n);
}

std::string Budgets::node_name(std::size_t node) const {
  return node < node_names.size() ? node_names[node] : fmt::format("host of node {}", node);
}

Bytes PricedPlan::gpu_peak_max() const {
  return gpu_peak_bytes.empty() ? 0 : *std::max_element(gpu_peak_bytes.begin(), gpu_peak_bytes.end());
}

Bytes PricedPlan::host_total() const {
  Bytes total = 0;
  for (Bytes b : numa_peak_bytes) total += b;
  return total;
}

std::string BudgetShortfall::message() const {
  // No single figure (a search that found nothing within both budgets): say what has no room.
  if (needed_bytes <= 0) return fmt::format("{}, within {:.1f} GiB of {} room and the GPU budget", where, to_gib(budget_bytes), budget);
  // One decimal, or as many more (up to six) as it takes to tell the two numbers apart and to show
  // a budget below 0.1 GiB as more than zero; in MiB when what is needed is under 0.1 GiB.
  const bool mib = needed_bytes < kGiB / 10;
  const auto in_unit = [mib](Bytes b) { return mib ? static_cast<double>(b) / static_cast<double>(kMiB) : to_gib(b); };
  const double have = in_unit(budget_bytes), need = in_unit(needed_bytes);
  int digits = 1;
  while (digits < 6 && (fmt::format("{:.{}f}", have, digits) == fmt::format("{:.{}f}", need, digits) ||
                        (have > 0 && have < std::pow(10.0, -digits)))) {
    ++digits;
  }
  const char* unit = mib ? "MiB" : "GiB";
  return fmt::format("{} budget {:.{}f} {} < {:.{}f} {} needed{}{}", budget, have, digits, unit, need, digits, unit,
                     where.empty() ? "" : " by ", where);
}

std::optional<BudgetShortfall> check_budgets(const Budgets& b, Bytes gpu_peak_bytes,
                                             const std::vector<Bytes>& numa_peak_bytes, const std::string& gpu_where,
                                             const std::string& host_where) {
  if (gpu_peak_bytes > b.gpu_bytes) return BudgetShortfall{"GPU", b.gpu_bytes, gpu_peak_bytes, gpu_where};
  // A socket's overflow spills into its node's other sockets: a node runs out when all are full.
  if (const auto over = host_overflow(numa_peak_bytes, b.numa_bytes, b.numa_per_node)) {
    return BudgetShortfall{b.node_name(static_cast<std::size_t>(over->node)), over->capacity, over->needed, host_where};
  }
  return std::nullopt;
}

PlanPricer::PlanPricer(const WorkloadContext& ctx, const Calibration& calibration, MemoryConstants constants,
                       FlatSchedules flat)
    : ctx_(ctx), durations_(ctx.hardware, calibration, ctx.workload.gpus), constants_(constants), flat_(flat) {}

PlanPricer::PlanPricer(const PlanPricer& same, FlatSchedules flat)
    : ctx_(same.ctx_), durations_(same.durations_), constants_(same.constants_), flat_(flat), memo_(same.memo_) {}

Plan PlanPricer::with_flat(Plan plan) const {
  plan.flat = applicable_flat(flat_, plan, ctx_.model, ctx_.workload);
  return plan;
}

LoweringOptions PlanPricer::lowering_options(int decoder_layers) const {
  LoweringOptions options;
  options.memory = constants_;
  options.decoder_layers = decoder_layers;
  options.symmetric_nodes = true;  // evaluated analytically: one node's stages when every node runs alike
  return options;
}

StepGraph PlanPricer::lower_plan(const Plan& plan, int decoder_layers) const {
  ++thread_work_counts().lowerings;
  return lower(plan, ctx_, lowering_options(decoder_layers));
}

bool PlanPricer::refuses(const Plan& plan, int decoder_layers) const {
  const LoweringOptions options = lowering_options(decoder_layers);
  const GraphSize size = estimate_step_graph(plan, ctx_, options);
  if (size.stages <= options.max_stages) return false;
  const std::lock_guard<std::mutex> lock(refusals_->mutex);
  if (refusals_->count++ == 0) {
    refusals_->first = InputError("", size.field, size.value, graph_size_refusal(size, options.max_stages)).what();
  }
  return true;
}

int PlanPricer::refused() const {
  const std::lock_guard<std::mutex> lock(refusals_->mutex);
  return refusals_->count;
}

std::string PlanPricer::first_refusal() const {
  const std::lock_guard<std::mutex> lock(refusals_->mutex);
  return refusals_->first;
}

PricedPlan PlanPricer::price(const Plan& plan, int decoder_layers) const {
  if (refuses(plan, decoder_layers)) {
    PricedPlan p;
    p.plan = plan;
    p.step_s = std::numeric_limits<Seconds>::infinity();
    p.gpu_peak_bytes.assign(static_cast<std::size_t>(ctx_.workload.gpus), std::numeric_limits<Bytes>::max());
    p.numa_peak_bytes.assign(static_cast<std::size_t>(ctx_.hardware.host_numa_count(ctx_.workload.gpus)), std::numeric_limits<Bytes>::max());
    return p;
  }
  ++thread_work_counts().priced;
  Plan bare = plan;
  bare.notes.clear();
  const auto key = std::make_pair(plan_to_json(bare).dump(), decoder_layers);
  {
    const std::lock_guard<std::mutex> lock(memo_->mutex);
    if (const auto it = memo_->priced.find(key); it != memo_->priced.end()) {
      ++thread_work_counts().price_hits;
      PricedPlan p = it->second;
      p.plan = plan;
      return p;
    }
  }
  const StepGraph g = lower_plan(plan, decoder_layers);
  const StageTimes t = analytic_step_times(g, durations_);
  ++thread_work_counts().simulations;
  MemoryPeaks m = memory_peaks(g, t, /*keep_samples=*/false);
  PricedPlan p;
  p.plan = plan;
  p.step_s = t.step_s;
  p.gpu_peak_bytes = std::move(m.gpu_peak_bytes);
  p.numa_peak_bytes = std::move(m.numa_peak_bytes);
  const std::lock_guard<std::mutex> lock(memo_->mutex);
  memo_->priced.emplace(key, p);
  return p;
}

int repeating_unit_layers(const ModelSpec& m) {
  const int L = m.layers;
  for (int p = 1; p < L; ++p) {
    bool repeats = true;
    for (int i = p; i < L && repeats; ++i) repeats = m.layer_kinds[static_cast<std::size_t>(i)] == m.layer_kinds[static_cast<std::size_t>(i % p)];
    if (repeats) return p;
  }
  return std::max(1, L);
}

}  // namespace oom
