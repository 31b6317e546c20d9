#include "planner/search/ep_planner.h"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include <fmt/format.h>

#include "costmodel/params.h"
#include "costmodel/token_text.h"
#include "planner/search/mixing_levels.h"
#include "planner/lowering/memory_report.h"

namespace oom {

std::vector<int> contiguous_resident_set(int layers, int count) {
  std::vector<int> r;
  for (int l = 0; l < std::min(layers, count); ++l) r.push_back(l);
  return r;
}

std::vector<int> interleaved_resident_set(int layers, int count) {
  count = std::clamp(count, 0, layers);
  if (count <= 2 || count == layers) return contiguous_resident_set(layers, count);
  std::vector<int> r = {0, 1};
  const int rest = count - 2;
  const double step = static_cast<double>(layers - 2) / rest;
  for (int i = 0; i < rest; ++i) {
    int l = 2 + static_cast<int>((i + 0.5) * step);
    l = std::max(l, r.back() + 1);  // keep the set strictly increasing for dense sets
    r.push_back(std::min(l, layers - (rest - i)));
  }
  return r;
}

std::vector<int> retained_set(int layers, int count) {
  std::vector<int> k;
  for (int l = std::max(0, layers - count); l < layers; ++l) k.push_back(l);
  return k;
}

std::vector<SplitSpec> ep_mixing_splits(const WorkloadContext& ctx, const std::vector<std::int64_t>& gdn_pieces_tokens) {
  std::vector<SplitSpec> out{SplitSpec{}};
  const ModelSpec& m = ctx.model;
  if (ctx.workload.gpus_per_seq() > 1) return out;  // pieces of a sequence already: ring attention
  const std::vector<int> heads = attention_head_group_levels(m);
  const std::vector<std::int64_t> gdn = gdn_piece_levels(ctx, gdn_pieces_tokens);
  const std::size_t levels = std::max(heads.size(), gdn.size());
  for (std::size_t i = 0; i < levels; ++i) {
    SplitSpec s;
    if (!heads.empty()) s.attention_head_group = heads[std::min(i, heads.size() - 1)];
    if (!gdn.empty()) s.gdn_chunk_tokens = gdn[std::min(i, gdn.size() - 1)];
    out.push_back(s);
  }
  return out;
}

namespace {

// The static memory of an EP plan decomposed by its free variables, exactly as static_memory()
// computes it: the GPU's Eq. 2 terms other than M_state depend only on (retained set, chunk);
// M_state is linear in the resident shards' parameters; each NUMA node's host bytes are those of
// the plan without residency (per slot count) less the resident shards' canonical state of the
// ranks on that node. One static_memory() call per (k, c) and per slot count replaces one per
// candidate.
class EpMemoryModel {
 public:
  EpMemoryModel(const WorkloadContext& ctx, const MemoryConstants& constants, const PlanPricer& pricer, int group,
                const SplitSpec& split)
      : ctx_(ctx), constants_(constants), pricer_(pricer), group_(group), split_(split) {
    const ModelParams params = model_params(ctx.model);
    replicas_ = ctx.workload.gpus / group;
    for (const auto& l : params.layers) {
      shard_params_.push_back(l.routed_experts / group);
      slice_params_.push_back(l.routed_experts / group / replicas_);
    }
    ranks_on_ = ctx.hardware.ranks_per_numa(ctx.workload.gpus);
  }

  // The resident set's shard parameters on a GPU and (EP groups) the slices each replica updates.
  struct Resident {
    ParamCount shard = 0, slice = 0;
  };
  Resident resident_params(const std::vector<int>& resident) const {
    Resident p;
    for (int l : resident) {
      p.shard += shard_params_[static_cast<std::size_t>(l)];
      p.slice += slice_params_[static_cast<std::size_t>(l)];
    }
    return p;
  }

  // GPU terms of (k, c): the slot count does not enter the GPU's Eq. 2.
  const MemoryReport& gpu_base(int retained, std::int64_t chunk) {
    const auto key = std::make_pair(retained, chunk);
    auto it = gpu_cache_.find(key);
    if (it != gpu_cache_.end()) return it->second;
    return gpu_cache_.emplace(key, static_memory(ctx_, plan(retained, chunk, 2), constants_)).first->second;
  }
  // Host bytes per NUMA node without residency: retained sets and chunks do not enter them.
  const std::vector<Bytes>& host_base(int slots) {
    auto it = host_cache_.find(slots);
    if (it != host_cache_.end()) return it->second;
    std::vector<Bytes> h;
    for (const HostNumaReport& n : static_memory(ctx_, plan(0, 65536, slots), constants_).host) h.push_back(n.total());
    return host_cache_.emplace(slots, std::move(h)).first->second;
  }

