#include "planner/calibration/validation.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <thread>

#include <fmt/format.h>

#include "costmodel/input_error.h"
#include "planner/engine/step_engine.h"
#include "planner/engine/baseline_run.h"
#include "planner/lowering/baselines.h"
#include "planner/lowering/graph_size_estimate.h"
#include "planner/lowering/memory_report.h"
#include "planner/lowering/step_graph.h"

namespace oom {
namespace {

enum Category { kCompute = 0, kCollective = 1, kTransfer = 2, kCpu = 3 };

int category_of(const std::string& kind) {
  if (kind == "all_to_all" || kind == "all_gather" || kind == "reduce_scatter") return kCollective;
  if (kind == "h2d" || kind == "d2h") return kTransfer;
  if (kind == "cpu_adamw" || kind == "torch_cpu_adamw" || kind == "host_accumulate" || kind == "host_prep") return kCpu;
  return kCompute;
}

}  // namespace

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

namespace {

Calibration calibration_of(const HardwareSpec& h, const std::vector<Calibration>& given, const std::string& engine) {
  for (const auto& c : given) {
    if (c.hardware == h.name) return c;
  }
  return load_calibration_for(h, engine);
}

// Fills the predicted values and their relative errors against what was measured. The GPU peak
// compared is the allocated one (traces/trace.h allocated_gpu_peak_bytes): a record's GPU peak is
// the largest allocated peak across ranks (reference §8), which holds no allocator fragmentation.
void compare(RecordPrediction& p, Seconds step_s, Bytes gpu_peak_bytes, Bytes host_bytes) {
  p.status = "ok";
  p.predicted_step_s = step_s;
  p.predicted_gpu_peak_gib = to_gib(gpu_peak_bytes);
  p.predicted_host_gib = to_gib(host_bytes);
  if (p.measured_step_s) p.rel_error = (*p.predicted_step_s - *p.measured_step_s) / *p.measured_step_s;
  if (p.measured_gpu_peak_gib) {
    p.gpu_peak_rel_error = (*p.predicted_gpu_peak_gib - *p.measured_gpu_peak_gib) / *p.measured_gpu_peak_gib;
  }
  if (p.measured_host_gib) p.host_rel_error = (*p.predicted_host_gib - *p.measured_host_gib) / *p.measured_host_gib;
}

RecordPrediction predict(const StepRecord& rec, const StepEngines& engines, const std::string& engine,
                         const std::vector<Calibration>& calibrations) {
  RecordPrediction p;
  p.id = rec.id;
  p.measured_step_s = rec.measured.step_s;
  p.measured_gpu_peak_gib = rec.measured.gpu_peak_gib;
  p.measured_host_gib = rec.measured.host_gib;
  try {
    const WorkloadContext ctx = resolve_workload(rec.workload, rec.origin);
    p.system = rec.system;
    if (!rec.system.empty()) {
      // A baseline system: lowered by planner/lowering/baselines.h; out-of-memory is a prediction too.
      const auto system = baseline_system_from_name(rec.system);
      if (!system) throw InputError(rec.origin, "system", "\"" + rec.system + "\"", "unknown baseline system");
      const BaselineResult b = run_baseline(*system, ctx, engines, engine, calibration_of(ctx.hardware, calibrations, engine));
      if (!b.fits()) {
        p.status = "oom";
        p.reason = b.failure();
        return p;
      }
      Bytes host = 0;
      for (const Bytes x : b.host_bytes_per_numa) host += x;
      compare(p, b.step_s, allocated_gpu_peak_bytes(b.trace), host);
      return p;
    }
    const Plan plan = plan_from_json(rec.plan, rec.origin, "plan");
    validate_plan(plan, ctx.model, ctx.workload, rec.origin, "plan");
    LoweringOptions sized;
    sized.symmetric_nodes = true;  // as simulate_plan lowers it
    check_step_graph_size(plan, ctx, sized, rec.origin, rec.origin);
    const SimulationResult r = simulate_plan(plan, ctx, engines, engine, calibration_of(ctx.hardware, calibrations, engine));
    Bytes host = 0;
    for (const Bytes b : r.trace.numa_peak_bytes) host += b;
    compare(p, r.trace.step_s, allocated_gpu_peak_bytes(r.trace), host);
  } catch (const std::exception& e) {
    p.status = "failed";
    p.reason = e.what();
  }
  return p;
}

}  // namespace

int worker_threads(std::size_t jobs, bool waits_on_processes) {
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const unsigned threads = std::min(cores + (waits_on_processes ? 1u : 0u), 4u);
  return static_cast<int>(std::max<std::size_t>(1, std::min<std::size_t>(jobs, threads)));
}

int engine_workers(const StepEngines& engines, const std::string& engine, std::size_t jobs) {
  const std::unique_ptr<StepEngine> e = engines.make(engine);
  const EngineConcurrency c = e ? e->concurrency() : EngineConcurrency::kExclusive;
  return c == EngineConcurrency::kExclusive ? 1 : worker_threads(jobs, c == EngineConcurrency::kInProcess);
}

void run_jobs(std::size_t jobs, int threads, const std::function<void(std::size_t)>& job) {
  std::atomic<std::size_t> next{0};
  auto work = [&] {
    for (std::size_t i = next++; i < jobs; i = next++) job(i);
  };
  std::vector<std::thread> pool;
  for (int w = 1; w < threads; ++w) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
}

StepBreakdown step_breakdown(const Trace& t, int gpu) {
  struct Edge {
    Seconds time_s;
    int category;
    int delta;
  };
  std::vector<Edge> edges;
  for (const auto& s : t.stages) {
    if (s.key.rank != gpu || s.end_s <= s.start_s) continue;
    const int c = category_of(s.kind);
    edges.push_back({s.start_s, c, +1});
    edges.push_back({s.end_s, c, -1});
  }
  std::sort(edges.begin(), edges.end(), [](const Edge& a, const Edge& b) { return a.time_s < b.time_s; });
  StepBreakdown out;
  int busy[4] = {0, 0, 0, 0};
  Seconds now = 0;
  auto account = [&](Seconds until) {
    const Seconds dt = until - now;
    if (dt <= 0) return;
    if (busy[kCompute] > 0) out.compute_s += dt;
    else if (busy[kCollective] > 0) out.exposed_collective_s += dt;
    else if (busy[kTransfer] > 0) out.exposed_transfer_s += dt;
    else if (busy[kCpu] > 0) out.exposed_cpu_update_s += dt;
    else out.idle_s += dt;
  };
  for (const Edge& e : edges) {
    account(e.time_s);
    now = std::max(now, e.time_s);
    busy[e.category] += e.delta;
  }
  account(t.step_s);
  return out;
}

SimulationResult simulate_plan(const Plan& plan, const WorkloadContext& ctx, const StepEngines& engines, const std::string& engine,
                               const Calibration& calibration, bool every_rank) {
  const auto e = engines.make(engine);
  if (!e) {
    std::string known;
    for (const auto& n : engines.names()) known += (known.empty() ? "" : ", ") + n;
    throw InputError("", "--engine", "\"" + engine + "\"", "unknown engine (known: " + known + ")");
  }
  LoweringOptions options;
  options.symmetric_nodes = !every_rank;
  const StepGraph g = lower(plan, ctx, options);
  const CalibratedDurationModel durations(ctx.hardware, calibration, ctx.workload.gpus);
  SimulationResult r;
  r.trace = e->execute(g, durations);
  r.breakdown = step_breakdown(r.trace, 0);
  r.stages = g.stages.size();
  r.ranks_emitted = g.ranks_emitted;
  const StageTimes times = times_of_trace(r.trace);
  const auto worst = std::max_element(r.trace.gpu_peak_bytes.begin(), r.trace.gpu_peak_bytes.end());
  const int gpu = worst == r.trace.gpu_peak_bytes.end() ? 0 : static_cast<int>(worst - r.trace.gpu_peak_bytes.begin());
  r.peak = gpu_peak_composition(g, times, gpu, static_memory(ctx, plan).gpu.eq2.state);
  r.binding = binding_peak(r.peak, plan);
  r.use_peaks = use_peaks(g, times);
  return r;
}

nlohmann::json simulation_to_json(const SimulationResult& r) {
  nlohmann::json gpus = nlohmann::json::array(), numa = nlohmann::json::array();
  for (const Bytes b : r.trace.gpu_peak_bytes) gpus.push_back(to_gib(b));
  for (const Bytes b : r.trace.numa_peak_bytes) numa.push_back(to_gib(b));
  const StepBreakdown& b = r.breakdown;
  return {{"engine", r.trace.engine},
          {"step_s", r.trace.step_s},
          {"stages", r.stages},
          {"ranks_emitted", r.ranks_emitted},
          {"gpu_peak_gib", gpus},
          {"numa_host_gib", numa},
          {"breakdown", {{"compute_s", b.compute_s},
                         {"exposed_a2a_s", b.exposed_collective_s},
                         {"exposed_transfer_s", b.exposed_transfer_s},
                         {"exposed_cpu_update_s", b.exposed_cpu_update_s},
                         {"idle_s", b.idle_s}}},
          {"peak", peak_composition_to_json(r.peak)},
          {"binding_peak", {{"peak", r.binding.peak}, {"gib", to_gib(r.binding.bytes)}, {"bounded_by", r.binding.bounded_by}}},
          {"use_peak_gib", use_peaks_to_json(r.use_peaks)}};
}

std::string simulation_text(const SimulationResult& r) {
  const std::string of = r.ranks_emitted > 0 ? fmt::format(" of {} ranks standing for all {}", r.ranks_emitted, r.trace.gpu_peak_bytes.size())
                                             : std::string();
  std::string out = fmt::format("Step time ({} engine, {} stages{}): {:.3f} s\n", r.trace.engine, r.stages, of, r.trace.step_s);
  const StepBreakdown& b = r.breakdown;
  out += fmt::format("  compute               {:9.3f} s\n", b.compute_s);
  out += fmt::format("  exposed A2A/collective{:9.3f} s\n", b.exposed_collective_s);
  out += fmt::format("  exposed PCIe transfer {:9.3f} s\n", b.exposed_transfer_s);
  out += fmt::format("  exposed CPU update    {:9.3f} s\n", b.exposed_cpu_update_s);
  out += fmt::format("  idle                  {:9.3f} s\n", b.idle_s);
  for (std::size_t i = 0; i < r.trace.gpu_peak_bytes.size(); ++i) {
    out += fmt::format("GPU {} peak: {:.2f} GiB\n", i, to_gib(r.trace.gpu_peak_bytes[i]));
  }
  for (std::size_t n = 0; n < r.trace.numa_peak_bytes.size(); ++n) {
    out += fmt::format("NUMA node {} host peak: {:.2f} GiB\n", n, to_gib(r.trace.numa_peak_bytes[n]));
  }
  out += fmt::format("GPU {} peak {:.2f} GiB at {}: base {:.2f} GiB", r.peak.gpu, to_gib(r.peak.total), r.peak.stage,
                     to_gib(r.peak.base));
  for (int u = 0; u < kMemoryUses; ++u) {
    const Bytes b = r.peak.by_use[static_cast<std::size_t>(u)];
    if (b > 0) out += fmt::format(", {} {:.2f} GiB", memory_use_name(static_cast<MemoryUse>(u)), to_gib(b));
  }
  out += fmt::format("\nbinding peak: {} ({:.2f} GiB), bounded by {}\n", r.binding.peak, to_gib(r.binding.bytes),
                     r.binding.bounded_by);
  return out;
}

ValidationReport validate_records(const RecordSet& records, const StepEngines& engines, const std::string& engine,
                                  const std::vector<Calibration>& calibrations) {
  ValidationReport report;
  std::vector<double> errors, baseline_errors;
  // Records are independent: they run as many at once as the engine allows
  // (StepEngine::concurrency()), each into its own slot (the report keeps the file's order).
  std::vector<RecordPrediction> predicted(records.steps.size());
  run_jobs(predicted.size(), engine_workers(engines, engine, predicted.size()),
           [&](std::size_t i) { predicted[i] = predict(records.steps[i], engines, engine, calibrations); });
  for (std::size_t i = 0; i < predicted.size(); ++i) {
    const StepRecord& rec = records.steps[i];
    RecordPrediction& p = predicted[i];
    if (p.status == "failed") ++report.failures;
    if (p.status == "oom") ++report.out_of_memory;
    if (p.rel_error) (rec.system.empty() ? errors : baseline_errors).push_back(std::abs(*p.rel_error));
    report.records.push_back(std::move(p));
  }
  report.count = static_cast<int>(errors.size());
  report.median_abs_rel_error = median(errors);
  report.max_abs_rel_error = errors.empty() ? 0 : *std::max_element(errors.begin(), errors.end());
  report.baseline_count = static_cast<int>(baseline_errors.size());
  report.baseline_median_abs_rel_error = median(baseline_errors);
  report.baseline_max_abs_rel_error =
      baseline_errors.empty() ? 0 : *std::max_element(baseline_errors.begin(), baseline_errors.end());
  return report;
}

nlohmann::json validation_to_json(const ValidationReport& r) {
  nlohmann::json records = nlohmann::json::array();
  auto opt = [](const std::optional<double>& v) { return v ? nlohmann::json(*v) : nlohmann::json(nullptr); };
  for (const auto& p : r.records) {
    nlohmann::json j = {{"id", p.id},
                        {"status", p.status},
                        {"system", p.system.empty() ? nlohmann::json(nullptr) : nlohmann::json(p.system)},
                        {"predicted_step_s", opt(p.predicted_step_s)},
                        {"measured_step_s", opt(p.measured_step_s)},
                        {"rel_error", opt(p.rel_error)},
                        {"predicted_gpu_peak_gib", opt(p.predicted_gpu_peak_gib)},
                        {"measured_gpu_peak_gib", opt(p.measured_gpu_peak_gib)},
                        {"gpu_peak_rel_error", opt(p.gpu_peak_rel_error)},
                        {"predicted_host_gib", opt(p.predicted_host_gib)},
                        {"measured_host_gib", opt(p.measured_host_gib)},
                        {"host_rel_error", opt(p.host_rel_error)}};
    if (!p.reason.empty()) j["reason"] = p.reason;
    records.push_back(std::move(j));
  }
  return {{"count", r.count},
          {"failures", r.failures},
          {"out_of_memory", r.out_of_memory},
          {"baseline_count", r.baseline_count},
          {"baseline_median_abs_rel_error", r.baseline_median_abs_rel_error},
          {"baseline_max_abs_rel_error", r.baseline_max_abs_rel_error},
          {"median_abs_rel_error", r.median_abs_rel_error},
          {"max_abs_rel_error", r.max_abs_rel_error},
          {"records", records}};
}

std::string validation_text(const ValidationReport& r) {
  std::string out = fmt::format("{:<20} {:>11} {:>11} {:>8}   {:>9} {:>9} {:>7}   {:>9} {:>9} {:>7}\n", "id", "predicted_s",
                                "measured_s", "error", "gpu_pred", "gpu_meas", "error", "host_pred", "host_meas", "error");
  auto num = [](const std::optional<double>& v, const char* f) { return v ? fmt::format(fmt::runtime(f), *v) : std::string("-"); };
  for (const auto& p : r.records) {
    if (p.status != "ok") {
      out += fmt::format("{:<20} {}: {}\n", p.id, p.status, p.reason);
      continue;
    }
    const std::optional<double> e = p.rel_error ? std::optional<double>(100 * *p.rel_error) : std::nullopt;
    const std::optional<double> ge = p.gpu_peak_rel_error ? std::optional<double>(100 * *p.gpu_peak_rel_error) : std::nullopt;
    const std::optional<double> he = p.host_rel_error ? std::optional<double>(100 * *p.host_rel_error) : std::nullopt;
    out += fmt::format("{:<20} {:>11} {:>11} {:>8}   {:>9} {:>9} {:>7}   {:>9} {:>9} {:>7}\n", p.id,
                       num(p.predicted_step_s, "{:.3f}"), num(p.measured_step_s, "{:.3f}"), num(e, "{:+.1f}%"),
                       num(p.predicted_gpu_peak_gib, "{:.1f}"), num(p.measured_gpu_peak_gib, "{:.1f}"), num(ge, "{:+.1f}%"),
                       num(p.predicted_host_gib, "{:.1f}"), num(p.measured_host_gib, "{:.1f}"), num(he, "{:+.1f}%"));
  }
  out += fmt::format("{} records: median |error| {:.1f}%, max |error| {:.1f}%, {} failed\n", r.count,
                     100 * r.median_abs_rel_error, 100 * r.max_abs_rel_error, r.failures);
  if (r.baseline_count > 0 || r.out_of_memory > 0) {
    out += fmt::format("{} baseline-system records: median |error| {:.1f}%, max |error| {:.1f}%, {} predicted out of memory\n",
                       r.baseline_count, 100 * r.baseline_median_abs_rel_error, 100 * r.baseline_max_abs_rel_error,
                       r.out_of_memory);
  }
  return out;
}

}  // namespace oom
