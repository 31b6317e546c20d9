// Study: a what-if sweep (`oom whatif`): models × hardware × GPUs × batch × context × budgets,
// each workload answered by the plan search and set against the baseline systems.
//
// A study file (experiments/*.json) names sweeps; each sweep is the cartesian product of its
// lists. The batch is given either as `global_batch` (sequences per step over all GPUs) or as
// `seqs_per_gpu` (e.g. one sequence per GPU at long context) or as `gpus_per_seq` (each sequence
// split over that many GPUs: context parallelism, global batch = gpus / it). Budgets are GiB or null (the
// hardware's capacity). `yarn_factor` defaults to the smallest whole factor that lets the model
// reach the sweep's context.
//   {"name": "default", "description": "...", "engine": "analytic",
//    "baselines": ["fsdp2-offload", "zero-offload", "megatrain"],
//    "sweeps": [{"name": "batch", "models": ["qwen3.6-35b-a3b"], "hardware": ["h100-sxm-node"],
//                "gpus": [4], "global_batch": [16, 32], "seq_len": [4096],
//                "gpu_budget_gib": [null], "host_budget_gib": [null, 512]}]}
// A sweep may also list "nodes" (node counts of each hardware, e.g. [1, 2, 4, 12] of
// "h200-sxm-node"), and then leave out "gpus" to use every GPU of the nodes: a scaling study.
// Paper studies (experiments/paper/) also name the figure or table they reproduce ("figure":
// "OOM Figure 5a") and may ask for other OOM plans than the search's ("systems" of a sweep, each
// a PlanVariant, default ["search"]): "search", "search:ep", "search:local" (the plan search over
// both paths or one), "base", "base:ep", "base:local" (the paper's Base plans,
// planner/search/plan_presets.h), "ep:R23/K4" (an EP plan with 23 interleaved resident decoders and the
// last 4 MoE-retained, 64K routing chunk: Table 5's grid), "local:A", "local:B", "local:1+1",
// "local:3+1" (the Local planner's operator splits with a named boundary policy, reference §4:
// Table 7), "search/noflat" (the search without FLAT's schedules). A sweep's optional "routing"
// (costmodel/routing.h) applies to all its workloads. Every workload of a sweep is answered once
// per system; the baselines once per workload (a sweep's optional "baselines" runs only those of
// the study's it lists, [] none). A sweep's optional "verdicts" states what the paper
// published about each workload of the sweep, per system: "fits", or the memory that runs out,
// "gpu" or "host" ({"search": "fits", "fsdp2-offload": "gpu"}; a key is one of the sweep's
// "systems" or of the baselines it runs); `oom whatif` prints each beside the predicted verdict
// (experiments/paper/capacity.json).
// The plan search comes in through a PlanFinder (cli/cmd_whatif.cc wires planner/search/plan_search.h;
// tests swap in a fake), so this runner depends only on the baselines and the workload types.
// A case that the plan search cannot fit is a row with its reason; a baseline that does not fit
// is out-of-memory with where, never a number. Units: seconds, bytes (GiB in text and CSV).
// run_study() runs its cases on as many threads as it is given (one by default); see there.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "costmodel/workload.h"
#include "planner/engine/baseline_run.h"
#include "planner/lowering/baselines.h"
#include "planner/plan/plan.h"
#include "traces/records.h"