  Bytes gpu_peak_bytes(const MemoryReport& base, const Resident& resident) const {
    const GpuPeakTerms& t = base.gpu.eq2;
    return eq2_gpu_peak(t.fixed, resident_shard_state_bytes(resident.shard, resident.slice, replicas_), t.keep, t.work,
                        constants_.gpu_headroom_fraction)
        .total();
  }

  // Each rank's host keeps the state of its slice of every streamed shard (the whole shard with one group).
  std::vector<Bytes> host_bytes(const std::vector<Bytes>& base, const Resident& resident) const {
    std::vector<Bytes> out(base);
    const ParamCount on_host = replicas_ > 1 ? resident.slice : resident.shard;
    for (std::size_t n = 0; n < out.size(); ++n) out[n] -= static_cast<Bytes>(ranks_on_[n]) * canonical_state_bytes(on_host);
    return out;
  }

 private:
  const WorkloadContext& ctx_;
  MemoryConstants constants_;
  const PlanPricer& pricer_;
  int group_;  // GPUs per EP group
  SplitSpec split_;  // the mixing sublayers' partitions (ep_mixing_splits)
  int replicas_ = 1;  // EP groups: replicas of each shard
  std::vector<ParamCount> shard_params_, slice_params_;
  std::vector<int> ranks_on_;
  std::map<std::pair<int, std::int64_t>, MemoryReport> gpu_cache_;
  std::map<int, std::vector<Bytes>> host_cache_;

  Plan plan(int retained, std::int64_t chunk, int slots) const {
    Plan p;
    p.path = ExpertPath::kEp;
    p.moe_retained_layers = retained_set(ctx_.model.layers, retained);
    p.routing_chunk_tokens = chunk;
    p.cpu_grad_slots = slots;
    p.ep_group_gpus = group_ < ctx_.workload.gpus ? group_ : 0;
    p.context_parallel_gpus = ctx_.workload.gpus_per_seq() > 1 ? ctx_.workload.gpus_per_seq() : 0;
    p.split = split_;
    return pricer_.with_flat(std::move(p));
  }
};

struct Point {
  ResidentShape shape = ResidentShape::kInterleaved;
  int resident = 0;
  int retained = 0;
  std::int64_t chunk = 0;
  int slots = 2;
  auto key() const { return std::make_tuple(static_cast<int>(shape), resident, retained, chunk, slots); }
};

// ", attention head groups of g, GDN pieces of C" for a partitioned plan; empty when unsplit.
std::string mixing_split_label(const SplitSpec& s) {
  std::string out;
  if (s.attention_head_group > 0) out += fmt::format(", attention head groups of {}", s.attention_head_group);
  if (s.gdn_chunk_tokens > 0) out += ", GDN pieces of " + tokens_text(s.gdn_chunk_tokens);
  return out;
}

class EpSearch {
 public:
  EpSearch(const PlanPricer& pricer, const EpPlannerOptions& options, int group, const SplitSpec& split)
      : pricer_(pricer), ctx_(pricer.context()), options_(options), memory_(ctx_, pricer.constants(), pricer, group, split),
        budgets_(workload_budgets(ctx_)), L_(ctx_.model.layers), group_(group), split_(split),
        max_resident_(L_) {
    // Chunks at or above the tokens per GPU all mean "one round": keep the smallest of them.
    const std::int64_t N = ctx_.workload.tokens_per_gpu();
    std::set<std::int64_t> chunks;
    std::int64_t one_round = 0;
    for (std::int64_t c : options.routing_chunks_tokens) {
      if (c < N) {
        chunks.insert(c);
      } else if (one_round == 0 || c < one_round) {
        one_round = c;
      }
    }
    if (one_round > 0 || chunks.empty()) chunks.insert(one_round > 0 ? one_round : N);
    chunks_.assign(chunks.begin(), chunks.end());
    first_chunk_ = options.first_chunk_tokens >= N && one_round > 0 ? one_round : options.first_chunk_tokens;
    if (!chunks.count(first_chunk_)) first_chunk_ = chunks_.back();
  }

  std::vector<int> resident_set(ResidentShape s, int count) const {
    return s == ResidentShape::kContiguous ? contiguous_resident_set(L_, count) : interleaved_resident_set(L_, count);
  }

