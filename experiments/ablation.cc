#include "experiments/ablation.h"

#include <algorithm>
#include <cmath>
#include <regex>

#include <fmt/format.h>

#include "costmodel/csv_input.h"
#include "costmodel/input_error.h"
#include "costmodel/json_input.h"
#include "planner/calibration/calibration.h"
#include "planner/calibration/validation.h"
#include "planner/engine/step_engine.h"
#include "planner/lowering/graph_size_estimate.h"

namespace oom {
namespace {

// Allowed step-time loss of a variant that still counts as "at equal throughput".
constexpr double kEqualThroughput = 0.02;

MemoryUse schedule_of(const JsonReader& r) {
  const std::string s = r.one_of("schedule", {"dispatch", "vocabulary", "boundaries", "optimizer"});
  if (s == "dispatch") return MemoryUse::kDispatch;
  if (s == "vocabulary") return MemoryUse::kVocabulary;
  if (s == "boundaries") return MemoryUse::kBoundaries;
  return MemoryUse::kOptimizer;
}

// Replaces "tokens_per_gpu" / "tokens_per_gpu/K" strings of the token-count fields by numbers.
void resolve_tokens(nlohmann::json& j, std::int64_t tokens_per_gpu, const std::string& file, const std::string& where) {
  static const std::regex form(R"(tokens_per_gpu(?:/([0-9]{1,18}))?)");
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it->is_object()) {
      resolve_tokens(*it, tokens_per_gpu, file, where + "." + it.key());
      continue;
    }
    if (!it->is_string()) continue;
    const std::string text = it->get<std::string>();
    std::smatch m;
    if (!std::regex_match(text, m, form)) continue;
    const std::int64_t k = m[1].matched ? std::stoll(m[1].str()) : 1;
    if (k <= 0 || tokens_per_gpu % k != 0) {
      throw InputError(file, where + "." + it.key(), "\"" + text + "\"",
                       fmt::format("{} tokens per GPU do not divide by {}", tokens_per_gpu, k));
    }
    *it = tokens_per_gpu / k;
  }
}

Seconds optimizer_tail(const Trace& t) {
  Seconds last_compute = 0;
  for (const auto& s : t.stages) {
    if (s.resource.ends_with(".compute")) last_compute = std::max(last_compute, s.end_s);
  }
  return std::max(0.0, t.step_s - last_compute);
}

std::string gib(Bytes b) { return fmt::format("{:.2f}", to_gib(b)); }

}  // namespace

AblationSpec ablation_from_json(const nlohmann::json& j, const std::string& file) {
  const JsonReader r(j, file);
  r.reject_unknown_keys({"name", "description", "engine", "schedule", "paper", "plan", "workloads", "variants"});
  AblationSpec s;
  s.name = r.string("name");
  s.description = r.string_or("description", "");
  s.engine = r.string_or("engine", "analytic");
  s.schedule = schedule_of(r);
  if (r.has("paper")) {
    const JsonReader p = r.object("paper");
    p.reject_unknown_keys({"peak_reduction", "step_time_change", "tail_speedup", "source"});
    s.paper.peak_reduction = p.optional_number("peak_reduction", 0.0, 1.0);
    s.paper.step_time_change = p.optional_number("step_time_change", -1.0, 10.0);
    s.paper.tail_speedup = p.optional_number("tail_speedup", 0.01, 1000.0);
    s.paper.source = p.string_or("source", "");
  }
  s.plan = r.object("plan").raw();
  const auto& workloads = r.array("workloads");
  if (workloads.empty()) r.fail("workloads", "needs at least one workload");
  for (std::size_t i = 0; i < workloads.size(); ++i) {
    const JsonReader w(workloads[i], file, fmt::format("workloads[{}]", i));
    w.reject_unknown_keys({"name", "workload"});
    s.workloads.push_back({w.string("name"), workload_from_json(w.object("workload").raw(), file, w.field("workload"))});
  }
  const auto& variants = r.array("variants");
  if (variants.size() < 2) r.fail("variants", "needs a reference and at least one variant");
  for (std::size_t i = 0; i < variants.size(); ++i) {
    const JsonReader v(variants[i], file, fmt::format("variants[{}]", i));
    v.reject_unknown_keys({"name", "plan"});
    s.variants.push_back({v.string("name"), v.has("plan") ? v.object("plan").raw() : nlohmann::json::object()});
  }
  return s;
}

