#include "planner/lowering/graph_size_estimate.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <map>
#include <set>
#include <utility>

#include <fmt/format.h>

#include "costmodel/input_error.h"
#include "planner/lowering/baselines_ktft.h"
#include "planner/lowering/lowering.h"

namespace oom {
namespace {

std::atomic<double> g_max_stages{kDefaultMaxStages};

using lowering::Over;
using lowering::RankGroups;

// What multiplies a stage: the input whose loop emits it (the innermost one).
enum class Cause { kStep, kSubBatches, kMoeChunks, kHeadGroups, kGdnPieces, kBuckets, kRegeneration, kRingHead, kCount };

// Counts a graph's stages and dependencies the way a lowering emits them: per call, one stage per
// emitted rank, and a collective's joins across nodes (lowering::collective_waits).
class Tally {
 public:
  Tally(int emit, int gpus_per_node) : emit_(emit), G_(std::max(1, gpus_per_node)) {}

  // A stage on every emitted rank, each with `deps` dependencies.
  void each(double deps, double times = 1) {
    stages_[static_cast<std::size_t>(cause_)] += times * emit_;
    deps_ += times * emit_ * deps;
  }
  // A collective over `groups`: a member per emitted rank, and a join per member set across nodes
  // (waiting for its members' distinct inputs); members wait for the join and their own input, or
  // on one node for every member's input.
  void collective(const RankGroups& groups, double times = 1) {
    auto it = sets_.find({groups.size, groups.strided});
    if (it == sets_.end()) {
      Sets sets;
      std::set<int> firsts;
      for (int r = 0; r < emit_; ++r) {
        const int first = groups.first(r);
        const bool across = spans_nodes(groups, first);
        if (firsts.insert(first).second && across) {
          ++sets.joins;
          sets.deps += std::min(groups.count(), emit_);
        }
        sets.deps += across ? 2 : groups.count();
      }
      it = sets_.emplace(std::make_pair(groups.size, groups.strided), sets).first;
    }
    stages_[static_cast<std::size_t>(cause_)] += times * (emit_ + it->second.joins);
    deps_ += times * it->second.deps;
  }
  // What was counted since `before`, counted `times` times in all.
  void repeat_since(const Tally& before, double times) {
    for (std::size_t c = 0; c < stages_.size(); ++c) stages_[c] = before.stages_[c] + (stages_[c] - before.stages_[c]) * times;
    deps_ = before.deps_ + (deps_ - before.deps_) * times;
  }
  void set_cause(Cause c) { cause_ = c; }
  Cause cause() const { return cause_; }

  GraphSize result() const {
    GraphSize g;
    for (const double s : stages_) g.stages += s;
    g.deps = deps_;
    return g;
  }
  // The cause with the most stages, other than the step's own.
  Cause largest_cause() const {
    Cause best = Cause::kStep;
    for (int c = 1; c < static_cast<int>(Cause::kCount); ++c) {
      if (stages_[static_cast<std::size_t>(c)] > stages_[static_cast<std::size_t>(best)]) best = static_cast<Cause>(c);
    }
    return best;
  }

 private:
  // Whether the set whose lowest rank is `first` has members on more than one node.
  bool spans_nodes(const RankGroups& groups, int first) const {
    const int last = groups.strided ? first + (groups.ranks - 1 - first) / groups.size * groups.size
                                    : std::min(groups.ranks, first + groups.size) - 1;
    return last / G_ != first / G_;
  }

  // Per member-set partition (size, strided) of the step's ranks: the joins and dependencies of
  // one collective over it.
  struct Sets {
    double joins = 0, deps = 0;
  };
  std::map<std::pair<int, bool>, Sets> sets_;
  int emit_, G_;
  Cause cause_ = Cause::kStep;
  std::array<double, static_cast<std::size_t>(Cause::kCount)> stages_{};
  double deps_ = 0;
};

// Sets the tally's cause for a scope, and back.
class CauseScope {
 public:
  CauseScope(Tally& t, Cause c) : t_(t), before_(t.cause()) { t_.set_cause(c); }
  ~CauseScope() { t_.set_cause(before_); }
  CauseScope(const CauseScope&) = delete;
  CauseScope& operator=(const CauseScope&) = delete;

