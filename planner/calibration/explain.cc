#include "planner/calibration/explain.h"

#include <algorithm>
#include <array>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "costmodel/input_error.h"
#include "costmodel/json_input.h"
#include "planner/calibration/validation.h"
#include "planner/engine/baseline_run.h"
#include "planner/lowering/baselines.h"
#include "planner/lowering/step_graph.h"

namespace oom {
namespace {

// Mechanisms in the order an instant of the step is charged to them (after compute).
enum Mechanism { kCollective, kH2d, kD2h, kCpuAdamW, kHostAccumulate, kHostPrep, kMechanisms };
constexpr std::array<const char*, kMechanisms> kMechanismNames = {"collectives", "h2d", "d2h", "cpu_adamw",
                                                                  "host_accumulate", "host_prep"};

int mechanism_of(const std::string& kind) {
  if (kind == "all_to_all" || kind == "all_gather" || kind == "reduce_scatter") return kCollective;
  if (kind == "h2d") return kH2d;
  if (kind == "d2h") return kD2h;
  if (kind == "cpu_adamw" || kind == "torch_cpu_adamw") return kCpuAdamW;
  if (kind == "host_accumulate") return kHostAccumulate;
  if (kind == "host_prep") return kHostPrep;
  return -1;  // compute (or a zero-work join)
}

// The published mechanisms a prediction is set beside (render_explanation): compute, replay
// included, and the rest of the step.
constexpr const char* kComputeWithReplay = "compute_with_replay_s";
constexpr const char* kNonCompute = "non_compute_s";

// The names layer_forward_s may hold: the decoders' layer kinds and their MoE (explain_step).
constexpr const char* kMoeLayer = "moe";
std::vector<std::string> published_layer_kinds() {
  std::vector<std::string> out;
  for (const auto k : {LayerKind::kFullAttention, LayerKind::kSlidingAttention, LayerKind::kLinearAttention, LayerKind::kLatentAttention}) {
    out.emplace_back(layer_kind_name(k));
  }
  out.emplace_back(kMoeLayer);
  return out;
}

// The seconds of the object under `key` (absent: none), each named by one of `known`.
std::map<std::string, double> number_map(const JsonReader& r, const std::string& key, const std::vector<std::string>& known) {
  std::map<std::string, double> out;
  if (!r.has(key)) return out;
  const JsonReader m = r.object(key);
  for (const auto& [name, value] : m.raw().items()) {
    if (std::find(known.begin(), known.end(), name) == known.end()) {
      m.fail(name, fmt::format("unknown field (known: {})", fmt::join(known, ", ")));
    }
    out[name] = m.number(name, 0, 1e9);
  }
  return out;
}

}  // namespace

std::vector<PublishedBreakdown> load_published_breakdowns(const std::string& path) {
  const nlohmann::json doc = read_json_file(path);
  const JsonReader root(doc, path);
  root.reject_unknown_keys({"version", "about", "breakdowns"});
  root.integer("version", 1, 1);
  std::vector<PublishedBreakdown> out;
  const nlohmann::json& list = root.array("breakdowns");
  for (std::size_t i = 0; i < list.size(); ++i) {
    const JsonReader r(list[i], path, fmt::format("breakdowns[{}]", i));
    r.reject_unknown_keys({"record", "source", "note", "step_s", "mechanisms", "gpu_allocated_gib", "host_gib", "layer_forward_s"});
    PublishedBreakdown b;
    b.record = r.string("record");
    b.source = r.string("source");
    b.note = r.string_or("note", "");
    b.step_s = r.optional_number("step_s", 0, 1e9);
    b.mechanisms_s = number_map(r, "mechanisms", {kComputeWithReplay, kNonCompute});
    b.gpu_allocated_gib = r.optional_number("gpu_allocated_gib", 0, 1e9);
    b.host_gib = r.optional_number("host_gib", 0, 1e9);
    b.layer_forward_s = number_map(r, "layer_forward_s", published_layer_kinds());
    out.push_back(std::move(b));
  }
  return out;
}

std::map<std::string, double> published_compute_times_s(const std::vector<PublishedBreakdown>& breakdowns) {
  std::map<std::string, double> out;
  for (const PublishedBreakdown& b : breakdowns) {
    if (const auto it = b.mechanisms_s.find(kComputeWithReplay); it != b.mechanisms_s.end()) out[b.record] = it->second;
  }
  return out;
}

StepExplanation explain_trace(const Trace& t, int gpu) {
  StepExplanation e;
  e.engine = t.engine;
  e.step_s = t.step_s;
  std::map<std::string, ResourceBusy> busy;
  struct Edge {
    Seconds time_s;
    int mechanism;        // −1: compute
    std::string kind;     // compute kind
    int delta;
  };
  std::vector<Edge> edges;
  for (const TraceStage& s : t.stages) {
    if (s.key.rank != gpu) continue;
    const Seconds d = s.end_s - s.start_s;
    ResourceBusy& b = busy[s.resource];
    b.resource = s.resource;
    ++b.stages;
    b.busy_s += std::max(0.0, d);
    if (d <= 0) continue;
    const int m = mechanism_of(s.kind);
    if (m < 0) e.compute_by_kind_s[s.kind] += d;
    edges.push_back({s.start_s, m, s.kind, +1});
    edges.push_back({s.end_s, m, s.kind, -1});
  }
  for (auto& [name, b] : busy) e.resources.push_back(b);
  std::sort(edges.begin(), edges.end(), [](const Edge& a, const Edge& b) {
    return a.time_s != b.time_s ? a.time_s < b.time_s : a.delta < b.delta;  // ends before starts at one instant
  });
  std::map<std::string, int> compute_running;
  std::array<int, kMechanisms> running{};
  std::map<std::string, Seconds> compute_exposed;
  std::array<Seconds, kMechanisms> exposed{};
  Seconds wait_s = 0, now = 0;
  auto account = [&](Seconds until) {
    const Seconds dt = until - now;
    if (dt <= 0) return;
    for (const auto& [kind, n] : compute_running) {
      if (n > 0) {
        compute_exposed[kind] += dt;  // one compute stream per rank: at most one kind runs
        return;
      }
    }
    for (int m = 0; m < kMechanisms; ++m) {
      if (running[static_cast<std::size_t>(m)] > 0) {
        exposed[static_cast<std::size_t>(m)] += dt;
        return;
      }
    }
    wait_s += dt;
  };
  for (const Edge& x : edges) {
    account(x.time_s);
    now = std::max(now, x.time_s);
    if (x.mechanism < 0) compute_running[x.kind] += x.delta;
    else running[static_cast<std::size_t>(x.mechanism)] += x.delta;
  }
  account(t.step_s);
  for (const auto& [kind, s] : compute_exposed) e.exposed_s.emplace_back("compute." + kind, s);
  for (int m = 0; m < kMechanisms; ++m) e.exposed_s.emplace_back(kMechanismNames[static_cast<std::size_t>(m)], exposed[static_cast<std::size_t>(m)]);
  e.exposed_s.emplace_back("wait", wait_s);
  return e;
}

StepExplanation explain_record(const RecordSet& records, const std::string& records_file, const std::string& id,
                               const StepEngines& engines, const std::string& engine,
                               const std::vector<PublishedBreakdown>& breakdowns) {
  const auto rec = std::find_if(records.steps.begin(), records.steps.end(), [&](const StepRecord& r) { return r.id == id; });
  if (rec == records.steps.end()) throw InputError(records_file, "--explain", "\"" + id + "\"", "no step record has this id");
  const WorkloadContext ctx = resolve_workload(rec->workload, rec->origin);
  const Calibration calibration = load_calibration_for(ctx.hardware, engine);
  Trace trace;
  std::optional<PeakComposition> peak;
  if (!rec->system.empty()) {
    const auto system = baseline_system_from_name(rec->system);
    if (!system) throw InputError(rec->origin, "system", "\"" + rec->system + "\"", "unknown baseline system");
    const BaselineResult b = run_baseline(*system, ctx, engines, engine, calibration);
    if (!b.fits()) throw InputError(rec->origin, "system", "\"" + rec->system + "\"", "predicted out of memory: " + b.failure());
    trace = b.trace;
  } else {
    const Plan plan = plan_from_json(rec->plan, rec->origin, "plan");
    validate_plan(plan, ctx.model, ctx.workload, rec->origin, "plan");
    SimulationResult r = simulate_plan(plan, ctx, engines, engine, calibration);
    trace = std::move(r.trace);
    peak = r.peak;
  }
  StepExplanation e = explain_trace(trace, 0);
  e.id = id;
  e.peak = peak;
  e.system = rec->system;
  e.measured_step_s = rec->measured.step_s;
  for (const Bytes b : trace.gpu_peak_bytes) e.gpu_peak_gib = std::max(e.gpu_peak_gib, to_gib(b));
  e.gpu_allocated_gib = to_gib(allocated_gpu_peak_bytes(trace));
  for (const Bytes b : trace.numa_peak_bytes) e.host_gib += to_gib(b);
  // Forward compute of rank 0's first decoder of each kind (attention or GDN mixing, and its MoE).
  std::map<std::string, int> first_layer;
  for (int l = 0; l < ctx.model.layers; ++l) {
    first_layer.emplace(std::string(layer_kind_name(ctx.model.layer_kinds[static_cast<std::size_t>(l)])), l);
  }
  for (const auto& [kind, l] : first_layer) {
    for (const TraceStage& s : trace.stages) {
      const StageKey& k = s.key;
      if (k.rank != 0 || k.phase != Phase::kForward || k.decoder != l || mechanism_of(s.kind) >= 0) continue;
      if (k.part == StagePart::kAttention || k.part == StagePart::kGdn) e.layer_forward_s[kind] += s.duration_s();
      else if (k.part == StagePart::kMoe && l == first_layer.begin()->second) e.layer_forward_s[kMoeLayer] += s.duration_s();
    }
  }
  for (const auto& b : breakdowns) {
    if (b.record == id) e.published = b;
  }
  if (!rec->measured.compute_s.empty()) {
    e.measured_compute_s = rec->measured.compute_s;
    e.predicted_compute_s = busy_by_direction_and_kind(trace, gpu_compute_resource_name(0));
  }
  return e;
}

nlohmann::json explanation_to_json(const StepExplanation& e) {
  nlohmann::json resources = nlohmann::json::array(), exposed = nlohmann::json::object();
  for (const auto& r : e.resources) resources.push_back({{"resource", r.resource}, {"stages", r.stages}, {"busy_s", r.busy_s}});
  for (const auto& [m, s] : e.exposed_s) exposed[m] = s;
  nlohmann::json j = {{"id", e.id},
                      {"engine", e.engine},
                      {"system", e.system.empty() ? nlohmann::json(nullptr) : nlohmann::json(e.system)},
                      {"step_s", e.step_s},
                      {"measured_step_s", e.measured_step_s ? nlohmann::json(*e.measured_step_s) : nlohmann::json(nullptr)},
                      {"gpu_allocated_gib", e.gpu_allocated_gib},
                      {"gpu_peak_gib", e.gpu_peak_gib},
                      {"host_gib", e.host_gib},
                      {"gpu_peak_composition", e.peak ? peak_composition_to_json(*e.peak) : nlohmann::json(nullptr)},
                      {"resources", resources},
                      {"compute_by_kind_s", e.compute_by_kind_s},
                      {"exposed_s", exposed},
                      {"layer_forward_s", e.layer_forward_s},
                      {"published", nullptr}};
  if (!e.measured_compute_s.empty()) {
    j["measured_compute_s"] = e.measured_compute_s;
    j["predicted_compute_s"] = e.predicted_compute_s;
  }
  if (e.published) {
    const PublishedBreakdown& b = *e.published;
    auto opt = [](const std::optional<double>& v) { return v ? nlohmann::json(*v) : nlohmann::json(nullptr); };
    j["published"] = {{"source", b.source},         {"note", b.note},           {"step_s", opt(b.step_s)},
                      {"mechanisms", b.mechanisms_s}, {"gpu_allocated_gib", opt(b.gpu_allocated_gib)},
                      {"host_gib", opt(b.host_gib)}, {"layer_forward_s", b.layer_forward_s}};
  }
  return j;
}

std::string explanation_text(const StepExplanation& e) {
  const PublishedBreakdown* pub = e.published ? &*e.published : nullptr;
  auto published = [](const std::optional<double>& v, const char* f) { return v ? fmt::format(fmt::runtime(f), *v) : std::string(""); };
  std::string out = fmt::format("{}{}: predicted step {:.3f} s ({} engine){}{}\n", e.id, e.system.empty() ? "" : " (" + e.system + ")",
                                e.step_s, e.engine,
                                e.measured_step_s ? fmt::format(", measured {:.3f} s ({:+.1f}%)", *e.measured_step_s,
                                                                100 * (e.step_s - *e.measured_step_s) / *e.measured_step_s)
                                                  : "",
                                pub && pub->step_s ? fmt::format(", published breakdown of a {:.2f} s step", *pub->step_s) : "");
  out += fmt::format("GPU peak {:.1f} GiB allocated{}, {:.1f} GiB reserved; host {:.1f} GiB{}\n", e.gpu_allocated_gib,
                     pub ? published(pub->gpu_allocated_gib, " (published {:.1f})") : "", e.gpu_peak_gib, e.host_gib,
                     pub ? published(pub->host_gib, " (published {:.1f})") : "");
  if (e.peak) {
    out += fmt::format("  GPU {} at {}: base {:.2f} GiB", e.peak->gpu, e.peak->stage, to_gib(e.peak->base));
    for (int u = 0; u < kMemoryUses; ++u) {
      const Bytes b = e.peak->of(static_cast<MemoryUse>(u));
      if (b > 0) out += fmt::format(", {} {:.2f} GiB", memory_use_name(static_cast<MemoryUse>(u)), to_gib(b));
    }
    out += "\n";
  }
  out += "\nBusy time per resource of rank 0 (s)\n";
  for (const auto& r : e.resources) out += fmt::format("  {:<28} {:>10.3f}  ({} stages)\n", r.resource, r.busy_s, r.stages);
  out += "\nCompute-stream busy time by operator kind (s)\n";
  Seconds compute = 0;
  for (const auto& [k, s] : e.compute_by_kind_s) {
    out += fmt::format("  {:<28} {:>10.3f}\n", k, s);
    compute += s;
  }
  out += fmt::format("  {:<28} {:>10.3f}\n", "total", compute);
  if (!e.measured_compute_s.empty()) {
    // Shares of each side's own total: a traced step's clock and tracing overhead scale every kind alike.
    Seconds predicted_total = 0, measured_total = 0;
    std::map<std::string, std::pair<Seconds, Seconds>> rows;
    for (const auto& [k, v] : e.predicted_compute_s) rows[k].first = v, predicted_total += v;
    for (const auto& [k, v] : e.measured_compute_s) rows[k].second = v, measured_total += v;
    out += "\nCompute stream by direction and kind, beside the measured breakdown    predicted         measured\n";
    for (const auto& [k, v] : rows) {
      out += fmt::format("  {:<28} {:>10.4f} s {:>5.1f}%  {:>10.4f} s {:>5.1f}%\n", k, v.first,
                         predicted_total > 0 ? 100 * v.first / predicted_total : 0.0, v.second,
                         measured_total > 0 ? 100 * v.second / measured_total : 0.0);
    }
  }
  out += "\nExposed time per mechanism (each instant charged once; sums to the step) (s)\n";
  Seconds compute_exposed = 0, total = 0;
  for (const auto& [m, s] : e.exposed_s) {
    out += fmt::format("  {:<28} {:>10.3f}\n", m, s);
    total += s;
    if (m.starts_with("compute.")) compute_exposed += s;
  }
  out += fmt::format("  {:<28} {:>10.3f}\n", "total", total);
  if (pub && !pub->mechanisms_s.empty()) {
    out += "\nBeside the published breakdown (s)            predicted  published\n";
    for (const auto& [m, v] : pub->mechanisms_s) {
      std::string predicted = "-";
      if (m == kComputeWithReplay) predicted = fmt::format("{:.3f}", compute_exposed);
      if (m == kNonCompute) predicted = fmt::format("{:.3f}", total - compute_exposed);
      out += fmt::format("  {:<40} {:>10} {:>10.3f}\n", m, predicted, v);
    }
  }
  if (!e.layer_forward_s.empty()) {
    out += "\nForward compute of one decoder of rank 0, by layer kind (s)";
    out += pub && !pub->layer_forward_s.empty() ? "     predicted  published\n" : "\n";
    for (const auto& [k, s] : e.layer_forward_s) {
      std::string p;
      if (pub) {
        const auto it = pub->layer_forward_s.find(k);
        if (it != pub->layer_forward_s.end()) p = fmt::format("{:>10.3f}", it->second);
      }
      out += fmt::format("  {:<40} {:>10.3f} {}\n", k, s, p);
    }
  }
  if (pub) out += fmt::format("\nPublished: {}{}\n", pub->source, pub->note.empty() ? "" : " (" + pub->note + ")");
  return out;
}

}  // namespace oom
