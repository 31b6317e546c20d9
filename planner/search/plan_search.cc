#include "planner/search/plan_search.h"

#include <algorithm>
#include <array>
#include <limits>
#include <memory>
#include <optional>

#include <fmt/format.h>

#include "costmodel/input_error.h"
#include "planner/engine/analytic_evaluator.h"
#include "planner/engine/step_engine.h"
#include "planner/lowering/memory_report.h"
#include "planner/search/configure_compare.h"
#include "planner/search/ep_planner.h"
#include "planner/search/local_planner.h"
#include "planner/search/plan_pricing.h"

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

PlanChoice plan_choice_of(const PricedPlan& p, const PlanPricer& pricer) {
  PlanChoice c = plan_choice_of(p, pricer.context());
  const StepGraph g = pricer.lower_plan(p.plan);
  const StageTimes t = analytic_step_times(g, pricer.durations());
  const auto worst = std::max_element(p.gpu_peak_bytes.begin(), p.gpu_peak_bytes.end());
  const int gpu = worst == p.gpu_peak_bytes.end() ? 0 : static_cast<int>(worst - p.gpu_peak_bytes.begin());
  c.peak = gpu_peak_composition(g, t, gpu, static_memory(pricer.context(), p.plan, pricer.constants()).gpu.eq2.state);
  c.binding = binding_peak(c.peak, p.plan);
  return c;
}

FlatSchedules bounded_flat_schedules() {
  FlatSchedules f;
  f.expert_dispatch = ExpertDispatch::kPipelinedLlep;
  f.vocab_projection = VocabProjection::kRingDtp;
  f.vocab_chunk_tokens = 1024;
  f.selective_checkpoint_offload = true;
  f.optimizer_bucket_mib = 64;
  return f;
}

std::string flat_schedules_text(const FlatSchedules& f) {
  std::vector<std::string> parts;
  if (f.expert_dispatch == ExpertDispatch::kPipelinedLlep) parts.emplace_back("PipelinedLLEP");
  if (f.vocab_projection == VocabProjection::kRingDtp) parts.push_back(fmt::format("Ring-DTP ({}-token blocks)", f.vocab_chunk_tokens));
  if (f.selective_checkpoint_offload) parts.emplace_back("SCO");
  if (f.optimizer_bucket_mib > 0) parts.push_back(fmt::format("OffloadStreamAdamW ({} MiB buckets)", f.optimizer_bucket_mib));
  return fmt::format("{}", fmt::join(parts, ", "));
}

PricedPlan refine_flat_schedules(const PlanPricer& pricer, PricedPlan best) {
  const WorkloadContext& ctx = pricer.context();
  const Budgets budgets = workload_budgets(ctx);
  const FlatSchedules on = bounded_flat_schedules();
  // Each schedule switched on or off in turn, then the update's bucket size among three; every
  // change starts from the best plan so far.
  const auto changed = [&](int which, FlatSchedules f) {
    switch (which) {
      case 0: f.expert_dispatch = f.expert_dispatch == ExpertDispatch::kStandard ? on.expert_dispatch : ExpertDispatch::kStandard; break;
      case 1:
        f.vocab_projection = f.vocab_projection == VocabProjection::kChunked ? on.vocab_projection : VocabProjection::kChunked;
        f.vocab_chunk_tokens = on.vocab_chunk_tokens;
        break;
      case 2: f.selective_checkpoint_offload = !f.selective_checkpoint_offload; break;
      case 3: f.optimizer_bucket_mib = f.optimizer_bucket_mib > 0 ? 0 : on.optimizer_bucket_mib; break;
      default: if (f.optimizer_bucket_mib > 0) f.optimizer_bucket_mib = std::array<std::int64_t, 3>{16, 64, 256}[static_cast<std::size_t>(which - 4)]; break;
    }
    return f;
  };
  for (int which = 0; which < 7; ++which) {
    Plan p = best.plan;
    p.flat = applicable_flat(changed(which, p.flat), p, ctx.model, ctx.workload);
    if (p == best.plan) continue;
    PricedPlan candidate = pricer.price(p);
    if (check_budgets(budgets, candidate.gpu_peak_max(), candidate.numa_peak_bytes, "", "")) continue;
    if (candidate.step_s < best.step_s * (1 - 1e-4)) best = std::move(candidate);
  }
  const std::string text = flat_schedules_text(best.plan.flat);
  const auto at = best.plan.notes.find("; FLAT: ");
  if (at != std::string::npos) best.plan.notes.erase(at);
  if (!text.empty()) best.plan.notes += "; FLAT: " + text;
  return best;
}

