#include "planner/calibration/calibrate.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <future>
#include <tuple>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

#include <Eigen/Dense>
#include <fmt/format.h>

#include "costmodel/input_error.h"
#include "planner/engine/analytic_evaluator.h"
#include "planner/engine/duration_model.h"
#include "planner/engine/step_engine.h"
#include "planner/lowering/baselines.h"
#include "planner/lowering/graph_size_estimate.h"
#include "planner/lowering/step_graph.h"

namespace oom {
namespace {

// One fitted constant: its field, whether it is an efficiency (≤ 1), and how far it may move
// from its estimate (a factor, both ways).
struct Constant {
  const char* name;
  double Calibration::*field;
  bool efficiency;
  double down_factor;  // the fit keeps the constant within [estimate / down, estimate · up]
  double up_factor;
};

const std::vector<Constant>& constants() {
  static const std::vector<Constant> c = {
      // Efficiencies against the BF16 dense peak (estimate / range: down = estimate / low,
      // up = high / estimate), each kept within what such kernels reach.
      // GEMMs: at most what a large square BF16 GEMM reaches (790 of 989 TFLOP/s measured on an
      // 8192³ GEMM, ../reference HARDWARE.md), at least half the datasheet-based estimate.
      {"gemm_efficiency", &Calibration::gemm_efficiency, true, 0.70 / 0.35, 0.80 / 0.70},
      {"expert_gemm_efficiency", &Calibration::expert_gemm_efficiency, true, 0.55 / 0.14, 0.80 / 0.55},
      // Flash attention (head dim ≤ 256) between FlashAttention-2 and FlashAttention-3 on the H100:
      // from FlashAttention-2's 298 TFLOP/s forward at head dim 256, 16K tokens, up to the 740
      // TFLOP/s (75 % of peak) FlashAttention-3 reaches at its best (FlashAttention-3 paper, Shah
      // et al. 2024, H100 SXM5 benchmarks); the backward runs below its forward there. The
      // estimate is FlashAttention-3's causal head-dim-256 figure (Calibration::attention_efficiency):
      // no record but a long-context one measures this kernel, so a fit without those (a fold that
      // leaves their model out) predicts it from the published kernel, not from the FlashAttention-2
      // era midpoint it started from before.
      {"attention_efficiency", &Calibration::attention_efficiency, true, 0.67 / 0.30, 0.75 / 0.67},
      // The backward: fitted only on a measured device (the CPU backend); on a GPU it is the
      // forward's times kFlashBackwardRatio (fit_calibration()).
      {"attention_backward_efficiency", &Calibration::attention_backward_efficiency, true, 0.41 / 0.25, 0.60 / 0.41},
      // A windowed kernel: from half of FlashAttention-2's figure up to FlashAttention-3's best.
      {"windowed_attention_efficiency", &Calibration::windowed_attention_efficiency, true, 0.45 / 0.15, 0.75 / 0.45},
      // PyTorch's memory-efficient kernel (head dim > 256; its arithmetic, its K/V re-reads priced
      // apart) and the chunked GDN kernels: wide ranges, no published H100 figure to narrow them.
      {"wide_attention_efficiency", &Calibration::wide_attention_efficiency, true, 0.15 / 0.05, 0.50 / 0.15},
      {"gdn_efficiency", &Calibration::gdn_efficiency, true, 0.10 / 0.01, 0.50 / 0.10},
      // NVLink all-to-all, all-gather and reduce-scatter: half to all of the per-GPU rate.
      {"fabric_efficiency", &Calibration::fabric_efficiency, true, 0.80 / 0.50, 1.0 / 0.80},
      // Achieved PCIe: between half the estimate and the x16 link's line rate.
      {"h2d_Bps", &Calibration::h2d_Bps, false, 2, 1.2},
      {"d2h_Bps", &Calibration::d2h_Bps, false, 2, 1.2},
      {"cpu_adamw_params_per_s", &Calibration::cpu_adamw_params_per_s, false, 10, 10},
      // torch.optim.AdamW over CPU shards (FSDP2's optimizer.step()): only the baseline-system
      // records price it; the same range around the socket's estimate.
      {"torch_adamw_params_per_s", &Calibration::torch_adamw_params_per_s, false, 10, 10},
      {"host_prep_params_per_s", &Calibration::host_prep_params_per_s, false, 10, 10},
      // Fixed costs (estimates 20, 20 and 30 µs): what a running step spends around each compute
      // stage besides its kernels' work (5 µs–5 ms: the eager dispatch of the stage's operators,
      // ten to several hundred of them as this project's backend counts them (planner/lowering/
      // operator_counts.cc) at 5–20 µs each, its waits on the copy and collective streams' events,
      // the host's bookkeeping between stages; an operator timed alone pays none of it), per local
      // expert (0.4 µs–1 ms), per collective (launch, split-size exchange, synchronization:
      // 0.6–300 µs).
      {"compute_overhead_s", &Calibration::compute_overhead_s, false, 20e-6 / 5e-6, 5e-3 / 20e-6},
      {"expert_overhead_s", &Calibration::expert_overhead_s, false, 50, 50},
      {"collective_overhead_s", &Calibration::collective_overhead_s, false, 50, 300e-6 / 30e-6},
      // Dispatch per operator (FitOptions::operator_overhead_s; fitted only where that estimate is
      // set, the measured CPU device: eager LibTorch pays 2–20 µs a call on one core).
      {"operator_overhead_s", &Calibration::operator_overhead_s, false, 10, 10},
  };
  return c;
}

// Where a fitted constant holds when several hardware are fitted together (one value per domain):
//   - what a GPU's kernels and launches reach (efficiencies, ramps, per-stage, per-expert and
//     per-operator costs): one value per GPU architecture, since GPUs of one architecture run the
//     same kernels on the same SMs (transfer_calibration() carries them over on that ground);
//   - collectives: one value per kind of fabric (NVLink, or PCIe peer to peer);
//   - links and CPU throughputs: one fraction of the datasheet figure each hardware states, for
//     every hardware alike (the PCIe DMA engines and the CPU update's memory-bound loops reach
//     their datasheet rates in the same proportion: the same software on another part).
std::string domain_of(double Calibration::*field, const HardwareSpec& h) {
  if (field == &Calibration::fabric_efficiency || field == &Calibration::collective_overhead_s) {
    return h.fabric.kind == FabricKind::kNvlink ? "nvlink" : "pcie_peer";
  }
  if (field == &Calibration::h2d_Bps || field == &Calibration::d2h_Bps || field == &Calibration::cpu_adamw_params_per_s ||
      field == &Calibration::torch_adamw_params_per_s || field == &Calibration::host_prep_params_per_s) {
    return "";
  }
  return h.gpu.architecture.empty() ? h.name : h.gpu.architecture;
}

// A record turned into something the fit can price with any calibration: lowered once, then
// shared, unchanged, by every fit over the same records (prepare_fit_records()).
struct Lowered {
  FitRow row;  // id, kind and measured time (held_out is the fit's)
  WorkloadContext ctx;
  StepGraph graph;
  std::vector<StageId> op_stages;  // operator records: the stages whose durations add up
  std::vector<std::int32_t> rank0_compute;  // step records: the stages on rank 0's compute stream
  // Step records with a measured breakdown (Measured::compute_s), in a fit that weighs it: each
  // direction and kind's stages on rank 0's compute stream and its measured share of that
  // stream's forward and backward busy time (`breakdown`: those stages, the optimizer's left out).
  struct Share {
    std::string key;
    std::vector<std::int32_t> stages;
    double measured = 0;
  };
  std::vector<Share> shares;
  std::vector<std::int32_t> breakdown;
  std::optional<AnalyticSchedule> schedule;  // step records: Eq. 3 over `graph`, built once
  std::optional<HostSharing> sharing;        // step records: the host sharing of `graph`, built once
  // Stages that price alike (DurationModel's contract: a cost depends on a stage's kind, phase,
  // resource, demand, shape and peers only), priced once per evaluation: layers repeat.
  std::vector<Stage> priced;             // one representative per distinct pricing
  std::vector<std::int32_t> priced_of;  // stage id → index into `priced`
  std::shared_ptr<const HardwareSpec> hardware;  // ctx.hardware, set with it, shared by every evaluation's model
  int hw = 0;  // index of its hardware among the fit's (FitRecords::hws)
};

// A record inside one fit: its lowering and what the fit holds of it.
struct Target {
  std::shared_ptr<const Lowered> l;
  FitRow row;
  double engine_factor = 1;                // step records: predicting engine / analytic at the last pass
  std::optional<double> compute_anchor_s;  // step records: published compute-stream busy time of rank 0
  // Step records, inside the fit: each stage's work stretch from host sharing, settled at the
  // constants of the fit's last accepted step and held while the Jacobian is taken (settling at
  // every evaluation costs ~15 Eq. 3 passes); empty: settle exactly.
  std::vector<std::pair<std::int32_t, double>> stretch;  // (stage, stretch) of the stretched stages
  bool stretched = false;
  // Inside the fit: which constants price a stage of this record (index into constants()). The
  // Jacobian's column of a constant that prices none of its stages is 0 without evaluating it.
  std::vector<bool> priced_by;
  // Inside the fit: the stage durations and Eq. 3 finish times at the residuals of the Jacobian's
  // base point (Eq3Base::kRecord), so that a column re-runs Eq. 3 only from the first stage whose
  // duration its constant moves (Eq3Base::kResume): the stages before keep their finish times.
  std::vector<Seconds> base_d, base_finish;
};

// What an evaluation does with the Eq. 3 base of its target (Target::base_d, base_finish).
enum class Eq3Base { kNone, kRecord, kResume };

// A model of `t`'s hardware under calibration `c`.
CalibratedDurationModel model_of(const Lowered& t, const Calibration& c) {
  return CalibratedDurationModel(t.hardware, c, t.ctx.workload.gpus);
}

// The part of a stage its price depends on (planner/engine/duration_model.h).
auto pricing_key(const Stage& s) {
  return std::make_tuple(static_cast<int>(s.op), static_cast<int>(s.phase), s.resource, s.gpu, s.flops, s.bytes, s.params,
                         s.shape.tokens, s.shape.seqs, s.shape.seq_len, s.shape.k, s.shape.n, s.shape.heads, s.shape.head_dim,
                         s.shape.window, s.shape.experts, s.peers, s.ops);
}

void index_pricing(Lowered& t) {
  std::map<decltype(pricing_key(Stage{})), std::int32_t> seen;
  t.priced_of.resize(t.graph.stages.size());
  for (const Stage& s : t.graph.stages) {
    auto [it, added] = seen.emplace(pricing_key(s), static_cast<std::int32_t>(t.priced.size()));
    if (added) {
      Stage p = s;
      p.name.clear();
      p.deps.clear();
      p.memory.clear();
      t.priced.push_back(std::move(p));
    }
    t.priced_of[static_cast<std::size_t>(s.id)] = it->second;
  }
}

struct Prediction {
  double time_s = 0;          // step or operator time
  double compute_busy_s = 0;  // step records: rank 0's compute-stream busy time
  std::vector<double> shares;  // step records: the predicted share of each Target::shares
};

// An operator record times one operator's kernels alone, outside a step (the published Table 8
// timings). Such a timing holds none of the per-stage cost of a running step
// (Calibration::compute_overhead_s: the waits on the copy and collective streams, the eager glue
// and the host's bookkeeping between a step's stages), and the records show none: they grow in
// proportion to the tokens with no fixed part (op-g4-moe 15 / 30 / 71 / 147 ms at 32K–256K,
// op-g4-reuse 4 / 8 / 21 / 39 ms), where a fixed cost per stage of the size the step records need
// would be a third of the 32K times.
StageCost isolated_operator_cost(const CalibratedDurationModel& model, const Stage& s, const StepGraph& g, const Calibration& c) {
  StageCost cost = model.cost(s, g);
  cost.fixed_s = std::max(0.0, cost.fixed_s - c.compute_overhead_s);
  return cost;
}

// `compute_busy`: also sum rank 0's compute-stream busy time (step records).
// `stretch`: settle host sharing exactly (whatever stretch `t` holds) and return the work stretch
// it gave each stage.
// `base`: record this evaluation's durations and finish times as the target's Eq. 3 base, or
// resume Eq. 3 from it (both bit for bit what a full pass gives; the settling path ignores it).
Prediction predict_detail(const Target& t, const Calibration& c, bool compute_busy,
                          std::vector<std::pair<std::int32_t, double>>* stretch = nullptr, Eq3Base base = Eq3Base::kNone) {
  const Lowered& l = *t.l;
  const CalibratedDurationModel model = model_of(l, c);
  Prediction out;
  if (t.row.kind == RecordKind::kOperator) {
    for (const StageId id : l.op_stages) out.time_s += isolated_operator_cost(model, l.graph.stage(id), l.graph, c).duration_s();
    return out;
  }
  // The fit evaluates thousands of times per thread: its buffers are the thread's, reused.
  thread_local std::vector<StageCost> priced;
  thread_local std::vector<Seconds> priced_s, d, finish;
  priced.resize(l.priced.size());
  priced_s.resize(l.priced.size());
  d.resize(l.graph.stages.size());
  for (std::size_t i = 0; i < l.priced.size(); ++i) {
    priced[i] = model.cost(l.priced[i], l.graph);
    priced_s[i] = priced[i].duration_s();
  }
  for (std::size_t v = 0; v < d.size(); ++v) d[v] = priced_s[static_cast<std::size_t>(l.priced_of[v])];
  if (compute_busy) {
    for (const std::int32_t v : l.rank0_compute) out.compute_busy_s += d[static_cast<std::size_t>(v)];
  }
  if (!l.shares.empty()) {
    double total = 0;
    for (const std::int32_t v : l.breakdown) total += d[static_cast<std::size_t>(v)];
    for (const auto& share : l.shares) {
      double busy = 0;
      for (const std::int32_t v : share.stages) busy += d[static_cast<std::size_t>(v)];
      out.shares.push_back(total > 0 ? busy / total : 0);
    }
  }
  auto fixed_s = [&](std::size_t v) { return priced[static_cast<std::size_t>(l.priced_of[v])].fixed_s; };
  auto eq3 = [&] {
    if (base == Eq3Base::kResume && t.base_d.size() == d.size()) {
      std::size_t from = 0;
      while (from < d.size() && d[from] == t.base_d[from]) ++from;
      finish.resize(d.size());
      std::copy(t.base_finish.begin(), t.base_finish.begin() + static_cast<std::ptrdiff_t>(from), finish.begin());
      return l.schedule->step_s_from(d, finish, from);
    }
    const Seconds s = l.schedule->step_s(d, finish);
    if (base == Eq3Base::kRecord) {  // at the fit's base point, on the fit's own thread
      auto& target = const_cast<Target&>(t);
      target.base_d = d;
      target.base_finish = finish;
    }
    return s;
  };
  Seconds step = 0;
  if (t.stretched && stretch == nullptr) {
    for (const auto& [v, k] : t.stretch) {
      const auto u = static_cast<std::size_t>(v);
      d[u] = fixed_s(u) + k * (d[u] - fixed_s(u));
    }
    step = eq3();
  } else if (l.sharing && !l.sharing->empty()) {
    // Only the stages that share host resources are settled: their costs, and (for the stretch)
    // their fair-share durations.
    const std::vector<std::int32_t>& sharing = l.sharing->stages();
    thread_local std::vector<StageCost> lane_costs;
    thread_local std::vector<Seconds> fair;
    lane_costs.resize(sharing.size());
    fair.resize(sharing.size());
    for (std::size_t i = 0; i < sharing.size(); ++i) {
      const auto v = static_cast<std::size_t>(sharing[i]);
      lane_costs[i] = priced[static_cast<std::size_t>(l.priced_of[v])];
      fair[i] = d[v];
    }
    step = l.sharing->settle(*l.schedule, lane_costs, d, finish);
    if (stretch) {
      // Out: the work stretch (settled over fair-share work) of every stage sharing changed.
      stretch->clear();
      for (std::size_t i = 0; i < sharing.size(); ++i) {
        const auto v = static_cast<std::size_t>(sharing[i]);
        const Seconds work = fair[i] - lane_costs[i].fixed_s;
        if (work > 0 && d[v] != fair[i]) stretch->emplace_back(sharing[i], (d[v] - lane_costs[i].fixed_s) / work);
      }
    }
  } else {
    step = eq3();
  }
  out.time_s = t.engine_factor * step;
  return out;
}

double predict(const Target& t, const Calibration& c) { return predict_detail(t, c, false).time_s; }

int first_layer_of(const ModelSpec& m, const std::string& layer_type) {
  if (layer_type == "moe") return 0;
  for (int l = 0; l < m.layers; ++l) {
    if (layer_kind_name(m.layer_kinds[static_cast<std::size_t>(l)]) == layer_type) return l;
  }
  return -1;
}

// The stages of an operator record: a mixing sublayer's forward is its projections (the input
// ones, and the output projection the lowering runs as a stage of its own after the core), and
// its core; a replay that reuses O rebuilds the projections alone, the output one included, over
// the kept O.
bool op_stage_matches(const std::string& op, const StageKey& k) {
  const bool proj = k.op == StageOp::kProj || k.op == StageOp::kOut, core = k.op == StageOp::kCore;
  if (op == "attention_forward") return k.part == StagePart::kAttention && (proj || core);
  if (op == "attention_replay_reuse_o") return k.part == StagePart::kAttention && proj;
  if (op == "gdn_mixing_forward") return k.part == StagePart::kGdn && (proj || core);
  if (op == "moe_forward") return k.part == StagePart::kMoe && (k.op == StageOp::kRouterShared || k.op == StageOp::kExperts);
  return false;
}

Lowered operator_target(const OperatorRecord& o, const HardwareSpec& hw) {
  Lowered t;
  t.row = {o.id, RecordKind::kOperator, false, o.time_s, 0, std::nullopt, 0};
  t.ctx.model = load_model_spec(o.model);
  t.ctx.hardware = hw;
  t.hardware = std::make_shared<const HardwareSpec>(hw);
  t.ctx.workload.model = o.model;
  t.ctx.workload.hardware = hw.name;
  t.ctx.workload.gpus = 1;
  t.ctx.workload.global_batch = o.batch;
  t.ctx.workload.seq_len = o.seq_len;
  const int layer = first_layer_of(t.ctx.model, o.layer_type);
  if (layer < 0) throw InputError(o.origin, "layer_type", o.layer_type, "the model has no layer of this kind");
  if (o.op != "attention_forward" && o.op != "attention_replay_reuse_o" && o.op != "gdn_mixing_forward" && o.op != "moe_forward") {
    throw InputError(o.origin, "op", o.op, "no StepGraph stages correspond to this operator");
  }
  Plan plan;  // one GPU, one pass over whole sequences, nothing partitioned
  plan.path = ExpertPath::kLocal;
  LoweringOptions options;
  options.decoder_layers = layer + 1;
  t.graph = lower(plan, t.ctx, options);
  for (const Stage& s : t.graph.stages) {
    const StageKey& k = s.key;
    if (k.rank == 0 && k.phase == Phase::kForward && k.decoder == layer && op_stage_matches(o.op, k)) t.op_stages.push_back(s.id);
  }
  if (t.op_stages.empty()) throw InputError(o.origin, "op", o.op, "no matching stages in the lowered layer");
  return t;
}

// A measured breakdown's shares (Measured::compute_s). A kind that takes less than
// kMinBreakdownShare of the stream is left out: its stages are mostly fixed cost, and its
// measured time is a few samples of the clock.
constexpr double kMinBreakdownShare = 0.03;

void add_breakdown(Lowered& t, const StepRecord& r) {
  if (r.measured.compute_s.empty()) return;
  for (const std::int32_t v : t.rank0_compute) {
    if (t.graph.stage(v).phase != Phase::kOptimizer) t.breakdown.push_back(v);
  }
  double total = 0;
  for (const auto& [key, seconds] : r.measured.compute_s) total += seconds;
  for (const auto& [key, seconds] : r.measured.compute_s) {
    const std::optional<ComputeKey> k = parse_compute_key(key);
    Lowered::Share share{key, {}, total > 0 ? seconds / total : 0};
    for (const std::int32_t v : t.breakdown) {
      const Stage& s = t.graph.stage(v);
      if (k && (s.phase == Phase::kBackward) == k->backward && op_kind_name(s.op) == k->kind) share.stages.push_back(v);
    }
    if (share.stages.empty()) {
      throw InputError(r.origin, "measured.compute_s." + key, fmt::format("{}", seconds),
                       "no forward or backward stage on rank 0's compute stream has this direction and operator kind");
    }
    if (share.measured >= kMinBreakdownShare) t.shares.push_back(std::move(share));
  }
}

// `breakdown`: also the record's measured breakdown (FitOptions::breakdown_weight > 0).
Lowered step_target(const StepRecord& r, bool breakdown) {
  Lowered t;
  t.row = {r.id, RecordKind::kStep, false, *r.measured.step_s, 0, std::nullopt, 0};
  t.ctx = resolve_workload(r.workload, r.origin);
  t.hardware = std::make_shared<const HardwareSpec>(t.ctx.hardware);
  if (!r.system.empty()) {
    // A baseline system's record: its step as configure_baseline() sets it up.
    const auto system = baseline_system_from_name(r.system);
    if (!system) throw InputError(r.origin, "system", "\"" + r.system + "\"", "unknown baseline system");
    BaselineGraph b = baseline_step_graph(*system, t.ctx);
    if (!b.setup) throw InputError(r.origin, "system", "\"" + r.system + "\"", "does not fit: " + b.oom->message());
    t.graph = std::move(b.graph);
  } else {
    const Plan plan = plan_from_json(r.plan, r.origin, "plan");
    validate_plan(plan, t.ctx.model, t.ctx.workload, r.origin, "plan");
    check_step_graph_size(plan, t.ctx, {}, r.origin, r.origin);
    t.graph = lower(plan, t.ctx);
  }
  t.schedule.emplace(t.graph);
  t.sharing.emplace(t.graph, model_of(t, default_calibration(t.ctx.hardware)));
  index_pricing(t);
  for (const Stage& s : t.graph.stages) {
    if (s.gpu == 0 && t.graph.resource(s.resource).kind == ResourceKind::kGpuCompute) t.rank0_compute.push_back(s.id);
  }
  if (breakdown) add_breakdown(t, r);
  return t;
}

}  // namespace

std::string_view record_kind_name(RecordKind k) {
  switch (k) {
    case RecordKind::kStep: return "step";
    case RecordKind::kBaseline: return "baseline";
    case RecordKind::kOperator: return "operator";
  }
  return "?";
}

std::vector<std::string> FitOptions::default_held_out_ids() {
  return {"t4-b64", "long-128k", "t6-512k-replay", "g-qwen3-b32", "g-qwen3-b32-fsdp2", "op-g4-global-128k", "op-g4-moe-128k"};
}

void use_measured_device(FitOptions& o) {
  o.measured_device_range = 100;
  o.attention_half_keys = 0;
  o.operator_overhead_s = 5e-6;
}

// The records of one hardware, each lowered once (a fifth of a fit's time when each fit lowered
// its own): step records, then operator records, in file order.
struct FitRecords {
  std::vector<HardwareSpec> hws;  // the hardware fitted together (one calibration each)
  bool breakdown = false;  // lowered with the measured breakdowns (FitOptions::breakdown_weight > 0)
  std::vector<std::shared_ptr<const Lowered>> records;
  std::vector<std::string> skipped;  // "id: reason" of the records that could not be lowered
  // Step times another engine gave, shared by every fit of these records: (record, engine,
  // calibration) → step time. A cross-validation's folds all take their first engine ratios at
  // the estimate: each of those simulations runs once, not once per fold. An engine's step time
  // is a function of the graph and the calibration, so a fit's result does not depend on which
  // fit simulated first. The only part that changes; guarded by `simulated_mutex`.
  mutable std::mutex simulated_mutex;
  mutable std::map<std::tuple<const Lowered*, std::string, std::string>, std::shared_future<double>> simulated;
};

// The step time of a step record's graph as `engine` executes it with calibration `c`: simulated
// once per (record, engine, calibration) for all the fits of `records`.
double engine_step_s(const FitRecords& records, const Target& t, const Calibration& c, const StepEngine& engine) {
  std::promise<double> mine;
  std::shared_future<double> result;
  bool simulate = false;
  {
    const std::lock_guard<std::mutex> lock(records.simulated_mutex);
    auto [it, added] = records.simulated.try_emplace(std::make_tuple(t.l.get(), engine.name(), calibration_to_json(c).dump()));
    if (added) {
      it->second = mine.get_future().share();
      simulate = true;
    }
    result = it->second;
  }
  if (simulate) {
    try {
      mine.set_value(engine.step_s(t.l->graph, model_of(*t.l, c)));
    } catch (...) {
      mine.set_exception(std::current_exception());  // every fit that asks sees the failure
    }
  }
  return result.get();
}

std::shared_ptr<const FitRecords> prepare_fit_records(const RecordSet& records, const HardwareSpec& hw, const FitOptions& options) {
  return prepare_fit_records(records, std::vector<HardwareSpec>{hw}, options);
}

std::shared_ptr<const FitRecords> prepare_fit_records(const RecordSet& records, const std::vector<HardwareSpec>& hws,
                                                      const FitOptions& options) {
  OOM_ASSERT(!hws.empty(), "a fit needs at least one hardware");
  auto out = std::make_shared<FitRecords>();
  out->hws = hws;
  out->breakdown = options.breakdown_weight > 0;
  auto index_of = [&](const std::string& name) {
    for (std::size_t h = 0; h < hws.size(); ++h) {
      if (hws[h].name == name) return static_cast<int>(h);
    }
    return -1;
  };
  for (const auto& r : records.steps) {
    const int h = index_of(r.workload.hardware);
    if (!r.measured.step_s || h < 0) continue;
    try {
      Lowered l = step_target(r, out->breakdown);
      l.hw = h;
      out->records.push_back(std::make_shared<const Lowered>(std::move(l)));
    } catch (const std::exception& e) {
      out->skipped.push_back(fmt::format("{}: {}", r.id, e.what()));
    }
  }
  for (const auto& o : records.operators) {
    const int h = index_of(o.hardware);
    if (h < 0) continue;
    try {
      Lowered l = operator_target(o, hws[static_cast<std::size_t>(h)]);
      l.hw = h;
      out->records.push_back(std::make_shared<const Lowered>(std::move(l)));
    } catch (const std::exception& e) {
      out->skipped.push_back(fmt::format("{}: {}", o.id, e.what()));
    }
  }
  return out;
}

double robust_residual(double e, double scale) {
  if (scale <= 0) return e;
  const double u = e / scale;
  return std::copysign(scale * std::sqrt(2 * (std::sqrt(1 + u * u) - 1)), e);
}

CalibrationFit fit_calibration(const RecordSet& records, const HardwareSpec& hw, const FitOptions& options) {
  return fit_calibration(*prepare_fit_records(records, hw, options), options);
}

std::string hardware_names(const std::vector<HardwareSpec>& hws, std::string_view separator) {
  std::string out;
  for (const HardwareSpec& hw : hws) out += (out.empty() ? "" : std::string(separator)) + hw.name;
  return out;
}

CalibrationFit fit_calibration(const RecordSet& records, const std::vector<HardwareSpec>& hws, const FitOptions& options) {
  return fit_calibration(*prepare_fit_records(records, hws, options), options);
}

CalibrationFit fit_calibration(const FitRecords& prepared, const FitOptions& options) {
  OOM_ASSERT(prepared.breakdown == (options.breakdown_weight > 0), "records prepared for another breakdown weight");
  const std::vector<HardwareSpec>& hws = prepared.hws;
  const std::size_t nh = hws.size();
  CalibrationFit fit;
  const std::unique_ptr<StepEngine> engine =
      options.engine == "analytic" ? nullptr : options.engines.make(options.engine);
  if (options.engine != "analytic" && !engine) {
    throw InputError("", "--engine", "\"" + options.engine + "\"", "unknown engine");
  }
  fit.skipped = prepared.skipped;
  std::vector<Target> targets;
  for (const auto& l : prepared.records) {
    Target t;
    t.l = l;
    t.row = l->row;
    t.row.held_out = std::find(options.held_out_ids.begin(), options.held_out_ids.end(), t.row.id) != options.held_out_ids.end();
    if (t.row.kind == RecordKind::kStep) {
      if (const auto a = options.compute_anchors_s.find(t.row.id); a != options.compute_anchors_s.end() && a->second > 0) {
        t.compute_anchor_s = a->second;
      }
    }
    targets.push_back(std::move(t));
  }
  std::vector<Calibration> estimates;  // one per hardware
  for (const HardwareSpec& hw : hws) {
    Calibration c = default_calibration(hw);
    c.hardware = hw.name;
    if (options.attention_half_keys >= 0) c.attention_half_keys = options.attention_half_keys;
    c.operator_overhead_s = options.operator_overhead_s;
    estimates.push_back(c);
  }
  fit.calibration = estimates.front();
  fit.calibrations = estimates;
  const bool any_fitted = std::any_of(targets.begin(), targets.end(), [](const Target& t) { return !t.row.held_out; });
  if (!any_fitted) {
    throw InputError("", "--hardware", hardware_names(hws, ","), nh > 1 ? "no usable record names these hardware (nothing to fit)"
                                                     : "no usable record names this hardware (nothing to fit)");
  }

  // The fitted parameters: one per constant and domain (domain_of()), in the order of constants();
  // with one hardware, one per constant. A parameter is the log of its constant on the first
  // hardware of its domain; on the domain's other hardware the constant keeps its ratio to that
  // hardware's own estimate.
  const auto& k = constants();
  struct Param {
    int constant;               // index into constants()
    std::string domain;
    std::vector<std::size_t> hws;  // the hardware it prices, the first one's value the parameter's
    double max_estimate = 0;       // of an efficiency, the largest estimate over its hardware
  };
  std::vector<Param> params;
  for (int i = 0; i < static_cast<int>(k.size()); ++i) {
    const std::size_t first = params.size();
    for (std::size_t h = 0; h < nh; ++h) {
      const std::string d = domain_of(k[static_cast<std::size_t>(i)].field, hws[h]);
      auto it = std::find_if(params.begin() + static_cast<std::ptrdiff_t>(first), params.end(),
                             [&](const Param& q) { return q.domain == d; });
      if (it == params.end()) {
        params.push_back(Param{i, d, {}, 0});
        it = params.end() - 1;
      }
      it->hws.push_back(h);
      it->max_estimate = std::max(it->max_estimate, estimates[h].*(k[static_cast<std::size_t>(i)].field));
    }
  }
  const int p = static_cast<int>(params.size());
  auto param_name = [&](const Param& q) {
    const std::string name = k[static_cast<std::size_t>(q.constant)].name;
    return q.hws.size() == nh ? name : name + "[" + q.domain + "]";
  };
  // A constant whose estimate is 0 (a mechanism this hardware is not priced with) stays 0.
  std::vector<bool> active(static_cast<std::size_t>(p));
  Eigen::VectorXd theta0(p);  // log of each parameter's estimate
  // A device measured by its own probes (the CPU backend) runs one attention kernel, windowed or
  // not (backend/model/model.h's blocked attention): its windowed efficiency is its attention efficiency,
  // and its backward, which its traced breakdowns time apart, is fitted. On a GPU the flash
  // backward follows the forward at the published ratio (Calibration::attention_backward_efficiency):
  // a step record times the two together, and fitted apart the backward drifted with the fit's
  // starting point wherever no long-context record of the model was fitted (0.32 to 0.41 with
  // Qwen3.6 left out), taking that model's long-context predictions from +4 to +24 %.
  const bool one_attention_kernel = options.measured_device_range > 0;
  for (int j = 0; j < p; ++j) {
    const Param& q = params[static_cast<std::size_t>(j)];
    const auto field = k[static_cast<std::size_t>(q.constant)].field;
    const double e = estimates[q.hws.front()].*field;
    active[static_cast<std::size_t>(j)] = e > 0 && !(one_attention_kernel && field == &Calibration::windowed_attention_efficiency) &&
                                          !(!one_attention_kernel && field == &Calibration::attention_backward_efficiency);
    theta0[j] = e > 0 ? std::log(e) : 0.0;
  }
  auto to_calibrations = [&](const Eigen::VectorXd& theta) {
    std::vector<Calibration> out = estimates;
    for (int j = 0; j < p; ++j) {
      if (!active[static_cast<std::size_t>(j)]) continue;
      const Param& q = params[static_cast<std::size_t>(j)];
      const auto field = k[static_cast<std::size_t>(q.constant)].field;
      for (const std::size_t h : q.hws) {
        const double e = estimates[h].*field;
        if (h == q.hws.front()) out[h].*field = std::exp(theta[j]);
        else if (e > 0) out[h].*field = e * std::exp(theta[j] - theta0[j]);
      }
    }
    for (Calibration& c : out) {
      // FP32 accumulation of BF16 partials follows the fitted CPU rate (no record isolates it).
      c.host_accumulate_params_per_s = accumulate_rate_of(c.cpu_adamw_params_per_s);
      if (one_attention_kernel) c.windowed_attention_efficiency = c.attention_efficiency;
      else c.attention_backward_efficiency = kFlashBackwardRatio * c.attention_efficiency;  // no record separates them
    }
    return out;
  };
  auto clamp = [&](Eigen::VectorXd& theta) {
    for (int j = 0; j < p; ++j) {
      const Param& q = params[static_cast<std::size_t>(j)];
      const Constant& ci = k[static_cast<std::size_t>(q.constant)];
      if (!active[static_cast<std::size_t>(j)]) {
        theta[j] = theta0[j];
        continue;
      }
      const double down = options.measured_device_range > 0 ? options.measured_device_range : ci.down_factor;
      const double up = options.measured_device_range > 0 ? options.measured_device_range : ci.up_factor;
      theta[j] = std::clamp(theta[j], theta0[j] - std::log(down), theta0[j] + std::log(up));
      // An efficiency stays ≤ 1 on every hardware of its domain (0 in log: one hardware).
      if (ci.efficiency) theta[j] = std::min(theta[j], q.hws.size() == 1 ? 0.0 : theta0[j] - std::log(q.max_estimate));
    }
  };
  // Which constants price each record's stages: each moved by a factor e^0.5 from its estimate; a
  // record none of whose stage costs move does not depend on it (the duration model's terms are
  // structural: a constant prices stages of a kind, phase or shape, whatever its value).
  auto costs_of = [&](const Lowered& t, const Calibration& c) {
    const CalibratedDurationModel model = model_of(t, c);
    std::vector<StageCost> out;
    if (t.row.kind == RecordKind::kOperator) {
      for (const StageId id : t.op_stages) out.push_back(isolated_operator_cost(model, t.graph.stage(id), t.graph, c));
    } else {
      for (const Stage& st : t.priced) out.push_back(model.cost(st, t.graph));
    }
    return out;
  };
  for (auto& t : targets) {
    const std::vector<StageCost> base = costs_of(*t.l, to_calibrations(theta0)[static_cast<std::size_t>(t.l->hw)]);
    t.priced_by.assign(static_cast<std::size_t>(p), false);
    for (int j = 0; j < p; ++j) {
      Eigen::VectorXd moved = theta0;
      moved[j] += 0.5;
      const std::vector<StageCost> c = costs_of(*t.l, to_calibrations(moved)[static_cast<std::size_t>(t.l->hw)]);
      for (std::size_t i = 0; i < c.size(); ++i) {
        if (c[i].fixed_s != base[i].fixed_s || c[i].work != base[i].work || c[i].rate != base[i].rate ||
            c[i].exclusive_rate != base[i].exclusive_rate) {
          t.priced_by[static_cast<std::size_t>(j)] = true;
          break;
        }
      }
    }
  }
  std::vector<const Target*> fitted;
  for (const auto& t : targets) {
    if (!t.row.held_out) fitted.push_back(&t);
  }
  const int n = static_cast<int>(fitted.size());
  std::vector<int> anchor_row(fitted.size(), -1);  // residual row of each fitted target's anchor
  std::vector<int> share_row(fitted.size(), -1);   // first residual row of its breakdown's shares
  int rows = n;
  for (std::size_t i = 0; i < fitted.size(); ++i) {
    if (fitted[i]->compute_anchor_s) anchor_row[i] = rows++;
    if (!fitted[i]->l->shares.empty()) {
      share_row[i] = rows;
      rows += static_cast<int>(fitted[i]->l->shares.size());
    }
  }
  // The residuals at `theta`; with `column` ≥ 0, `theta` differs from the point of residuals
  // `base` in that constant only, and the records it prices none of keep their `base` residuals
  // (the others resume Eq. 3 from their base). `record`: `theta` is the Jacobian's base point.
  // `settled`: settle host sharing exactly at `theta` and return each fitted target's stretch there.
  using Stretch = std::vector<std::pair<std::int32_t, double>>;
  // A step record whose host stages share the socket, DRAM or PCIe uplinks: settled, not just Eq. 3.
  auto shares_host = [](const Target& t) { return t.row.kind == RecordKind::kStep && t.l->sharing && !t.l->sharing->empty(); };
  auto residuals = [&](const Eigen::VectorXd& theta, int column = -1, const Eigen::VectorXd* base = nullptr,
                       bool record = false, std::vector<Stretch>* settled = nullptr) {
    const std::vector<Calibration> cals = to_calibrations(theta);
    Eigen::VectorXd r(rows + p);
    for (int i = 0; i < n; ++i) {
      const Target& t = *fitted[static_cast<std::size_t>(i)];
      const int a = anchor_row[static_cast<std::size_t>(i)];
      const int sh = share_row[static_cast<std::size_t>(i)];
      const int shares = static_cast<int>(t.l->shares.size());
      if (column >= 0 && !t.priced_by[static_cast<std::size_t>(column)]) {
        r[i] = (*base)[i];
        if (a >= 0) r[a] = (*base)[a];
        for (int k = 0; k < shares; ++k) r[sh + k] = (*base)[sh + k];
        continue;
      }
      const double w = t.row.kind == RecordKind::kOperator ? options.operator_weight : 1.0;
      const Eq3Base eq3 = column >= 0 ? Eq3Base::kResume : record ? Eq3Base::kRecord : Eq3Base::kNone;
      const Prediction pr = predict_detail(t, cals[static_cast<std::size_t>(t.l->hw)], t.compute_anchor_s.has_value(),
                                           settled != nullptr && shares_host(t) ? &(*settled)[static_cast<std::size_t>(i)] : nullptr, eq3);
      r[i] = w * robust_residual(std::log(pr.time_s / t.row.measured_s), options.robust_scale);
      if (a >= 0) r[a] = options.anchor_weight * std::log(pr.compute_busy_s / *t.compute_anchor_s);
      // A record's shares weigh together as much as its step: breakdown_weight / √(its shares).
      const double ws = shares > 0 ? options.breakdown_weight / std::sqrt(static_cast<double>(shares)) : 0;
      for (int k = 0; k < shares; ++k) {
        const double predicted = std::max(pr.shares[static_cast<std::size_t>(k)], 1e-9);
        r[sh + k] = ws * std::log(predicted / t.l->shares[static_cast<std::size_t>(k)].measured);
      }
    }
    for (int i = 0; i < p; ++i) r[rows + i] = options.prior_weight * (theta[i] - theta0[i]);
    return r;
  };

  // Host sharing settled exactly at `theta` (`stretches`: what residuals() returned there)
  // and held (Target::stretch) until the next accepted step; `theta` becomes the Jacobian's base.
  std::vector<Stretch> at_start(fitted.size()), candidate(fitted.size());
  auto hold_at = [&](const Eigen::VectorXd& theta, std::vector<Stretch>& stretches) {
    for (std::size_t i = 0; i < fitted.size(); ++i) {
      auto& target = const_cast<Target&>(*fitted[i]);
      target.stretch.swap(stretches[i]);
      target.stretched = shares_host(target);
    }
    return residuals(theta, -1, nullptr, true);
  };

  // Levenberg–Marquardt with a forward-difference Jacobian in log space, from several
  // deterministic starting points (the max-plus model has kinks and local minima); the best wins.
  // A run ends converged (`done`) or after `max_iterations`.
  struct Run {
    double cost;
    Eigen::VectorXd theta;
    bool done;
  };
  auto levenberg_marquardt = [&](Eigen::VectorXd theta, int& iterations, int max_iterations) {
    clamp(theta);
    residuals(theta, -1, nullptr, false, &at_start);
    Eigen::VectorXd r = hold_at(theta, at_start);
    double cost = r.squaredNorm();
    double lambda = 1e-2;
    const double h = 1e-2;  // wide enough to step over the kinks of the max-plus model
    int it = 0;
    bool done = false;
    for (; it < max_iterations; ++it) {
      // Columns are independent (a column only reads the base it resumes from): computed on a few threads.
      Eigen::MatrixXd J(rows + p, p);
      auto columns = [&](int first, int stride) {
        for (int j = first; j < p; j += stride) {
          Eigen::VectorXd t = theta;
          t[j] += h;
          J.col(j) = (residuals(t, j, &r) - r) / h;
        }
      };
      const int threads = options.threads > 0 ? options.threads
                                              : static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 4u));
      std::vector<std::thread> workers;
      for (int w = 1; w < threads; ++w) workers.emplace_back(columns, w, threads);
      columns(0, threads);
      for (auto& w : workers) w.join();
      const Eigen::MatrixXd A = J.transpose() * J;
      const Eigen::VectorXd g = J.transpose() * r;
      bool improved = false;
      bool converged = false;
      for (int attempt = 0; attempt < 12 && !improved; ++attempt) {
        Eigen::MatrixXd M = A;
        for (int j = 0; j < p; ++j) M(j, j) += lambda * std::max(A(j, j), 1e-9);
        Eigen::VectorXd next = theta - M.ldlt().solve(g);
        clamp(next);
        // A step is taken on the cost with host sharing settled at the step's end, not with the
        // stretch held from the base: held, a step that only moves the overlaps looks like progress,
        // and the fit circles instead of converging (the cost settled afresh rises again).
        const double cn = residuals(next, -1, nullptr, false, &candidate).squaredNorm();
        if (cn < cost) {
          improved = true;
          // Converged when the cost stops falling or the constants stop moving.
          converged = cost - cn < 1e-6 * cost || (next - theta).lpNorm<Eigen::Infinity>() < 1e-4;
          theta = next;
          r = hold_at(theta, candidate);
          cost = r.squaredNorm();
          lambda = std::max(lambda / 3, 1e-7);
        } else {
          lambda *= 4;
        }
      }
      if (!improved || converged) {
        done = true;
        break;
      }
    }
    iterations += it;
    return Run{cost, theta, done};
  };
  auto settle_exactly = [&] {
    for (auto& t : targets) t.stretched = false;
  };
  int it = 0;
  std::uint64_t seed = 0x9e3779b97f4a7c15ULL;
  auto uniform = [&seed] {  // deterministic LCG in [−1, 1)
    seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<double>(seed >> 11) / static_cast<double>(1ULL << 53) * 2.0 - 1.0;
  };
  // Starting points: the estimate, then deterministic perturbations of it within ×3.
  std::vector<Eigen::VectorXd> starts{theta0};
  for (int start = 1; start < options.starts; ++start) {
    Eigen::VectorXd t0 = theta0;
    for (int i = 0; i < p; ++i) {
      if (active[static_cast<std::size_t>(i)]) t0[i] += std::log(3.0) * uniform();
    }
    starts.push_back(t0);
  }
  const bool screened = options.screen_iterations > 0 && options.finalists < static_cast<int>(starts.size());
  const int screening = std::min(options.screen_iterations, options.max_iterations);
  // Every start, screened; the lowest cost wins (ties: the earlier start).
  auto from_every_start = [&] {
    std::vector<Run> runs;
    for (const Eigen::VectorXd& t0 : starts) runs.push_back(levenberg_marquardt(t0, it, screened ? screening : options.max_iterations));
    if (screened) {
      // The finalists (lowest cost after screening; ties keep the earlier start) run on from where
      // screening left them; the others stop.
      std::vector<std::size_t> order(runs.size());
      for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
      std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return runs[a].cost < runs[b].cost; });
      for (int f = 0; f < options.finalists; ++f) {
        Run& r = runs[order[static_cast<std::size_t>(f)]];
        if (!r.done) r = levenberg_marquardt(r.theta, it, options.max_iterations - screening);
      }
    }
    return *std::min_element(runs.begin(), runs.end(), [](const Run& a, const Run& b) { return a.cost < b.cost; });
  };
  // Another engine than the analytic one: refresh each step record's engine/analytic ratio at
  // the fitted constants and refit from there (the ratio varies slowly with the constants, the
  // analytic model carries the gradient). Returns the largest relative change of a ratio.
  // Held-out records take no part: what the fit does must not depend on them (`held_out`: refresh
  // those instead, for their rows).
  auto refresh_engine_factors = [&](const std::vector<Calibration>& cals, bool held_out) {
    settle_exactly();
    double moved = 0;
    for (auto& t : targets) {
      if (t.row.kind != RecordKind::kStep || t.row.held_out != held_out) continue;
      const Calibration& c = cals[static_cast<std::size_t>(t.l->hw)];
      const double before = t.engine_factor;
      t.engine_factor = 1;
      const double analytic_s = predict(t, c);
      t.engine_factor = analytic_s > 0 ? engine_step_s(prepared, t, c, *engine) / analytic_s : 1.0;
      moved = std::max(moved, std::abs(t.engine_factor / before - 1));
    }
    return moved;
  };
  // Another engine: the ratios are first taken at the estimate, so that every fit, the first from
  // every start included, is to the engine's step times (the basin, FitOptions::starts has several,
  // is chosen on them, not on the analytic ones': on the H100 records, out-of-sample errors through
  // SimGrid fell from 5.9 / 12.8 % to 5.4 / 11.5 % median, record / model left out, when the basin
  // was first chosen on them: traces/paper/README.md). A fit from every start on the analytic step
  // times alone, to take the first ratios at its constants, costs as much again; on the H100
  // records it ends in the same basin (no fitted constant 5 % apart).
  // Refresh, refit, `engine_passes` times, then a last refresh at the final constants; the passes
  // end early once a refresh leaves the ratios where the refit before found them.
  // The first refit runs from every start; later refits run on from where the one before ended.
  // A refit that leaves every constant where it was would find the same ratios at the next
  // refresh: the passes end there without simulating again (the result is the same bit for bit).
  Eigen::VectorXd theta = theta0;
  bool converged = false;  // the run the constants come from ended converged
  auto take = [&](const Run& run) {
    theta = run.theta;
    converged = run.done;
  };
  if (engine) clamp(theta);
  else take(from_every_start());
  for (int pass = 0; engine; ++pass) {
    // Past the last refit, a refresh only re-prices the fitted rows.
    if (pass > 0 && pass >= options.engine_passes && !options.engine_fitted_rows) break;
    const double moved = refresh_engine_factors(to_calibrations(theta), false);
    // The first refresh, at the estimate, is always followed by a fit.
    if (pass > 0 && (pass >= options.engine_passes || moved <= options.engine_ratio_tolerance)) break;
    const Eigen::VectorXd refreshed_at = theta;
    take(pass == 0 ? from_every_start() : levenberg_marquardt(theta, it, options.max_iterations));
    if (theta == refreshed_at) break;
  }
  // The last refresh was at `theta`: the held-out records' ratios there too.
  if (engine && options.engine_held_out_rows) refresh_engine_factors(to_calibrations(theta), true);
  settle_exactly();
  fit.iterations = it;
  fit.converged = converged;
  fit.calibrations = to_calibrations(theta);
  for (int j = 0; j < p; ++j) {
    if (std::abs(theta[j] - theta0[j]) > 1e-3) fit.fitted.push_back(param_name(params[static_cast<std::size_t>(j)]));
  }
  std::string fitted_ids, held_ids, anchored;
  int broken_down = 0;
  for (auto& t : targets) {
    if (t.compute_anchor_s && !t.row.held_out) anchored += (anchored.empty() ? "" : ", ") + t.row.id;
    if (!t.l->shares.empty() && !t.row.held_out) ++broken_down;
    const Prediction pr = predict_detail(t, fit.calibrations[static_cast<std::size_t>(t.l->hw)], true);
    t.row.predicted_s = pr.time_s;
    t.row.predicted_compute_s = pr.compute_busy_s;
    t.row.compute_anchor_s = t.compute_anchor_s;
    fit.rows.push_back(t.row);
    (t.row.held_out ? held_ids : fitted_ids) += (t.row.held_out ? held_ids : fitted_ids).empty() ? t.row.id : ", " + t.row.id;
  }
  std::string together;
  if (nh > 1) {
    together = "; fitted together with " + hardware_names(hws) +
               " (GPU constants per architecture, collectives per fabric kind, link and CPU rates as one fraction of each datasheet's)";
  }
  for (Calibration& c : fit.calibrations) {
    c.fitted_from = fmt::format(
        "least squares ({} engine{}) over {}; held out: {}{}{}{}", options.engine,
        options.robust_scale > 0 ? fmt::format(", soft-L1 at {:g}", options.robust_scale) : "", fitted_ids, held_ids.empty() ? "none" : held_ids,
        anchored.empty() ? "" : "; published compute times of " + anchored,
        broken_down == 0 ? "" : fmt::format("; measured compute breakdowns of the {} fitted step records that have one", broken_down),
        together);
  }
  fit.calibration = fit.calibrations.front();
  return fit;
}