AblationSpec load_ablation(const std::string& path) { return ablation_from_json(read_json_file(path), path); }

AblationSpec smallest_cases(AblationSpec spec) {
  const auto size = [](const AblationWorkload& w) {
    return std::pair(w.workload.gpus, static_cast<double>(w.workload.global_batch) * static_cast<double>(w.workload.seq_len));
  };
  const auto it = std::min_element(spec.workloads.begin(), spec.workloads.end(),
                                   [&](const AblationWorkload& a, const AblationWorkload& b) { return size(a) < size(b); });
  if (it != spec.workloads.end()) spec.workloads = {*it};
  return spec;
}

Plan ablation_plan(const AblationSpec& spec, const AblationVariant& v, const WorkloadContext& ctx, const std::string& file) {
  nlohmann::json j = spec.plan;
  j.merge_patch(v.plan_patch);
  const std::string where = fmt::format("variant '{}' plan", v.name);
  resolve_tokens(j, ctx.workload.tokens_per_gpu(), file, where);
  const Plan p = plan_from_json(j, file, where);
  validate_plan(p, ctx.model, ctx.workload, file, where);
  return p;
}

WorkEstimate estimate_ablation(const AblationSpec& spec, const std::string& file) {
  WorkEstimate e;
  LoweringOptions options;
  options.symmetric_nodes = true;  // as simulate_plan lowers it
  for (const auto& w : spec.workloads) {
    const WorkloadContext ctx = resolve_workload(w.workload, fmt::format("{} (workload '{}')", file, w.name));
    for (const auto& v : spec.variants) {
      ++e.cases;
      e.stages += estimate_step_graph(ablation_plan(spec, v, ctx, file), ctx, options).stages;
    }
  }
  e.wall_s = e.stages * kPricingSecondsPerStage;
  return e;
}

AblationResult run_ablation(const AblationSpec& spec, const StepEngines& engines, const std::string& file,
                            const AblationProgress& progress) {
  if (!engines.has(spec.engine)) throw InputError(file, "engine", "\"" + spec.engine + "\"", "unknown engine");
  // Every case resolved and validated before the first one runs.
  std::vector<WorkloadContext> contexts;
  std::vector<std::vector<Plan>> plans;
  for (const auto& w : spec.workloads) {
    contexts.push_back(resolve_workload(w.workload, fmt::format("{} (workload '{}')", file, w.name)));
    plans.emplace_back();
    for (const auto& v : spec.variants) {
      plans.back().push_back(ablation_plan(spec, v, contexts.back(), file));
      LoweringOptions sized;
      sized.symmetric_nodes = true;  // as simulate_plan lowers it
      check_step_graph_size(plans.back().back(), contexts.back(), sized, fmt::format("{} (variant '{}')", file, v.name));
    }
  }
  AblationResult out;
  out.spec = spec;
  const int total = static_cast<int>(spec.workloads.size() * spec.variants.size());
  int done = 0;
  for (std::size_t wi = 0; wi < spec.workloads.size(); ++wi) {
    const WorkloadContext& ctx = contexts[wi];
    const Calibration calibration = load_calibration_for(ctx.hardware, spec.engine);
    const std::size_t first = out.rows.size();
    for (std::size_t vi = 0; vi < spec.variants.size(); ++vi) {
      const SimulationResult sim = simulate_plan(plans[wi][vi], ctx, engines, spec.engine, calibration);
      AblationRow row;
      row.workload = spec.workloads[wi].name;
      row.variant = spec.variants[vi].name;
      row.plan = plans[wi][vi];
      row.step_s = sim.trace.step_s;
      row.optimizer_tail_s = optimizer_tail(sim.trace);
      row.gpu_peak_bytes = *std::max_element(sim.trace.gpu_peak_bytes.begin(), sim.trace.gpu_peak_bytes.end());
      row.fits_gpu = row.gpu_peak_bytes <= ctx.gpu_budget_bytes();
      row.use_peaks = sim.use_peaks;
      row.study_peak_bytes = sim.use_peaks[static_cast<std::size_t>(spec.schedule)];
      row.binding_peak = sim.binding.peak;
      const AblationRow& ref = vi == 0 ? row : out.rows[first];
      const auto change = [](double a, double b) { return b > 0 ? a / b - 1 : 0.0; };
      row.peak_change = change(static_cast<double>(row.study_peak_bytes), static_cast<double>(ref.study_peak_bytes));
      row.step_change = change(row.step_s, ref.step_s);
      row.gpu_peak_change = change(static_cast<double>(row.gpu_peak_bytes), static_cast<double>(ref.gpu_peak_bytes));
      row.tail_speedup = row.optimizer_tail_s > 0 ? ref.optimizer_tail_s / row.optimizer_tail_s : 1.0;
      out.rows.push_back(std::move(row));
      if (progress) progress(++done, total, fmt::format("{} / {}", spec.workloads[wi].name, spec.variants[vi].name));
    }
    AblationResult::Best best{spec.workloads[wi].name, out.rows[first].variant, 0, 0, 1};
    for (std::size_t i = first + 1; i < out.rows.size(); ++i) {
      const AblationRow& r = out.rows[i];
      // Only a variant whose GPU peak fits the budget can be the answer.
      const bool better = r.fits_gpu && (spec.schedule == MemoryUse::kOptimizer
                                             ? r.tail_speedup > best.tail_speedup
                                             : r.step_change <= kEqualThroughput && r.peak_change < best.peak_change);
      if (better) best = {r.workload, r.variant, r.peak_change, r.step_change, r.tail_speedup};
    }
    out.best.push_back(best);
  }
  return out;
}

