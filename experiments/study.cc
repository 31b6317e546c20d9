#include "experiments/study.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "costmodel/csv_input.h"
#include "costmodel/hardware_spec.h"
#include "costmodel/input_error.h"
#include "costmodel/input_limits.h"
#include "costmodel/json_input.h"
#include "costmodel/token_text.h"
#include "experiments/published.h"
#include "planner/calibration/calibration.h"
#include "planner/calibration/validation.h"
#include "planner/lowering/graph_size_estimate.h"
#include "planner/search/plan_search.h"

namespace oom {
namespace {

constexpr std::int64_t kMaxInt = std::int64_t{1} << 40;

// A baseline's cell in a sweep that does not run it (StudySweep::baselines).
constexpr const char* kNotInSweep = "not run: the sweep lists other baselines";

// The columns every study CSV starts with (study_csv()); the baselines' and the published
// records' follow.
const std::vector<std::string> kStudyCsvColumns = {"sweep",  "system",  "model",    "hardware",       "gpus",
                                                   "global_batch", "seq_len", "gpu_budget_gib", "host_budget_gib", "status",
                                                   "plan",   "step_s",  "tokens_per_s", "gpu_peak_gib", "host_gib"};

// A list of GiB budgets, each a positive number or null; absent = [null].
std::vector<std::optional<double>> budget_list(const JsonReader& r, const std::string& key) {
  if (!r.has(key)) return {std::nullopt};
  const nlohmann::json& v = r.raw().at(key);
  if (!v.is_array() || v.empty()) r.fail(key, "expected a non-empty list of GiB budgets (numbers or null)");
  std::vector<std::optional<double>> out;
  for (std::size_t i = 0; i < v.size(); ++i) {
    const std::string path = fmt::format("{}[{}]", r.field(key), i);
    if (v[i].is_null()) {
      out.push_back(std::nullopt);
    } else if (!v[i].is_number() || v[i].get<double>() <= 0) {
      r.fail_value(path, v[i], "expected a positive number of GiB or null");
    } else {
      out.push_back(v[i].get<double>());
    }
  }
  return out;
}

std::vector<std::int64_t> non_empty(const JsonReader& r, const std::string& key, std::int64_t min, std::int64_t max = kMaxInt) {
  std::vector<std::int64_t> v = r.integer_list(key, min, max);
  if (v.empty()) r.fail(key, "expected a non-empty list");
  return v;
}

StudySweep sweep_from_json(const JsonReader& r) {
  r.reject_unknown_keys({"name", "models", "hardware", "nodes", "gpus", "global_batch", "seqs_per_gpu", "gpus_per_seq",
                         "seq_len", "gpu_budget_gib", "host_budget_gib", "yarn_factor", "routing", "systems", "baselines", "verdicts"});
  StudySweep s;
  s.name = r.string("name");
  s.models = r.string_list("models");
  if (s.models.empty()) r.fail("models", "expected a non-empty list");
  s.hardware = r.string_list("hardware");
  if (s.hardware.empty()) r.fail("hardware", "expected a non-empty list");
  if (r.has("nodes")) {
    for (const std::int64_t n : non_empty(r, "nodes", 1, kMaxNodes)) s.nodes.push_back(static_cast<int>(n));
  }
  // Without "gpus", a sweep over node counts uses every GPU of the nodes (expand_study).
  if (s.nodes.empty() || r.has("gpus")) {
    for (const std::int64_t g : non_empty(r, "gpus", 1, kMaxWorkloadGpus)) s.gpus.push_back(static_cast<int>(g));
  }
  const bool batch = r.has("global_batch"), per_gpu = r.has("seqs_per_gpu"), per_seq = r.has("gpus_per_seq");
  if (int{batch} + int{per_gpu} + int{per_seq} != 1) {
    r.fail(batch ? (per_gpu ? "seqs_per_gpu" : "gpus_per_seq") : per_gpu ? "gpus_per_seq" : "global_batch",
           "give exactly one of global_batch, seqs_per_gpu and gpus_per_seq");
  }
  if (batch) s.global_batch = non_empty(r, "global_batch", 1);
  if (per_gpu) s.seqs_per_gpu = non_empty(r, "seqs_per_gpu", 1);
  if (per_seq) s.gpus_per_seq = non_empty(r, "gpus_per_seq", 1);
  s.seq_len = non_empty(r, "seq_len", 1);
  s.gpu_budget_gib = budget_list(r, "gpu_budget_gib");
  s.host_budget_gib = budget_list(r, "host_budget_gib");
  s.yarn_factor = r.optional_number("yarn_factor", 1.0, 1024.0);
  if (r.has("routing")) s.routing = routing_from_json(r.object("routing").raw(), r.file(), r.field("routing"));
  if (r.has("systems")) {
    const std::vector<std::string> names = r.string_list("systems");
    if (names.empty()) r.fail("systems", "expected a non-empty list of OOM systems");
    s.systems.clear();
    for (std::size_t i = 0; i < names.size(); ++i) {
      const auto v = plan_variant_from_name(names[i]);
      if (!v) {
        r.fail_value(fmt::format("{}[{}]", r.field("systems"), i), names[i],
                     "unknown OOM system (known: search, search:ep, search:local, base, base:ep, base:local, ep:R<r>/K<k>, "
                     "local:A, local:B, local:1+1, local:3+1)");
      }
      s.systems.push_back(*v);
    }
  }
  if (r.has("baselines")) {
    // Checked against the study's baselines in study_from_json.
    s.baselines.emplace();
    const std::vector<std::string> names = r.string_list("baselines");
    for (std::size_t i = 0; i < names.size(); ++i) {
      const auto b = baseline_system_from_name(names[i]);
      if (!b) r.fail_value(fmt::format("{}[{}]", r.field("baselines"), i), names[i], "unknown baseline system");
      s.baselines->push_back(*b);
    }
  }
  if (r.has("verdicts")) {
    // {"system": "fits" | "gpu" | "host"}; which systems may be named is checked with the study's
    // baselines (study_from_json).
    const JsonReader v = r.object("verdicts");
    if (v.raw().empty()) r.fail("verdicts", "expected an object of at least one system's verdict");
    for (const auto& [system, value] : v.raw().items()) {
      const auto c = value.is_string() ? capacity_from_name(value.get<std::string>()) : std::nullopt;
      if (!c) v.fail_value(v.field(system), value, "expected \"fits\", \"gpu\" or \"host\" (the memory that runs out)");
      s.verdicts.push_back({system, *c});
    }
  }
  return s;
}

// A sweep's baselines are the study's; its verdicts name one of its OOM systems or one of the
// baselines it runs.
void check_sweep_systems(const StudySpec& s, const std::string& file) {
  for (std::size_t i = 0; i < s.sweeps.size(); ++i) {
    const StudySweep& w = s.sweeps[i];
    const auto in_study = [&](BaselineSystem b) { return std::find(s.baselines.begin(), s.baselines.end(), b) != s.baselines.end(); };
    if (w.baselines) {
      for (std::size_t k = 0; k < w.baselines->size(); ++k) {
        const BaselineSystem b = (*w.baselines)[k];
        if (!in_study(b)) {
          throw InputError(file, fmt::format("sweeps[{}].baselines[{}]", i, k), "\"" + std::string(baseline_system_name(b)) + "\"",
                           "a sweep runs some of the study's baselines, and this is not one of them");
        }
      }
    }
    for (const PublishedVerdict& v : w.verdicts) {
      const auto variant = plan_variant_from_name(v.system);
      const auto baseline = baseline_system_from_name(v.system);
      const bool oom = variant && std::find(w.systems.begin(), w.systems.end(), *variant) != w.systems.end();
      const bool base = baseline && in_study(*baseline) &&
                        (!w.baselines || std::find(w.baselines->begin(), w.baselines->end(), *baseline) != w.baselines->end());
      if (oom && plan_variant_name(*variant) != v.system) {
        throw InputError(file, fmt::format("sweeps[{}].verdicts.{}", i, v.system), "\"" + v.system + "\"",
                         fmt::format("spell the system as its \"systems\" entry does: {}", plan_variant_name(*variant)));
      }
      if (!oom && !base) {
        throw InputError(file, fmt::format("sweeps[{}].verdicts.{}", i, v.system), "\"" + v.system + "\"",
                         "a verdict names one of the sweep's systems or one of the baselines it runs");
      }
    }
  }
}

nlohmann::json budgets_to_json(const std::vector<std::optional<double>>& v) {
  nlohmann::json a = nlohmann::json::array();
  for (const auto& b : v) a.push_back(b ? nlohmann::json(*b) : nlohmann::json(nullptr));
  return a;
}

std::string baseline_names_text() {
  std::string out;
  for (const auto b : known_baseline_systems()) out += (out.empty() ? "" : ", ") + std::string(baseline_system_name(b));
  return out;
}

std::string budget_text(const std::optional<double>& b) { return b ? fmt::format("{:g}", *b) : std::string(); }

std::string gib_text(Bytes b) { return fmt::format("{:.1f}", to_gib(b)); }

Bytes sum(const std::vector<Bytes>& v) {
  Bytes s = 0;
  for (const Bytes b : v) s += b;
  return s;
}

// The smallest whole YaRN factor that lets `model` reach `seq_len`.
double auto_yarn_factor(const std::string& model, std::int64_t seq_len, const std::string& file) {
  const ModelSpec m = load_model_spec(model);
  if (m.max_position <= 0 || seq_len <= m.max_position) return 1.0;
  (void)file;
  return std::ceil(static_cast<double>(seq_len) / static_cast<double>(m.max_position));
}

}  // namespace

std::string plan_variant_name(const PlanVariant& v) {
  switch (v.kind) {
    case PlanVariant::Kind::kSearch:
      return (v.path == "auto" ? "search" : "search:" + v.path) + (v.flat ? "" : "/noflat");
    case PlanVariant::Kind::kBase:
      return v.path == "auto" ? "base" : "base:" + v.path;
    case PlanVariant::Kind::kEpGrid:
      return fmt::format("ep:R{}/K{}", v.resident_layers, v.retained_layers);
    case PlanVariant::Kind::kLocalPolicy:
      return "local:" + v.policy;
  }
  return "search";
}

std::optional<PlanVariant> plan_variant_from_name(const std::string& spelled) {
  PlanVariant v;
  std::string name = spelled;
  // "search/noflat": the plan search without FLAT's schedules.
  if (name.starts_with("search") && name.ends_with("/noflat")) {
    name.resize(name.size() - 7);
    v.flat = false;
  }
  for (const auto& [prefix, kind] : {std::pair{std::string("search"), PlanVariant::Kind::kSearch},
                                     std::pair{std::string("base"), PlanVariant::Kind::kBase}}) {
    if (prefix == "base" && !v.flat) break;
    if (name == prefix || name == prefix + ":auto" || name == prefix + ":ep" || name == prefix + ":local") {
      v.kind = kind;
      v.path = name == prefix ? "auto" : name.substr(prefix.size() + 1);
      return v;
    }
  }
  if (!v.flat) return std::nullopt;
  if (name == "local:A" || name == "local:B" || name == "local:1+1" || name == "local:3+1") {
    v.kind = PlanVariant::Kind::kLocalPolicy;
    v.path = "local";
    v.policy = name.substr(6);
    return v;
  }
  int r = -1, k = -1;
  char tail = 0;
  if (name.rfind("ep:R", 0) == 0 && std::sscanf(name.c_str(), "ep:R%d/K%d%c", &r, &k, &tail) == 2 && r >= 0 && k >= 0 &&
      r <= 4096 && k <= 4096 && name == fmt::format("ep:R{}/K{}", r, k)) {
    v.kind = PlanVariant::Kind::kEpGrid;
    v.path = "ep";
    v.resident_layers = r;
    v.retained_layers = k;
    return v;
  }
  return std::nullopt;
}

Plan with_boundary_policy(Plan p, const std::string& policy, int layers) {
  p.keep_attention_results = policy != "A";
  p.boundaries = BoundaryPolicy{};
  const int every = policy == "1+1" ? 2 : policy == "3+1" ? 4 : 1;
  if (every > 1) {
    p.boundaries.host_kept_all = false;
    for (int l = 0; l < layers; l += every) p.boundaries.host_kept.push_back(l);
    p.boundaries.regenerate_cap = every - 1;
  }
  // SCO offloads every boundary to the host: it applies under A and B, not under a policy that
  // regenerates some boundaries (applicable_flat(); validate_plan refuses that plan).
  if (!p.boundaries.host_kept_all) p.flat.selective_checkpoint_offload = false;
  return p;
}

std::string plan_summary(const Plan& p) {
  std::string s;
  if (p.path == ExpertPath::kEp) {
    s = fmt::format("ep R{}/K{} c{}", p.resident_layers.size(), p.moe_retained_layers.size(), tokens_text(p.routing_chunk_tokens));
    if (p.ep_group_gpus > 0) s += fmt::format(" EP{}", p.ep_group_gpus);  // GPUs per EP group
    if (p.context_parallel_gpus > 1) s += fmt::format(" CP{}", p.context_parallel_gpus);  // GPUs per sequence
  } else {
    s = fmt::format("local {}", p.param_transfer == ParamTransfer::kShard ? "shard" : "full");
    if (p.split.attention_head_group > 0) s += fmt::format(" h{}", p.split.attention_head_group);
    if (p.split.gdn_chunk_tokens > 0) s += " g" + tokens_text(p.split.gdn_chunk_tokens);
    if (p.split.moe_chunk_tokens > 0) s += " m" + tokens_text(p.split.moe_chunk_tokens);
    if (p.keep_attention_results) s += " O/LSE";
    if (!p.boundaries.host_kept_all) s += fmt::format(" keep{}", p.boundaries.host_kept.size());
  }
  // FLAT's schedules: +LLEP, +RingDTP, +SCO, +OSA<bucket MiB>.
  const FlatSchedules& f = p.flat;
  if (f.expert_dispatch == ExpertDispatch::kPipelinedLlep) s += " +LLEP";
  if (f.vocab_projection == VocabProjection::kRingDtp) s += " +RingDTP";
  if (f.selective_checkpoint_offload) s += " +SCO";
  if (f.optimizer_bucket_mib > 0) s += fmt::format(" +OSA{}", f.optimizer_bucket_mib);
  return s;
}

Bytes StudyPlan::host_bytes() const { return sum(host_bytes_per_numa); }

std::string StudyRow::label() const {
  const Workload& w = study_case.workload;
  const std::string nodes = w.nodes ? fmt::format("*{}", *w.nodes) : std::string();
  std::string s = fmt::format("{} {}{} x{} B={} S={}", w.model, w.hardware, nodes, w.gpus, w.global_batch, tokens_text(w.seq_len));
  if (w.gpu_budget_gib) s += fmt::format(" gpu<={:g}GiB", *w.gpu_budget_gib);
  if (w.host_budget_gib) s += fmt::format(" host<={:g}GiB", *w.host_budget_gib);
  if (!(study_case.system == PlanVariant{})) s += " [" + plan_variant_name(study_case.system) + "]";
  return s;
}

StudySpec study_from_json(const nlohmann::json& j, const std::string& file) {
  const JsonReader r(j, file);
  r.reject_unknown_keys({"name", "description", "figure", "engine", "baselines", "sweeps"});
  StudySpec s;
  s.name = r.string("name");
  s.description = r.string_or("description", "");
  s.figure = r.string_or("figure", "");
  s.engine = r.string_or("engine", "analytic");
  if (r.has("baselines")) {
    s.baselines.clear();
    const auto names = r.string_list("baselines");
    for (std::size_t i = 0; i < names.size(); ++i) {
      const auto b = baseline_system_from_name(names[i]);
      if (!b) {
        r.fail_value(fmt::format("baselines[{}]", i), names[i],
                     fmt::format("unknown baseline system (known: {})", baseline_names_text()));
      }
      s.baselines.push_back(*b);
    }
  }
  if (!r.has("sweeps") || !r.raw().at("sweeps").is_array() || r.raw().at("sweeps").empty()) {
    r.fail("sweeps", "expected a non-empty list of sweeps");
  }
  const nlohmann::json& sweeps = r.raw().at("sweeps");
  for (std::size_t i = 0; i < sweeps.size(); ++i) {
    s.sweeps.push_back(sweep_from_json(JsonReader(sweeps[i], file, fmt::format("sweeps[{}]", i))));
  }
  check_sweep_systems(s, file);
  return s;
}

nlohmann::json study_to_json(const StudySpec& s) {
  nlohmann::json baselines = nlohmann::json::array();
  for (const auto b : s.baselines) baselines.push_back(std::string(baseline_system_name(b)));
  nlohmann::json sweeps = nlohmann::json::array();
  for (const auto& w : s.sweeps) {
    nlohmann::json j = {{"name", w.name}, {"models", w.models}, {"hardware", w.hardware},
                        {"seq_len", w.seq_len}, {"gpu_budget_gib", budgets_to_json(w.gpu_budget_gib)},
                        {"host_budget_gib", budgets_to_json(w.host_budget_gib)}};
    if (!w.nodes.empty()) j["nodes"] = w.nodes;
    if (!w.gpus.empty()) j["gpus"] = w.gpus;
    if (!w.global_batch.empty()) j["global_batch"] = w.global_batch;
    if (!w.seqs_per_gpu.empty()) j["seqs_per_gpu"] = w.seqs_per_gpu;
    if (!w.gpus_per_seq.empty()) j["gpus_per_seq"] = w.gpus_per_seq;
    if (w.yarn_factor) j["yarn_factor"] = *w.yarn_factor;
    if (!w.routing.uniform()) j["routing"] = routing_to_json(w.routing);
    if (w.systems != std::vector<PlanVariant>{PlanVariant{}}) {
      nlohmann::json systems = nlohmann::json::array();
      for (const auto& v : w.systems) systems.push_back(plan_variant_name(v));
      j["systems"] = systems;
    }
    if (w.baselines) {
      nlohmann::json names = nlohmann::json::array();
      for (const auto b : *w.baselines) names.push_back(std::string(baseline_system_name(b)));
      j["baselines"] = names;
    }
    if (!w.verdicts.empty()) {
      nlohmann::json verdicts = nlohmann::json::object();
      for (const auto& v : w.verdicts) verdicts[v.system] = capacity_name(v.verdict);
      j["verdicts"] = verdicts;
    }
    sweeps.push_back(std::move(j));
  }
  nlohmann::json j = {{"name", s.name}, {"description", s.description}, {"engine", s.engine}, {"baselines", baselines}, {"sweeps", sweeps}};
  if (!s.figure.empty()) j["figure"] = s.figure;
  return j;
}

StudySpec load_study(const std::string& path) { return study_from_json(read_json_file(path), path); }

StudySpec default_study() {
  StudySpec s;
  s.name = "default";
  s.description = "Qwen3.6-35B-A3B on four H100s: global batch 16-256 at 4K, and 64K-1M context with one sequence per GPU";
  StudySweep batch;
  batch.name = "batch";
  batch.models = {"qwen3.6-35b-a3b"};
  batch.hardware = {"h100-sxm-node"};
  batch.gpus = {4};
  batch.global_batch = {16, 32, 64, 128, 256};
  batch.seq_len = {4096};
  StudySweep context = batch;
  context.name = "context";
  context.global_batch.clear();
  context.seqs_per_gpu = {1};
  context.seq_len = {65536, 131072, 262144, 524288, 1048576};
  s.sweeps = {batch, context};
  return s;
}

StudySpec smallest_cases(StudySpec s) {
  const auto smallest = [](auto& list) {
    if (!list.empty()) list = {*std::min_element(list.begin(), list.end())};
  };
  for (auto& w : s.sweeps) {
    w.models.resize(1);
    w.hardware.resize(1);
    smallest(w.nodes);
    smallest(w.gpus);
    smallest(w.global_batch);
    smallest(w.seqs_per_gpu);
    smallest(w.gpus_per_seq);
    smallest(w.seq_len);
    w.gpu_budget_gib.resize(1);
    w.host_budget_gib.resize(1);
  }
  return s;
}

std::vector<StudyCase> expand_study(const StudySpec& s) {
  std::vector<StudyCase> out;
  for (const auto& w : s.sweeps) {
    for (const auto& model : w.models) {
      for (const auto& hw : w.hardware) {
        // (nodes, GPUs) of this hardware: the sweep's GPU counts on each node count (or on the
        // hardware's own), or every GPU of each node count.
        std::vector<std::pair<std::optional<int>, int>> sizes;
        const std::vector<std::optional<int>> node_counts =
            w.nodes.empty() ? std::vector<std::optional<int>>{std::nullopt} : std::vector<std::optional<int>>(w.nodes.begin(), w.nodes.end());
        for (const std::optional<int> nodes : node_counts) {
          if (w.gpus.empty()) sizes.emplace_back(nodes, *nodes * load_hardware_spec(hw).gpus_per_node);
          for (const int gpus : w.gpus) sizes.emplace_back(nodes, gpus);
        }
        for (const auto& [nodes, gpus] : sizes) {
          std::vector<std::int64_t> batches = w.global_batch;
          if (batches.empty()) {
            for (const std::int64_t per : w.seqs_per_gpu) batches.push_back(per * gpus);
            // Each sequence over `per` GPUs (context parallelism); resolve_workload refuses a
            // count that does not divide the GPUs, naming global_batch.
            for (const std::int64_t per : w.gpus_per_seq) batches.push_back(std::max<std::int64_t>(1, gpus / per));
          }
          for (const std::int64_t b : batches) {
            for (const std::int64_t S : w.seq_len) {
              for (const auto& gb : w.gpu_budget_gib) {
                for (const auto& hb : w.host_budget_gib) {
                  Workload wl;
                  wl.model = model;
                  wl.hardware = hw;
                  wl.nodes = nodes;
                  wl.gpus = gpus;
                  wl.global_batch = b;
                  wl.seq_len = S;
                  wl.gpu_budget_gib = gb;
                  wl.host_budget_gib = hb;
                  wl.yarn_factor = w.yarn_factor ? *w.yarn_factor : auto_yarn_factor(model, S, s.name);
                  wl.routing = w.routing;
                  for (const auto& system : w.systems) out.push_back({w.name, wl, system});
                }
              }
            }
          }
        }
      }
    }
  }
  return out;
}

StudyResult run_study(const StudySpec& spec, const StepEngines& engines, const PlanFinder& find_plan,
                      const StudyProgress& progress, int threads) {
  const auto started = std::chrono::steady_clock::now();
  StudyResult result;
  result.spec = spec;
  const std::vector<StudyCase> cases = expand_study(spec);
  result.rows.resize(cases.size());
  // The baselines do not depend on the OOM system: they run once per workload, on the first of its
  // cases (a workload's systems are consecutive cases), and the others copy them.
  std::vector<std::size_t> first_of(cases.size());
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const bool same = i > 0 && cases[i - 1].workload == cases[i].workload && cases[i - 1].sweep == cases[i].sweep;
    first_of[i] = same ? first_of[i - 1] : i;
  }
  // One job per case (the plan search) and one per workload (its baselines), largest first by the
  // estimated stages of the case's graph, so that the long cases start at once; each job writes
  // only its own row, so the rows are the same whatever the threads and the order they finish in.
  struct Job {
    std::size_t row = 0;
    bool baselines = false;
    double stages = 0;
  };
  std::vector<Job> jobs;
  std::vector<WorkloadContext> contexts;
  contexts.reserve(cases.size());
  LoweringOptions estimate_options;
  estimate_options.symmetric_nodes = true;
  for (std::size_t i = 0; i < cases.size(); ++i) {
    contexts.push_back(resolve_workload(cases[i].workload, fmt::format("study {} sweep {}", spec.name, cases[i].sweep)));
    Plan representative;
    if (contexts[i].workload.gpus_per_seq() > 1) representative.context_parallel_gpus = contexts[i].workload.gpus_per_seq();
    const double stages = threads > 1 ? estimate_step_graph(representative, contexts[i], estimate_options).stages : 0.0;
    jobs.push_back({i, false, stages});
    if (first_of[i] == i) jobs.push_back({i, true, stages});
  }
  if (threads > 1) std::stable_sort(jobs.begin(), jobs.end(), [](const Job& a, const Job& b) { return a.stages > b.stages; });
  // An engine that allows one run at a time runs the baselines one at a time.
  const std::unique_ptr<StepEngine> baseline_engine = engines.make(spec.engine);
  const bool exclusive = !baseline_engine || baseline_engine->concurrency() == EngineConcurrency::kExclusive;
  std::mutex baseline_mutex, progress_mutex;
  std::vector<std::exception_ptr> errors(jobs.size());
  std::vector<int> pending(cases.size(), 0);  // jobs left before a row is complete
  for (const Job& j : jobs) ++pending[j.baselines ? j.row : j.row];
  for (std::size_t i = 0; i < cases.size(); ++i) {
    if (first_of[i] != i) ++pending[i];  // waits on its first case's baselines
  }
  int done = 0;
  const auto finish_row = [&](std::size_t i) {
    // Called with progress_mutex held once every job of row i is done.
    StudyRow& row = result.rows[i];
    const BaselineResult* best = nullptr;
    for (const auto& b : row.baselines) {
      if (b.fits() && (!best || b.tokens_per_s > best->tokens_per_s)) best = &b;
    }
    if (best) row.best_baseline = std::string(baseline_system_name(best->system));
    if (best && row.plan && best->tokens_per_s > 0) row.speedup = row.plan->tokens_per_s / best->tokens_per_s;
    ++done;
    if (progress) progress(done, static_cast<int>(cases.size()), row.label());
  };
  const auto run_job = [&](std::size_t j) {
    const Job& job = jobs[j];
    const StudyCase& c = cases[job.row];
    const WorkloadContext& ctx = contexts[job.row];
    StudyRow& row = result.rows[job.row];
    try {
      if (!job.baselines) {
        row.study_case = c;
        try {
          row.plan = find_plan(ctx, c.system);
        } catch (const InputError&) {
          throw;
        } catch (const InfeasibleWorkload& e) {
          row.infeasible = e.what();
          row.infeasible_space = e.space();
        } catch (const std::runtime_error& e) {
          row.infeasible = e.what();
        }
      } else {
        // The constants fitted with the engine that runs the baselines (NAME.ENGINE.json first).
        const Calibration calibration = load_calibration_for(ctx.hardware, spec.engine);
        const StudySweep* sweep = nullptr;
        for (const auto& w : spec.sweeps) sweep = w.name == c.sweep && !sweep ? &w : sweep;
        std::vector<BaselineResult> baselines;
        for (const auto system : spec.baselines) {
          if (sweep && sweep->baselines && std::find(sweep->baselines->begin(), sweep->baselines->end(), system) == sweep->baselines->end()) {
            BaselineResult skipped;
            skipped.system = system;
            skipped.not_run = kNotInSweep;
            baselines.push_back(std::move(skipped));
            continue;
          }
          std::unique_lock<std::mutex> lock(baseline_mutex, std::defer_lock);
          if (exclusive) lock.lock();
          BaselineResult b = run_baseline(system, ctx, engines, spec.engine, calibration);
          b.trace = Trace{};  // rows keep the numbers only
          baselines.push_back(std::move(b));
        }
        const std::lock_guard<std::mutex> lock(progress_mutex);
        for (std::size_t i = job.row; i < cases.size() && first_of[i] == job.row; ++i) {
          result.rows[i].baselines = baselines;
          if (i != job.row && --pending[i] == 0) finish_row(i);
        }
      }
    } catch (...) {
      errors[j] = std::current_exception();
    }
    const std::lock_guard<std::mutex> lock(progress_mutex);
    if (--pending[job.row] == 0) finish_row(job.row);
  };
  run_jobs(jobs.size(), std::max(1, threads), run_job);
  // The first error in case order, as one thread running the cases in order would throw it.
  std::optional<std::pair<std::size_t, std::exception_ptr>> first_error;
  for (std::size_t j = 0; j < jobs.size(); ++j) {
    if (errors[j] && (!first_error || jobs[j].row < first_error->first)) first_error = std::make_pair(jobs[j].row, errors[j]);
  }
  if (first_error) std::rethrow_exception(first_error->second);
  result.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return result;
}