nlohmann::json calibration_fit_to_json(const CalibrationFit& fit) {
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& r : fit.rows) {
    nlohmann::json row = {{"id", r.id}, {"kind", std::string(record_kind_name(r.kind))}, {"held_out", r.held_out}, {"measured_s", r.measured_s},
                          {"predicted_s", r.predicted_s}, {"rel_error", r.rel_error()}};
    if (r.compute_anchor_s) {
      row["compute_anchor_s"] = *r.compute_anchor_s;
      row["predicted_compute_s"] = r.predicted_compute_s;
    }
    rows.push_back(std::move(row));
  }
  return {{"calibration", calibration_to_json(fit.calibration)}, {"fitted", fit.fitted}, {"iterations", fit.iterations},
          {"converged", fit.converged}, {"records", rows}, {"skipped", fit.skipped}};
}

std::string calibration_fit_text(const CalibrationFit& fit) {
  std::string out = fmt::format("Calibration of {} ({} iterations, {}); fitted: {}\n", fit.calibration.hardware, fit.iterations,
                                fit.converged ? "converged" : "stopped at the iteration limit", fmt::join(fit.fitted, ", "));
  const nlohmann::json c = calibration_to_json(fit.calibration);
  for (const auto& [key, value] : c.items()) {
    if (value.is_number()) out += fmt::format("  {:<30} {:.6g}\n", key, value.get<double>());
  }
  out += fmt::format("{:<22} {:<9} {:>9} {:>12} {:>12} {:>8}\n", "record", "kind", "role", "measured_s", "predicted_s", "error");
  for (const auto& r : fit.rows) {
    out += fmt::format("{:<22} {:<9} {:>9} {:>12.4f} {:>12.4f} {:>+7.1f}%\n", r.id, record_kind_name(r.kind), r.held_out ? "held out" : "fit",
                       r.measured_s, r.predicted_s, 100 * r.rel_error());
  }
  for (const auto& r : fit.rows) {
    if (!r.compute_anchor_s) continue;
    out += fmt::format("{:<22} compute busy (published {:.3f} s) predicted {:.3f} s {:>+7.1f}%{}\n", r.id, *r.compute_anchor_s,
                       r.predicted_compute_s, 100 * (r.predicted_compute_s / *r.compute_anchor_s - 1),
                       r.held_out ? " (held out)" : "");
  }
  for (const auto& s : fit.skipped) out += "skipped " + s + "\n";
  return out;
}

}  // namespace oom