std::string ablation_csv(const AblationResult& r) {
  std::string out = "workload,variant,step_s,optimizer_tail_s,gpu_peak_gib,study_peak_gib";
  for (int u = 0; u < kMemoryUses; ++u) out += fmt::format(",{}_peak_gib", memory_use_name(static_cast<MemoryUse>(u)));
  out += ",fits_gpu,binding_peak,peak_change,step_change,gpu_peak_change,tail_speedup\n";
  const auto quoted = [](const std::string& s) {
    std::string q = "\"";
    for (const char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
    return q + "\"";
  };
  for (const auto& row : r.rows) {
    out += fmt::format("{},{},{:.6g},{:.6g},{},{}", quoted(row.workload), quoted(row.variant), row.step_s, row.optimizer_tail_s,
                       gib(row.gpu_peak_bytes), gib(row.study_peak_bytes));
    for (const Bytes b : row.use_peaks) out += "," + gib(b);
    out += fmt::format(",{},{},{:.4f},{:.4f},{:.4f},{:.4f}\n", row.fits_gpu ? "yes" : "no", row.binding_peak, row.peak_change, row.step_change,
                       row.gpu_peak_change, row.tail_speedup);
  }
  return out;
}

void check_ablation_csv(const std::string& text, const std::string& file) {
  check_csv_table(parse_csv(text, file), file,
                  {"workload", "variant", "step_s", "gpu_peak_gib", "study_peak_gib", "peak_change", "step_change", "gpu_peak_change"},
                  [](const std::string& column) {
                    const bool text = column == "workload" || column == "variant" || column == "fits_gpu" || column == "binding_peak";
                    return text ? CsvColumn::kText : CsvColumn::kNumber;
                  });
}

nlohmann::json ablation_result_to_json(const AblationResult& r) {
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& row : r.rows) {
    nlohmann::json uses = nlohmann::json::object();
    for (int u = 0; u < kMemoryUses; ++u) uses[std::string(memory_use_name(static_cast<MemoryUse>(u)))] = to_gib(row.use_peaks[static_cast<std::size_t>(u)]);
    rows.push_back({{"workload", row.workload}, {"variant", row.variant}, {"plan", plan_to_json(row.plan)},
                    {"step_s", row.step_s}, {"optimizer_tail_s", row.optimizer_tail_s},
                    {"gpu_peak_gib", to_gib(row.gpu_peak_bytes)}, {"fits_gpu", row.fits_gpu}, {"study_peak_gib", to_gib(row.study_peak_bytes)},
                    {"use_peak_gib", uses}, {"binding_peak", row.binding_peak}, {"peak_change", row.peak_change},
                    {"step_change", row.step_change}, {"gpu_peak_change", row.gpu_peak_change}, {"tail_speedup", row.tail_speedup}});
  }
  nlohmann::json best = nlohmann::json::array();
  for (const auto& b : r.best) {
    best.push_back({{"workload", b.workload}, {"variant", b.variant}, {"peak_change", b.peak_change},
                    {"step_change", b.step_change}, {"tail_speedup", b.tail_speedup}});
  }
  const auto opt = [](const std::optional<double>& v) { return v ? nlohmann::json(*v) : nlohmann::json(); };
  return {{"name", r.spec.name},
          {"description", r.spec.description},
          {"engine", r.spec.engine},
          {"schedule", memory_use_name(r.spec.schedule)},
          {"paper", {{"peak_reduction", opt(r.spec.paper.peak_reduction)}, {"step_time_change", opt(r.spec.paper.step_time_change)},
                     {"tail_speedup", opt(r.spec.paper.tail_speedup)}, {"source", r.spec.paper.source}}},
          {"rows", rows},
          {"best", best}};
}