namespace {

// The faster of a path's plan configured without FLAT's schedules and with them (on a tie, the
// one with the smaller GPU peak); either may be missing.
std::optional<PricedPlan> better(std::optional<PricedPlan> a, std::optional<PricedPlan> b) {
  if (!a) return b;
  if (!b) return a;
  if (b->step_s < a->step_s * (1 - 1e-4)) return b;
  if (a->step_s < b->step_s * (1 - 1e-4)) return a;
  return b->gpu_peak_max() < a->gpu_peak_max() ? b : a;
}

// How far over its budget a shortfall is (needed / budget), for picking the closest path.
double overshoot(const BudgetShortfall& s) {
  return s.budget_bytes > 0 ? static_cast<double>(s.needed_bytes) / static_cast<double>(s.budget_bytes) : 1e300;
}

}  // namespace

Bytes measured_gpu_peak(const ShortExecutionEstimate& measured, Executor& model, const Plan& plan, const WorkloadContext& ctx,
                        const MemoryConstants& memory) {
  Bytes deeper = 0;  // nothing deeper when the short executions ran the whole model
  if (!measured.full_depth) {
    const ShortExecutionEstimate short_model = estimate_by_short_executions(model, plan, ctx);
    const Measurement full = model.run(plan, ctx, {0});
    const Bytes full_model = full.gpu_peak_bytes.empty() ? 0 : *std::max_element(full.gpu_peak_bytes.begin(), full.gpu_peak_bytes.end());
    deeper = full_model > short_model.gpu_peak_bytes ? full_model - short_model.gpu_peak_bytes : 0;
  }
  return eq2_gpu_peak(memory.gpu_fixed_bytes, 0, 0, measured.gpu_peak_bytes + deeper, memory.gpu_headroom_fraction).total();
}