 private:
  Tally& t_;
  Cause before_;
};

bool is_attention(LayerKind k) { return k != LayerKind::kLinearAttention; }

// planner/lowering/lowering.cc and lowering_layers.cc on counts: the same loops, each stage a tally.
class StepCounter {
 public:
  StepCounter(const Plan& plan, const WorkloadContext& ctx, const LoweringOptions& options)
      : plan_(plan), m_(ctx.model), params_(model_params(ctx.model)), P_(ctx.workload.gpus),
        ep_(plan.path == ExpertPath::kEp), E_(plan.ep_group(P_)), D_(P_ / E_),
        layers_(options.decoder_layers > 0 ? std::min(options.decoder_layers, m_.layers) : m_.layers),
        C_(ep_ ? plan.context_parallel() : 1), seqs_(ctx.workload.seqs_per_gpu()), S_(ctx.workload.seq_len / C_),
        routing_(lowering::rank_routing(plan, ctx, layers_)), llep_(lowering::runs_llep(plan, P_)),
        emit_(lowering::emitted_ranks(plan, ctx, options, routing_)), t_(emit_, ctx.hardware.gpus_per_node) {}

  GraphSize run() {
    embedding_forward();
    for (int l = 0; l < layers_; ++l) decoder_forward(l, true);
    head();
    for (int l = layers_ - 1; l >= 0; --l) decoder_backward(l);
    embedding_backward();
    GraphSize g = t_.result();
    describe(g, t_.largest_cause());
    return g;
  }

 private:
  RankGroups groups(Over over) const { return lowering::over_groups(over, P_, E_, C_); }
  int members(Over over) const { return groups(over).count(); }
  void collective(Over over, double times = 1) { t_.collective(groups(over), times); }
  bool streamed() const { return plan_.flat.optimizer_bucket_mib > 0; }
  Over expert_replicas() const { return lowering::expert_replicas_over(plan_, P_); }
  Over expert_allgather(int l) const { return lowering::expert_allgather_over(plan_, l, P_); }
  ParamCount common_params(int l) const { return params_.layers[static_cast<std::size_t>(l)].common(); }
  ParamCount expert_params_on_gpu(int l) const {
    const ParamCount bank = params_.layers[static_cast<std::size_t>(l)].routed_experts;
    return ep_ ? bank / E_ : bank;
  }
  std::int64_t live_seqs() const {
    return (!ep_ && plan_.split.sub_batch_seqs > 0) ? std::min(plan_.split.sub_batch_seqs, seqs_) : seqs_;
  }
  // Lowering::moe_chunks: the count, and the size of the last chunk.
  std::int64_t moe_chunks(std::int64_t tokens) const {
    const std::int64_t c = ep_ ? plan_.routing_chunk_tokens : plan_.split.moe_chunk_tokens;
    return c <= 0 || c >= tokens ? 1 : (tokens + c - 1) / c;
  }
  bool spills(int l) const {
    return llep_ && routing_[static_cast<std::size_t>(l)].spilled_experts > 0 && m_.moe_layer(l);
  }

  void deliver(Over allgather) {
    t_.each(1);  // the H2D after the slot's previous consumer
    if (members(allgather) > 1) collective(allgather);
  }

  void embedding_forward() {
    deliver(Over::kNone);
    t_.each(1);
  }

  // Stages of one sub-batch's mixing forward (Lowering::mixing_forward).
  void mixing_forward(int l, std::int64_t seqs, bool first_pass, bool reuse_o) {
    const LayerKind kind = m_.layer_kinds[static_cast<std::size_t>(l)];
    t_.each(2);  // projections
    if (is_attention(kind)) {
      if (reuse_o) {
        t_.each(1);  // O/LSE back from the host
        t_.each(2);  // output projection
        return;
      }
      if (C_ > 1) collective(Over::kContext);
      {
        const CauseScope scope(t_, Cause::kHeadGroups);
        t_.each(1, attention_head_groups(m_.attention(kind), plan_.split.attention_head_group));
      }
      if (first_pass && plan_.keep_attention_results) t_.each(1);
      t_.each(C_ > 1 ? 2 : 1);
      return;
    }
    {
      const CauseScope scope(t_, Cause::kGdnPieces);
      t_.each(1, gdn_call_shape(seqs, S_, plan_.split.gdn_chunk_tokens).pieces);
    }
    gdn_state_chain();
    t_.each(1);
  }
  void gdn_state_chain() {
    if (C_ <= 1) return;
    collective(Over::kContext, C_ - 1);
    t_.each(2);
  }