std::string ablation_table_text(const AblationResult& r) {
  std::string out = fmt::format("{}: {} ({} engine)\n", r.spec.name, r.spec.description, r.spec.engine);
  const std::string peak = std::string(memory_use_name(r.spec.schedule));
  out += fmt::format("{:<34} {:<34} {:>9} {:>9} {:>9} {:>11} {:>8} {:>8} {:>7}\n", "workload", "variant", "step s", "tail s",
                     "GPU GiB", peak + " GiB", "Δpeak", "Δstep", "tail×");
  for (const auto& row : r.rows) {
    out += fmt::format("{:<34} {:<34} {:9.3f} {:9.3f} {:8.2f}{} {:11.2f} {:7.1f}% {:7.1f}% {:7.2f}\n", row.workload, row.variant,
                       row.step_s, row.optimizer_tail_s, to_gib(row.gpu_peak_bytes), row.fits_gpu ? " " : "!", to_gib(row.study_peak_bytes),
                       100 * row.peak_change, 100 * row.step_change, row.tail_speedup);
  }
  if (std::any_of(r.rows.begin(), r.rows.end(), [](const AblationRow& row) { return !row.fits_gpu; })) {
    out += "! the GPU peak exceeds the workload's GPU budget (HBM unless the workload sets one)\n";
  }
  for (const auto& b : r.best) {
    out += r.spec.schedule == MemoryUse::kOptimizer
               ? fmt::format("{}: best {}: optimizer tail {:.2f}× faster, step {:+.1f}%\n", b.workload, b.variant, b.tail_speedup,
                             100 * b.step_change)
               : fmt::format("{}: best at equal throughput (≤ +2% step): {}: {} peak {:+.1f}%, step {:+.1f}%\n", b.workload,
                             b.variant, peak, 100 * b.peak_change, 100 * b.step_change);
  }
  const PublishedAblation& p = r.spec.paper;
  if (p.peak_reduction || p.tail_speedup) {
    out += "published: ";
    if (p.peak_reduction) out += fmt::format("{} peak −{:.1f}%", peak, 100 * *p.peak_reduction);
    if (p.step_time_change) out += fmt::format(", step {:+.1f}%", 100 * *p.step_time_change);
    if (p.tail_speedup) out += fmt::format("{}optimizer step {:.2f}× faster", p.peak_reduction ? ", " : "", *p.tail_speedup);
    if (!p.source.empty()) out += " (" + p.source + ")";
    out += "\n";
  }
  return out;
}

}  // namespace oom
