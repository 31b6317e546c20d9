// Lowering internals shared by the EP and Local lowerings (planner/lowering/step_graph.h's lower()).
//
// Not a public interface: lower() is. The Lowering class emits the stages of one step for every
// rank in lock step, so that a collective (all-to-all, all-gather, reduce-scatter) can depend on
// its members' inputs on every rank. Work is per GPU: P ranks run the same schedule on their own
// resources. The runtime rules of reference §3 become edges:
//   - two-slot parameter window: the H2D of a window use waits for the last consumer of the use
//     two before it (buffer reuse); both slots are allocated for the whole step, each sized for
//     the largest parameter group (part of the graph's base GPU bytes);
//   - CPU gradient slots (per kind: managed parameters, expert shards): the D2H of the i-th
//     gradient waits for the CPU update of gradient i − slots;
//   - compute waits for its weight version: compute stages depend on their window copy;
//   - an update waits for all its gradients: the CPU update depends on every D2H of its layer;
//   - one update executor per rank shared by managed parameters and expert shards;
//   - two GPU gradient buffers: a decoder's backward starts producing gradients only when the
//     buffer of the decoder two before it has been drained (D2H or GPU AdamW done);
//   - expert-gradient D2H on its own stream.
// Not thread-safe; one Lowering per call.
#pragma once

#include <algorithm>
#include <array>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "costmodel/flops.h"
#include "costmodel/memory.h"
#include "costmodel/params.h"
#include "planner/lowering/operator_counts.h"
#include "planner/lowering/step_graph.h"