  // One MoE chunk's forward (Lowering::moe_dispatch_half + moe_expert_half).
  void moe_forward_chunk(int l, double times) {
    t_.each(2, times);  // router and shared expert
    if (!m_.moe_layer(l)) {
      t_.each(1, times);  // the residual add
      return;
    }
    if (!ep_ || E_ == 1) {
      t_.each(2, times);  // experts
      return;
    }
    collective(Over::kGroup, times);  // dispatch
    t_.each(3, times);                // experts
    collective(Over::kGroup, times);  // return
    t_.each(1, times);                // combine
  }
  void moe_backward_chunk(int l, double times) {
    if (!m_.moe_layer(l)) {
      t_.each(1, times);
      return;
    }
    if (ep_ && E_ > 1) {
      collective(Over::kGroup, times);
      t_.each(2, times);
      collective(Over::kGroup, times);
    } else {
      t_.each(1, times);
    }
    t_.each(1, times);
  }

  void decoder_forward(int l, bool original) {
    deliver(expert_allgather(l));
    if (original) {
      switch (plan_.boundaries.place(l)) {
        case BoundaryPolicy::Place::kHost: t_.each(1); break;
        case BoundaryPolicy::Place::kGpu: gpu_boundaries_.insert(l); break;
        case BoundaryPolicy::Place::kRegenerated: break;
      }
    }
    const bool reuse_o = !original && plan_.keep_attention_results && is_attention(m_.layer_kinds[static_cast<std::size_t>(l)]);
    sub_batches([&](std::int64_t seqs) {
      mixing_forward(l, seqs, original, reuse_o);
      if (spills(l)) collective(Over::kGroup);
      const CauseScope scope(t_, Cause::kMoeChunks);
      moe_forward_chunk(l, static_cast<double>(moe_chunks(seqs * S_)));
    });
  }

  // `body(seqs)` per sub-batch of the decoder's sequences, under the sub-batches' cause when there
  // is more than one.
  template <class Body>
  void sub_batches(Body body) {
    const std::int64_t sb = live_seqs();
    const CauseScope scope(t_, sb < seqs_ ? Cause::kSubBatches : t_.cause());
    // Every sub-batch but the last has sb sequences; the last the rest.
    const std::int64_t full = (seqs_ - 1) / sb, last = seqs_ - full * sb;
    if (full > 0) {
      const Tally before = t_;
      body(sb);
      t_.repeat_since(before, static_cast<double>(full));
    }
    body(last);
  }

  void boundary_for_backward(int l) {
    if (gpu_boundaries_.count(l)) return;
    const auto place = plan_.boundaries.place(l);
    if (place == BoundaryPolicy::Place::kHost) {
      t_.each(2);
      gpu_boundaries_.insert(l);
      return;
    }
    int j = l - 1;
    while (j > 0 && plan_.boundaries.place(j) == BoundaryPolicy::Place::kRegenerated && !gpu_boundaries_.count(j)) --j;
    if (j < 0) j = 0;
    const CauseScope scope(t_, Cause::kRegeneration);
    if (plan_.boundaries.place(j) == BoundaryPolicy::Place::kRegenerated && !gpu_boundaries_.count(j)) {
      t_.each(1);  // the embeddings gathered again
      gpu_boundaries_.insert(j);
    } else {
      boundary_for_backward(j);
    }
    const int cap = std::max(1, plan_.boundaries.regenerate_cap);
    for (int d = j; d < l; ++d) {
      decoder_forward(d, false);
      if (d + 1 > l - cap) gpu_boundaries_.insert(d + 1);
    }
  }

