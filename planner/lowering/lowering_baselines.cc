// Lowering of the baseline systems (planner/lowering/baselines.h) to a StepGraph.
//
// One step = `accumulation_steps` micro-batches, each a forward over every decoder (checkpoint
// saved to the host), the loss, and a backward that reloads each checkpoint, recomputes the
// decoder and runs its backward. Per decoder the weights pass a two-slot window: the H2D copy of
// a use waits for the last consumer of the use two before it; sharded systems copy 1/P and
// all-gather the rest over the fabric. Gradients: sharded systems reduce-scatter and copy their
// 1/P to the host (summed there from the second micro-batch on); MegaTrain copies the whole BF16
// gradient through two CPU gradient slots and sums the ranks' partials in FP32 on the host. Two
// GPU gradient buffers: a decoder's backward waits until the buffer two before it (the head's, or
// a decoder's) has drained. The optimizer runs per layer during the backward (MegaTrain) or, after the
// backward of the last micro-batch, as one CPU Adam pass over the rank's shard (FSDP2, ZeRO).
// With the routed experts in units of their own (BaselineSetup::expert_units > 1) the decoder's
// window holds its other parameters through the decoder, and the expert units pass a second
// two-slot window, one delivery per slice of the expert computation in the forward, the recompute
// and the backward (a unit is resharded after its recomputed forward, as after any forward, so the
// backward gathers it again: one pass over the experts more than the whole-decoder wrapping, which
// stays gathered from the recompute through the backward); each unit's gradient takes its turn in
// the gradient buffers. Under context parallelism (FSDP2 only: each sequence split over
// consecutive ranks) every rank runs its piece of a sequence, the mixing cores with ring attention
// or the GDN state chain over the sequence's GPUs (BaselineLowering::mixing_core).
#include <algorithm>
#include <deque>
#include <map>

#include <fmt/format.h>

#include "costmodel/flops.h"
#include "costmodel/input_error.h"
#include "costmodel/params.h"
#include "costmodel/traffic.h"
#include "planner/lowering/baselines.h"
#include "planner/lowering/graph_size_estimate.h"
#include "planner/lowering/lowering.h"
#include "planner/lowering/lowering_toolkit.h"

namespace oom {
namespace {

using PerRank = std::vector<StageId>;

class BaselineLowering : lowering::RankedBuilder {
 public:
  BaselineLowering(const BaselineSetup& setup, const WorkloadContext& ctx, const LoweringOptions& options)
      : RankedBuilder(ctx, options, setup.micro_batch_seqs, ctx.workload.local_seq_len(),
                      // Every rank runs the same schedule (no expert parallelism): one node's stages stand for
                      // every node's when the nodes are alike (LoweringOptions::symmetric_nodes).
                      options.symmetric_nodes && lowering::whole_nodes_alike(ctx.hardware, ctx.workload.gpus) ? ctx.hardware.gpus_per_node
                                                                                                              : ctx.workload.gpus),
        setup_(setup),
        t_(baseline_traits(setup.system, ctx.workload.gpus)),
        params_(model_params(ctx.model)),
        C_(ctx.workload.gpus_per_seq()),
        span_(ctx.workload.seq_len) {
    none_.assign(static_cast<std::size_t>(P_), -1);
    decoders_.last[0] = decoders_.last[1] = none_;
    experts_.last[0] = experts_.last[1] = none_;
    last_compute_ = none_;
    last_d2h_ = none_;
  }

  StepGraph run() {
    const BaselineMemory mem = baseline_static_memory(setup_, ctx_, k_);
    StepGraph& g = b_.graph();
    for (auto& b : g.gpu_base_bytes) b = k_.gpu_fixed_bytes + mem.window_bytes + mem.staging_bytes;
    // Host: the static footprint less the checkpoints, which the stages allocate and free.
    const std::vector<int> ranks_on = ctx_.hardware.ranks_per_numa(P_);
    for (std::size_t n = 0; n < g.numa_base_bytes.size() && n < mem.host_bytes_per_numa.size(); ++n) {
      g.numa_base_bytes[n] = mem.host_bytes_per_numa[n] - ranks_on[n] * boundary_bytes(m_.layers, seqs_, S_, m_.hidden);
    }
    g.gpu_headroom_fraction = k_.gpu_headroom_fraction;

    for (micro_ = 0; micro_ < setup_.accumulation_steps; ++micro_) {
      embedding_forward();
      for (int l = 0; l < layers_; ++l) decoder_forward(l);
      head();
      for (int l = layers_ - 1; l >= 0; --l) decoder_backward(l);
      embedding_backward();
    }
    if (!t_.optimizer_overlaps_backward) optimizer_after_backward();
    g.ranks_emitted = emit_ < P_ ? emit_ : 0;
    return b_.take();
  }