namespace oom::lowering {

using PerRank = std::vector<StageId>;  // one stage per rank (−1: none)

// A partition of `ranks` ranks into the member sets of a collective: blocks of `size` consecutive
// ranks, or (`strided`) the ranks with the same residue modulo `size`.
struct RankGroups {
  int ranks = 1;
  int size = 1;
  bool strided = false;
  int first(int rank) const { return strided ? rank % size : rank / size * size; }  // the set's lowest rank
  int count() const { return strided ? ranks / size : std::min(size, ranks); }        // members per set
  std::vector<int> members(int rank) const {
    std::vector<int> out;
    const int step = strided ? size : 1, end = strided ? ranks : std::min(ranks, first(rank) + size);
    for (int q = first(rank); q < end; q += step) out.push_back(q);
    return out;
  }
};

struct RankResources {
  ResourceId compute = 0, h2d = 0, d2h = 0, expert_d2h = 0, fabric = 0, cpu = 0, prep = 0;
  int numa = 0;
};

// Whether `gpus` ranks fill whole nodes of `h`, more than one, each node at the same largest
// latency and smallest sustained rate from the others (what the duration model prices a
// collective over all of them by): the condition, besides identical work per rank, for one node's
// stages to stand for every node's (LoweringOptions::symmetric_nodes).
bool whole_nodes_alike(const HardwareSpec& h, int gpus);

// Whether the plan runs PipelinedLLEP over `gpus` GPUs: the EP path with more than one GPU per
// EP group.
bool runs_llep(const Plan& plan, int gpus);

// The routing the lowering prices for the first `layers` decoders: each rank's received dispatch
// load relative to the mean (after LLEP's rebalancing when the plan runs it) and the experts it
// fetches and lends; every EP group routes alike, so rank r has the balance of its place r mod E.
std::vector<LlepBalance> rank_routing(const Plan& plan, const WorkloadContext& ctx, int layers);

// The ranks whose stages a lowering emits (StepGraph::ranks_emitted): one node's when
// options.symmetric_nodes asks for it and every node runs the same schedule under `routing`
// (rank_routing), else every rank. The lowering and its size estimate (graph_size_estimate.h)
// both read it here.
int emitted_ranks(const Plan& plan, const WorkloadContext& ctx, const LoweringOptions& options, const std::vector<LlepBalance>& routing);

// Adds rank `rank`'s resources (of `ranks`) to `b`: its compute stream, H2D and D2H engines, the
// expert-gradient D2H stream when `expert_grad_stream` (else expert_d2h stays 0), its fabric port,
// and its CPU update executor and host preparation worker on the NUMA node the rank runs on.
RankResources add_rank_resources(StepGraphBuilder& b, const HardwareSpec& h, int rank, int ranks,
                                 bool expert_grad_stream);

// A stage of rank `rank` keyed by `what` in phase `phase`, decoder `layer` (−1: none) and
// micro-batch `micro_batch` (−1: none), on resource `res`: what every lowering starts a stage from.
inline Stage keyed_stage(const StageWhat& what, OpKind op, Phase phase, ResourceId res, int rank, int layer,
                         int micro_batch = -1) {
  Stage s;
  s.key = what.key(rank, phase, layer, micro_batch);
  s.op = op;
  s.resource = res;
  return s;
}

// Adds `from[r]` to the dependencies of `s` once (nothing when `from` is empty or has no stage for r).
inline void add_dep_once(Stage& s, const PerRank& from, int r) {
  if (from.empty()) return;
  const StageId d = from[static_cast<std::size_t>(r)];
  if (d >= 0 && std::find(s.deps.begin(), s.deps.end(), d) == s.deps.end()) s.deps.push_back(d);
}

// One stage per rank of `ranks`: `make_stage(r)` handed to `add` for the emitted ranks 0..emit−1;
// every other rank r takes its representative's, rank r mod emit (LoweringOptions::symmetric_nodes;
// emit = ranks: every rank's own).
template <class Make, class Add>
PerRank stages_per_rank(int ranks, int emit, Make make_stage, Add add) {
  PerRank out(static_cast<std::size_t>(ranks));
  for (int r = 0; r < ranks; ++r) {
    out[static_cast<std::size_t>(r)] = r < emit ? add(make_stage(r)) : out[static_cast<std::size_t>(r % emit)];
  }
  return out;
}

// What every member of a collective waits for, given each member q's input `inputs[q]` (−1 or
// absent: none); each member also waits for its own rank's input (add_dep_once). Members on one
// node wait for the distinct inputs themselves, which keeps every single-node graph as it was.
// Across nodes (rank r on node r / gpus_per_node) they wait for one join: a zero-work stage, made
// from `first` (the first member's stage) with ".join" in its key, that waits for the inputs. A
// collective then adds P dependencies instead of P², so a step's graph grows linearly with its
// GPUs. The join follows the first member's previous stage on its port, so the members also wait
// for that member's previous collective, as NCCL's collectives on one communicator follow each
// other on every rank (the same times where members finish together: uniform routing, every
// baseline). `add` adds a stage and returns its id.
template <class Add>
std::vector<StageId> collective_waits(int gpus_per_node, const std::vector<int>& peers, const PerRank& inputs, Stage first,
                                      Add add) {
  std::vector<StageId> waits;
  if (inputs.empty() || peers.empty()) return waits;
  const int per_node = std::max(1, gpus_per_node);
  const bool across = std::any_of(peers.begin(), peers.end(), [&](int q) { return q / per_node != peers.front() / per_node; });
  for (const int q : peers) {
    const StageId d = inputs[static_cast<std::size_t>(q)];
    if (d >= 0 && (across || std::find(waits.begin(), waits.end(), d) == waits.end())) waits.push_back(d);
  }
  if (!across) return waits;
  std::sort(waits.begin(), waits.end());
  waits.erase(std::unique(waits.begin(), waits.end()), waits.end());
  first.key.join = true;
  first.op = OpKind::kSync;
  first.flops = 0;
  first.bytes = 0;
  first.peers.clear();
  first.deps = std::move(waits);
  return {add(std::move(first))};
}

// Which ranks a collective of the EP/Local lowering spans: none (no collective), every rank, the
// rank's EP group (Plan::ep_group_gpus consecutive ranks), the replicas of its expert shard
// (the rank at its place in every EP group), or the GPUs that share its sequence
// (Plan::context_parallel_gpus consecutive ranks).
enum class Over { kNone, kAll, kGroup, kReplicas, kContext };

// The member sets of a collective over `over` among `ranks` ranks in EP groups of `ep_group` GPUs
// and sequences over `context` GPUs (kNone: every rank alone).
inline RankGroups over_groups(Over over, int ranks, int ep_group, int context) {
  switch (over) {
    case Over::kNone: return {ranks, 1, false};
    case Over::kGroup: return {ranks, ep_group, false};
    case Over::kReplicas: return {ranks, ep_group, true};
    case Over::kContext: return {ranks, context, false};
    case Over::kAll: break;
  }
  return {ranks, ranks, false};
}

// How an expert shard reaches its replicas and its gradient leaves them over `gpus` GPUs:
// kReplicas when the plan's EP groups replicate each shard (Plan::ep_group_gpus), else kNone.
inline Over expert_replicas_over(const Plan& plan, int gpus) {
  return plan.path == ExpertPath::kEp && plan.ep_replicas(gpus) > 1 ? Over::kReplicas : Over::kNone;
}
// The all-gather that completes decoder `layer`'s expert weights in the window: over every rank
// (Local shard delivery), over the replicas (EP groups, a streamed shard), or none.
inline Over expert_allgather_over(const Plan& plan, int layer, int gpus) {
  if (plan.path != ExpertPath::kEp) return plan.param_transfer == ParamTransfer::kShard ? Over::kAll : Over::kNone;
  return plan.is_resident(layer) ? Over::kNone : expert_replicas_over(plan, gpus);
}

// One collective per member set of `groups`: each member's stage made by `make_stage(r)` (on its
// fabric port, with its bytes), with its set's PeerList (one list, shared by the set's stages), and
// waiting for every member's input (collective_waits: a join across nodes, made from the first
// member's stage) and its own. Ranks from `emit` on take their representatives' stages
// (stages_per_rank). `add` adds a stage and returns its id.
template <class Make, class Add>
PerRank collective_stages(const RankGroups& groups, int emit, int gpus_per_node, const PerRank& inputs, Make make_stage,
                          Add add) {
  std::map<int, std::pair<PeerList, std::vector<StageId>>> sets;  // by first member: members, what they wait for
  return stages_per_rank(
      groups.ranks, emit,
      [&](int r) {
        const int first = groups.first(r);
        auto it = sets.find(first);
        if (it == sets.end()) {
          PeerList peers = groups.members(r);
          std::vector<StageId> waits = collective_waits(gpus_per_node, peers, inputs, make_stage(first), add);
          it = sets.emplace(first, std::make_pair(std::move(peers), std::move(waits))).first;
        }
        Stage s = make_stage(r);
        s.peers = it->second.first;
        s.deps = it->second.second;
        add_dep_once(s, inputs, r);
        return s;
      },
      add);
}

// What a window use made available: the copies compute must wait for.
struct WindowUse {
  PerRank ready;       // last copy (or all-gather) per rank, −1 when nothing was copied
  int slot = 0;
  Bytes bytes = 0;     // per rank
};

class Lowering {
 public:
  Lowering(const Plan& plan, const WorkloadContext& ctx, const LoweringOptions& options);
  StepGraph run();