namespace {

// A GPU memory figure: GiB from 0.1 GiB, MiB below (the tiny models' budgets).
std::string memory_text(Bytes b) {
  return b >= kGiB / 10 ? fmt::format("{:.2f} GiB", to_gib(b)) : fmt::format("{:.3f} MiB", static_cast<double>(b) / static_cast<double>(kMiB));
}

// One configuration of the requested paths under ctx's budgets, compared and (with
// `measured_budget` > 0) held to the executor's measured peaks. `fits` is false when every
// configured plan measured over `measured_budget`; `over` is then the measured peak of the fastest.
struct Configured {
  PlanSearchResult result;
  bool fits = true;
  Bytes over = 0;
};

Configured configure_and_compare(const WorkloadContext& ctx, const Calibration& calibration, const PlanSearchOptions& options,
                                 Bytes measured_budget) {
  const PlanPricer pricer(ctx, calibration, options.memory);
  // Each path is configured without FLAT's schedules and with all of them (they change which
  // plans fit: a bounded dispatch, vocabulary or boundary peak leaves room for residency and
  // retention); the faster is refined schedule by schedule.
  const PlanPricer flat_pricer(pricer, bounded_flat_schedules());
  Configured out;
  PlanSearchResult& r = out.result;
  r.model_gpu_budget_bytes = ctx.gpu_budget_bytes();
  std::vector<PricedPlan> configured;
  std::vector<BudgetShortfall> shortfalls;
  std::string not_applicable;
  const auto keep = [&](std::optional<PricedPlan> best, const std::optional<BudgetShortfall>& plain_miss,
                        const std::optional<BudgetShortfall>& flat_miss) {
    if (best) {
      configured.push_back(options.flat ? refine_flat_schedules(pricer, std::move(*best)) : std::move(*best));
    } else if (plain_miss || flat_miss) {
      // The schedules bound peaks: the shortfall with them is the one to report.
      shortfalls.push_back(flat_miss ? *flat_miss : *plain_miss);
    }
  };
  if (options.path != "local") {
    const EpSearchResult ep = plan_ep(pricer), ep_flat = options.flat ? plan_ep(flat_pricer) : EpSearchResult{};
    r.candidates_priced += ep.priced + ep_flat.priced;
    keep(better(ep.best, ep_flat.best), ep.shortfall, ep_flat.shortfall);
    if (!ep.best && !ep.shortfall && !ep_flat.best && !ep_flat.shortfall) {
      not_applicable = fmt::format("the EP path needs the {} experts of {} to split evenly over the {} GPUs or an EP group of them",
                                   ctx.model.moe.experts, ctx.model.name, ctx.workload.gpus);
    }
  }
  // A model deeper than the boundary search plans is refused by --path local (plan_local names the
  // field) and leaves the choice to EP with --path auto.
  // So is a workload over several nodes (the Local path sums gradients in one node's host memory).
  // And one that splits its sequences over GPUs (the Local path runs whole sequences per GPU).
  const bool local_plannable = ctx.model.layers <= kMaxBoundaryDpDecoders && ctx.hardware.nodes_used(ctx.workload.gpus) == 1 &&
                               ctx.workload.gpus_per_seq() == 1;
  if (options.path == "local" || (options.path != "ep" && local_plannable)) {
    const LocalSearchResult local = plan_local(pricer), local_flat = options.flat ? plan_local(flat_pricer) : LocalSearchResult{};
    r.candidates_priced += local.priced + local_flat.priced;
    keep(better(local.best, local_flat.best), local.shortfall, local_flat.shortfall);
  }
  if (configured.empty()) {
    // Candidates over the stage limit were skipped, not priced: say so beside the closest miss.
    const int refused = pricer.refused() + flat_pricer.refused();
    const std::string skipped =
        refused == 0 ? ""
                     : fmt::format("{} candidate plan{} skipped, over the stage limit (first: {})", refused, refused == 1 ? "" : "s",
                                   pricer.refused() > 0 ? pricer.first_refusal() : flat_pricer.first_refusal());
    const auto closest = std::min_element(shortfalls.begin(), shortfalls.end(),
                                          [](const BudgetShortfall& a, const BudgetShortfall& b) { return overshoot(a) < overshoot(b); });
    if (closest == shortfalls.end() || closest->needed_bytes == std::numeric_limits<Bytes>::max()) {
      if (!skipped.empty()) throw InfeasibleWorkload(skipped);
      throw InfeasibleWorkload(not_applicable.empty() ? "no plan fits the budgets" : not_applicable);
    }
    throw InfeasibleWorkload(skipped.empty() ? closest->message() : closest->message() + "; " + skipped, closest->space());
  }
  const bool measure = measured_budget > 0;
  std::size_t winner = 0;
  std::vector<Seconds> compared(configured.size(), 0.0);
  std::vector<Bytes> measured(configured.size(), 0);
  if (configured.size() > 1 || measure) {
    const auto graph_executor = [&](const std::string& name) {
      std::unique_ptr<StepEngine> engine = options.engines.make(name);
      if (!engine) {
        throw InputError("", "compare_engine", "\"" + name + "\"", fmt::format("unknown engine (known: {})", fmt::join(options.engines.names(), ", ")));
      }
      return std::make_unique<GraphExecutor>(std::move(engine), calibration);
    };
    std::unique_ptr<Executor> own;
    Executor* executor = options.compare_executor;
    if (executor == nullptr) {
      own = graph_executor(options.compare_engine);
      executor = own.get();
    }
    std::vector<Plan> plans;
    for (const PricedPlan& p : configured) plans.push_back(p.plan);
    const CompareResult cmp = configure_then_compare(*executor, plans, ctx);
    for (std::size_t i = 0; i < cmp.estimates.size(); ++i) compared[i] = cmp.estimates[i].step_s;
    winner = cmp.winner;
    if (measure) {
      const std::unique_ptr<Executor> model = graph_executor("analytic");
      std::optional<std::size_t> fitting;
      for (std::size_t i = 0; i < configured.size(); ++i) {
        measured[i] = measured_gpu_peak(cmp.estimates[i], *model, configured[i].plan, ctx, options.memory);
        if (measured[i] <= measured_budget && (!fitting || compared[i] < compared[*fitting])) fitting = i;
      }
      if (fitting) {
        winner = *fitting;
      } else {
        out.fits = false;
        out.over = measured[winner];
      }
    }
    if (configured.size() > 1) r.compare_engine = options.compare_executor != nullptr ? executor->name() : options.compare_engine;
  }
  for (std::size_t i = 0; i < configured.size(); ++i) {
    PlanChoice c = plan_choice_of(configured[i], pricer);
    c.compared_step_s = compared[i];
    c.measured_gpu_peak_bytes = measured[i];
    if (i == winner) {
      r.chosen = std::move(c);
    } else {
      r.alternatives.push_back(std::move(c));
    }
  }
  return out;
}

}  // namespace