 private:
  bool last_micro() const { return micro_ == setup_.accumulation_steps - 1; }
  ParamCount head_params() const { return (params_.lm_head > 0 ? params_.lm_head : params_.embedding) + params_.final_norm; }
  void mem(StageId s, MemorySpace space, int device, Bytes bytes, bool at_end) {
    if (bytes != 0) b_.graph().stages[static_cast<std::size_t>(s)].memory.push_back({space, device, bytes, at_end});
  }

  PerRank compute(const StageWhat& what, OpKind op, Phase phase, int layer, Flops flops, Bytes bytes, const OpShape& shape,
                  const std::vector<PerRank>& deps) {
    last_compute_ = compute_stage(what, op, phase, layer, flops, bytes, shape, deps);
    return last_compute_;
  }

  // Over every rank, or over each block of `group` consecutive ranks (a sequence's GPUs).
  PerRank collective(const StageWhat& what, OpKind op, Phase phase, int layer, Bytes bytes, const PerRank& inputs, int group = 0) {
    return collective_over(lowering::RankGroups{P_, group > 0 ? group : P_}, what, op, phase, layer, bytes, inputs);
  }

  PerRank copy(const StageWhat& what, OpKind op, Phase phase, int layer, Bytes bytes, const std::vector<PerRank>& deps) {
    return each_rank([&](int r) {
      Stage s = make(what, op, phase, op == OpKind::kH2d ? rr(r).h2d : rr(r).d2h, r, layer);
      s.bytes = bytes;
      for (const auto& d : deps) dep(s, d, r);
      return s;
    });
  }

  // A two-slot window of unsharded units: a use's copy waits for the last consumer of the use two
  // before it.
  struct Window {
    int uses = 0;
    PerRank last[2];
  };

  // One window use: the rank's copy (and the all-gather of the others' shards). Returns what
  // compute waits for and the slot to release (window.last[slot] = its last consumer).
  std::pair<PerRank, int> deliver(Window& window, Phase phase, int layer, ParamCount params, StageWhat unit) {
    const int slot = window.uses++ % 2;
    const ParamCount copied = t_.sharded_params ? params / P_ : params;
    PerRank ready = copy(unit.with(StageOp::kH2d), OpKind::kH2d, phase, layer, t_.h2d_bytes_per_param * copied, {window.last[slot]});
    if (t_.sharded_params && P_ > 1) {
      ready = collective(unit.with(StageOp::kAllGather), OpKind::kAllGather, phase, layer, working_weight_bytes(params - copied), ready);
    }
    return {ready, slot};
  }
  std::pair<PerRank, int> deliver(Phase phase, int layer, ParamCount params, StagePart part = StagePart::kWeights) {
    return deliver(decoders_, phase, layer, params, what(part, StageOp::kH2d));
  }
  // The expert GEMM over one of `units` equal expert units: its experts and the tokens routed to them.
  OpShape expert_shape(int units) const {
    OpShape shape;
    shape.tokens = seqs_ * S_ * m_.moe.top_k / units;
    shape.k = m_.hidden;
    shape.experts = m_.moe.experts / units;
    return shape;
  }
  DecoderUnits units(int l) const {
    return decoder_units(params_.layers[static_cast<std::size_t>(l)], t_.sharded_params ? setup_.expert_units : 1);
  }

