#include "planner/lowering/lowering.h"

#include <algorithm>

#include <fmt/format.h>

#include "costmodel/input_error.h"
#include "costmodel/traffic.h"
#include "planner/lowering/graph_size_estimate.h"
#include "planner/lowering/memory_report.h"
#include "planner/lowering/operator_counts.h"

namespace oom {
namespace lowering {
namespace {

// Bytes a GPU AdamW step touches per parameter: FP32 master and two moments read and written,
// the BF16 gradient read and the BF16 weight written.
constexpr Bytes kGpuAdamBytesPerParam = 2 * kCanonicalBytesPerParam + kBf16Bytes + kBf16Bytes;

void append(std::vector<StageId>& to, const PerRank& from, int rank) {
  if (from.empty()) return;
  const StageId s = from[static_cast<std::size_t>(rank)];
  if (s >= 0 && std::find(to.begin(), to.end(), s) == to.end()) to.push_back(s);
}

// The largest latency and smallest sustained rate from node `node` to the other nodes in `nodes`.
std::pair<Seconds, BytesPerS> farthest_view(const HardwareSpec& h, int node, const std::vector<int>& nodes) {
  Seconds latency = 0;
  BytesPerS rate = h.network.per_node_Bps();
  for (const int other : nodes) {
    if (other == node) continue;
    latency = std::max(latency, h.network.latency_between(node, other));
    rate = std::min(rate, h.network.sustained_Bps(node, other));
  }
  return {latency, rate};
}

// Whether every node sees the members of its EP group (`group` consecutive ranks of `P`) and of
// its shard's replica set (every group-th rank) as node 0 does: groups of whole nodes or within
// one node, each the same latency and rate away.
bool groups_alike(const HardwareSpec& h, int P, int group) {
  const int G = h.gpus_per_node;
  if (group == P) return true;
  if (group % G != 0 && G % group != 0) return false;
  const auto nodes_of = [&](const std::vector<int>& ranks) {
    std::vector<int> nodes;
    for (const int q : ranks) {
      if (nodes.empty() || nodes.back() != q / G) nodes.push_back(q / G);
    }
    return nodes;
  };
  const auto view = [&](int node) {
    const int rank = node * G;
    return std::make_pair(farthest_view(h, node, nodes_of(RankGroups{P, group, false}.members(rank))),
                          farthest_view(h, node, nodes_of(RankGroups{P, group, true}.members(rank))));
  };
  const auto first = view(0);
  for (int node = 1; node < P / G; ++node) {
    if (view(node) != first) return false;
  }
  return true;
}

// Whether every node of the step runs the same schedule: whole nodes, more than one, every rank
// of every decoder with the same routing load and LLEP exchange, no Ring-DTP head (its ring
// crosses the nodes in one direction), and each node at the same largest latency and smallest
// sustained rate from the others (what the duration model prices a collective over all of them by),
// and from the other members of its EP group and replica set.
bool nodes_run_alike(const Plan& plan, const WorkloadContext& ctx, const std::vector<LlepBalance>& routing) {
  if (!whole_nodes_alike(ctx.hardware, ctx.workload.gpus) || plan.flat.ring_dtp(ctx.workload.gpus)) return false;
  if (!groups_alike(ctx.hardware, ctx.workload.gpus, plan.ep_group(ctx.workload.gpus))) return false;
  if (!groups_alike(ctx.hardware, ctx.workload.gpus, plan.context_parallel())) return false;
  for (const LlepBalance& b : routing) {
    for (std::size_t r = 1; r < b.loads.size(); ++r) {
      if (b.loads[r] != b.loads[0]) return false;
    }
    for (std::size_t r = 1; r < b.fetched.size(); ++r) {
      if (b.fetched[r] != b.fetched[0] || b.lent[r] != b.lent[0]) return false;
    }
  }
  return true;
}

// The loss keeps only each token's log-sum-exp, never the logits (backend/model/model.cc
// ChunkedCrossEntropy, plan_ops ring_backward): its backward computes every block's logits again
// before their two products, dL/dx and dL/dW.
inline constexpr double kLossBackwardRatio = 1 + kMatmulBackwardRatio;
// What that backward moves through HBM: the recomputed logits written and capped again (the
// forward's passes but its log-sum-exp read), then the softmax gradient's own.
Bytes loss_backward_with_recompute_hbm_bytes(const ModelSpec& m, std::int64_t tokens) {
  return loss_forward_hbm_bytes(m, tokens) - tokens * std::int64_t{m.vocab} * kFp32Bytes + loss_backward_hbm_bytes(m, tokens);
}

}  // namespace

bool runs_llep(const Plan& plan, int gpus) {
  return plan.path == ExpertPath::kEp && plan.ep_group(gpus) > 1 && plan.flat.expert_dispatch == ExpertDispatch::kPipelinedLlep;
}

std::vector<LlepBalance> rank_routing(const Plan& plan, const WorkloadContext& ctx, int layers) {
  const int P = ctx.workload.gpus;
  const bool ep = plan.path == ExpertPath::kEp;
  const int E = plan.ep_group(P);
  std::vector<LlepBalance> routing = ep_layer_balance(ctx.workload.routing, ctx.model.moe.experts, layers, ep ? E : 1, runs_llep(plan, P));
  if (ep && P / E > 1) {
    const auto tile = [&](auto& v) {
      for (int r = E; r < P; ++r) v.push_back(v[static_cast<std::size_t>(r % E)]);
    };
    for (LlepBalance& b : routing) {
      tile(b.loads);
      tile(b.fetched);
      tile(b.lent);
    }
  }
  return routing;
}

int emitted_ranks(const Plan& plan, const WorkloadContext& ctx, const LoweringOptions& options, const std::vector<LlepBalance>& routing) {
  const bool alike = options.symmetric_nodes && plan.path == ExpertPath::kEp && nodes_run_alike(plan, ctx, routing);
  return alike ? ctx.hardware.gpus_per_node : ctx.workload.gpus;
}

bool whole_nodes_alike(const HardwareSpec& h, int P) {
  const int G = h.gpus_per_node;
  if (G <= 0 || P <= G || P % G != 0) return false;
  const int nodes = P / G;
  std::vector<int> all(static_cast<std::size_t>(nodes));
  for (int n = 0; n < nodes; ++n) all[static_cast<std::size_t>(n)] = n;
  const auto first = farthest_view(h, 0, all);
  for (int node = 1; node < nodes; ++node) {
    if (farthest_view(h, node, all) != first) return false;
  }
  return true;
}

std::size_t Lowering::KeyHash::operator()(const StageKey& k) const {
  std::size_t h = 0;
  for (const int v : {k.rank, static_cast<int>(k.phase), k.micro_batch, k.decoder, static_cast<int>(k.part), k.sub_batch, k.repeat,
                      k.chunk, k.head_group, k.ring_step, k.bucket, static_cast<int>(k.op), static_cast<int>(k.join)}) {
    h = h * 1000003u ^ static_cast<std::size_t>(v + 7);
  }
  return h;
}

StageId Lowering::add(Stage s) {
  if (emit_ >= P_) return b_.add(std::move(s));
  StageKey k = s.key;
  if (k.rank < emit_) {
    const StageId id = b_.add(std::move(s));
    representative_[k] = id;  // the latest stage of the key: a repeat replaces the earlier one
    return id;
  }
  k.rank %= emit_;
  const auto it = representative_.find(k);
  OOM_ASSERT(it != representative_.end(), "a mirrored rank's stage before its representative's");
  return it->second;
}

RankResources add_rank_resources(StepGraphBuilder& b, const HardwareSpec& h, int rank, int ranks,
                                 bool expert_grad_stream) {
  const int r = rank;
  RankResources rr;
  rr.numa = h.numa_of_rank(r, ranks);
  rr.compute = b.add_resource(ResourceKind::kGpuCompute, gpu_compute_resource_name(r), r, -1);
  rr.h2d = b.add_resource(ResourceKind::kH2d, fmt::format("gpu{}.h2d", r), r, rr.numa);
  rr.d2h = b.add_resource(ResourceKind::kD2h, fmt::format("gpu{}.d2h", r), r, rr.numa);
  if (expert_grad_stream) {
    rr.expert_d2h = b.add_resource(ResourceKind::kExpertGradD2h, fmt::format("gpu{}.expert_grad_d2h", r), r, rr.numa);
  }
  rr.fabric = b.add_resource(ResourceKind::kFabric, fmt::format("gpu{}.fabric", r), r, -1);
  rr.cpu = b.add_resource(ResourceKind::kCpuUpdate, fmt::format("numa{}.cpu_update.r{}", rr.numa, r), r, rr.numa);
  rr.prep = b.add_resource(ResourceKind::kHostPrep, fmt::format("numa{}.host_prep.r{}", rr.numa, r), r, rr.numa);
  return rr;
}

Lowering::Lowering(const Plan& plan, const WorkloadContext& ctx, const LoweringOptions& options)
    : plan_(plan),
      ctx_(ctx),
      m_(ctx.model),
      options_(options),
      params_(model_params(ctx.model)),
      b_(ctx.workload.gpus, ctx.hardware.host_numa_count(ctx.workload.gpus)) {
  P_ = ctx.workload.gpus;
  ep_ = plan.path == ExpertPath::kEp;
  E_ = plan.ep_group(P_);
  D_ = P_ / E_;
  if (!ep_) check_local_applies(ctx);
  layers_ = options.decoder_layers > 0 ? std::min(options.decoder_layers, m_.layers) : m_.layers;
  C_ = ep_ ? plan.context_parallel() : 1;
  seqs_ = ctx.workload.seqs_per_gpu();
  S_ = ctx.workload.seq_len / C_;
  span_ = ctx.workload.seq_len;
  N_ = seqs_ * S_;
  for (int r = 0; r < P_; ++r) r_.push_back(add_rank_resources(b_, ctx.hardware, r, P_, /*expert_grad_stream=*/true));
  last_compute_.assign(static_cast<std::size_t>(P_), -1);
  slot_last_use_[0].assign(static_cast<std::size_t>(P_), -1);
  slot_last_use_[1].assign(static_cast<std::size_t>(P_), -1);
  last_update_.assign(static_cast<std::size_t>(P_), -1);
  // Routing: each rank's share of a dispatch (skewed routing makes some ranks receive more);
  // PipelinedLLEP spills the excess to the least-loaded ranks.
  // Every EP group routes its own tokens alike: rank r has the balance of its place r mod E.
  llep_ = runs_llep(plan, P_);
  routing_ = rank_routing(plan, ctx, layers_);
  for (int l = 0; l < layers_; ++l) largest_share_.push_back(largest_expert_share(ctx.workload.routing, m_.moe.experts, l));
  emit_ = emitted_ranks(plan, ctx, options, routing_);
}

ParamCount Lowering::expert_params_on_gpu(int layer) const {
  const ParamCount bank = params_.layers[static_cast<std::size_t>(layer)].routed_experts;
  return ep_ ? bank / E_ : bank;
}

ParamCount Lowering::expert_params_h2d(int layer) const {
  const ParamCount bank = params_.layers[static_cast<std::size_t>(layer)].routed_experts;
  // EP: the shard, or with replicas the 1/D of it this rank's host updates (the rest all-gathered).
  if (ep_) return plan_.is_resident(layer) ? 0 : bank / E_ / D_;
  return plan_.param_transfer == ParamTransfer::kShard ? bank / P_ : bank;
}

std::int64_t Lowering::live_seqs() const {
  return (!ep_ && plan_.split.sub_batch_seqs > 0) ? std::min(plan_.split.sub_batch_seqs, seqs_) : seqs_;
}

std::vector<std::int64_t> Lowering::moe_chunks(std::int64_t tokens) const {
  const std::int64_t c = ep_ ? plan_.routing_chunk_tokens : plan_.split.moe_chunk_tokens;
  std::vector<std::int64_t> out;
  if (c <= 0 || c >= tokens) return {tokens};
  for (std::int64_t done = 0; done < tokens; done += c) out.push_back(std::min(c, tokens - done));
  return out;
}

Stage Lowering::make(const StageWhat& what, OpKind op, Phase phase, ResourceId res, int rank, int layer) const {
  Stage s = keyed_stage(what, op, phase, res, rank, layer);
  s.key.sub_batch = sub_batch_;
  return s;
}

void Lowering::gpu_alloc(StageId s, int rank, Bytes bytes, bool at_end, MemoryUse use) {
  if (bytes > 0) b_.graph().stages[static_cast<std::size_t>(s)].memory.push_back({MemorySpace::kGpu, rank, bytes, at_end, use});
}
void Lowering::gpu_free(StageId s, int rank, Bytes bytes, MemoryUse use) {
  if (bytes > 0) b_.graph().stages[static_cast<std::size_t>(s)].memory.push_back({MemorySpace::kGpu, rank, -bytes, true, use});
}
void Lowering::host_alloc(StageId s, int rank, Bytes bytes, bool at_end) {
  if (bytes > 0) {
    b_.graph().stages[static_cast<std::size_t>(s)].memory.push_back({MemorySpace::kHost, r_[static_cast<std::size_t>(rank)].numa, bytes, at_end});
  }
}
void Lowering::host_free(StageId s, int rank, Bytes bytes) {
  if (bytes > 0) {
    b_.graph().stages[static_cast<std::size_t>(s)].memory.push_back({MemorySpace::kHost, r_[static_cast<std::size_t>(rank)].numa, -bytes, true});
  }
}

OperatorRun Lowering::operator_run(const StageWhat& what, Phase phase) const {
  OperatorRun run;
  run.pass = phase == Phase::kBackward                                  ? OperatorPass::kBackward
             : replaying_ || what.op == StageOp::kCoreRefwd ? OperatorPass::kReplay
                                                             : OperatorPass::kForward;
  run.first_in_layer = sub_batch_ <= 0;
  run.experts_over_ranks = ep_ && E_ > 1;
  run.moe_retained = moe_retained_;
  run.context_ranks = C_;
  run.context_chain = context_chain_;
  return run;
}

void Lowering::collective_operators(const PerRank& stages, const StageWhat& what, Phase phase, int layer, const OpShape& shape) {
  const std::int64_t ops = backend_operators(m_, layer, what.part, what.op, operator_run(what, phase), shape);
  for (int r = 0; r < emit_; ++r) b_.graph().stages[static_cast<std::size_t>(stages[static_cast<std::size_t>(r)])].ops = ops;
}

PerRank Lowering::compute_all(const StageWhat& what, OpKind op, Phase phase, int layer, Flops flops, Bytes bytes,
                              const OpShape& shape, const std::vector<PerRank>& deps) {
  const std::int64_t ops = op_calls_ * backend_operators(m_, layer, what.part, what.op, operator_run(what, phase), shape);
  const PerRank out = stages_per_rank(
      P_, emit_,
      [&](int r) {
        Stage s = make(what, op, phase, r_[static_cast<std::size_t>(r)].compute, r, layer);
        s.flops = flops;
        s.bytes = bytes;
        s.shape = shape;
        s.ops = ops;
        for (const auto& d : deps) append(s.deps, d, r);
        return s;
      },
      [&](Stage s) { return add(std::move(s)); });
  last_compute_ = out;
  return out;
}

RankGroups Lowering::groups(Over over) const { return over_groups(over, P_, E_, C_); }

PerRank Lowering::collective_all(const StageWhat& what, OpKind op, Phase phase, int layer, Bytes bytes_per_rank,
                                 const PerRank& inputs, Over over) {
  return collective_stages(
      groups(over), emit_, ctx_.hardware.gpus_per_node, inputs,
      [&](int r) {
        Stage s = make(what, op, phase, r_[static_cast<std::size_t>(r)].fabric, r, layer);
        s.bytes = bytes_per_rank;
        return s;
      },
      [&](Stage s) { return add(std::move(s)); });
}

PerRank Lowering::collective_each(const StageWhat& what, OpKind op, Phase phase, int layer,
                                  const std::vector<Bytes>& bytes_of_rank, const PerRank& inputs, Over over) {
  PerRank out = collective_all(what, op, phase, layer, 0, inputs, over);
  for (int r = 0; r < emit_; ++r) {  // the emitted members (the others are theirs)
    b_.graph().stages[static_cast<std::size_t>(out[static_cast<std::size_t>(r)])].bytes = bytes_of_rank[static_cast<std::size_t>(r)];
  }
  return out;
}

PerRank Lowering::compute_loaded(const StageWhat& what, OpKind op, Phase phase, int layer, Flops flops, Bytes bytes,
                                 OpShape shape, const std::vector<double>& load, const std::vector<PerRank>& deps) {
  PerRank out = compute_all(what, op, phase, layer, flops, bytes, shape, deps);
  for (int r = 0; r < emit_; ++r) {  // the emitted ranks (the others are theirs)
    const double f = load[static_cast<std::size_t>(r)];
    Stage& s = b_.graph().stages[static_cast<std::size_t>(out[static_cast<std::size_t>(r)])];
    s.flops = flops * f;
    s.bytes = static_cast<Bytes>(static_cast<double>(bytes) * f);
    s.shape.tokens = static_cast<std::int64_t>(std::llround(static_cast<double>(shape.tokens) * f));
  }
  return out;
}

WindowUse Lowering::deliver_weights(StagePart part, Phase phase, int layer, ParamCount common,
                                    ParamCount expert_h2d, ParamCount expert_total, Over allgather) {
  WindowUse use;
  use.slot = window_uses_++ % 2;
  use.bytes = working_weight_bytes(common + expert_total);
  window_slot_bytes_ = std::max(window_slot_bytes_, use.bytes);
  use.ready.assign(static_cast<std::size_t>(P_), -1);
  const PerRank& previous = slot_last_use_[static_cast<std::size_t>(use.slot)];
  PerRank shard_copies(static_cast<std::size_t>(P_), -1);
  for (int r = 0; r < P_; ++r) {
    const auto& rr = r_[static_cast<std::size_t>(r)];
    Stage s = make(what(part, StageOp::kH2d), OpKind::kH2d, phase, rr.h2d, r, layer);
    s.bytes = working_weight_bytes(common + expert_h2d);
    // The copy goes through the pinned staging pool in transfer_chunk_mib pieces.
    const Bytes chunk = std::max<std::int64_t>(1, plan_.transfer_chunk_mib) * kMiB;
    s.transfers = std::max<Bytes>(1, (s.bytes + chunk - 1) / chunk);
    append(s.deps, previous, r);  // buffer reuse: the slot's previous consumer has finished
    const StageId copy = add(std::move(s));
    use.ready[static_cast<std::size_t>(r)] = copy;
    shard_copies[static_cast<std::size_t>(r)] = copy;
  }
  if (member_count(allgather) > 1) {
    // Each rank receives the other members' shards: (n−1)/n of what it holds.
    const Bytes received = working_weight_bytes(expert_total - expert_h2d);
    use.ready = collective_all(what(part, StageOp::kAllGather), OpKind::kAllGather, phase, layer, received, shard_copies, allgather);
    // The local shard is staged beside the slot until the all-gather has rebuilt the bank.
    for (int r = 0; r < P_; ++r) {
      gpu_alloc(shard_copies[static_cast<std::size_t>(r)], r, working_weight_bytes(expert_h2d));
      gpu_free(use.ready[static_cast<std::size_t>(r)], r, working_weight_bytes(expert_h2d));
    }
  }
  return use;
}

void Lowering::release_window(const WindowUse& use, const PerRank& last) {
  slot_last_use_[static_cast<std::size_t>(use.slot)] = last;
}

PerRank Lowering::reduce_scatter(StagePart part, int layer, ParamCount params_on_gpu, const PerRank& ready,
                                 Over reduce, ParamCount& sent) {
  sent = params_on_gpu;
  const int n = member_count(reduce);
  if (n == 1) return ready;
  // Each rank sends (n−1)/n of its gradient and keeps the reduced 1/n.
  sent = params_on_gpu / n;
  return collective_all(what(part, StageOp::kReduceScatter), OpKind::kReduceScatter, Phase::kBackward, layer,
                        gradient_bytes(params_on_gpu) * (n - 1) / n, ready, reduce);
}

PerRank Lowering::gradient_d2h(const StageWhat& what, int layer, Bytes bytes, Bytes freed, const PerRank& after,
                               bool expert_kind) {
  const int kind = expert_kind ? 1 : 0;
  const int index = grads_sent_[static_cast<std::size_t>(kind)]++;
  const auto& landings = slot_landings_[static_cast<std::size_t>(kind)];
  const int slots = std::max(1, plan_.cpu_grad_slots);
  PerRank out(static_cast<std::size_t>(P_));
  for (int r = 0; r < P_; ++r) {
    const auto& rr = r_[static_cast<std::size_t>(r)];
    Stage s = make(what, OpKind::kD2h, Phase::kBackward, expert_kind ? rr.expert_d2h : rr.d2h, r, layer);
    s.bytes = bytes;
    append(s.deps, after, r);
    // CPU gradient slot reuse: wait for the stage that consumed gradient index − slots.
    if (index >= slots) {
      OOM_ASSERT(index - slots < static_cast<int>(landings.size()), "gradient slot reused before its consumer was lowered");
      append(s.deps, landings[static_cast<std::size_t>(index - slots)], r);
    }
    out[static_cast<std::size_t>(r)] = add(std::move(s));
    gpu_free(out[static_cast<std::size_t>(r)], r, freed, MemoryUse::kOptimizer);
  }
  return out;
}

void Lowering::gradients_to_host(StagePart part, int layer, ParamCount params_on_gpu, const PerRank& ready,
                                 Over reduce, bool expert_kind, std::vector<PerRank>& d2h_out) {
  if (params_on_gpu <= 0) return;
  ParamCount sent = params_on_gpu;
  const PerRank after = reduce_scatter(part, layer, params_on_gpu, ready, reduce, sent);
  const PerRank out = gradient_d2h(what(part, StageOp::kGradD2h), layer, gradient_bytes(sent), gradient_bytes(params_on_gpu), after, expert_kind);
  d2h_out.push_back(out);
  pending_grad_frees_.push_back(out);
}

PerRank Lowering::host_accumulate(const StageWhat& what, int layer, ParamCount params, const std::vector<PerRank>& d2h) {
  // Local host reduction: each rank's executor adds its BF16 partial into the FP32 sum. Partials
  // are managed gradients (kind 0); the first one this accumulation consumes is `index`.
  auto& landings = slot_landings_[0];
  const auto& updates = slot_updates_[0];
  const int index = static_cast<int>(landings.size());
  const int slots = std::max(1, plan_.cpu_grad_slots);
  PerRank acc(static_cast<std::size_t>(P_));
  for (int r = 0; r < P_; ++r) {
    Stage s = make(what, OpKind::kHostAccumulate, Phase::kOptimizer, r_[static_cast<std::size_t>(r)].cpu, r, layer);
    s.params = params;
    s.bytes = gradient_bytes(params);
    for (const auto& d : d2h) append(s.deps, d, r);
    if (index >= slots) {
      OOM_ASSERT(index - slots < static_cast<int>(updates.size()), "FP32 sum slot reused before its update was lowered");
      append(s.deps, updates[static_cast<std::size_t>(index - slots)], r);
    }
    acc[static_cast<std::size_t>(r)] = add(std::move(s));
  }
  while (static_cast<int>(landings.size()) < grads_sent_[0]) landings.push_back(acc);
  return acc;
}

PerRank Lowering::update_and_publish(StagePart part, int bucket, int layer, ParamCount params,
                                     const std::vector<PerRank>& ready, bool after_every_rank) {
  PerRank upd(static_cast<std::size_t>(P_));
  std::vector<StageId> every_rank;  // after_every_rank: the distinct ready stages of all ranks, gathered once
  if (after_every_rank) {
    for (const auto& d : ready) {
      for (int q = 0; q < P_; ++q) append(every_rank, d, q);
    }
  }
  for (int r = 0; r < P_; ++r) {
    const auto& rr = r_[static_cast<std::size_t>(r)];
    Stage s = make(what(part, StageOp::kCpuAdamW).at_bucket(bucket), OpKind::kCpuAdamW, Phase::kOptimizer, rr.cpu, r, layer);
    s.params = params;
    s.bytes = canonical_state_bytes(params);
    if (after_every_rank) {
      s.deps = every_rank;
    } else {
      for (const auto& d : ready) append(s.deps, d, r);
    }
    upd[static_cast<std::size_t>(r)] = add(std::move(s));
    // Weight publication: BF16 staging of the updated masters for the next step's copies.
    Stage p = make(what(part, StageOp::kPublish).at_bucket(bucket), OpKind::kHostPrep, Phase::kOptimizer, rr.prep, r, layer);
    p.params = params;
    p.bytes = working_weight_bytes(params);
    p.deps.push_back(upd[static_cast<std::size_t>(r)]);
    add(std::move(p));
  }
  last_update_ = upd;
  return upd;
}

void Lowering::record_consumer(int kind, const PerRank& update) {
  auto& updates = slot_updates_[static_cast<std::size_t>(kind)];
  auto& landings = slot_landings_[static_cast<std::size_t>(kind)];
  const int sent = grads_sent_[static_cast<std::size_t>(kind)];
  while (static_cast<int>(updates.size()) < sent) updates.push_back(update);
  while (static_cast<int>(landings.size()) < sent) landings.push_back(update);  // not accumulated: the update read it
}

void Lowering::cpu_update(StagePart part, int layer, ParamCount params_per_rank, const std::vector<PerRank>& d2h,
                          bool accumulate_partials, ParamCount partial_params) {
  if (d2h.empty() && params_per_rank <= 0) return;
  // With host accumulation, the update of any part waits for every rank's partial.
  const std::vector<PerRank> ready =
      accumulate_partials ? std::vector<PerRank>{host_accumulate(what(part, StageOp::kHostAccumulate), layer, partial_params, d2h)} : d2h;
  const PerRank upd = update_and_publish(part, -1, layer, params_per_rank, ready, accumulate_partials);
  // The updates free the CPU gradient slots of every gradient they consumed.
  for (int kind = 0; kind < 2; ++kind) record_consumer(kind, upd);
}

PerRank Lowering::gpu_adamw(StagePart part, int layer, ParamCount params, const PerRank& ready, ParamCount freed) {
  PerRank out = compute_all(what(part, StageOp::kGpuAdamW), OpKind::kGpuAdamW, Phase::kOptimizer, layer, 0,
                            params * kGpuAdamBytesPerParam, OpShape{}, {ready});
  const Bytes gradient = gradient_bytes(freed >= 0 ? freed : params);
  for (int r = 0; r < P_; ++r) gpu_free(out[static_cast<std::size_t>(r)], r, gradient, MemoryUse::kOptimizer);
  pending_grad_frees_.push_back(out);
  return out;
}

void Lowering::resident_update(int layer, ParamCount shard, const PerRank& ready) {
  if (shard <= 0) return;  // a decoder without routed experts (a dense first decoder) has no shard to update
  // Without replicas the reduce-scatter is none and the slice is the whole shard.
  ParamCount slice = shard;
  const PerRank reduced = reduce_scatter(StagePart::kExperts, layer, shard, ready, expert_replicas(), slice);
  const PerRank updated = gpu_adamw(StagePart::kExperts, layer, slice, reduced, shard);
  if (expert_replicas() != Over::kNone) {
    collective_all(what(StagePart::kExperts, StageOp::kAllGather), OpKind::kAllGather, Phase::kOptimizer, layer,
                   working_weight_bytes(shard - slice), updated, expert_replicas());
  }
}

void Lowering::stream_gradients(StagePart part, int layer, ParamCount params_on_gpu, const PerRank& ready,
                                Over reduce, bool expert_kind, bool accumulate_partials,
                                ParamCount update_params_per_rank) {
  if (params_on_gpu <= 0) return;
  ParamCount sent = params_on_gpu;
  const PerRank after = reduce_scatter(part, layer, params_on_gpu, ready, reduce, sent);
  const Bytes bucket_bytes = plan_.flat.optimizer_bucket_mib * kMiB;
  const std::int64_t buckets = std::max<std::int64_t>(1, (gradient_bytes(sent) + bucket_bytes - 1) / bucket_bytes);
  const int kind = expert_kind ? 1 : 0;
  const auto& updates = slot_updates_[static_cast<std::size_t>(kind)];
  PerRank d2h;
  for (std::int64_t i = 0; i < buckets; ++i) {
    // Even buckets; the last takes the remainder.
    const auto share = [&](auto total) { return total / buckets + (i + 1 == buckets ? total % buckets : 0); };
    const ParamCount part_params = share(sent);
    OOM_ASSERT(static_cast<int>(updates.size()) == grads_sent_[static_cast<std::size_t>(kind)],
               "streamed gradients are updated bucket by bucket");
    d2h = gradient_d2h(what(part, StageOp::kGradD2h).at_bucket(static_cast<int>(i)), layer, gradient_bytes(part_params),
                       share(gradient_bytes(params_on_gpu)), after, expert_kind);
    const PerRank ready_for_update =
        accumulate_partials ? host_accumulate(what(part, StageOp::kHostAccumulate).at_bucket(static_cast<int>(i)), layer, part_params, {d2h}) : d2h;
    record_consumer(kind, update_and_publish(part, static_cast<int>(i), layer, share(update_params_per_rank),
                                             {ready_for_update}, accumulate_partials));
  }
  pending_grad_frees_.push_back(d2h);
}

void Lowering::embedding_forward() {
  // The embedding passes the window like a layer; the lookup is a gather on HBM.
  const WindowUse w = deliver_weights(StagePart::kEmbedding, Phase::kForward, -1, params_.embedding, 0, 0, Over::kNone);
  OpShape shape;
  shape.tokens = N_;
  const PerRank gather = compute_all(what(StagePart::kEmbedding, StageOp::kGather), OpKind::kElementwise, Phase::kForward, -1, 0,
                                     boundary_bytes(1, seqs_, S_, m_.hidden), shape, {w.ready});
  release_window(w, gather);
}

void Lowering::head_forward_backward() {
  if (plan_.flat.ring_dtp(P_)) {
    ring_head_forward_backward();
    return;
  }
  const ParamCount head = (params_.lm_head > 0 ? params_.lm_head : params_.embedding) + params_.final_norm;
  const WindowUse w = deliver_weights(StagePart::kLmHead, Phase::kForward, -1, head, 0, 0, Over::kNone);
  const std::int64_t chunk = plan_.flat.logits_block_tokens(N_);
  const Bytes logits = logits_workspace_bytes(m_, chunk);
  OpShape shape;
  shape.tokens = N_;
  shape.k = m_.hidden;
  shape.n = m_.vocab;
  const Flops f = lm_head_flops(m_, N_);
  const PerRank fwd = compute_all(what(StagePart::kLmHead, StageOp::kLoss), OpKind::kGemm, Phase::kForward, -1, f,
                                  loss_forward_hbm_bytes(m_, N_), shape, {w.ready});
  const PerRank bwd = compute_all(what(StagePart::kLmHead, StageOp::kBackward), OpKind::kGemm, Phase::kBackward, -1, kLossBackwardRatio * f,
                                  loss_backward_with_recompute_hbm_bytes(m_, N_), shape, {fwd});
  // A tied head is the embedding table: its gradient starts here and the embeddings' backward adds
  // into it, one gradient with one D2H and one update (embedding_backward); the head's own group
  // is the final norm.
  const ParamCount head_group = m_.tied_embeddings ? params_.final_norm : head;
  for (int r = 0; r < P_; ++r) {
    gpu_alloc(fwd[static_cast<std::size_t>(r)], r, logits, false, MemoryUse::kVocabulary);
    gpu_free(fwd[static_cast<std::size_t>(r)], r, logits, MemoryUse::kVocabulary);
    gpu_alloc(bwd[static_cast<std::size_t>(r)], r, logits, false, MemoryUse::kVocabulary);
    gpu_alloc(bwd[static_cast<std::size_t>(r)], r, gradient_bytes(head), false, MemoryUse::kOptimizer);
    // Over more than one logits block the head's gradient is summed in FP32, then added in.
    if (chunk < N_) {
      gpu_alloc(bwd[static_cast<std::size_t>(r)], r, head_accumulator_bytes(head), false, MemoryUse::kOptimizer);
      gpu_free(bwd[static_cast<std::size_t>(r)], r, head_accumulator_bytes(head), MemoryUse::kOptimizer);
    }
    gpu_free(bwd[static_cast<std::size_t>(r)], r, logits, MemoryUse::kVocabulary);
    // The running gradient of the hidden states lives until the embedding's backward.
    gpu_alloc(bwd[static_cast<std::size_t>(r)], r, boundary_bytes(1, live_seqs(), S_, m_.hidden), false, MemoryUse::kActivations);
  }
  hidden_grad_alloc_ = bwd;
  release_window(w, bwd);
  if (streamed_optimizer()) {
    stream_gradients(StagePart::kLmHead, -1, head_group, bwd, Over::kAll, false, false, head_group / P_);
    return;
  }
  std::vector<PerRank> d2h;
  gradients_to_host(StagePart::kLmHead, -1, head_group, bwd, Over::kAll, false, d2h);
  cpu_update(StagePart::kLmHead, -1, head_group / P_, d2h, false, 0);
}

void Lowering::ring_head_forward_backward() {
  // Ring-DTP: rank r holds vocabulary shard r (V/P rows of the head). Each rank's hidden states
  // visit every shard: P steps, each computing one block of logits against the local shard and
  // folding it into the block's online log-sum-exp, while the next block arrives from the ring
  // neighbour. What circulates is the smaller of a rank's hidden block (N·h) and a head shard
  // ((V/P)·h), with what travels beside it (ring_dtp_hops); in the backward it travels with its
  // FP32 gradient partial (hidden-state or head-shard), so every rank ends with its shard's whole
  // gradient and its tokens' hidden-state gradient.
  const ParamCount head = (params_.lm_head > 0 ? params_.lm_head : params_.embedding);
  const ParamCount shard = head / P_ + params_.final_norm;
  const PerRank hidden = last_compute_;  // the last decoder's output: the block each rank starts with
  const WindowUse w = deliver_weights(StagePart::kLmHead, Phase::kForward, -1, shard, 0, 0, Over::kNone);
  const RingDtpHops hops = ring_dtp_hops(m_, N_, P_);
  const bool weights_move = hops.weights_move;
  const std::int64_t chunk = plan_.flat.logits_block_tokens(N_);
  const Bytes logits = sharded_logits_workspace_bytes(m_, chunk, P_);
  OpShape shape;
  shape.tokens = N_;
  shape.k = m_.hidden;
  shape.n = m_.vocab / P_;
  const Flops f = lm_head_flops(m_, N_) / P_;  // one block against one shard
  const Bytes fwd_bytes = loss_forward_hbm_bytes(m_, N_) / P_, bwd_bytes = loss_backward_with_recompute_hbm_bytes(m_, N_) / P_;
  // The ring's buffers (kVocabulary): a hop allocates what arrives when it starts and releases what
  // it sent (a block received earlier; this rank's own block or shard is not the ring's) when it
  // ends. The backward's blocks travel with their FP32 gradient partials; the last hop takes the
  // partials home alone. Each step holds one block, the one arriving during its hop, and one logits
  // block while it computes.
  const Bytes block = hops.forward, pair = hops.backward;
  const Bytes partial = weights_move ? (m_.vocab / P_) * m_.hidden * kFp32Bytes : N_ * m_.hidden * kFp32Bytes;
  const auto each = [&](const PerRank& at, auto&& fn) {
    for (int r = 0; r < P_; ++r) fn(at[static_cast<std::size_t>(r)], r);
  };
  PerRank last = w.ready, arrived = w.ready;
  for (int step = 0; step < P_; ++step) {
    last = compute_all(what(StagePart::kLmHead, StageOp::kLoss).at_ring_step(step), OpKind::kGemm, Phase::kForward, -1, f, fwd_bytes,
                       shape, {last, arrived});
    each(last, [&](StageId s, int r) {
      gpu_alloc(s, r, logits, false, MemoryUse::kVocabulary);
      gpu_free(s, r, logits, MemoryUse::kVocabulary);
    });
    if (step + 1 < P_) {
      arrived = collective_all(what(StagePart::kLmHead, StageOp::kPass).at_ring_step(step), OpKind::kAllGather, Phase::kForward, -1,
                               block, step == 0 ? (weights_move ? w.ready : hidden) : arrived);
      each(arrived, [&](StageId s, int r) {
        gpu_alloc(s, r, block, false, MemoryUse::kVocabulary);
        if (step > 0) gpu_free(s, r, block, MemoryUse::kVocabulary);
      });
    }
  }
  // The last block received: a shard is done with; a hidden block starts the backward.
  if (weights_move) each(last, [&](StageId s, int r) { gpu_free(s, r, block, MemoryUse::kVocabulary); });
  PerRank bwd = last;
  arrived = last;
  for (int step = 0; step < P_; ++step) {
    bwd = compute_all(what(StagePart::kLmHead, StageOp::kBackward).at_ring_step(step), OpKind::kGemm, Phase::kBackward, -1,
                      kLossBackwardRatio * f, bwd_bytes, shape, {bwd, arrived});
    each(bwd, [&](StageId s, int r) {
      // The partial starts here; a hidden block held from the forward becomes the backward's (its
      // targets and log-sum-exp, without the running state).
      if (step == 0) gpu_alloc(s, r, weights_move ? partial : pair - block, false, MemoryUse::kVocabulary);
      gpu_alloc(s, r, logits, false, MemoryUse::kVocabulary);
      gpu_free(s, r, logits, MemoryUse::kVocabulary);
    });
    // The partials move on; after the last step they return home (P hops in all).
    const bool home = step + 1 == P_;
    arrived = collective_all(what(StagePart::kLmHead, StageOp::kGradPass).at_ring_step(step), OpKind::kAllGather, Phase::kBackward, -1,
                             home ? partial : pair, bwd);
    each(arrived, [&](StageId s, int r) {
      gpu_alloc(s, r, home ? partial : pair, false, MemoryUse::kVocabulary);
      // What was sent: this rank's own shard is the window's, its partial the ring's.
      gpu_free(s, r, weights_move && step == 0 ? partial : pair, MemoryUse::kVocabulary);
    });
  }
  each(arrived, [&](StageId s, int r) {
    gpu_alloc(bwd[static_cast<std::size_t>(r)], r, gradient_bytes(shard), false, MemoryUse::kOptimizer);
    gpu_free(s, r, partial, MemoryUse::kVocabulary);  // the partial that came home, added in
    gpu_alloc(s, r, boundary_bytes(1, live_seqs(), S_, m_.hidden), false, MemoryUse::kActivations);
  });
  hidden_grad_alloc_ = arrived;
  last_compute_ = compute_all(what(StagePart::kLmHead, StageOp::kDone), OpKind::kSync, Phase::kBackward, -1, 0, 0, OpShape{}, {arrived});
  release_window(w, last_compute_);
  // Each shard's gradient is complete on its owner: no reduce-scatter.
  if (streamed_optimizer()) {
    stream_gradients(StagePart::kLmHead, -1, shard, last_compute_, Over::kNone, false, false, shard);
    return;
  }
  std::vector<PerRank> d2h;
  gradients_to_host(StagePart::kLmHead, -1, shard, last_compute_, Over::kNone, false, d2h);
  cpu_update(StagePart::kLmHead, -1, shard, d2h, false, 0);
}

void Lowering::embedding_backward() {
  OpShape shape;
  shape.tokens = N_;
  const PerRank scatter = compute_all(what(StagePart::kEmbedding, StageOp::kScatter), OpKind::kElementwise, Phase::kBackward, -1, 0,
                                      boundary_bytes(1, seqs_, S_, m_.hidden), shape, {last_compute_});
  // A tied table's gradient was allocated by the head's backward (unless Ring-DTP sharded the head).
  const bool allocated = m_.tied_embeddings && !plan_.flat.ring_dtp(P_);
  for (int r = 0; r < P_; ++r) {
    if (!allocated) gpu_alloc(scatter[static_cast<std::size_t>(r)], r, gradient_bytes(params_.embedding), false, MemoryUse::kOptimizer);
    gpu_free(scatter[static_cast<std::size_t>(r)], r, boundary_bytes(1, live_seqs(), S_, m_.hidden), MemoryUse::kActivations);
  }
  if (streamed_optimizer()) {
    stream_gradients(StagePart::kEmbedding, -1, params_.embedding, scatter, Over::kAll, false, false, params_.embedding / P_);
    return;
  }
  std::vector<PerRank> d2h;
  gradients_to_host(StagePart::kEmbedding, -1, params_.embedding, scatter, Over::kAll, false, d2h);
  cpu_update(StagePart::kEmbedding, -1, params_.embedding / P_, d2h, false, 0);
}

StepGraph Lowering::run() {
  // Base occupancy: M_0 + M_state on each GPU; on each NUMA node the static host footprint less
  // the boundaries and O/LSE, which the stages allocate and free themselves.
  const MemoryReport report = static_memory(ctx_, plan_, options_.memory);
  StepGraph& g = b_.graph();
  for (int r = 0; r < P_; ++r) g.gpu_base_bytes[static_cast<std::size_t>(r)] = report.gpu.eq2.fixed + report.gpu.eq2.state;
  for (const auto& h : report.host) {
    Bytes base = 0;
    for (const auto& item : h.items) {
      if (!item.per_step) base += item.bytes;
    }
    if (static_cast<std::size_t>(h.numa) < g.numa_base_bytes.size()) g.numa_base_bytes[static_cast<std::size_t>(h.numa)] = base;
  }
  g.gpu_headroom_fraction = options_.memory.gpu_headroom_fraction;

  embedding_forward();
  for (int l = 0; l < layers_; ++l) decoder_forward(l, Phase::kForward, true);
  head_forward_backward();
  for (int l = layers_ - 1; l >= 0; --l) decoder_backward(l);
  embedding_backward();
  // The two window slots are allocated once, each sized for the largest parameter group.
  for (auto& b : b_.graph().gpu_base_bytes) b += 2 * window_slot_bytes_;
  b_.graph().ranks_emitted = emit_ < P_ ? emit_ : 0;
  return b_.take();
}

}  // namespace lowering

StepGraph lower(const Plan& plan, const WorkloadContext& ctx, const LoweringOptions& options) {
  OOM_ASSERT(ctx.workload.gpus >= 1, "at least one GPU");
  check_step_graph_size(plan, ctx, options, "");
  lowering::Lowering l(plan, ctx, options);
  StepGraph g = l.run();
  OOM_ASSERT(check_step_graph(g, false).empty(), "lowering produced a malformed StepGraph");
  return g;
}

}  // namespace oom