  void mixing_backward(int l, std::int64_t seqs) {
    const LayerKind kind = m_.layer_kinds[static_cast<std::size_t>(l)];
    t_.each(1);  // output projection
    if (is_attention(kind)) {
      if (C_ > 1) collective(Over::kContext, 2);
      const int groups = attention_head_groups(m_.attention(kind), plan_.split.attention_head_group);
      const CauseScope scope(t_, Cause::kHeadGroups);
      t_.each(1, groups * (groups > 1 && !plan_.keep_attention_results ? 2.0 : 1.0));
    } else {
      {
        const CauseScope scope(t_, Cause::kGdnPieces);
        t_.each(1, gdn_call_shape(seqs, S_, plan_.split.gdn_chunk_tokens).pieces);
      }
      gdn_state_chain();
    }
    t_.each(C_ > 1 ? 2 : 1);  // projections
  }

  void decoder_backward(int l) {
    const bool load_after = plan_.boundaries.place(l) == BoundaryPolicy::Place::kHost;
    if (!load_after) boundary_for_backward(l);
    deliver(expert_allgather(l));
    if (load_after) boundary_for_backward(l);
    const bool retained = ep_ && plan_.is_moe_retained(l);
    const bool reuse_o = plan_.keep_attention_results && is_attention(m_.layer_kinds[static_cast<std::size_t>(l)]);
    t_.each(3);  // the gradient buffer's gate (after the first sub-batch's replay)
    sub_batches([&](std::int64_t seqs) {
      mixing_forward(l, seqs, false, reuse_o);
      if (spills(l)) collective(Over::kGroup);
      {
        const CauseScope scope(t_, Cause::kMoeChunks);
        const double chunks = static_cast<double>(moe_chunks(seqs * S_));
        if (!retained) moe_forward_chunk(l, chunks);
        moe_backward_chunk(l, chunks);
      }
      if (spills(l)) collective(Over::kGroup);
      mixing_backward(l, seqs);
    });
    gpu_boundaries_.erase(l);  // released after the replay
    const ParamCount common = common_params(l), experts = expert_params_on_gpu(l);
    if (streamed()) {
      if (ep_) {
        if (plan_.is_resident(l)) {
          resident_update(experts);
        } else {
          stream_gradients(experts, expert_replicas(), false);
        }
        stream_gradients(common, Over::kAll, false);
      } else {
        stream_gradients(common + experts, plan_.param_transfer == ParamTransfer::kShard ? Over::kAll : Over::kNone,
                         plan_.param_transfer != ParamTransfer::kShard);
      }
      return;
    }
    int d2h = 0;
    if (ep_) {
      const bool resident = plan_.is_resident(l);
      if (resident) {
        resident_update(experts);
      } else {
        d2h += gradients_to_host(experts, expert_replicas());
      }
      d2h += gradients_to_host(common, Over::kAll);
      cpu_update(d2h, common / P_ + (resident ? 0 : experts / D_), false);
    } else if (plan_.param_transfer == ParamTransfer::kShard) {
      d2h += gradients_to_host(common + experts, Over::kAll);
      cpu_update(d2h, (common + experts) / P_, false);
    } else {
      d2h += gradients_to_host(common + experts, Over::kNone);
      cpu_update(d2h, (common + experts) / P_, true);
    }
  }

  int gradients_to_host(ParamCount params, Over reduce) {
    if (params <= 0) return 0;
    if (members(reduce) > 1) collective(reduce);
    t_.each(2);  // the D2H, after its CPU gradient slot's update
    return 1;
  }
  void cpu_update(int d2h, ParamCount params_per_rank, bool accumulate) {
    if (d2h == 0 && params_per_rank <= 0) return;
    if (accumulate) t_.each(d2h);
    t_.each(accumulate ? std::min(P_, emit_) : std::max(1, d2h));  // the update
    t_.each(1);                                                   // its publication
  }
  void resident_update(ParamCount shard) {
    if (shard <= 0) return;
    if (expert_replicas() != Over::kNone) collective(Over::kReplicas);
    t_.each(1);
    if (expert_replicas() != Over::kNone) collective(Over::kReplicas);
  }
  void stream_gradients(ParamCount params_on_gpu, Over reduce, bool accumulate) {
    if (params_on_gpu <= 0) return;
    const int n = members(reduce);
    if (n > 1) collective(reduce);
    const ParamCount sent = n > 1 ? params_on_gpu / n : params_on_gpu;
    const Bytes bucket_bytes = plan_.flat.optimizer_bucket_mib * kMiB;
    const double buckets = std::max<double>(1, std::ceil(static_cast<double>(gradient_bytes(sent)) / static_cast<double>(bucket_bytes)));
    const CauseScope scope(t_, Cause::kBuckets);
    t_.each(2, buckets);  // D2H
    if (accumulate) t_.each(1, buckets);
    t_.each(accumulate ? std::min(P_, emit_) : 1, buckets);  // update
    t_.each(1, buckets);                                       // publication
  }