  // Forward (or recompute) of decoder l: mixing then MoE with the whole expert bank. Returns the last stage.
  // `first` receives the first stage per rank (where the decoder's activations are allocated).
  PerRank decoder_compute(int l, Phase phase, const std::vector<PerRank>& deps, PerRank& first) {
    const LayerKind kind = m_.layer_kinds[static_cast<std::size_t>(l)];
    const LayerFlops f = layer_flops(m_, l, seqs_, S_);
    const std::int64_t T = seqs_ * S_;
    const bool attention = kind != LayerKind::kLinearAttention;
    OpShape proj;
    proj.tokens = T;
    proj.k = m_.hidden;
    proj.seqs = seqs_;
    proj.seq_len = S_;
    const MoeTraffic t = moe_hbm_bytes(m_, l, T);
    PerRank x = compute(what(attention ? StagePart::kAttention : StagePart::kGdn, StageOp::kProj), OpKind::kGemm, phase, l, f.mixing_projection,
                        mixing_hbm_bytes(m_, l, T), proj, deps);
    first = x;
    const MixingCore core = mixing_core(l, phase, x);
    OpShape dense;
    dense.tokens = T;
    dense.k = m_.hidden;
    x = compute(what(StagePart::kMoe, StageOp::kRouterShared), OpKind::kGemm, phase, l, f.moe.router + f.moe.shared_expert + f.moe.dense_mlp, t.pre,
                dense, core.after());
    free_ring(core, x);
    if (!m_.moe_layer(l)) return compute(what(StagePart::kMoe, StageOp::kCombine), OpKind::kElementwise, phase, l, 0, t.combine, dense, {x});
    const DecoderUnits u = units(l);
    if (u.expert_units == 0) {
      return compute(what(StagePart::kMoe, StageOp::kExperts), OpKind::kExpertGemm, phase, l, f.moe.routed_experts, t.experts + t.combine,
                     expert_shape(1), {x});
    }
    // Expert units in order, each over the tokens routed to its experts once it is delivered.
    const int U = u.expert_units;
    const OpShape experts = expert_shape(U);
    const PerRank routed = x;
    for (int e = 0; e < U; ++e) {
      const auto [ready, slot] = deliver(experts_, phase, l, u.expert_unit, what(StagePart::kExperts, StageOp::kH2d).at_bucket(e));
      x = compute(what(StagePart::kMoe, StageOp::kExperts).at_bucket(e), OpKind::kExpertGemm, phase, l, f.moe.routed_experts / U,
                  t.experts / U + (e + 1 == U ? t.combine : 0), experts, {routed, ready, x});
      experts_.last[slot] = x;
    }
    return x;
  }