int study_threads() { return static_cast<int>(std::max(1u, std::thread::hardware_concurrency())); }

WorkEstimate& WorkEstimate::operator+=(const WorkEstimate& o) {
  cases += o.cases;
  stages += o.stages;
  wall_s += o.wall_s;
  return *this;
}

std::string WorkEstimate::text() const {
  const std::string wall = wall_s < 120 ? fmt::format("{:.0f} s", std::ceil(wall_s)) : fmt::format("{:.0f} min", std::ceil(wall_s / 60));
  return fmt::format("{} case{}, {:.2g} stages: about {}", cases, cases == 1 ? "" : "s", stages, wall);
}

WorkEstimate estimate_study(const StudySpec& spec, int threads) {
  WorkEstimate e;
  double largest = 0;
  LoweringOptions options;
  options.symmetric_nodes = true;  // as the search prices its candidates
  for (const auto& c : expand_study(spec)) {
    const WorkloadContext ctx = resolve_workload(c.workload, fmt::format("study {} sweep {}", spec.name, c.sweep));
    Plan representative;
    if (ctx.workload.gpus_per_seq() > 1) representative.context_parallel_gpus = ctx.workload.gpus_per_seq();
    ++e.cases;
    const double stages = estimate_step_graph(representative, ctx, options).stages;
    e.stages += stages;
    largest = std::max(largest, stages);
  }
  e.wall_s = std::max(largest, e.stages / std::max(1, threads)) * kSearchSecondsPerStage;
  return e;
}