 private:
  // --- building blocks (lowering.cc) ---
  Stage make(const StageWhat& what, OpKind op, Phase phase, ResourceId res, int rank, int layer) const;
  // Adds a stage of an emitted rank; a stage of another rank (symmetric_nodes) is its
  // representative's, rank r mod emit_'s stage with the same key, added before it in lock step.
  StageId add(Stage s);
  void gpu_alloc(StageId s, int rank, Bytes bytes, bool at_end = false, MemoryUse use = MemoryUse::kOther);
  void gpu_free(StageId s, int rank, Bytes bytes, MemoryUse use = MemoryUse::kOther);  // at the stage's end
  void host_alloc(StageId s, int rank, Bytes bytes, bool at_end = true);
  void host_free(StageId s, int rank, Bytes bytes);
  // How the backend runs a stage of `what` in `phase` where the lowering is now (Stage::ops).
  OperatorRun operator_run(const StageWhat& what, Phase phase) const;
  // Sets the operators the backend dispatches in the emitted members of a collective (an EP
  // all-to-all's bookkeeping) over `shape`.
  void collective_operators(const PerRank& stages, const StageWhat& what, Phase phase, int layer, const OpShape& shape);
  // A compute stage on every rank; `deps` per rank (may be empty), plus extra common deps.
  PerRank compute_all(const StageWhat& what, OpKind op, Phase phase, int layer, Flops flops, Bytes bytes,
                      const OpShape& shape, const std::vector<PerRank>& deps);
  // A collective on every rank's fabric port among the members `over` names: member r depends on
  // inputs[q] of every member q (through a join across nodes, collective_waits).
  PerRank collective_all(const StageWhat& what, OpKind op, Phase phase, int layer, Bytes bytes_per_rank,
                         const PerRank& inputs, Over over = Over::kAll);
  // The same with each member's own bytes (uneven all-to-alls under skewed routing).
  PerRank collective_each(const StageWhat& what, OpKind op, Phase phase, int layer,
                          const std::vector<Bytes>& bytes_of_rank, const PerRank& inputs, Over over);
  // The member sets of a collective over `over` (kNone: every rank alone), and their size.
  RankGroups groups(Over over) const;
  int member_count(Over over) const { return groups(over).count(); }
  // A compute stage per rank with each rank's own FLOPs and bytes scaled by `load[r]`.
  PerRank compute_loaded(const StageWhat& what, OpKind op, Phase phase, int layer, Flops flops, Bytes bytes,
                         OpShape shape, const std::vector<double>& load, const std::vector<PerRank>& deps);
  // Copies the weights of one window use (common params + expert params on this GPU): each rank's
  // H2D of `common` + `expert_h2d`, then, unless `allgather` is kNone, an all-gather among those
  // members of the rest of `expert_total`.
  WindowUse deliver_weights(StagePart part, Phase phase, int layer, ParamCount common,
                            ParamCount expert_h2d, ParamCount expert_total, Over allgather);
  // Marks `last` as the last consumer of `use` (frees the slot at its end).
  void release_window(const WindowUse& use, const PerRank& last);
  // Over the members `reduce` names (more than one): the group's gradient reduce-scattered over the
  // fabric, `sent` = the 1/n each of the n members keeps; else `ready` as it is and `sent` = the
  // whole group.
  PerRank reduce_scatter(StagePart part, int layer, ParamCount params_on_gpu, const PerRank& ready, Over reduce,
                         ParamCount& sent);
  // The D2H of one gradient (the `index`-th of its kind): it waits for `after` and for the stage
  // that freed its CPU gradient slot (the update, or the host accumulation that consumed a
  // partial), and frees `freed` GPU bytes at its end.
  PerRank gradient_d2h(const StageWhat& what, int layer, Bytes bytes, Bytes freed, const PerRank& after, bool expert_kind);
  // Each rank adds its BF16 partial into the FP32 host sum once its D2Hs `d2h` are done and the
  // FP32 sum slot is free (the update of the gradient `cpu_grad_slots` earlier has read it). The
  // accumulation frees the partial's landing slot: the next D2H need not wait for the update.
  PerRank host_accumulate(const StageWhat& what, int layer, ParamCount params, const std::vector<PerRank>& d2h);
  // CPU AdamW of `params` per rank (part.cpu_adamw, in gradient bucket `bucket` or −1), waiting for its own
  // rank's `ready` stages or, `after_every_rank`, for every rank's; then its BF16 publication.
  PerRank update_and_publish(StagePart part, int bucket, int layer, ParamCount params,
                             const std::vector<PerRank>& ready, bool after_every_rank);
  // Gradients of one parameter group to the host and their CPU update and publication.
  // `reduce` first reduce-scatters over those members (each rank then sends 1/n).
  void gradients_to_host(StagePart part, int layer, ParamCount params_on_gpu, const PerRank& ready,
                         Over reduce, bool expert_kind, std::vector<PerRank>& d2h_out);
  void cpu_update(StagePart part, int layer, ParamCount params_per_rank, const std::vector<PerRank>& d2h,
                  bool accumulate_partials, ParamCount partial_params);
  // `update` consumed every gradient of `kind` sent so far that has none yet: it frees their CPU
  // slots (and their landing slots where no host accumulation freed them first).
  void record_consumer(int kind, const PerRank& update);
  // GPU AdamW of `params` per rank after `ready`; frees the GPU gradient of `freed` parameters
  // (default: `params`) at its end.
  PerRank gpu_adamw(StagePart part, int layer, ParamCount params, const PerRank& ready, ParamCount freed = -1);
  // A resident expert shard's update: GPU AdamW on the owner, or with replicas (EP groups) its
  // gradient reduce-scattered over them, each replica's AdamW on its 1/D slice, and the updated
  // BF16 slices all-gathered over them.
  void resident_update(int layer, ParamCount shard, const PerRank& ready);
  // OffloadStreamAdamW: one parameter group's gradients (optionally reduce-scattered first) to the
  // host in buckets of plan.flat.optimizer_bucket_mib, each bucket updated (after the ranks'
  // partials are summed when `accumulate_partials`) and published as soon as it arrived.
  // `update_params_per_rank` is what each rank updates of the whole group.
  void stream_gradients(StagePart part, int layer, ParamCount params_on_gpu, const PerRank& ready,
                        Over reduce, bool expert_kind, bool accumulate_partials, ParamCount update_params_per_rank);
  bool streamed_optimizer() const { return plan_.flat.optimizer_bucket_mib > 0; }