  // The mixing core of decoder l after `x` (forward, recompute or backward): what the next stage
  // waits for, and the ring's buffers it frees.
  struct MixingCore {
    PerRank core, ring;
    Bytes ring_bytes = 0;
    std::vector<PerRank> after() const { return ring.empty() ? std::vector<PerRank>{core} : std::vector<PerRank>{core, ring}; }
  };
  // Frees the ring's buffers of `core` at the end of `next`, the stage after the core.
  void free_ring(const MixingCore& core, const PerRank& next) {
    if (!core.ring.empty()) gpu_mem(next, -core.ring_bytes, true);
  }
  // The attention or GDN core over this rank's tokens. Under context parallelism (C_ > 1, the
  // EP path's lowering does the same, planner/lowering/lowering_layers.cc): the attention core
  // does 1/C of the whole sequence's work, its keys spanning the sequence (zig-zag pieces balance
  // the causal mask), while ring attention passes each piece's K/V around the sequence's GPUs, an
  // all-gather of C − 1 pieces per member beside the core (in backward the pieces pass again and
  // their gradients come back as a reduce-scatter), its buffers held until the next stage; GDN
  // runs its piece from a zero state, passes the pieces' FP32 states along the sequence's GPUs
  // (C − 1 hops one after another; in backward the state gradients, last to first) and corrects
  // its piece with the state it received (2·T·H_v·d_k·d_v FLOPs, twice that in backward).
  MixingCore mixing_core(int l, Phase phase, const PerRank& x) {
    const LayerKind kind = m_.layer_kinds[static_cast<std::size_t>(l)];
    const bool attention = kind != LayerKind::kLinearAttention, backward = phase == Phase::kBackward;
    const std::int64_t T = seqs_ * S_;
    OpShape core;
    core.seqs = seqs_;
    core.seq_len = attention ? span_ : S_;
    core.tokens = T;
    const Flops flops = context_parallel_core_flops(m_, l, seqs_, attention ? span_ : S_, attention ? C_ : 1);
    MixingCore out;
    if (attention) {
      const AttentionSpec& a = m_.attention(kind);
      core.heads = a.heads;
      core.head_dim = a.head_dim;
      core.window = a.window_tokens;
      if (C_ > 1) {
        const Bytes wire = static_cast<Bytes>(C_ - 1) * ring_kv_bytes(a, T);
        out.ring = collective(what(StagePart::kAttention, StageOp::kAllGather), OpKind::kAllGather, phase, l, wire, x, C_);
        out.ring_bytes = ring_attention_buffer_bytes(a, T, backward);
        gpu_mem(out.ring, out.ring_bytes, false);
        if (backward) {
          out.ring = collective(what(StagePart::kAttention, StageOp::kReduceScatter), OpKind::kReduceScatter, phase, l, wire, out.ring, C_);
        }
      }
    } else {
      core.heads = m_.gdn.value_heads;
      core.head_dim = m_.gdn.value_head_dim;
    }
    const StagePart part = attention ? StagePart::kAttention : StagePart::kGdn;
    const double ratio = !backward ? 1.0 : attention ? kAttentionBackwardRatio : kGdnBackwardRatio;
    out.core = compute(what(part, backward ? StageOp::kCoreBwd : StageOp::kCore), attention ? OpKind::kAttention : OpKind::kGdn, phase, l,
                       ratio * flops, mixing_core_hbm_bytes(m_, l, seqs_, S_, backward), core, {x});
    if (backward) {
      // The mixing core backward's buffers (attention or GDN), held over the core's stage.
      const Bytes grads = mixing_backward_total_bytes(m_, l, seqs_, S_);
      gpu_workspace(out.core, grads);
    }
    if (!attention && C_ > 1) {
      PerRank arrived = out.core;
      for (int step = 0; step + 1 < C_; ++step) {
        arrived = collective(what(StagePart::kGdn, backward ? StageOp::kGradPass : StageOp::kPass).at_ring_step(step), OpKind::kAllGather, phase,
                             l, gdn_state_bytes(m_.gdn, seqs_), arrived, C_);
      }
      const Flops correction = (backward ? 2.0 : 1.0) * gdn_state_correction_flops(m_.gdn, T);
      out.core = compute(what(part, backward ? StageOp::kCoreBwd : StageOp::kCore).at_chunk(1), OpKind::kGdn, phase, l, correction, 0, core,
                         {arrived, out.core});
    }
    return out;
  }

  Bytes activations(int l) const {
    return mixing_activation_bytes(m_, l, seqs_, S_) + moe_activation_bytes(m_, l, seqs_ * S_);
  }

  void embedding_forward() {
    const auto [ready, slot] = deliver(Phase::kForward, -1, params_.embedding, StagePart::kEmbedding);
    OpShape shape;
    shape.tokens = seqs_ * S_;
    const PerRank gather = compute(what(StagePart::kEmbedding, StageOp::kGather), OpKind::kElementwise, Phase::kForward, -1, 0,
                                   boundary_bytes(1, seqs_, S_, m_.hidden), shape, {ready, last_compute_});
    decoders_.last[slot] = gather;
  }

  void decoder_forward(int l) {
    const auto [ready, slot] = deliver(Phase::kForward, l, units(l).outer);
    // Activation offload: the decoder's input goes to the host for the backward.
    const Bytes boundary = boundary_bytes(1, seqs_, S_, m_.hidden);
    const PerRank save = copy(what(StagePart::kBoundary, StageOp::kD2h), OpKind::kD2h, Phase::kForward, l, boundary, {last_compute_});
    for (int r = 0; r < P_; ++r) mem(save[static_cast<std::size_t>(r)], MemorySpace::kHost, rr(r).numa, boundary, true);
    checkpoints_[l] = save;
    PerRank first;
    const PerRank out = decoder_compute(l, Phase::kForward, {last_compute_, ready}, first);
    // The forward's activations live from its first stage to its last (checkpointing frees them).
    const Bytes act = activations(l);
    gpu_mem(first, act, false);
    gpu_mem(out, -act, true);
    decoders_.last[slot] = out;
  }