  EpMemoryModel::Resident resident_params(ResidentShape shape, int count) {
    auto& table = resident_params_[static_cast<int>(shape)];
    if (table.empty()) {
      for (int r = 0; r <= L_; ++r) table.push_back(memory_.resident_params(resident_set(shape, r)));
    }
    return table[static_cast<std::size_t>(count)];
  }

  // The largest memory-feasible resident count for (shape, k, c, slots), or −1.
  int largest_resident(ResidentShape shape, int retained, std::int64_t chunk, int slots) {
    const MemoryReport& gpu = memory_.gpu_base(retained, chunk);
    const std::vector<Bytes>& host = memory_.host_base(slots);
    for (int r = max_resident_; r >= 0; --r) {
      if (fits(gpu, host, resident_params(shape, r))) return r;
    }
    return -1;
  }

  bool fits(const MemoryReport& gpu, const std::vector<Bytes>& host, const EpMemoryModel::Resident& resident) const {
    return !check_budgets(budgets_, memory_.gpu_peak_bytes(gpu, resident), memory_.host_bytes(host, resident), "", "");
  }

  // Counts the memory-feasible points of the whole enumeration (every shape, r, k, c, slots).
  void count_space(EpSearchResult& out) {
    for (std::int64_t c : chunks_) {
      for (int slots : options_.cpu_grad_slots) {
        for (int k = 0; k <= L_; ++k) {
          const MemoryReport& gpu = memory_.gpu_base(k, c);
          const std::vector<Bytes>& host = memory_.host_base(slots);
          for (ResidentShape shape : {ResidentShape::kContiguous, ResidentShape::kInterleaved}) {
            for (int r = 0; r <= max_resident_; ++r) {
              ++out.enumerated;
              if (fits(gpu, host, resident_params(shape, r))) ++out.memory_feasible;
            }
          }
        }
      }
    }
  }

  Plan make_plan(const Point& p) const {
    Plan plan;
    plan.path = ExpertPath::kEp;
    plan.resident_layers = resident_set(p.shape, p.resident);
    plan.moe_retained_layers = retained_set(L_, p.retained);
    plan.routing_chunk_tokens = p.chunk;
    plan.cpu_grad_slots = p.slots;
    plan.context_parallel_gpus = ctx_.workload.gpus_per_seq() > 1 ? ctx_.workload.gpus_per_seq() : 0;
    plan.split = split_;
    plan.notes = fmt::format("R{}/K{} ({}), {} routing chunk, {} CPU gradient slot{}{}", p.resident, p.retained,
                             p.shape == ResidentShape::kContiguous ? "contiguous" : "interleaved", tokens_text(p.chunk),
                             p.slots, p.slots == 1 ? "" : "s", mixing_split_label(split_));
    if (group_ < ctx_.workload.gpus) {
      plan.ep_group_gpus = group_;
      plan.notes += fmt::format(", EP groups of {} GPUs ({} replicas of each shard)", group_, ctx_.workload.gpus / group_);
    }
    if (plan.context_parallel_gpus > 1) {
      plan.notes += fmt::format(", each sequence over {} GPUs (ring attention)", plan.context_parallel_gpus);
    }
    return pricer_.with_flat(std::move(plan));
  }

  // Prices the point; a plan whose simulated memory exceeds a budget is retried with fewer
  // resident layers (at most three times). Returns the step time of the feasible plan priced.
  std::optional<Seconds> price(Point p, EpSearchResult& out) {
    for (int tries = 0; tries < 3 && p.resident >= 0; ++tries) {
      if (priced_.count(p.key())) return priced_.at(p.key());
      PricedPlan pp = pricer_.price(make_plan(p));
      ++out.priced;
      const auto miss = check_budgets(budgets_, pp.gpu_peak_max(), pp.numa_peak_bytes, "the simulated EP step", "the simulated EP step");
      if (!miss) {
        priced_[p.key()] = pp.step_s;
        points_.push_back(p);
        plans_.push_back(std::move(pp));
        return plans_.back().step_s;
      }
      if (!first_simulated_miss_) first_simulated_miss_ = miss;
      priced_[p.key()] = std::nullopt;
      --p.resident;
    }
    return std::nullopt;
  }