  // --- the step (lowering.cc: embedding, LM head; lowering_layers.cc: decoders) ---
  void embedding_forward();
  void head_forward_backward();
  void ring_head_forward_backward();  // Ring-DTP
  void embedding_backward();
  void decoder_forward(int layer, Phase phase, bool save_boundary);
  void decoder_backward(int layer);
  PerRank boundary_for_backward(int layer);
  // Releases decoder `layer`'s input (GPU copy and host copy) at `replayed`, its replay's last mixing stage.
  void release_input_after_replay(int layer, const PerRank& replayed);
  PerRank mixing_forward(int layer, Phase phase, std::int64_t seqs, const WindowUse& w, const PerRank& input,
                         bool first_pass, bool replay_reuses_o);
  PerRank mixing_backward(int layer, std::int64_t seqs, const PerRank& ready);
  // Context parallelism: the attention core's FLOPs of decoder `layer` on one rank (its queries'
  // share of every sequence's core: 1/C of the whole sequence's, the pieces balanced as ring
  // attention's zig-zag order balances them), and the core's shape (keys over the whole sequence).
  Flops attention_core_flops(int layer, std::int64_t seqs) const;
  // Ring attention around the core of decoder `layer` (context parallelism): the K/V pieces pass
  // around the sequence's GPUs beside the core (`after`: what the pieces wait for), and in
  // backward the pieces' gradients come back; allocates the ring's buffers as it starts. Returns
  // what the core's consumer waits for besides the core (empty without context parallelism).
  PerRank ring_attention(int layer, Phase phase, const PerRank& after);
  // Frees the ring's buffers at the end of `until` (the core's consumer).
  void ring_buffers_free(int layer, Phase phase, const PerRank& until);
  // Gated DeltaNet under context parallelism: the pieces' recurrent states (or, in backward, their
  // gradients) passed along the sequence's GPUs after `local` (the piece's `chunks` chunks), then
  // each piece corrected. Returns the correction per rank (`local` without context parallelism).
  PerRank gdn_state_chain(int layer, Phase phase, const PerRank& local, int chunks);
  // One forward chunk (both halves back to back); `fetched`: LLEP's weight fetch the expert GEMMs
  // wait for (empty: none).
  PerRank moe_forward_chunk(int layer, Phase phase, std::int64_t tokens, const WindowUse& w, const PerRank& input,
                            int chunk, const PerRank& fetched);
  // The two halves of a forward chunk: router and dispatch; experts, return and combine. A plain
  // chunk runs them back to back; PipelinedLLEP issues round c+1's dispatch before round c's experts.
  struct MoeRound {
    PerRank pre, dispatch;  // dispatch empty without a fabric all-to-all
    PerRank fetched;        // LLEP's weight fetch the experts wait for (empty: none)
    std::int64_t tokens = 0;
    int chunk = 0;
  };
  MoeRound moe_dispatch_half(int layer, Phase phase, std::int64_t tokens, const WindowUse& w, const PerRank& input,
                             int chunk);
  PerRank moe_expert_half(int layer, Phase phase, const MoeRound& round, const WindowUse& w);
  // The MoE sublayer's forward over `tokens` tokens in rounds; allocates the saved activations
  // (freed here unless `retained`). Returns the last stage per rank.
  PerRank moe_forward(int layer, Phase phase, std::int64_t tokens, const WindowUse& w, const PerRank& input,
                      bool retained);
  // LLEP: spilled experts' weights to their helpers (forward, recompute) and their gradients
  // back to the owners (backward). Empty when nothing spills.
  PerRank llep_fetch(int layer, Phase phase, const PerRank& after);
  PerRank llep_gradient_return(int layer, const PerRank& after);
  // Per-rank received load of decoder `layer`'s dispatch relative to the mean (1 = balanced); every
  // EP group routes alike, so rank r has the load of its place r mod E in its group.
  const std::vector<double>& rank_load(int layer) const { return routing_[static_cast<std::size_t>(layer)].loads; }
  Bytes moe_activation_on_rank(std::int64_t tokens, int layer, int rank) const;
  Bytes llep_expert_bytes(int layer) const;           // BF16 weights of one routed expert
  Bytes llep_weight_bytes(int layer, int rank) const;  // the experts `rank` fetches under LLEP
  Bytes llep_gradient_bytes(int layer, int rank) const;  // their gradients (a backward)
  // Per rank, the bytes of one LLEP exchange (weights out, or gradients back); empty when nothing spills.
  std::vector<Bytes> llep_exchange_bytes(int layer) const;
  PerRank moe_backward_chunk(int layer, std::int64_t tokens, const PerRank& ready, int chunk, const PerRank& fetched);