  void head() {
    const ParamCount head = head_params();
    const auto [ready, slot] = deliver(Phase::kForward, -1, head, StagePart::kLmHead);
    const std::int64_t T = tokens();
    const Bytes logits = logits_workspace_bytes(m_, std::min(k_.loss_chunk_tokens, T));
    const lowering::LossHead h = lowering::loss_head(m_, T);
    const PerRank fwd = compute(what(StagePart::kLmHead, StageOp::kLoss), OpKind::kGemm, Phase::kForward, -1, h.forward_flops, h.forward_bytes,
                                h.shape, {ready, last_compute_});
    const PerRank bwd = compute(what(StagePart::kLmHead, StageOp::kBackward), OpKind::kGemm, Phase::kBackward, -1, h.backward_flops,
                                h.backward_bytes, h.shape, {fwd});
    gpu_workspace(fwd, logits);
    gpu_mem(bwd, logits + t_.grad_bytes_per_param * head, false);
    gpu_mem(bwd, -logits, true);
    gpu_mem(bwd, boundary_bytes(1, seqs_, S_, m_.hidden), true);  // running gradient of the hidden states
    decoders_.last[slot] = bwd;
    // A tied head is the embedding table: its gradient, started here, is completed by the
    // embeddings' backward and leaves with it (one reduce-scatter or D2H, one update); the head's
    // own group is the final norm.
    gradients(-1, StagePart::kLmHead, m_.tied_embeddings ? params_.final_norm : head, bwd);
  }

  void decoder_backward(int l) {
    const DecoderUnits u = units(l);
    const ParamCount p = u.outer;  // the whole decoder, or its parameters outside the expert units
    const auto [ready, slot] = deliver(Phase::kBackward, l, p);
    const Bytes boundary = boundary_bytes(1, seqs_, S_, m_.hidden);
    const PerRank load = copy(what(StagePart::kBoundary, StageOp::kH2d), OpKind::kH2d, Phase::kBackward, l, boundary, {checkpoints_.at(l)});
    gpu_mem(load, boundary, false);
    // Whole decoder: its gradient buffer is taken when the recompute starts. With expert units each
    // unit's gradient, then the outer unit's, takes its buffer when its backward starts.
    const bool apart = u.expert_units > 0;
    const std::vector<PerRank> gate = apart ? std::vector<PerRank>{ready, load, last_compute_} : with_free_gradient_buffer({ready, load, last_compute_});
    PerRank first;
    const PerRank recomputed = decoder_compute(l, Phase::kRecompute, gate, first);
    const Bytes act = activations(l);
    gpu_mem(first, act + (apart ? 0 : t_.grad_bytes_per_param * p), false);  // recompute activations (and the gradient buffer)

    const LayerKind kind = m_.layer_kinds[static_cast<std::size_t>(l)];
    const LayerFlops f = layer_flops(m_, l, seqs_, S_);
    const std::int64_t T = seqs_ * S_;
    const MoeTraffic t = moe_hbm_bytes(m_, l, T);
    OpShape dense;
    dense.tokens = T;
    dense.k = m_.hidden;
    PerRank x = recomputed;
    if (apart) {
      // Expert units last to first: delivered again, backward over their slice, gradient out.
      const int U = u.expert_units;
      const OpShape experts = expert_shape(U);
      for (int e = U - 1; e >= 0; --e) {
        const auto [unit_ready, unit_slot] = deliver(experts_, Phase::kBackward, l, u.expert_unit, what(StagePart::kExperts, StageOp::kH2d).at_bucket(e));
        x = compute(what(StagePart::kMoe, StageOp::kExpertsBwd).at_bucket(e), OpKind::kExpertGemm, Phase::kBackward, l,
                    kMatmulBackwardRatio * f.moe.routed_experts / U, kMemoryBackwardRatio * (t.experts / U + (e + 1 == U ? t.combine : 0)),
                    experts, with_free_gradient_buffer({x, unit_ready}));
        gpu_mem(x, t_.grad_bytes_per_param * u.expert_unit, false);
        experts_.last[unit_slot] = x;
        gradients(l, what(StagePart::kExperts, StageOp::kGradD2h).at_bucket(e), u.expert_unit, x);
      }
    } else if (m_.moe_layer(l)) {
      x = compute(what(StagePart::kMoe, StageOp::kExpertsBwd), OpKind::kExpertGemm, Phase::kBackward, l, kMatmulBackwardRatio * f.moe.routed_experts,
                  kMemoryBackwardRatio * (t.experts + t.combine), expert_shape(1), {recomputed});
    }
    x = compute(what(StagePart::kMoe, StageOp::kRouterSharedBwd), OpKind::kGemm, Phase::kBackward, l,
                kMatmulBackwardRatio * (f.moe.router + f.moe.shared_expert + f.moe.dense_mlp),
                kMemoryBackwardRatio * (m_.moe_layer(l) ? t.pre : t.pre + t.combine), dense, apart ? with_free_gradient_buffer({x}) : std::vector<PerRank>{x});
    if (apart) gpu_mem(x, t_.grad_bytes_per_param * p, false);  // the outer unit's gradient buffer
    const bool attention = kind != LayerKind::kLinearAttention;
    const MixingCore core = mixing_core(l, Phase::kBackward, x);
    OpShape proj;
    proj.tokens = T;
    proj.k = m_.hidden;
    x = compute(what(attention ? StagePart::kAttention : StagePart::kGdn, StageOp::kProjBwd), OpKind::kGemm, Phase::kBackward, l,
                kMatmulBackwardRatio * f.mixing_projection, kMemoryBackwardRatio * mixing_hbm_bytes(m_, l, T), proj, core.after());
    free_ring(core, x);
    gpu_mem(x, -(act + boundary), true);
    for (int r = 0; r < P_; ++r) mem(x[static_cast<std::size_t>(r)], MemorySpace::kHost, rr(r).numa, -boundary, true);
    decoders_.last[slot] = x;
    gradients(l, what(apart ? StagePart::kCommon : StagePart::kLayer, StageOp::kGradD2h), p, x);
  }