  void head() {
    if (plan_.flat.ring_dtp(P_)) {
      const ParamCount shard = (params_.lm_head > 0 ? params_.lm_head : params_.embedding) / P_ + params_.final_norm;
      deliver(Over::kNone);
      {
        const CauseScope scope(t_, Cause::kRingHead);
        t_.each(2, P_);
        collective(Over::kAll, P_ - 1);
        t_.each(2, P_);
        collective(Over::kAll, P_);
      }
      t_.each(1);
      optimizer_of(shard, Over::kNone, shard);
      return;
    }
    const ParamCount head = (params_.lm_head > 0 ? params_.lm_head : params_.embedding) + params_.final_norm;
    deliver(Over::kNone);
    t_.each(1);
    t_.each(1);
    const ParamCount group = m_.tied_embeddings ? params_.final_norm : head;
    optimizer_of(group, Over::kAll, group / P_);
  }
  void embedding_backward() {
    t_.each(1);
    optimizer_of(params_.embedding, Over::kAll, params_.embedding / P_);
  }
  // A step-level group's gradient: streamed, or to the host and updated.
  void optimizer_of(ParamCount params, Over reduce, ParamCount per_rank) {
    if (streamed()) {
      stream_gradients(params, reduce, false);
      return;
    }
    cpu_update(gradients_to_host(params, reduce), per_rank, false);
  }

  void describe(GraphSize& g, Cause c) const {
    const auto set = [&](const std::string& field, auto value) {
      g.field = field;
      g.value = fmt::format("{}", value);
      g.plan_field = true;
    };
    switch (c) {
      case Cause::kMoeChunks:
        if (ep_) {
          set("routing_chunk_tokens", plan_.routing_chunk_tokens);
        } else {
          set("split.moe_chunk_tokens", plan_.split.moe_chunk_tokens);
        }
        return;
      case Cause::kSubBatches: set("split.sub_batch_seqs", plan_.split.sub_batch_seqs); return;
      case Cause::kHeadGroups: set("split.attention_head_group", plan_.split.attention_head_group); return;
      case Cause::kGdnPieces: set("split.gdn_chunk_tokens", plan_.split.gdn_chunk_tokens); return;
      case Cause::kBuckets: set("flat.optimizer_bucket_mib", plan_.flat.optimizer_bucket_mib); return;
      case Cause::kRegeneration: set("boundaries", "(regenerated decoders)"); return;
      case Cause::kRingHead: set("flat.vocab_projection", "\"ring_dtp\""); return;
      case Cause::kStep:
      case Cause::kCount: break;
    }
    g.field = "gpus";
    g.value = std::to_string(P_);
    g.plan_field = false;
  }

  const Plan& plan_;
  const ModelSpec& m_;
  ModelParams params_;
  int P_;
  bool ep_;
  int E_, D_, layers_, C_;
  std::int64_t seqs_, S_;
  std::vector<LlepBalance> routing_;
  bool llep_;
  int emit_;
  Tally t_;
  std::set<int> gpu_boundaries_;  // decoders whose input is on the GPU (Lowering::gpu_boundaries_)
};

// The baseline systems' sizes: the workload's, never a plan field's.
GraphSize workload_sized(const Tally& t, int gpus) {
  GraphSize g = t.result();
  g.value = std::to_string(gpus);
  return g;
}

// planner/lowering/lowering_baselines.cc (FSDP2, ZeRO, MegaTrain) on counts.
class BaselineCounter {
 public:
  BaselineCounter(const BaselineSetup& setup, const WorkloadContext& ctx, const LoweringOptions& options)
      : s_(setup), m_(ctx.model), traits_(baseline_traits(setup.system, ctx.workload.gpus)), params_(model_params(ctx.model)),
        P_(ctx.workload.gpus), C_(ctx.workload.gpus_per_seq()),
        layers_(options.decoder_layers > 0 ? std::min(options.decoder_layers, m_.layers) : m_.layers),
        emit_(options.symmetric_nodes && lowering::whole_nodes_alike(ctx.hardware, P_) ? ctx.hardware.gpus_per_node : P_),
        t_(emit_, ctx.hardware.gpus_per_node) {}