  // Parameters of decoder `layer` this GPU holds in the window: (common, experts).
  ParamCount common_params(int layer) const { return params_.layers[static_cast<std::size_t>(layer)].common(); }
  ParamCount expert_params_on_gpu(int layer) const;
  ParamCount expert_params_h2d(int layer) const;  // 0 for resident EP shards
  // How an expert shard reaches its replicas and its gradient leaves them: kReplicas when the EP
  // groups replicate each shard (Plan::ep_group_gpus), else kNone.
  Over expert_replicas() const { return expert_replicas_over(plan_, P_); }
  Over expert_allgather(int layer) const { return expert_allgather_over(plan_, layer, P_); }
  std::int64_t live_seqs() const;                 // sequences processed at once (Local sub-batches)
  std::vector<std::int64_t> moe_chunks(std::int64_t tokens) const;

  const Plan& plan_;
  const WorkloadContext& ctx_;
  const ModelSpec& m_;
  LoweringOptions options_;
  ModelParams params_;
  StepGraphBuilder b_;
  std::vector<RankResources> r_;
  int P_ = 1;
  int E_ = 1;  // GPUs per EP group (P_ on the Local path and with one group)
  int D_ = 1;  // EP groups: replicas of each expert shard
  int C_ = 1;  // GPUs per sequence (context parallelism); each holds S_ of its span_ tokens
  int emit_ = 1;  // ranks whose stages are emitted: P_, or one node's under symmetric_nodes
  struct KeyHash {
    std::size_t operator()(const StageKey& k) const;
  };
  std::unordered_map<StageKey, StageId, KeyHash> representative_;  // emitted stages by key (symmetric_nodes)
  bool ep_ = true;
  int layers_ = 0;  // decoders lowered
  std::int64_t seqs_ = 1, S_ = 1, N_ = 1;  // sequences (pieces) per GPU, tokens of each, tokens per GPU
  std::int64_t span_ = 1;                  // tokens of a whole sequence (S_ · C_)