  void embedding_backward() {
    OpShape shape;
    shape.tokens = seqs_ * S_;
    // A tied table's gradient is held since the head's backward: no buffer to wait for.
    const bool tied = m_.tied_embeddings;
    const PerRank scatter = compute(what(StagePart::kEmbedding, StageOp::kScatter), OpKind::kElementwise, Phase::kBackward, -1, 0,
                                    boundary_bytes(1, seqs_, S_, m_.hidden), shape,
                                    tied ? std::vector<PerRank>{last_compute_} : with_free_gradient_buffer({last_compute_}));
    if (!tied) gpu_mem(scatter, t_.grad_bytes_per_param * params_.embedding, false);
    gpu_mem(scatter, -boundary_bytes(1, seqs_, S_, m_.hidden), true);
    gradients(-1, StagePart::kEmbedding, params_.embedding, scatter);
  }

  // Two GPU gradient buffers, taken in turn by the head's, each decoder's and the embedding's
  // gradient: `deps` and the drain of the buffer two back, whose turn a new gradient takes.
  std::vector<PerRank> with_free_gradient_buffer(std::vector<PerRank> deps) const {
    if (grad_drains_.size() >= 2) deps.push_back(grad_drains_[grad_drains_.size() - 2]);
    return deps;
  }

  // The gradients of one parameter group (held on the GPU from `ready` on) to the host; summed
  // there over micro-batches or ranks; updated per layer when the optimizer overlaps the backward.
  void gradients(int layer, StagePart part, ParamCount params, const PerRank& ready) {
    gradients(layer, what(part, StageOp::kGradD2h), params, ready);
  }
  void gradients(int layer, const StageWhat& group, ParamCount params, const PerRank& ready) {
    const Bytes on_gpu = t_.grad_bytes_per_param * params;
    PerRank after = ready;
    ParamCount sent = params;
    if (t_.sharded_params && P_ > 1) {
      after = collective(group.with(StageOp::kReduceScatter), OpKind::kReduceScatter, Phase::kBackward, layer,
                         on_gpu * (P_ - 1) / P_, ready);
      sent = params / P_;
    }
    std::vector<PerRank> deps = {after};
    const int index = grads_sent_++;
    if (!t_.sharded_params && index >= 2) deps.push_back(slot_consumers_[static_cast<std::size_t>(index - 2)]);  // two CPU slots
    const PerRank d2h = copy(group.with(StageOp::kGradD2h), OpKind::kD2h, Phase::kBackward, layer, t_.grad_bytes_per_param * sent, deps);
    gpu_mem(d2h, -on_gpu, true);
    // Every gradient takes its turn in the two GPU gradient buffers: the head's, each decoder's, the
    // embedding's.
    grad_drains_.push_back(d2h);
    last_d2h_ = d2h;
    PerRank consumed = d2h;
    const bool host_sum = !t_.sharded_params ? P_ > 1 || micro_ > 0 : micro_ > 0;
    if (host_sum) {
      // FP32 sum on the host: each rank adds what it received (its partial of the whole group,
      // or its shard for the micro-batches after the first).
      consumed = each_rank([&](int r) {
        Stage s = make(group.with(StageOp::kHostAccumulate), OpKind::kHostAccumulate, Phase::kOptimizer, rr(r).cpu, r, layer);
        s.params = sent;
        s.bytes = gradient_bytes(sent);
        dep(s, d2h, r);
        return s;
      });
    }
    slot_consumers_.push_back(consumed);
    if (t_.optimizer_overlaps_backward && last_micro()) {
      // Each rank updates 1/P of the group once every rank's partial is summed.
      const PerRank upd = each_rank([&](int r) {
        Stage s = make(group.with(StageOp::kCpuAdamW), t_.optimizer, Phase::kOptimizer, rr(r).cpu, r, layer);
        s.params = params / P_;
        s.bytes = canonical_state_bytes(params / P_);
        for (int q = 0; q < P_; ++q) dep(s, consumed, q);
        return s;
      });
      publish(group, layer, params / P_, upd);
    } else if (last_micro()) {
      pending_updates_.push_back({layer, group, params, consumed});
    }
  }