  EpSearchResult run() {
    EpSearchResult out;
    count_space(out);
    if (ctx_.model.moe.experts % group_ != 0 || ctx_.workload.gpus % group_ != 0) return out;
    if (out.memory_feasible == 0) {
      out.shortfall = least_demanding_shortfall();
      return out;
    }
    // 1. The frontier at the first chunk and slot count: every k on a grid, both shapes.
    std::vector<int> grid;
    for (int k = 0; k <= L_; ++k) {
      if (k <= 6 || k % 4 == 0 || k == L_) grid.push_back(k);
    }
    // The first chunk, or when nothing fits with it the largest smaller chunk that fits.
    std::vector<std::int64_t> first_chunks = {first_chunk_};
    for (auto it = chunks_.rbegin(); it != chunks_.rend(); ++it) {
      if (*it < first_chunk_) first_chunks.push_back(*it);
    }
    auto frontier = [&](int k) {
      for (ResidentShape shape : {ResidentShape::kInterleaved, ResidentShape::kContiguous}) {
        for (const std::int64_t c : first_chunks) {
          const int r = largest_resident(shape, k, c, options_.first_slots);
          if (r < 0) continue;
          price({shape, r, k, c, options_.first_slots}, out);
          break;
        }
      }
    };
    for (int k : grid) frontier(k);
    // Refine k between the grid points around the best.
    if (const auto best = best_index(); best) {
      const int kb = points_[*best].retained;
      for (int k = std::max(0, kb - 3); k <= std::min(L_, kb + 3); ++k) frontier(k);
    }
    // 2. The best few frontier points over every chunk and slot count.
    std::vector<std::size_t> order(points_.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return plans_[a].step_s < plans_[b].step_s; });
    std::vector<Point> top;
    for (std::size_t i : order) {
      if (static_cast<int>(top.size()) >= options_.refine_top) break;
      top.push_back(points_[i]);
    }
    for (const Point& t : top) {
      for (std::int64_t c : chunks_) {
        for (int slots : options_.cpu_grad_slots) {
          const int r = largest_resident(t.shape, t.retained, c, slots);
          if (r >= 0) price({t.shape, r, t.retained, c, slots}, out);
        }
      }
    }
    // 3. Around the best: fewer resident layers, and the other shape.
    if (const auto best = best_index(); best) {
      const Point b = points_[*best];
      for (int d = 1; d <= 2; ++d) {
        if (b.resident - d >= 0) price({b.shape, b.resident - d, b.retained, b.chunk, b.slots}, out);
      }
      const ResidentShape other = b.shape == ResidentShape::kContiguous ? ResidentShape::kInterleaved : ResidentShape::kContiguous;
      price({other, b.resident, b.retained, b.chunk, b.slots}, out);
    }
    if (const auto chosen = chosen_index(); chosen) {
      out.best = plans_[*chosen];
    } else {
      // Eq. 2 admitted plans whose simulated memory timeline did not fit: report that.
      out.shortfall = least_demanding_shortfall();
      if (!out.shortfall) out.shortfall = first_simulated_miss_;
    }
    return out;
  }

  std::optional<std::size_t> best_index() const {
    if (plans_.empty()) return std::nullopt;
    std::size_t b = 0;
    for (std::size_t i = 1; i < plans_.size(); ++i) {
      if (plans_[i].step_s < plans_[b].step_s) b = i;
    }
    return b;
  }

  // Within tie_fraction of the fastest, the most GPU headroom (then the faster).
  std::optional<std::size_t> chosen_index() const {
    const auto best = best_index();
    if (!best) return std::nullopt;
    const Seconds limit = plans_[*best].step_s * (1 + options_.tie_fraction);
    std::size_t c = *best;
    for (std::size_t i = 0; i < plans_.size(); ++i) {
      if (plans_[i].step_s > limit) continue;
      const Bytes hi = plans_[i].gpu_peak_max(), hc = plans_[c].gpu_peak_max();
      if (hi < hc || (hi == hc && plans_[i].step_s < plans_[c].step_s)) c = i;
    }
    return c;
  }

