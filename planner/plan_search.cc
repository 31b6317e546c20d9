#include "planner/plan_search.h"

#include <algorithm>

#include <fmt/format.h>

#include "costmodel/input_error.h"
#include "planner/configure_compare.h"
#include "planner/ep_planner.h"
#include "planner/local_planner.h"
#include "planner/plan_pricing.h"
#include "planner/step_engine.h"

namespace oom {
PlanChoice plan_choice_of(const PricedPlan& p, const WorkloadContext& ctx) {
  PlanChoice c;
  c.plan = p.plan;
  c.predicted_step_s = p.step_s;
  const double tokens = static_cast<double>(ctx.workload.global_batch) * static_cast<double>(ctx.workload.seq_len);
  c.tokens_per_s = p.step_s > 0 ? tokens / p.step_s : 0.0;
  c.gpu_peak_bytes = p.gpu_peak_max();
  c.host_bytes_per_numa = p.numa_peak_bytes;
  return c;
}

namespace {

// How far over its budget a shortfall is (needed / budget), for picking the closest path.
double overshoot(const BudgetShortfall& s) {
  return s.budget_bytes > 0 ? static_cast<double>(s.needed_bytes) / static_cast<double>(s.budget_bytes) : 1e300;
}

}  // namespace

PlanSearchResult search_plan(const WorkloadContext& ctx, const Calibration& calibration, const PlanSearchOptions& options) {
  if (options.path != "ep" && options.path != "local" && options.path != "auto") {
    throw InputError("", "--path", "\"" + options.path + "\"", "expected ep, local or auto");
  }
  if (options.path == "auto" && !make_step_engine(options.compare_engine)) {
    throw InputError("", "compare_engine", "\"" + options.compare_engine + "\"",
                     fmt::format("unknown engine (known: {})", fmt::join(step_engine_names(), ", ")));
  }
  const PlanPricer pricer(ctx, calibration);
  PlanSearchResult r;
  std::vector<PricedPlan> configured;
  std::vector<BudgetShortfall> shortfalls;
  std::string not_applicable;
  if (options.path != "local") {
    const EpSearchResult ep = plan_ep(pricer);
    r.candidates_priced += ep.priced;
    if (ep.best) configured.push_back(*ep.best);
    if (ep.shortfall) shortfalls.push_back(*ep.shortfall);
    if (!ep.best && !ep.shortfall) {
      not_applicable = fmt::format("the EP path needs the {} experts of {} to split evenly over {} GPUs",
                                   ctx.model.moe.experts, ctx.model.name, ctx.workload.gpus);
    }
  }
  if (options.path != "ep") {
    const LocalSearchResult local = plan_local(pricer);
    r.candidates_priced += local.priced;
    if (local.best) configured.push_back(*local.best);
    if (local.shortfall) shortfalls.push_back(*local.shortfall);
  }
  if (configured.empty()) {
    if (shortfalls.empty()) throw InfeasibleWorkload(not_applicable.empty() ? "no plan fits the budgets" : not_applicable);
    const auto closest = std::min_element(shortfalls.begin(), shortfalls.end(),
                                          [](const BudgetShortfall& a, const BudgetShortfall& b) { return overshoot(a) < overshoot(b); });
    throw InfeasibleWorkload(closest->message());
  }
  std::size_t winner = 0;
  std::vector<Seconds> compared(configured.size(), 0.0);
  if (configured.size() > 1) {
    std::unique_ptr<StepEngine> engine = make_step_engine(options.compare_engine);
    if (!engine) {
      throw InputError("", "compare_engine", "\"" + options.compare_engine + "\"",
                       fmt::format("unknown engine (known: {})", fmt::join(step_engine_names(), ", ")));
    }
    GraphExecutor executor(std::move(engine), calibration);
    std::vector<Plan> plans;
    for (const PricedPlan& p : configured) plans.push_back(p.plan);
    const CompareResult cmp = configure_then_compare(executor, plans, ctx);
    winner = cmp.winner;
    for (std::size_t i = 0; i < cmp.estimates.size(); ++i) compared[i] = cmp.estimates[i].step_s;
    r.compare_engine = options.compare_engine;
  }
  for (std::size_t i = 0; i < configured.size(); ++i) {
    PlanChoice c = plan_choice_of(configured[i], ctx);
    c.compared_step_s = compared[i];
    if (i == winner) {
      r.chosen = std::move(c);
    } else {
      r.alternatives.push_back(std::move(c));
    }
  }
  return r;
}

nlohmann::json plan_choice_to_json(const PlanChoice& c) {
  nlohmann::json per_numa = nlohmann::json::array();
  Bytes host = 0;
  for (Bytes b : c.host_bytes_per_numa) {
    per_numa.push_back(to_gib(b));
    host += b;
  }
  nlohmann::json j = {{"path", std::string(path_name(c.plan.path))},
                      {"plan", plan_to_json(c.plan)},
                      {"predicted_step_s", c.predicted_step_s},
                      {"tokens_per_s", c.tokens_per_s},
                      {"gpu_peak_gib", to_gib(c.gpu_peak_bytes)},
                      {"host_gib", to_gib(host)},
                      {"host_gib_per_numa", per_numa}};
  if (c.compared_step_s > 0) j["compared_step_s"] = c.compared_step_s;
  return j;
}

nlohmann::json plan_search_to_json(const PlanSearchResult& r) {
  nlohmann::json j = plan_choice_to_json(r.chosen);
  nlohmann::json alts = nlohmann::json::array();
  for (const PlanChoice& a : r.alternatives) alts.push_back(plan_choice_to_json(a));
  j["alternatives"] = alts;
  j["compare_engine"] = r.compare_engine;
  j["candidates_priced"] = r.candidates_priced;
  return j;
}

std::string plan_search_text(const PlanSearchResult& r) {
  auto line = [](const PlanChoice& c) {
    std::string host;
    for (std::size_t n = 0; n < c.host_bytes_per_numa.size(); ++n) {
      host += fmt::format("{}numa{} {:.1f} GiB", n ? ", " : "", n, to_gib(c.host_bytes_per_numa[n]));
    }
    return fmt::format("  path {:<5}  step {:8.3f} s  {:9.0f} tokens/s  GPU peak {:6.1f} GiB  host {}\n  plan: {}\n",
                       path_name(c.plan.path), c.predicted_step_s, c.tokens_per_s, to_gib(c.gpu_peak_bytes), host,
                       c.plan.notes);
  };
  std::string out = "chosen:\n" + line(r.chosen);
  for (const PlanChoice& a : r.alternatives) out += "best of the other path:\n" + line(a);
  if (!r.compare_engine.empty()) {
    out += fmt::format("Configure-then-Compare ({} short executions): {:.3f} s", r.compare_engine, r.chosen.compared_step_s);
    for (const PlanChoice& a : r.alternatives) out += fmt::format(" vs {:.3f} s", a.compared_step_s);
    out += "\n";
  }
  return out;
}

}  // namespace oom