  void publish(const StageWhat& group, int layer, ParamCount params, const PerRank& upd) {
    if (!t_.publishes_bf16) return;
    each_rank([&](int r) {
      Stage s = make(group.with(StageOp::kPublish), OpKind::kHostPrep, Phase::kOptimizer, rr(r).prep, r, layer);
      s.params = params;
      s.bytes = working_weight_bytes(params);
      dep(s, upd, r);
      return s;
    });
  }

  // One CPU Adam pass over the rank's shard after the backward has finished (optimizer.step()).
  void optimizer_after_backward() {
    bool first = true;
    for (const auto& u : pending_updates_) {
      const PerRank upd = each_rank([&](int r) {
        Stage s = make(u.group.with(StageOp::kCpuAdamW), t_.optimizer, Phase::kOptimizer, rr(r).cpu, r, u.layer);
        s.params = u.params / P_;
        s.bytes = canonical_state_bytes(u.params / P_);
        dep(s, u.ready, r);
        if (first) dep(s, last_d2h_, r);  // the step begins when the rank's backward is done
        return s;
      });
      publish(u.group, u.layer, u.params / P_, upd);
      first = false;
    }
  }

  struct PendingUpdate {
    int layer;
    StageWhat group;
    ParamCount params;
    PerRank ready;
  };

  const BaselineSetup setup_;
  const BaselineTraits t_;
  const ModelParams params_;
  // S_ (RankedBuilder): the tokens of each sequence on one GPU, its piece of span_ tokens under
  // context parallelism, where each sequence is split over C_ consecutive ranks (1: whole sequences).
  const int C_;
  const std::int64_t span_;
  PerRank none_, last_compute_, last_d2h_;
  Window decoders_, experts_;  // the decoders' (or outer units') window and the expert units'
  int grads_sent_ = 0;
  std::vector<PerRank> slot_consumers_;  // per gradient sent: the stage that freed its CPU slot
  std::vector<PerRank> grad_drains_;     // per gradient buffer (the head's, each decoder backward's, the embedding's): the D2H that drained it
  std::map<int, PerRank> checkpoints_;   // decoder → the D2H that saved its input
  std::vector<PendingUpdate> pending_updates_;
};

}  // namespace

StepGraph lower_baseline(const BaselineSetup& setup, const WorkloadContext& ctx, const LoweringOptions& options) {
  OOM_ASSERT(ctx.workload.gpus >= 1, "at least one GPU");
  OOM_ASSERT(setup.micro_batch_seqs >= 1 && setup.accumulation_steps >= 1, "a micro-batch of at least one sequence");
  check_graph_size(estimate_baseline_graph(setup, ctx, options), options, "");
  BaselineLowering l(setup, ctx, options);
  StepGraph g = l.run();
  OOM_ASSERT(check_step_graph(g, false).empty(), "baseline lowering produced a malformed StepGraph");
  return g;
}

}  // namespace oom