PlanSearchResult search_plan(const WorkloadContext& ctx, const Calibration& calibration, const PlanSearchOptions& options) {
  if (options.path != "ep" && options.path != "local" && options.path != "auto") {
    throw InputError("", "--path", "\"" + options.path + "\"", "expected ep, local or auto");
  }
  if (options.path == "auto" && options.compare_executor == nullptr && !options.engines.has(options.compare_engine)) {
    throw InputError("", "compare_engine", "\"" + options.compare_engine + "\"",
                     fmt::format("unknown engine (known: {})", fmt::join(options.engines.names(), ", ")));
  }
  if (!options.hold_measured_gpu_peak) return configure_and_compare(ctx, calibration, options, 0).result;
  if (options.compare_executor == nullptr) {
    throw InputError("", "hold_measured_gpu_peak", "true", "needs an executor that measures (--compare-engine torch)");
  }
  // Configure under a model budget, measure, and tighten the model budget until a configured plan
  // measures within the real one: by the ratio budget / measured peak of the fastest plan while the
  // model still fits plans, then by bisection between the tightest model budget whose plans
  // measured over and the loosest that fits none.
  const Bytes budget = ctx.gpu_budget_bytes();
  const std::string executor = options.compare_executor->name();
  WorkloadContext planned = ctx;
  Bytes model_budget = budget, over_at = 0, none_at = 0, last_over = 0;
  std::string none_why;
  for (int attempt = 1; attempt <= kMeasuredPeakAttempts; ++attempt) {
    planned.workload.gpu_budget_gib = to_gib(model_budget);
    try {
      Configured c = configure_and_compare(planned, calibration, options, budget);
      c.result.measured_attempts = attempt;
      if (c.fits) return std::move(c.result);
      over_at = model_budget;
      last_over = c.over;
    } catch (const InfeasibleWorkload& e) {
      if (attempt == 1) throw;
      none_at = model_budget;
      none_why = e.what();
    }
    if (none_at == 0) {
      // At least 1 % tighter each time, so that the loop moves where the ratio rounds to 1.
      model_budget = static_cast<Bytes>(static_cast<double>(over_at) * std::min(0.99, static_cast<double>(budget) / static_cast<double>(last_over)));
    } else {
      if (over_at - none_at <= over_at / 100) break;
      model_budget = none_at + (over_at - none_at) / 2;
    }
  }
  if (none_at > 0) {
    throw InfeasibleWorkload(fmt::format("GPU budget {}: the plans the memory model fits under {} measured over it on the {} executor "
                                         "(the fastest {}), and under {}: {}",
                                         memory_text(budget), memory_text(over_at), executor, memory_text(last_over),
                                         memory_text(none_at), none_why),
                             "gpu");
  }
  throw InfeasibleWorkload(fmt::format("GPU budget {}: the fastest plan configured under a model budget of {} measured {} on the {} "
                                       "executor ({} configurations)",
                                       memory_text(budget), memory_text(over_at), memory_text(last_over), executor, kMeasuredPeakAttempts),
                           "gpu");
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
  if (c.measured_gpu_peak_bytes > 0) j["measured_gpu_peak_gib"] = to_gib(c.measured_gpu_peak_bytes);
  j["peak"] = peak_composition_to_json(c.peak);
  j["binding_peak"] = {{"peak", c.binding.peak}, {"gib", to_gib(c.binding.bytes)}, {"bounded_by", c.binding.bounded_by}};
  return j;
}