namespace oom {

// How an OOM row gets its plan (see the study format above).
struct PlanVariant {
  enum class Kind { kSearch, kBase, kEpGrid, kLocalPolicy };
  Kind kind = Kind::kSearch;
  std::string path = "auto";  // kSearch, kBase: "auto" | "ep" | "local"
  int resident_layers = 0;    // kEpGrid: interleaved resident decoders (R)
  int retained_layers = 0;    // kEpGrid: the last decoders MoE-retained (K)
  std::string policy;         // kLocalPolicy: "A" | "B" | "1+1" | "3+1"
  bool flat = true;           // kSearch: FLAT's schedules offered to the search ("search/noflat": not)
  bool operator==(const PlanVariant&) const = default;
};
// The study-file spelling: "search", "base:ep", "ep:R23/K4", "local:1+1" ...
std::string plan_variant_name(const PlanVariant& v);
// The variant of a spelling, or nullopt when `name` is none of the forms above.
std::optional<PlanVariant> plan_variant_from_name(const std::string& name);
// The boundary policy of a Local plan (reference §4): A = every boundary on the host, O/LSE
// recomputed; B = A + O/LSE kept; "1+1" / "3+1" = B + one boundary kept in every 2 / 4 decoders,
// the others regenerated. Returns the plan with keep_attention_results and boundaries set, and
// SCO (flat.checkpoint_offload) dropped under 1+1 and 3+1, which keep only some boundaries on the
// host; the plan's other schedules are kept as they are.
Plan with_boundary_policy(Plan p, const std::string& policy, int layers);

// A capacity verdict (`oom whatif` sets what a study states the paper published beside what it
// predicts): the workload fits, or the memory that runs out first, the GPU's or the host's.
enum class Capacity { kFits, kGpu, kHost };
// "fits", "gpu", "host"
std::string capacity_name(Capacity c);
// The verdict of a spelling, or nullopt when `name` is none of the three.
std::optional<Capacity> capacity_from_name(const std::string& name);
// A published verdict on one system of a sweep: an OOM system of its "systems" (spelled as
// plan_variant_name() spells it) or a baseline system of the study.
struct PublishedVerdict {
  std::string system;
  Capacity verdict = Capacity::kFits;
  bool operator==(const PublishedVerdict&) const = default;
};

struct StudySweep {
  std::string name;
  std::vector<std::string> models;
  std::vector<std::string> hardware;
  // Node counts of each hardware (Workload::nodes: its node spec repeated); empty: the hardware's
  // own. With nodes, "gpus" may be left out: every GPU of the nodes.
  std::vector<int> nodes;
  std::vector<int> gpus;
  std::vector<std::int64_t> global_batch;  // either this ...
  std::vector<std::int64_t> seqs_per_gpu;  // ... or this ...
  std::vector<std::int64_t> gpus_per_seq;  // ... or this (each sequence over that many GPUs) is non-empty
  std::vector<std::int64_t> seq_len;
  std::vector<std::optional<double>> gpu_budget_gib{std::nullopt};
  std::vector<std::optional<double>> host_budget_gib{std::nullopt};
  std::optional<double> yarn_factor;  // nullopt: the smallest whole factor that reaches seq_len
  RoutingSpec routing;                // every workload's routing (costmodel/routing.h; default uniform)
  std::vector<PlanVariant> systems{PlanVariant{}};  // the OOM plans of each workload
  // The baselines the sweep runs ("baselines": a subset of the study's, possibly empty); nullopt:
  // every baseline of the study. A row's cell of a baseline the sweep leaves out reads "n/a".
  std::optional<std::vector<BaselineSystem>> baselines;
  // The paper's capacity verdicts on every workload of the sweep ("verdicts": {"search": "fits",
  // "fsdp2-offload": "gpu"}), in the order of their systems' names; empty: none stated.
  std::vector<PublishedVerdict> verdicts;
};

struct StudySpec {
  std::string name;
  std::string description;
  std::string figure;               // what a paper study reproduces ("OOM Figure 5a"); "" otherwise
  std::string engine = "analytic";  // StepEngine that runs the baselines
  std::vector<BaselineSystem> baselines = all_baseline_systems();
  std::vector<StudySweep> sweeps;
};

// Parses a study object. Throws InputError naming `file`, the field and the value (unknown keys,
// empty lists, not exactly one of global_batch, seqs_per_gpu and gpus_per_seq, unknown baselines).
StudySpec study_from_json(const nlohmann::json& j, const std::string& file);
nlohmann::json study_to_json(const StudySpec& s);
StudySpec load_study(const std::string& path);
// The default study: Qwen3.6-35B-A3B on four H100s, global batch 16–256 at 4K ("batch") and
// 64K–1M context with one sequence per GPU ("context").
StudySpec default_study();

// The study cut to each sweep's smallest workload, answered by every system of the sweep: its
// first model, hardware and budgets, and the least of its node counts, GPU counts, batch and
// context lists (`oom whatif --smallest`, `oom report-paper --smallest`: a quick check that every
// sweep and system of a study runs).
StudySpec smallest_cases(StudySpec s);

// One workload of a sweep.
struct StudyCase {
  std::string sweep;
  Workload workload;
  PlanVariant system;
};
// Every case of every sweep, in file order (models, hardware, gpus, batch, context, budgets,
// systems).
std::vector<StudyCase> expand_study(const StudySpec& s);

// What the plan search answered for one workload.
struct StudyPlan {
  Plan plan;
  std::string summary;  // short description, e.g. "ep R23/K0 c65536"
  Seconds step_s = 0;
  double tokens_per_s = 0;
  Bytes gpu_peak_bytes = 0;
  std::vector<Bytes> host_bytes_per_numa;
  Bytes host_bytes() const;
};
// A short description of a plan for tables: "ep R23/K0 c64K", "local shard h2 keepO regen" ...
std::string plan_summary(const Plan& p);

// Returns the plan of `system` for the workload, or throws std::runtime_error whose what() is one
// line saying why no plan fits (e.g. planner/search/plan_search.h's InfeasibleWorkload). InputError
// passes through.
using PlanFinder = std::function<StudyPlan(const WorkloadContext&, const PlanVariant& system)>;
// Called after each case: cases done, total, the case's label.
using StudyProgress = std::function<void(int done, int total, const std::string& label)>;

// A published measurement matched to a row (a step record of traces/records.h).
struct PublishedPoint {
  std::string id;
  Measured measured;
};

struct StudyRow {
  StudyCase study_case;
  std::optional<StudyPlan> plan;    // nullopt when no plan fits
  std::string infeasible;           // why no plan fits
  std::string infeasible_space;     // the memory that runs out, "gpu" or "host"; "" when neither is why
  std::vector<BaselineResult> baselines;  // in the spec's order, traces dropped
  // Chosen plan's tokens/s over the best baseline that fits (nullopt when either is missing).
  std::optional<double> speedup;
  std::string best_baseline;
  std::optional<PublishedPoint> published;                     // the OOM plan's, when matched
  std::vector<std::optional<PublishedPoint>> published_baselines;  // per baseline; empty: none attached
  std::string label() const;        // "qwen3.6-35b-a3b h100-sxm-node ×4 B=32 S=4096"
};

struct StudyResult {
  StudySpec spec;
  std::vector<StudyRow> rows;
  Seconds wall_s = 0;  // how long the study took to run
  std::string published_file;  // the records attached (attach_published); "" = none
};

// Runs every case: the plan search through `find_plan`, each baseline with the engine of `engines`
// named `spec.engine` and the hardware's calibration for that engine (load_calibration_for()). A
// workload that does not resolve (unknown model, too many GPUs) throws InputError naming the
// study's sweep and field; an engine that `engines` does not offer, InputError naming it
// (run_baseline()); with several errors, the first case's.
// `threads`: how many cases run at once (the calling thread among them). With more than one, the
// cases start largest first (by their estimated stages), `find_plan` must be safe to call from
// several threads, `progress` is called under a lock as cases finish (so `done` counts up, the
// labels in finishing order), and the baselines of an engine that allows one run at a time
// (StepEngine::concurrency()) run one at a time. The rows, and so every output written from them,
// are the same whatever the threads.
StudyResult run_study(const StudySpec& spec, const StepEngines& engines, const PlanFinder& find_plan,
                      const StudyProgress& progress = {}, int threads = 1);
// Threads for a study run on this machine: one per core.
int study_threads();

// What a study or an ablation will cost, told before it runs (`oom whatif`, `oom ablation`,
// `oom report-paper` print it on stderr): its cases, the estimated stages of the graph each case
// lowers (planner/lowering/graph_size_estimate.h; for a what-if case, of one representative plan:
// the EP plan at the default routing chunk over its GPUs, one node's stages when nodes run alike,
// as the search prices its candidates), and a wall time at a measured cost per stage.
struct WorkEstimate {
  int cases = 0;
  double stages = 0;   // summed over the cases
  Seconds wall_s = 0;  // estimated
  WorkEstimate& operator+=(const WorkEstimate& o);
  // "24 cases, 3.1e+06 stages: about 40 s" (what the commands print, after "estimate: ").
  std::string text() const;
};
// Time on one core per estimated stage of a what-if case's representative plan: the plan search
// over both paths with and without FLAT's schedules, and the baselines, of each case. Measured as
// the CPU time of `oom whatif --no-plots` with no file (the default study, RelWithDebInfo, on a
// 2-core machine): 93.7 s over 1.2e5 estimated stages (7.8e-4 s each), rounded up so that a run
// finishes within its estimate (tests/study/study_test.cc WorkEstimate.ASmallStudy...: the small
// study's CPU time against it). The wall time on an idle machine is this over the threads.
inline constexpr double kSearchSecondsPerStage = 8.5e-4;
// Wall time per estimated stage of a case that lowers and prices one plan (an ablation case: the
// lowering and the analytic engine): `oom ablation experiments/flat-dispatch.json --no-plots`,
// measured alike, 1.85 s over 2.2e5 stages.
inline constexpr double kPricingSecondsPerStage = 8.5e-6;
// The estimate of every case of `spec` (workloads resolved as run_study resolves them), run on
// `threads` threads: the largest case or the cases' sum over the threads, whichever is longer
// (run_study starts the largest first).
WorkEstimate estimate_study(const StudySpec& spec, int threads = 1);

// A stated verdict of a row against the predicted one: the row's OOM system's (a stated verdict on
// it), and on the first of its workload's rows (the sweep's first system) each stated baseline's.
// `predicted` is "fits", "gpu", "host", or "n/a" (not run, or no memory is why: a path that does
// not apply); `detail` the GPU and host peaks of what fits, else why it does not.
struct VerdictCheck {
  std::string system;
  Capacity published = Capacity::kFits;
  std::string predicted;
  std::string detail;
  bool matches() const { return predicted == capacity_name(published); }
};
std::vector<VerdictCheck> verdict_checks(const StudyResult& r, const StudyRow& row);
// Whether any sweep of the study states a verdict (the table, CSV and JSON then carry them).
bool states_verdicts(const StudySpec& s);
// "capacity verdicts: 14 stated, 14 match" (with the mismatches' count when there are any).
std::string verdict_summary_text(const StudyResult& r);

// The table `oom whatif` prints: workload, chosen plan, step time, tokens/s, GPU peak, host
// memory, each baseline's step time or OOM, speedup over the best baseline.
std::string study_table_text(const StudyResult& r);
// One CSV line per case with a header line; columns named in the header (see study.cc). A value
// that is absent (no budget, no plan fits, a baseline out of memory, no published record) is an
// empty cell.
std::string study_csv(const StudyResult& r);
// Checks a study CSV before a reader uses it (`oom plot`): the header has study_csv()'s leading
// columns, every row as many cells as the header, and every numeric cell a finite number, or
// empty where study_csv() writes an absent value (every column but gpus, global_batch and
// seq_len). Throws InputError naming `file`:LINE, the column and the cell (costmodel/csv_input.h).
void check_study_csv(const std::string& text, const std::string& file);
nlohmann::json study_result_to_json(const StudyResult& r);

}  // namespace oom