std::string study_table_text(const StudyResult& r) {
  std::string out = fmt::format("Study \"{}\": {}\n", r.spec.name, r.spec.description);
  std::string header = fmt::format("{:<8} {:<44} {:<30} {:>8} {:>9} {:>8} {:>8}", "sweep", "workload", "plan", "step_s",
                                   "tokens/s", "gpu_GiB", "host_GiB");
  for (const auto b : r.spec.baselines) header += fmt::format(" {:>14}", baseline_system_name(b));
  header += fmt::format(" {:>8}", "speedup");
  const bool published = !r.published_file.empty();
  if (published) header += fmt::format(" {:>18}", "published (error)");
  header += "\n";
  out += header;
  for (const auto& row : r.rows) {
    std::string line = fmt::format("{:<8} {:<44} ", row.study_case.sweep, row.label());
    if (row.plan) {
      line += fmt::format("{:<30} {:>8.3f} {:>9.0f} {:>8} {:>8}", row.plan->summary, row.plan->step_s, row.plan->tokens_per_s,
                          gib_text(row.plan->gpu_peak_bytes), gib_text(row.plan->host_bytes()));
    } else {
      line += fmt::format("{:<30} {:>8} {:>9} {:>8} {:>8}", "infeasible", "-", "-", "-", "-");
    }
    for (const auto& b : row.baselines) {
      if (b.fits()) {
        line += fmt::format(" {:>14}", fmt::format("{:.2f}s", b.step_s));
      } else {
        line += fmt::format(" {:>14}", b.failure_cell());
      }
    }
    line += fmt::format(" {:>8}", row.speedup ? fmt::format("{:.2f}x", *row.speedup) : std::string("-"));
    if (published) {
      std::string cell = "-";
      if (row.published && row.published->measured.step_s) {
        const auto e = relative_error(row.plan ? std::optional<double>(row.plan->step_s) : std::nullopt, row.published->measured.step_s);
        cell = fmt::format("{:.2f}s {}", *row.published->measured.step_s, e ? fmt::format("{:+.1f}%", 100 * *e) : std::string("(no plan)"));
      }
      line += fmt::format(" {:>18}", cell);
    }
    out += line + "\n";
  }
  // Reasons, once each: why no plan fits, why each baseline ran out of memory or how it was wrapped to fit.
  for (const auto& row : r.rows) {
    if (!row.plan) out += fmt::format("  {}: no plan fits: {}\n", row.label(), row.infeasible);
    for (const auto& b : row.baselines) {
      if (!b.fits() && b.not_run != kNotInSweep) out += fmt::format("  {}: {}: {}\n", row.label(), baseline_system_name(b.system), b.failure());
      if (b.fits() && b.setup && b.setup->expert_units > 1) {
        out += fmt::format("  {}: {}: experts wrapped in {} units per decoder (a whole decoder does not fit), micro-batch of {} x {}\n",
                           row.label(), baseline_system_name(b.system), b.setup->expert_units, b.setup->micro_batch_seqs,
                           b.setup->accumulation_steps);
      }
    }
  }
  // Published baseline points, one line each.
  for (const auto& row : r.rows) {
    for (std::size_t i = 0; i < row.published_baselines.size() && i < row.baselines.size(); ++i) {
      const auto& p = row.published_baselines[i];
      const auto& b = row.baselines[i];
      if (!p || !p->measured.step_s) continue;
      const auto e = relative_error(b.fits() ? std::optional<double>(b.step_s) : std::nullopt, p->measured.step_s);
      out += fmt::format("  {}: {} published {:.2f} s ({}): predicted {}\n", row.label(), baseline_system_name(b.system),
                         *p->measured.step_s, p->id,
                         e ? fmt::format("{:.2f} s, {:+.1f}%", b.step_s, 100 * *e) : std::string("out of memory"));
    }
  }
  if (states_verdicts(r.spec)) {
    // The paper's capacity verdicts beside the predicted ones, a mismatch marked.
    out += "Capacity verdicts, published / predicted:\n";
    for (const auto& row : r.rows) {
      for (const VerdictCheck& c : verdict_checks(r, row)) {
        const bool detail = c.matches() ? c.predicted == "fits" : true;
        out += fmt::format("  {}: {} {} / {}{}{}\n", row.label(), c.system, capacity_name(c.published), c.predicted,
                           detail && !c.detail.empty() ? " (" + c.detail + ")" : std::string(), c.matches() ? "" : "  MISMATCH");
      }
    }
    out += verdict_summary_text(r) + "\n";
  }
  if (published) out += published_errors_text(r) + "\n";
  out += fmt::format("{} cases in {:.1f} s\n", r.rows.size(), r.wall_s);
  return out;
}