  // Routing: per decoder, each rank's received dispatch load relative to the mean, after LLEP's
  // rebalancing when the plan runs it, and the experts each rank fetches / lends under LLEP.
  std::vector<LlepBalance> routing_;
  std::vector<double> largest_share_;  // per decoder: the largest expert's share of its assignments
  bool llep_ = false;

  int sub_batch_ = -1;    // the sub-batch being lowered when a decoder runs several (stage keys), else −1
  bool replaying_ = false;  // lowering a decoder's replay before its backward (Stage::ops: under autograd)
  // The backend calls one compute stage makes (Stage::ops counts each): a whole-sequence GDN piece
  // over a sub-batch runs C/S sequences a call.
  std::int64_t op_calls_ = 1;
  bool moe_retained_ = false;   // lowering a retained MoE's forward (Stage::ops: it builds graphs)
  bool context_chain_ = false;  // lowering the GDN stage that runs the sequence's chain (Stage::ops)
  PerRank last_compute_;  // the most recent compute stage per rank (data flow between sublayers)
  std::array<PerRank, 2> slot_last_use_;  // last consumer of each window slot per rank
  int window_uses_ = 0;
  Bytes window_slot_bytes_ = 0;  // the largest window use: each of the two slots has this size
  // CPU gradient slots: per kind (0 managed, 1 expert) and gradient index, the CPU update that
  // consumed it, and the stage that freed its landing slot (the update, or the host accumulation
  // that added the partial into the FP32 sum).
  std::array<std::vector<PerRank>, 2> slot_updates_;
  std::array<std::vector<PerRank>, 2> slot_landings_;
  std::array<int, 2> grads_sent_{0, 0};
  PerRank last_update_;  // last CPU update per rank
  // GPU gradient buffers (two slots): per decoder backward, the stages that free its buffer.
  std::vector<std::vector<PerRank>> grad_buffer_frees_;
  std::vector<PerRank> pending_grad_frees_;
  // Boundaries available on the GPU for backward: layer → (stage per rank, bytes per rank).
  std::map<int, std::pair<PerRank, Bytes>> gpu_boundaries_;
  std::map<int, PerRank> host_boundaries_;  // layer → D2H stage that saved it
  std::map<int, PerRank> olse_saved_;       // layer → D2H stage that saved O/LSE
  PerRank boundary_consumed_;               // the backward stage that last released a loaded boundary
  PerRank boundary_consumed_before_;        // SCO: the one before it (two boundary buffers)
  PerRank moe_backward_done_;               // the decoder last run backward: its last MoE backward stage (a host-kept boundary load waits for it)
  PerRank hidden_grad_alloc_;               // stage that allocated the running hidden-state gradient
};

}  // namespace oom::lowering