  GraphSize run() {
    for (micro_ = 0; micro_ < s_.accumulation_steps; ++micro_) {
      deliver();  // the embedding
      t_.each(2);
      for (int l = 0; l < layers_; ++l) {
        deliver();
        t_.each(1);  // the boundary to the host
        decoder_compute(l, false);
      }
      deliver();  // the head
      t_.each(2);
      t_.each(1);
      gradients();
      for (int l = layers_ - 1; l >= 0; --l) decoder_backward(l);
      t_.each(2);  // the embeddings' scatter
      gradients();
    }
    // Updates after the backward: one per gradient group of the last micro-batch.
    if (!traits_.optimizer_overlaps_backward) {
      t_.each(2, pending_);
      if (traits_.publishes_bf16) t_.each(1, pending_);
    }
    return workload_sized(t_, P_);
  }

 private:
  bool sharded() const { return traits_.sharded_params && P_ > 1; }
  void deliver() {
    t_.each(1);
    if (sharded()) t_.collective({P_, P_, false});
  }
  int expert_units(int l) const {
    return decoder_units(params_.layers[static_cast<std::size_t>(l)], traits_.sharded_params ? s_.expert_units : 1).expert_units;
  }
  void mixing_core(int l, bool backward) {
    const bool attention = m_.layer_kinds[static_cast<std::size_t>(l)] != LayerKind::kLinearAttention;
    if (attention && C_ > 1) t_.collective({P_, C_, false}, backward ? 2 : 1);
    t_.each(1);
    if (!attention && C_ > 1) {
      t_.collective({P_, C_, false}, C_ - 1);
      t_.each(2);
    }
  }
  void decoder_compute(int l, bool recompute) {
    t_.each(2);
    mixing_core(l, false);
    t_.each(2);  // router and shared expert
    if (!m_.moe_layer(l)) {
      t_.each(1);
      return;
    }
    const int units = expert_units(l);
    if (units == 0) {
      t_.each(1);
      return;
    }
    for (int e = 0; e < units; ++e) {
      deliver();
      t_.each(3);
    }
    (void)recompute;
  }
  void decoder_backward(int l) {
    deliver();
    t_.each(1);  // the boundary back
    decoder_compute(l, true);
    const int units = m_.moe_layer(l) ? expert_units(l) : 0;
    if (units > 0) {
      for (int e = 0; e < units; ++e) {
        deliver();
        t_.each(3);
        gradients();
      }
    } else if (m_.moe_layer(l)) {
      t_.each(1);
    }
    t_.each(1);  // router backward
    mixing_core(l, true);
    t_.each(2);  // projections' backward
    gradients();
  }
  void gradients() {
    if (sharded()) t_.collective({P_, P_, false});
    t_.each(2);  // D2H
    const bool host_sum = !traits_.sharded_params ? P_ > 1 || micro_ > 0 : micro_ > 0;
    if (host_sum) t_.each(1);
    if (micro_ + 1 != s_.accumulation_steps) return;
    if (traits_.optimizer_overlaps_backward) {
      t_.each(std::min(P_, emit_));
      if (traits_.publishes_bf16) t_.each(1);
    } else {
      ++pending_;
    }
  }

  const BaselineSetup s_;
  const ModelSpec& m_;
  const BaselineTraits traits_;
  const ModelParams params_;
  const int P_, C_, layers_, emit_;
  Tally t_;
  int micro_ = 0;
  int pending_ = 0;  // gradient groups updated after the backward
};

}  // namespace

double max_stages_default() { return g_max_stages.load(); }
void set_max_stages_default(double max_stages) { g_max_stages.store(max_stages); }

GraphSize estimate_step_graph(const Plan& plan, const WorkloadContext& ctx, const LoweringOptions& options) {
  return StepCounter(plan, ctx, options).run();
}

std::string graph_size_refusal(const GraphSize& size, double max_stages) {
  return fmt::format("would lower to {:.3g} stages (limit {:.3g}; --max-stages raises it)", size.stages, max_stages);
}

void check_graph_size(const GraphSize& size, const LoweringOptions& options, const std::string& plan_file,
                      const std::string& workload_file) {
  if (size.stages <= options.max_stages) return;
  throw InputError(size.plan_field ? plan_file : workload_file, size.field, size.value, graph_size_refusal(size, options.max_stages));
}

void check_step_graph_size(const Plan& plan, const WorkloadContext& ctx, const LoweringOptions& options,
                           const std::string& plan_file, const std::string& workload_file) {
  check_graph_size(estimate_step_graph(plan, ctx, options), options, plan_file, workload_file);
}

}  // namespace oom

