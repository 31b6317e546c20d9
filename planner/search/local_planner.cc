#include "planner/search/local_planner.h"

#include <algorithm>
#include <array>

#include <fmt/format.h>

#include "costmodel/host_placement.h"
#include "costmodel/input_error.h"
#include "costmodel/token_text.h"
#include "planner/engine/analytic_evaluator.h"
#include "planner/lowering/memory_report.h"
#include "planner/search/mixing_levels.h"

namespace oom {

namespace {

bool dominates(const BoundaryLabel& a, const BoundaryLabel& b) {
  return a.time_s <= b.time_s && (a.host_slack || a.host_bytes <= b.host_bytes) &&
         (a.gpu_slack || (a.gpu_peak_bytes <= b.gpu_peak_bytes && a.gpu_held_bytes <= b.gpu_held_bytes));
}

}  // namespace

bool ParetoSet::insert(const BoundaryLabel& l) {
  for (const BoundaryLabel& o : labels_) {
    if (dominates(o, l)) return false;
  }
  std::erase_if(labels_, [&](const BoundaryLabel& o) { return dominates(l, o); });
  labels_.push_back(l);
  return true;
}

void ParetoSet::keep_fastest(std::size_t n) {
  if (labels_.size() <= n) return;
  std::nth_element(labels_.begin(), labels_.begin() + static_cast<std::ptrdiff_t>(n), labels_.end(),
                   [](const BoundaryLabel& a, const BoundaryLabel& b) { return a.time_s < b.time_s; });
  labels_.resize(n);
}

std::vector<BoundaryLabel> boundary_dp(const LayerTable& t, const BoundaryDpOptions& o) {
  const int L = static_cast<int>(t.replay_s.size());
  OOM_ASSERT(L <= kMaxBoundaryDpDecoders, "plan_local refuses deeper models before the DP");
  OOM_ASSERT(static_cast<int>(t.backward_live_bytes.size()) == L, "one live footprint per decoder");
  const int cap = std::max(1, o.regenerate_cap);
  const int max_run = std::max(0, o.max_regenerate_run);
  const Bytes B = t.boundary_bytes;
  // prefix[i] = replay_s[0] + ... + replay_s[i−1]
  std::vector<Seconds> prefix(static_cast<std::size_t>(L) + 1, 0.0);
  for (int l = 0; l < L; ++l) prefix[static_cast<std::size_t>(l) + 1] = prefix[static_cast<std::size_t>(l)] + t.replay_s[static_cast<std::size_t>(l)];
  // Regenerating decoders j+1..j+n from kept boundary j, in reverse, `cap` held at a time: each
  // pass runs the no-grad forwards j..top−1 and keeps the last `cap` boundaries it produces.
  auto run_cost = [&](int j, int n) {
    Seconds total = 0;
    for (int top = j + n; top > j; top -= cap) total += prefix[static_cast<std::size_t>(top)] - prefix[static_cast<std::size_t>(j)];
    return total;
  };
  // suffix_live[l] = the largest backward footprint of decoders l..L−1.
  std::vector<Bytes> suffix_live(static_cast<std::size_t>(L) + 1, 0);
  for (int l = L - 1; l >= 0; --l) {
    suffix_live[static_cast<std::size_t>(l)] = std::max(suffix_live[static_cast<std::size_t>(l) + 1], t.backward_live_bytes[static_cast<std::size_t>(l)]);
  }
  // Checks the limits of a label after decoder l and marks the resources that can no longer bind:
  // even with every later boundary on the host (held on the GPU) the label stays within them.
  auto within = [&](BoundaryLabel& a, int l) {
    if (o.gpu_limit_bytes > 0 && a.gpu_peak_bytes > o.gpu_limit_bytes) return false;
    if (o.host_limit_bytes > 0 && a.host_bytes > o.host_limit_bytes) return false;
    const Bytes later = static_cast<Bytes>(L - 1 - l) * B;
    a.host_slack = o.host_limit_bytes > 0 && a.host_bytes + later <= o.host_limit_bytes;
    a.gpu_slack = o.gpu_limit_bytes > 0 &&
                  std::max(a.gpu_peak_bytes, suffix_live[static_cast<std::size_t>(l) + 1] + a.gpu_held_bytes + later + cap * B) <=
                      o.gpu_limit_bytes;
    return true;
  };
  // cur[n]: labels whose last n decoders are regenerated (an open run).
  std::vector<ParetoSet> cur(static_cast<std::size_t>(max_run) + 1), next(cur.size());
  BoundaryLabel start;
  start.time_s = t.base_step_s;
  start.host_bytes = t.host_fixed_bytes;
  start.gpu_peak_bytes = t.floor_bytes;
  cur[0].insert(start);
  for (int l = 0; l < L; ++l) {
    for (auto& s : next) s.clear();
    const Bytes live = t.backward_live_bytes[static_cast<std::size_t>(l)];
    for (int n = 0; n <= max_run; ++n) {
      for (const BoundaryLabel& a : cur[static_cast<std::size_t>(n)].labels()) {
        const Seconds closed = n > 0 ? a.time_s + run_cost(l - n - 1, n) : a.time_s;
        BoundaryLabel host = a;  // kept on the host: saved in forward, loaded for backward
        host.time_s = closed;
        host.host_bytes += B;
        host.gpu_peak_bytes = std::max(a.gpu_peak_bytes, live + a.gpu_held_bytes);
        host.host_kept.set(static_cast<std::size_t>(l));
        if (within(host, l)) next[0].insert(host);
        BoundaryLabel gpu = a;  // held on the GPU from its forward to its backward
        gpu.time_s = closed;
        gpu.gpu_held_bytes += B;
        gpu.gpu_peak_bytes = std::max(a.gpu_peak_bytes, live + gpu.gpu_held_bytes);
        gpu.gpu_held.set(static_cast<std::size_t>(l));
        if (within(gpu, l)) next[0].insert(gpu);
        if (l > 0 && n < max_run) {  // regenerated: up to `cap` regenerated boundaries in flight
          BoundaryLabel regen = a;
          regen.gpu_peak_bytes = std::max(a.gpu_peak_bytes, live + a.gpu_held_bytes + cap * B);
          if (within(regen, l)) next[static_cast<std::size_t>(n) + 1].insert(regen);
        }
      }
    }
    if (o.max_labels_per_state > 0) {
      for (auto& set : next) set.keep_fastest(static_cast<std::size_t>(o.max_labels_per_state));
    }
    std::swap(cur, next);
  }
  ParetoSet done;
  for (int n = 0; n <= max_run; ++n) {
    for (BoundaryLabel a : cur[static_cast<std::size_t>(n)].labels()) {
      if (n > 0) a.time_s += run_cost(L - 1 - n, n);
      done.insert(a);
    }
  }
  return done.labels();
}

namespace {

bool has_attention(const ModelSpec& m) { return m.count(LayerKind::kFullAttention) + m.count(LayerKind::kSlidingAttention) > 0; }

// The operator splits of a plan's notes: only the partitioned dimensions, or "no operator splits".
std::string split_text(const SplitSpec& s) {
  std::vector<std::string> parts;
  if (s.attention_head_group > 0) parts.push_back(fmt::format("head group {}", s.attention_head_group));
  if (s.gdn_chunk_tokens > 0) parts.push_back("GDN chunk " + tokens_text(s.gdn_chunk_tokens));
  if (s.sub_batch_seqs > 0) parts.push_back(fmt::format("sub-batch {}", s.sub_batch_seqs));
  if (s.moe_chunk_tokens > 0) parts.push_back("MoE chunk " + tokens_text(s.moe_chunk_tokens));
  return parts.empty() ? std::string("no operator splits") : fmt::format("{}", fmt::join(parts, ", "));
}

Plan local_plan(const SplitSpec& split, bool keep) {
  Plan p;
  p.path = ExpertPath::kLocal;
  p.param_transfer = ParamTransfer::kShard;
  p.cpu_grad_slots = 1;
  p.split = split;
  p.keep_attention_results = keep;
  return p;
}

}  // namespace

LayerTable local_layer_table(const PlanPricer& pricer, const SplitSpec& split, bool keep) {
  const WorkloadContext& ctx = pricer.context();
  const ModelSpec& m = ctx.model;
  const int L = m.layers;
  const int u = repeating_unit_layers(m);
  const Plan plan = pricer.with_flat(local_plan(split, keep));
  LayerTable t;
  t.boundary_bytes = boundary_bytes(1, ctx.workload.seqs_per_gpu(), ctx.workload.seq_len, m.hidden);
  if (keep) {
    for (int l = 0; l < L; ++l) {
      const LayerKind k = m.layer_kinds[static_cast<std::size_t>(l)];
      if (k != LayerKind::kLinearAttention) t.host_fixed_bytes += attention_result_bytes(m.attention(k), ctx.workload.seqs_per_gpu(), ctx.workload.seq_len);
    }
  }
  // One repeating unit, read stage by stage.
  const int unit_layers = std::min(u, L);
  const StepGraph g = pricer.lower_plan(plan, unit_layers);
  std::vector<Seconds> d;
  const StageTimes times = analytic_step_times(g, pricer.durations(), &d);
  const MemoryPeaks mem = memory_peaks(g, times, /*keep_samples=*/true);
  const std::vector<MemorySample>& samples = mem.timelines.at(0).samples;
  std::vector<Seconds> replay(static_cast<std::size_t>(unit_layers), 0.0);
  std::vector<Seconds> from(static_cast<std::size_t>(unit_layers), 1e300), to(static_cast<std::size_t>(unit_layers), 0.0);
  for (const Stage& s : g.stages) {
    if (s.gpu != 0 || s.layer < 0 || s.layer >= unit_layers) continue;
    const auto i = static_cast<std::size_t>(s.id);
    const auto l = static_cast<std::size_t>(s.layer);
    const bool compute = g.resource(s.resource).kind == ResourceKind::kGpuCompute;
    // The no-grad forward a regeneration repeats is the replay half of the decoder's backward
    // (a partitioned attention's per-group re-forward belongs to its backward, not to the replay).
    if (compute && s.phase == Phase::kRecompute && s.key.op != StageOp::kCoreRefwd) replay[l] += d[i];
    if (s.phase == Phase::kRecompute || s.phase == Phase::kBackward) {
      from[l] = std::min(from[l], times.start_s[i]);
      to[l] = std::max(to[l], times.finish_s[i]);
    }
  }
  std::vector<Bytes> live(static_cast<std::size_t>(unit_layers), 0);
  for (int l = 0; l < unit_layers; ++l) {
    const auto li = static_cast<std::size_t>(l);
    Bytes held = g.gpu_base_bytes.at(0), best = 0;
    for (const MemorySample& smp : samples) {
      if (smp.time_s > to[li]) break;
      if (smp.time_s <= from[li]) {
        held = smp.bytes;
        best = held;
      } else {
        best = std::max(best, smp.bytes);
      }
    }
    live[li] = std::max(best, held);
  }
  for (const MemorySample& smp : samples) t.floor_bytes = std::max(t.floor_bytes, smp.bytes);
  for (int l = 0; l < L; ++l) {
    t.replay_s.push_back(replay[static_cast<std::size_t>(l % unit_layers)]);
    t.backward_live_bytes.push_back(live[static_cast<std::size_t>(l % unit_layers)]);
  }
  // Fixed and per-unit cost from one and two units, extrapolated to full depth (reference §5).
  if (2 * u >= L) {
    t.base_step_s = pricer.price(plan, 0).step_s;
  } else {
    const Seconds one = times.step_s;
    const Seconds two = pricer.price(plan, 2 * u).step_s;
    t.base_step_s = one + (static_cast<double>(L) / u - 1.0) * (two - one);
  }
  return t;
}

namespace {

// Partition levels per dimension, coarsest (0 = unpartitioned) first.
struct Menu {
  std::vector<std::vector<std::int64_t>> levels;  // head group, GDN chunk, sub-batch, MoE chunk
  SplitSpec split(const std::array<int, 4>& at) const {
    SplitSpec s;
    s.attention_head_group = static_cast<int>(levels[0][static_cast<std::size_t>(at[0])]);
    s.gdn_chunk_tokens = levels[1][static_cast<std::size_t>(at[1])];
    s.sub_batch_seqs = levels[2][static_cast<std::size_t>(at[2])];
    s.moe_chunk_tokens = levels[3][static_cast<std::size_t>(at[3])];
    return s;
  }
};

Menu partition_menu(const WorkloadContext& ctx, const LocalPlannerOptions& o) {
  const ModelSpec& m = ctx.model;
  const std::int64_t S = ctx.workload.seq_len, seqs = ctx.workload.seqs_per_gpu(), N = seqs * S;
  Menu menu;
  menu.levels.assign(4, {0});
  for (int g : attention_head_group_levels(m)) menu.levels[0].push_back(g);
  for (std::int64_t x : gdn_piece_levels(ctx, o.gdn_chunks_tokens)) menu.levels[1].push_back(x);
  for (std::int64_t d = seqs / 2; d >= 1; --d) {
    if (seqs % d == 0) menu.levels[2].push_back(d);
  }
  std::vector<std::int64_t> c = o.moe_chunks_tokens;
  std::sort(c.rbegin(), c.rend());
  for (std::int64_t x : c) {
    if (x < N) menu.levels[3].push_back(x);
  }
  return menu;
}

struct Finalist {
  BoundaryLabel label;
  SplitSpec split;
  bool keep = false;
  int cap = 1;
  bool coarsest = false;  // its menu entry fits with no coarser neighbour that fits
};

// Partitioned dimensions of a split: among plans the model prices alike, the one that splits fewer
// operators is the one to run (fewer kernel calls and hand-offs than the model resolves).
int split_dimensions(const SplitSpec& s) {
  return (s.attention_head_group > 0) + (s.gdn_chunk_tokens > 0) + (s.moe_chunk_tokens > 0) + (s.sub_batch_seqs > 0);
}

Plan finalist_plan(const Finalist& f, int layers) {
  Plan p = local_plan(f.split, f.keep);
  int host = 0, gpu = 0;
  for (int l = 0; l < layers; ++l) {
    if (f.label.host_kept.test(static_cast<std::size_t>(l))) {
      p.boundaries.host_kept.push_back(l);
      ++host;
    } else if (f.label.gpu_held.test(static_cast<std::size_t>(l))) {
      p.boundaries.gpu_held.push_back(l);
      ++gpu;
    }
  }
  p.boundaries.host_kept_all = host == layers;
  if (p.boundaries.host_kept_all) p.boundaries.host_kept.clear();
  p.boundaries.regenerate_cap = host + gpu == layers ? 1 : f.cap;
  p.notes = fmt::format("{}; O/LSE {}; boundaries {} host, {} GPU, {} regenerated (cap {})", split_text(f.split),
                        f.keep ? "kept" : "recomputed", host, gpu, layers - host - gpu, p.boundaries.regenerate_cap);
  return p;
}

}  // namespace

LocalSearchResult plan_local(const PlanPricer& pricer, const LocalPlannerOptions& o) {
  const WorkloadContext& ctx = pricer.context();
  const ModelSpec& m = ctx.model;
  const int L = m.layers;
  check_local_applies(ctx);
  if (L > kMaxBoundaryDpDecoders) {
    throw InputError(m.name, "num_hidden_layers", std::to_string(L),
                     fmt::format("the Local planner's boundary search plans up to {} decoders; plan the ep path "
                                 "(oom plan --path ep) or write the Local plan by hand",
                                 kMaxBoundaryDpDecoders));
  }
  const Budgets budgets = workload_budgets(ctx);
  const double eps = pricer.constants().gpu_headroom_fraction;
  LocalSearchResult out;

  // Host room per rank for boundaries and O/LSE: each NUMA node's budget less what its ranks need
  // with every boundary regenerated and O/LSE recomputed (model state, pinned pools, process).
  Plan bare = local_plan({}, false);
  bare.boundaries.host_kept_all = false;
  bare = pricer.with_flat(std::move(bare));
  const MemoryReport bare_memory = static_memory(ctx, bare, pricer.constants());
  const std::vector<int> ranks_on = ctx.hardware.ranks_per_numa(ctx.workload.gpus);
  // A socket's overflow spills into its node's other sockets (costmodel/host_placement.h): the
  // room is each node's, shared by the ranks on it.
  Bytes host_room = -1;
  std::vector<Bytes> demand, budget, ranks;
  for (const HostNumaReport& h : bare_memory.host) {
    demand.push_back(h.total());
    budget.push_back(budgets.numa_bytes.at(static_cast<std::size_t>(h.numa)));
    ranks.push_back(h.ranks);
  }
  const int per_node = std::max(1, budgets.numa_per_node);
  const auto needed = per_node_sums(demand, per_node), have = per_node_sums(budget, per_node), on = per_node_sums(ranks, per_node);
  for (std::size_t node = 0; node < needed.size(); ++node) {
    if (on[node] == 0) continue;
    if (needed[node] > have[node]) {
      out.shortfall = BudgetShortfall{budgets.node_name(node), have[node], needed[node],
                                      "the Local path's canonical state and pinned pools with every boundary regenerated"};
      return out;
    }
    const Bytes room = (have[node] - needed[node]) / on[node];
    host_room = host_room < 0 ? room : std::min(host_room, room);
  }

  // The menu and its all-host static GPU peaks.
  const Menu menu = partition_menu(ctx, o);
  std::array<int, 4> size{};
  for (int d = 0; d < 4; ++d) size[static_cast<std::size_t>(d)] = static_cast<int>(menu.levels[static_cast<std::size_t>(d)].size());
  out.menu = size[0] * size[1] * size[2] * size[3];
  auto index = [&](const std::array<int, 4>& a) { return ((a[0] * size[1] + a[1]) * size[2] + a[2]) * size[3] + a[3]; };
  std::vector<char> fits(static_cast<std::size_t>(out.menu), 0);
  std::vector<std::array<int, 4>> all;
  Bytes finest_peak = 0;
  std::string finest_where;
  for (int a = 0; a < size[0]; ++a)
    for (int b = 0; b < size[1]; ++b)
      for (int c = 0; c < size[2]; ++c)
        for (int e = 0; e < size[3]; ++e) {
          const std::array<int, 4> at{a, b, c, e};
          all.push_back(at);
          const MemoryReport r = static_memory(ctx, pricer.with_flat(local_plan(menu.split(at), false)), pricer.constants());
          fits[static_cast<std::size_t>(index(at))] = r.gpu.eq2.total() <= budgets.gpu_bytes;
          if (a == size[0] - 1 && b == size[1] - 1 && c == size[2] - 1 && e == size[3] - 1) {
            finest_peak = r.gpu.eq2.total();
            finest_where = r.gpu.work_peak_at;
          }
        }
  // Minimal fitting entries (no coarser neighbour fits) and their one-level-finer neighbours.
  std::vector<char> chosen(fits.size(), 0), coarsest(fits.size(), 0);
  for (const auto& at : all) {
    if (!fits[static_cast<std::size_t>(index(at))]) continue;
    bool minimal = true;
    for (int d = 0; d < 4 && minimal; ++d) {
      if (at[static_cast<std::size_t>(d)] == 0) continue;
      auto coarser = at;
      --coarser[static_cast<std::size_t>(d)];
      minimal = !fits[static_cast<std::size_t>(index(coarser))];
    }
    if (!minimal) continue;
    chosen[static_cast<std::size_t>(index(at))] = 1;
    coarsest[static_cast<std::size_t>(index(at))] = 1;
    for (int d = 0; d < 4; ++d) {
      auto finer = at;
      if (++finer[static_cast<std::size_t>(d)] < size[static_cast<std::size_t>(d)] && fits[static_cast<std::size_t>(index(finer))]) {
        chosen[static_cast<std::size_t>(index(finer))] = 1;
      }
    }
  }
  if (std::none_of(chosen.begin(), chosen.end(), [](char c) { return c != 0; })) {
    out.shortfall = BudgetShortfall{"GPU", budgets.gpu_bytes, finest_peak,
                                    finest_where + " on the Local path with the smallest partitions"};
    return out;
  }

  // Short executions and the boundary DP for every chosen entry, with and without O/LSE.
  BoundaryDpOptions dp;
  dp.max_regenerate_run = o.max_regenerate_run;
  dp.gpu_limit_bytes = static_cast<Bytes>(static_cast<double>(budgets.gpu_bytes) / (1.0 + eps));
  dp.host_limit_bytes = std::max<Bytes>(host_room, 1);
  std::vector<Finalist> finalists;
  int over_limit = 0;  // entries whose graph is over the stage limit (skipped)
  for (const auto& at : all) {
    if (!chosen[static_cast<std::size_t>(index(at))]) continue;
    ++out.configured;
    for (bool keep : {false, true}) {
      if (keep && !has_attention(m)) continue;
      if (pricer.refuses(pricer.with_flat(local_plan(menu.split(at), keep)))) {
        ++over_limit;  // over the stage limit: skipped
        continue;
      }
      const LayerTable table = local_layer_table(pricer, menu.split(at), keep);
      for (int cap : o.regenerate_caps) {
        dp.regenerate_cap = cap;
        for (const BoundaryLabel& l : boundary_dp(table, dp)) {
          finalists.push_back({l, menu.split(at), keep, cap, coarsest[static_cast<std::size_t>(index(at))] != 0});
        }
      }
    }
  }
  out.labels = static_cast<std::int64_t>(finalists.size());
  std::sort(finalists.begin(), finalists.end(), [](const Finalist& a, const Finalist& b) { return a.label.time_s < b.label.time_s; });

  // Full-depth pricing of the best labels, and of the fastest label of each coarsest entry (the
  // short executions and the DP estimate: a finer neighbour a hair ahead there must not keep the
  // coarser plan from being priced); simulated memory checked against every budget.
  std::vector<PricedPlan> feasible;
  std::optional<BudgetShortfall> first_miss;
  std::vector<std::pair<Plan, bool>> tried;  // each plan priced, and whether it fits
  auto plan_of = [&](const Finalist& f) { return pricer.with_flat(finalist_plan(f, L)); };
  // Prices `p` (once per plan); whether it fits the budgets.
  auto price = [&](const Plan& p) {
    const auto it = std::find_if(tried.begin(), tried.end(), [&](const auto& t) { return t.first == p; });
    if (it != tried.end()) return it->second;
    PricedPlan pp = pricer.price(p);
    ++out.priced;
    const auto miss = check_budgets(budgets, pp.gpu_peak_max(), pp.numa_peak_bytes, "the simulated Local step", "the simulated Local step");
    tried.emplace_back(p, !miss);
    if (miss) {
      if (!first_miss) first_miss = miss;
      return false;
    }
    feasible.push_back(std::move(pp));
    return true;
  };
  std::vector<SplitSpec> coarsest_priced;
  for (const Finalist& f : finalists) {
    if (!f.coarsest || std::find(coarsest_priced.begin(), coarsest_priced.end(), f.split) != coarsest_priced.end()) continue;
    coarsest_priced.push_back(f.split);
    price(plan_of(f));
  }
  // The best labels, as many as would have been priced without the coarsest entries' (a plan
  // priced among those counts where it ranks).
  std::vector<Plan> ranked_plans;
  int ranked = 0;
  for (const Finalist& f : finalists) {
    if (ranked >= o.finalists || static_cast<int>(ranked_plans.size()) >= 3 * o.finalists) break;
    const Plan p = plan_of(f);
    if (std::find(ranked_plans.begin(), ranked_plans.end(), p) != ranked_plans.end()) continue;
    ranked_plans.push_back(p);
    ranked += price(p) ? 1 : 0;
  }
  if (feasible.empty()) {
    if (!first_miss && over_limit > 0) return out;  // nothing priced: the pricer says why (PlanPricer::refused)
    out.shortfall = first_miss ? first_miss
                               : std::optional<BudgetShortfall>(BudgetShortfall{
                                     "host", host_room, 0, "boundaries and O/LSE of the Local path (no boundary policy fits)"});
    return out;
  }
  // Delivery and gradient slots are tried once each on one plan: the fastest, or within
  // tie_fraction of it one that splits fewer operators (the faster by a hair of two such plans is
  // chance; the variants' gain, which decides, is the same for both).
  auto fastest = std::min_element(feasible.begin(), feasible.end(), [](const PricedPlan& a, const PricedPlan& b) { return a.step_s < b.step_s; });
  const Seconds tie = fastest->step_s * (1 + o.tie_fraction);
  const PricedPlan* base = &*fastest;
  for (const PricedPlan& p : feasible) {
    if (p.step_s <= tie && split_dimensions(p.plan.split) < split_dimensions(base->plan.split)) base = &p;
  }
  {
    Plan full = base->plan;
    full.param_transfer = ParamTransfer::kFull;
    Plan two = base->plan;
    two.cpu_grad_slots = 2;
    for (const Plan& p : {full, two}) {
      PricedPlan pp = pricer.price(p);
      ++out.priced;
      if (!check_budgets(budgets, pp.gpu_peak_max(), pp.numa_peak_bytes, "", "")) feasible.push_back(std::move(pp));
    }
  }
  const PricedPlan* best = &feasible.front();
  for (const PricedPlan& p : feasible) best = p.step_s < best->step_s ? &p : best;
  const Seconds limit = best->step_s * (1 + o.tie_fraction);
  // Within the tie: the lowest GPU peak, then the fewest split operators.
  const PricedPlan* chosen_plan = best;
  for (const PricedPlan& p : feasible) {
    if (p.step_s > limit) continue;
    const bool lower = p.gpu_peak_max() < chosen_plan->gpu_peak_max();
    const bool coarser = p.gpu_peak_max() == chosen_plan->gpu_peak_max() &&
                         split_dimensions(p.plan.split) < split_dimensions(chosen_plan->plan.split);
    if (lower || coarser) chosen_plan = &p;
  }
  out.best = *chosen_plan;
  return out;
}

}  // namespace oom