std::string study_csv(const StudyResult& r) {
  std::string out = fmt::format("{}", fmt::join(kStudyCsvColumns, ","));
  for (const auto b : r.spec.baselines) {
    const auto n = baseline_system_name(b);
    out += fmt::format(",{0}_step_s,{0}_tokens_per_s,{0}_gpu_peak_gib,{0}_host_gib,{0}_oom", n);
  }
  out += ",best_baseline,speedup";
  const bool published = !r.published_file.empty();
  if (published) {
    out += ",published_id,published_step_s,published_tokens_per_s,step_error,published_gpu_peak_gib,gpu_peak_error,published_host_gib,host_error";
    for (const auto b : r.spec.baselines) {
      out += fmt::format(",{0}_published_id,{0}_published_step_s,{0}_published_tokens_per_s,{0}_step_error", baseline_system_name(b));
    }
  }
  const bool verdicts = states_verdicts(r.spec);
  if (verdicts) {
    out += ",published_verdict,verdict";
    for (const auto b : r.spec.baselines) out += fmt::format(",{0}_published_verdict,{0}_verdict", baseline_system_name(b));
  }
  out += "\n";
  auto quoted = [](const std::string& s) {
    std::string q = "\"";
    for (const char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
    return q + "\"";
  };
  for (const auto& row : r.rows) {
    const Workload& w = row.study_case.workload;
    out += fmt::format("{},{},{},{},{},{},{},{},{},", row.study_case.sweep, plan_variant_name(row.study_case.system), w.model,
                       w.hardware, w.gpus, w.global_batch, w.seq_len, budget_text(w.gpu_budget_gib), budget_text(w.host_budget_gib));
    if (row.plan) {
      out += fmt::format("ok,{},{:.6g},{:.6g},{:.3f},{:.3f}", quoted(row.plan->summary), row.plan->step_s,
                         row.plan->tokens_per_s, to_gib(row.plan->gpu_peak_bytes), to_gib(row.plan->host_bytes()));
    } else {
      out += fmt::format("infeasible,{},,,,", quoted(row.infeasible));
    }
    for (const auto& b : row.baselines) {
      if (b.fits()) {
        out += fmt::format(",{:.6g},{:.6g},{:.3f},{:.3f},", b.step_s, b.tokens_per_s, to_gib(b.gpu_peak_bytes),
                           to_gib(sum(b.host_bytes_per_numa)));
      } else {
        out += fmt::format(",,,,,{}", quoted(b.failure()));
      }
    }
    out += fmt::format(",{},{}", row.best_baseline, row.speedup ? fmt::format("{:.4g}", *row.speedup) : std::string());
    if (published) {
      const double tokens = static_cast<double>(w.global_batch) * static_cast<double>(w.seq_len);
      auto num = [](std::optional<double> v, const char* f) { return v ? fmt::format(fmt::runtime(f), *v) : std::string(); };
      auto tps = [&](std::optional<double> step) { return step && *step > 0 ? std::optional<double>(tokens / *step) : std::nullopt; };
      const std::optional<Measured> m = row.published ? std::optional<Measured>(row.published->measured) : std::nullopt;
      const auto pick = [&](auto field) { return m ? (*m).*field : std::optional<double>(); };
      const std::optional<double> pstep = pick(&Measured::step_s), pgpu = pick(&Measured::gpu_peak_gib), phost = pick(&Measured::host_gib);
      const bool plan = row.plan.has_value();
      out += fmt::format(",{},{},{},{},{},{},{},{}", row.published ? row.published->id : std::string(), num(pstep, "{:.6g}"),
                         num(tps(pstep), "{:.6g}"), num(relative_error(plan ? std::optional<double>(row.plan->step_s) : std::nullopt, pstep), "{:.4f}"),
                         num(pgpu, "{:.3f}"),
                         num(relative_error(plan ? std::optional<double>(to_gib(row.plan->gpu_peak_bytes)) : std::nullopt, pgpu), "{:.4f}"),
                         num(phost, "{:.3f}"),
                         num(relative_error(plan ? std::optional<double>(to_gib(row.plan->host_bytes())) : std::nullopt, phost), "{:.4f}"));
      for (std::size_t i = 0; i < r.spec.baselines.size(); ++i) {
        const std::optional<PublishedPoint> p = i < row.published_baselines.size() ? row.published_baselines[i] : std::nullopt;
        const std::optional<double> bstep = p ? p->measured.step_s : std::nullopt;
        const bool fits = i < row.baselines.size() && row.baselines[i].fits();
        out += fmt::format(",{},{},{},{}", p ? p->id : std::string(), num(bstep, "{:.6g}"), num(tps(bstep), "{:.6g}"),
                           num(relative_error(fits ? std::optional<double>(row.baselines[i].step_s) : std::nullopt, bstep), "{:.4f}"));
      }
    }
    if (verdicts) {
      // Each system's stated verdict and the predicted one; empty cells where none is stated.
      const std::vector<VerdictCheck> checks = verdict_checks(r, row);
      const auto cells = [&](const std::string& system) {
        for (const auto& c : checks) {
          if (c.system == system) return fmt::format(",{},{}", capacity_name(c.published), c.predicted);
        }
        return std::string(",,");
      };
      out += cells(plan_variant_name(row.study_case.system));
      for (const auto b : r.spec.baselines) out += cells(std::string(baseline_system_name(b)));
    }
    out += "\n";
  }
  return out;
}

nlohmann::json study_result_to_json(const StudyResult& r) {
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& row : r.rows) {
    nlohmann::json j = {{"sweep", row.study_case.sweep},
                        {"system", plan_variant_name(row.study_case.system)},
                        {"workload", workload_to_json(row.study_case.workload)}};
    if (row.plan) {
      j["plan"] = {{"summary", row.plan->summary},
                   {"plan", plan_to_json(row.plan->plan)},
                   {"step_s", row.plan->step_s},
                   {"tokens_per_s", row.plan->tokens_per_s},
                   {"gpu_peak_gib", to_gib(row.plan->gpu_peak_bytes)},
                   {"host_gib", to_gib(row.plan->host_bytes())}};
    } else {
      j["plan"] = nullptr;
      j["infeasible"] = row.infeasible;
    }
    nlohmann::json baselines = nlohmann::json::array();
    for (const auto& b : row.baselines) baselines.push_back(baseline_result_to_json(b));
    j["baselines"] = baselines;
    j["best_baseline"] = row.best_baseline.empty() ? nlohmann::json(nullptr) : nlohmann::json(row.best_baseline);
    j["speedup"] = row.speedup ? nlohmann::json(*row.speedup) : nlohmann::json(nullptr);
    if (states_verdicts(r.spec)) {
      nlohmann::json checks = nlohmann::json::array();
      for (const VerdictCheck& c : verdict_checks(r, row)) {
        checks.push_back({{"system", c.system}, {"published", capacity_name(c.published)}, {"predicted", c.predicted},
                          {"matches", c.matches()}, {"detail", c.detail}});
      }
      j["verdicts"] = checks;
    }
    if (!r.published_file.empty()) {
      auto point = [](const std::optional<PublishedPoint>& p) {
        if (!p) return nlohmann::json(nullptr);
        auto opt = [](std::optional<double> v) { return v ? nlohmann::json(*v) : nlohmann::json(nullptr); };
        return nlohmann::json{{"id", p->id}, {"step_s", opt(p->measured.step_s)}, {"gpu_peak_gib", opt(p->measured.gpu_peak_gib)},
                              {"host_gib", opt(p->measured.host_gib)}};
      };
      j["published"] = point(row.published);
      nlohmann::json pb = nlohmann::json::array();
      for (const auto& p : row.published_baselines) pb.push_back(point(p));
      j["published_baselines"] = pb;
    }
    rows.push_back(std::move(j));
  }
  nlohmann::json out = {{"study", study_to_json(r.spec)}, {"rows", rows}, {"wall_s", r.wall_s}};
  if (states_verdicts(r.spec)) out["verdict_summary"] = verdict_summary_text(r);
  if (!r.published_file.empty()) {
    out["published_file"] = r.published_file;
    out["published_errors"] = published_errors_to_json(published_errors(r));
  }
  return out;
}

void check_study_csv(const std::string& text, const std::string& file) {
  check_csv_table(parse_csv(text, file), file, kStudyCsvColumns, [](const std::string& column) {
    if (column == "sweep" || column == "system" || column == "model" || column == "hardware" || column == "status" ||
        column == "plan" || column == "best_baseline" || column.ends_with("_oom") || column.ends_with("_id") ||
        column.ends_with("verdict")) {
      return CsvColumn::kText;
    }
    if (column == "gpus" || column == "global_batch" || column == "seq_len") return CsvColumn::kNumber;
    return CsvColumn::kNumberOrEmpty;  // budgets, results: empty where absent (no budget, infeasible, out of memory)
  });
}

}  // namespace oom