  // The budget that the least demanding EP plan exceeds: no resident or retained layers and the
  // smallest routing chunk for the GPU; as many resident layers as the GPU allows for the host.
  std::optional<BudgetShortfall> least_demanding_shortfall() {
    const std::int64_t c = chunks_.front();
    const int slots = *std::min_element(options_.cpu_grad_slots.begin(), options_.cpu_grad_slots.end());
    const MemoryReport& base = memory_.gpu_base(0, c);
    const std::vector<Bytes>& host = memory_.host_base(slots);
    const Bytes gpu = memory_.gpu_peak_bytes(base, {});
    if (gpu > budgets_.gpu_bytes) {
      return BudgetShortfall{"GPU", budgets_.gpu_bytes, gpu,
                             fmt::format("{} on the EP path with the smallest routing chunk ({}){} and no resident or retained layers",
                                         base.gpu.work_peak_at, tokens_text(c), mixing_split_label(split_))};
    }
    int r = 0;
    while (r < max_resident_ && memory_.gpu_peak_bytes(base, resident_params(ResidentShape::kContiguous, r + 1)) <= budgets_.gpu_bytes) ++r;
    const std::string partition = mixing_split_label(split_);
    return check_budgets(budgets_, 0, memory_.host_bytes(host, resident_params(ResidentShape::kContiguous, r)), "",
                         fmt::format("the EP path's canonical state and pinned pools with {} resident layers{}", r,
                                     partition.empty() ? "" : " (as many as the GPU holds" + partition + ")"));
  }

 private:
  const PlanPricer& pricer_;
  const WorkloadContext& ctx_;
  EpPlannerOptions options_;
  EpMemoryModel memory_;
  Budgets budgets_;
  int L_ = 0;
  int group_ = 1;         // GPUs per EP group
  SplitSpec split_;       // the mixing sublayers' partitions of every plan of this search
  int max_resident_ = 0;  // resident layers allowed: none when groups replicate the shards
  std::vector<std::int64_t> chunks_;
  std::int64_t first_chunk_ = 65536;
  std::optional<BudgetShortfall> first_simulated_miss_;
  std::map<std::tuple<int, int, int, std::int64_t, int>, std::optional<Seconds>> priced_;
  std::vector<Point> points_;
  std::vector<PricedPlan> plans_;
  std::vector<EpMemoryModel::Resident> resident_params_[2];
};

}  // namespace

std::vector<int> ep_group_candidates(const WorkloadContext& ctx) {
  const int P = ctx.workload.gpus, G = ctx.hardware.gpus_per_node, experts = ctx.model.moe.experts;
  const auto valid = [&](int e) { return e >= 1 && P % e == 0 && experts % e == 0; };
  std::vector<int> out;
  if (valid(P)) {
    out.push_back(P);
  } else {
    // The largest group of whole nodes, else the largest group at all (of 2+ GPUs).
    int whole = 0, any = 0;
    for (int e = P - 1; e >= 2 && whole == 0; --e) {
      if (!valid(e)) continue;
      if (any == 0) any = e;
      if (G > 0 && e % G == 0) whole = e;
    }
    if (whole > 0 || any > 0) out.push_back(whole > 0 ? whole : any);
  }
  if (G > 0 && P > G && valid(G) && (out.empty() || out.front() != G)) out.push_back(G);
  return out;
}

EpSearchResult plan_ep_under(const PlanPricer& pricer, const EpPlannerOptions& options, int group, const SplitSpec& split) {
  EpSearch search(pricer, options, group, split);
  return search.run();
}

EpSearchResult plan_ep(const PlanPricer& pricer, const EpPlannerOptions& options) {
  const std::vector<int> groups =
      options.ep_group_gpus > 0 ? std::vector<int>{options.ep_group_gpus} : ep_group_candidates(pricer.context());
  const std::vector<SplitSpec> splits = ep_mixing_splits(pricer.context(), options.gdn_pieces_tokens);
  EpSearchResult out;
  bool first = true;
  for (const int group : groups) {
    // The mixing sublayers unsplit first; partitions only where no plan fits unsplit (they add
    // calls and, without kept O/LSE, a re-forward per head group). Then every partition is
    // searched and the fastest plan kept: a finer one frees GPU memory for resident layers, which
    // can gain more than its extra calls cost.
    for (std::size_t i = 0; i < splits.size(); ++i) {
      EpSearchResult r = plan_ep_under(pricer, options, group, splits[i]);
      out.enumerated += r.enumerated;
      out.memory_feasible += r.memory_feasible;
      out.priced += r.priced;
      // The largest group's shortfall, at its finest partition (its least demanding plan).
      if (first) out.shortfall = r.shortfall;
      if (r.best) {
        if (!out.best || r.best->step_s < out.best->step_s) out.best = std::move(r.best);
        if (i == 0) break;
      }
    }
    first = false;
  }
  if (out.best) out.shortfall.reset();
  return out;
}

}  // namespace oom