namespace oom {

GraphSize estimate_baseline_graph(const BaselineSetup& setup, const WorkloadContext& ctx, const LoweringOptions& options) {
  return BaselineCounter(setup, ctx, options).run();
}

GraphSize estimate_ktft_graph(const BaselineSetup& setup, const WorkloadContext& ctx, const LoweringOptions& options) {
  // planner/lowering/baselines_ktft.cc on counts: every rank's stages.
  const ModelSpec& m = ctx.model;
  const int P = ctx.workload.gpus;
  const int layers = options.decoder_layers > 0 ? std::min(options.decoder_layers, m.layers) : m.layers;
  Tally t(P, ctx.hardware.gpus_per_node);
  const RankGroups all{P, P, false};
  const double micro = setup.accumulation_steps;
  const auto deliver = [&](double times) {
    t.each(1, times);
    if (P > 1) t.collective(all, times);
  };
  int moe_layers = 0;
  for (int l = 0; l < layers; ++l) moe_layers += m.moe_layer(l) ? 1 : 0;
  // Per micro-batch, decoder and pass (forward, recompute, backward): its weights, their
  // readiness, the mixing's projections and core, the router; a MoE decoder's experts on rank 0's
  // host (every rank's input gathered to rank 0, out, the CPU experts, the output back, scattered);
  // the backward's gradient reduce-scatter and D2H.
  deliver(3 * micro * layers);
  t.each(2, 3 * micro * layers);
  t.each(1, 3 * micro * layers * 3);
  t.each(static_cast<double>(P), 3 * micro * moe_layers * 3 / P);  // rank 0's three stages
  if (P > 1) t.collective(all, 3 * micro * moe_layers * 2);
  if (P > 1) t.collective(all, micro * layers);
  t.each(1, micro * layers);
  // The head: its weights, forward and backward; the optimizer: the gradients' join and the update.
  deliver(micro);
  t.each(1, 2 * micro);
  t.each(2 * micro * layers, 1);
  t.each(1, 1);
  return workload_sized(t, P);
}

GraphSize estimate_megatron_graph(const MegatronSetup& setup, const WorkloadContext& ctx, const LoweringOptions& options) {
  // planner/lowering/baselines_megatron.cc on counts: every rank's stages (one node).
  const ModelSpec& m = ctx.model;
  const int P = ctx.workload.gpus;
  const int layers = options.decoder_layers > 0 ? std::min(options.decoder_layers, m.layers) : m.layers;
  const int tp = setup.tensor_parallel, ep = setup.expert_parallel, dp = setup.data_parallel;
  Tally t(P, ctx.hardware.gpus_per_node);
  const RankGroups tensor{P, tp, false}, experts{P, ep, false}, data{P, tp, true};
  const auto exchange = [&](double times) {
    if (tp > 1) t.collective(tensor, times);
  };
  for (int l = 0; l < layers; ++l) {
    // Three passes (forward, recompute, backward) per micro-batch.
    const double times = 3.0 * setup.accumulation_steps;
    exchange(2 * times);  // the mixing's all-gather and reduce-scatter
    t.each(2, 2 * times);
    exchange(2 * times);  // the MoE sublayer's
    t.each(2, times);
    if (!m.moe_layer(l)) continue;
    if (ep > 1) t.collective(experts, 2 * times);
    t.each(2, times);
  }
  t.each(2, 4.0 * setup.accumulation_steps);  // embedding forward and backward, head forward and backward
  if (dp > 1) t.collective(data, 2);
  t.each(2, 3);
  return workload_sized(t, P);
}

}  // namespace oom