nlohmann::json plan_search_to_json(const PlanSearchResult& r) {
  nlohmann::json j = plan_choice_to_json(r.chosen);
  nlohmann::json alts = nlohmann::json::array();
  for (const PlanChoice& a : r.alternatives) alts.push_back(plan_choice_to_json(a));
  j["alternatives"] = alts;
  j["compare_engine"] = r.compare_engine;
  j["candidates_priced"] = r.candidates_priced;
  if (r.measured_attempts > 0) {
    j["model_gpu_budget_gib"] = to_gib(r.model_gpu_budget_bytes);
    j["measured_attempts"] = r.measured_attempts;
  }
  return j;
}

std::string plan_search_text(const PlanSearchResult& r) {
  auto line = [](const PlanChoice& c) {
    // NUMA nodes in a row with the same figure share one entry ("numa0-15 29.8 GiB" on a cluster).
    std::string host;
    const auto& b = c.host_bytes_per_numa;
    for (std::size_t n = 0; n < b.size();) {
      std::size_t last = n;
      while (last + 1 < b.size() && fmt::format("{:.1f}", to_gib(b[last + 1])) == fmt::format("{:.1f}", to_gib(b[n]))) ++last;
      const std::string which = last == n ? fmt::format("numa{}", n) : fmt::format("numa{}-{}", n, last);
      host += fmt::format("{}{} {:.1f} GiB", n ? ", " : "", which, to_gib(b[n]));
      n = last + 1;
    }
    return fmt::format("  path {:<5}  step {:8.3f} s  {:9.0f} tokens/s  GPU peak {:6.1f} GiB  host {}\n  plan: {}\n"
                       "  binding peak: {} {:.1f} GiB at the GPU peak, bounded by {}\n",
                       path_name(c.plan.path), c.predicted_step_s, c.tokens_per_s, to_gib(c.gpu_peak_bytes), host,
                       c.plan.notes, c.binding.peak, to_gib(c.binding.bytes), c.binding.bounded_by);
  };
  std::string out = "chosen:\n" + line(r.chosen);
  for (const PlanChoice& a : r.alternatives) out += "best of the other path:\n" + line(a);
  if (!r.compare_engine.empty()) {
    out += fmt::format("Configure-then-Compare ({} short executions): {:.3f} s", r.compare_engine, r.chosen.compared_step_s);
    for (const PlanChoice& a : r.alternatives) out += fmt::format(" vs {:.3f} s", a.compared_step_s);
    out += "\n";
  }
  if (r.measured_attempts > 0) {
    out += "GPU peak measured by the short executions (Eq. 2 around the allocated peak): " + memory_text(r.chosen.measured_gpu_peak_bytes);
    for (const PlanChoice& a : r.alternatives) out += " vs " + memory_text(a.measured_gpu_peak_bytes);
    out += fmt::format("; configured under a model budget of {} ({} configuration{})\n", memory_text(r.model_gpu_budget_bytes),
                       r.measured_attempts, r.measured_attempts == 1 ? "" : "s");
  }
  return out;
}

}  // namespace oom
