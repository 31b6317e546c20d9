// Decoder layers of the lowering: forward, replay, backward, boundaries and gradients
// (reference §3 for EP, §4 for Local). See planner/lowering/lowering.h for the runtime rules.
#include <algorithm>
#include <optional>

#include <fmt/format.h>

#include "costmodel/input_error.h"
#include "costmodel/memory.h"
#include "costmodel/traffic.h"
#include "planner/lowering/lowering.h"

namespace oom::lowering {
namespace {

bool is_attention(LayerKind k) { return k != LayerKind::kLinearAttention; }

// The shape of one head group's attention core over the queries of `seqs` pieces of `piece` tokens
// of sequences `span` tokens long (context parallelism; else piece = span, complete sequences).
OpShape attention_core_shape(const AttentionSpec& a, int groups, std::int64_t seqs, std::int64_t span, std::int64_t piece) {
  OpShape core;
  core.seqs = seqs;
  core.seq_len = span;
  core.heads = a.heads / groups;
  core.head_dim = a.head_dim;
  core.window = a.window_tokens;
  core.tokens = seqs * piece;
  return core;
}

// The shape of one of `chunks` GDN sequence chunks over `seqs` sequences of `seq_len` tokens.
OpShape gdn_core_shape(const GdnSpec& g, std::int64_t seqs, std::int64_t seq_len, int chunks) {
  OpShape core;
  core.seqs = seqs;
  core.seq_len = seq_len / chunks;
  core.tokens = seqs * seq_len / chunks;
  core.heads = g.value_heads;
  core.head_dim = g.value_head_dim;
  return core;
}

// The mixing's output projection (o_proj, or GDN's out_proj) over `tokens` tokens: its GEMM reads
// the core's output, heads × head_dim (or the GDN value width) wide.
OpShape output_projection_shape(const ModelSpec& m, LayerKind kind, std::int64_t tokens) {
  OpShape s;
  s.tokens = tokens;
  s.k = is_attention(kind) ? std::int64_t{m.attention(kind).heads} * m.attention(kind).value_dim() : m.gdn.value_dim();
  return s;
}

// The routed experts' shape on one rank: the token–expert assignments of `tokens` tokens it
// processes, over the experts it holds.
OpShape routed_experts_shape(const ModelSpec& m, std::int64_t tokens, bool over_ranks, int ep_ranks) {
  OpShape s;
  s.tokens = tokens * m.moe.top_k;
  s.k = m.hidden;
  s.experts = over_ranks ? m.moe.experts / ep_ranks : m.moe.experts;
  return s;
}

}  // namespace

PerRank Lowering::mixing_forward(int l, Phase phase, std::int64_t seqs, const WindowUse& w, const PerRank& input,
                                 bool first_pass, bool reuse_o) {
  const LayerKind kind = m_.layer_kinds[static_cast<std::size_t>(l)];
  const LayerFlops f = layer_flops(m_, l, seqs, S_);
  OpShape proj;
  proj.tokens = seqs * S_;
  proj.k = m_.hidden;
  proj.seqs = seqs;
  proj.seq_len = S_;
  const StagePart part = is_attention(kind) ? StagePart::kAttention : StagePart::kGdn;
  const PerRank p = compute_all(what(part, StageOp::kProj), OpKind::kGemm, phase, l, f.mixing_projection - f.mixing_output,
                                mixing_hbm_bytes(m_, l, seqs * S_), proj, {input, w.ready});
  // The output projection runs after the core, on its output (or on the kept O).
  const auto output_projection = [&](std::vector<PerRank> after) {
    return compute_all(what(part, StageOp::kOut), OpKind::kGemm, phase, l, f.mixing_output, 0,
                       output_projection_shape(m_, kind, seqs * S_), std::move(after));
  };
  PerRank last = p;
  if (is_attention(kind)) {
    const AttentionSpec& a = m_.attention(kind);
    const Bytes olse = attention_result_bytes(a, seqs, S_);
    const Flops core_flops = attention_core_flops(l, seqs);
    if (reuse_o) {
      // O/LSE come back from the host; the core is not recomputed (reference §4 "Keep").
      PerRank load(static_cast<std::size_t>(P_));
      for (int r = 0; r < P_; ++r) {
        Stage s = make(what(StagePart::kAttention, StageOp::kOlseH2d), OpKind::kH2d, phase, r_[static_cast<std::size_t>(r)].h2d, r, l);
        s.bytes = olse;
        if (olse_saved_.count(l)) s.deps.push_back(olse_saved_.at(l)[static_cast<std::size_t>(r)]);
        load[static_cast<std::size_t>(r)] = add(std::move(s));
      }
      last = output_projection({p, load});
    } else {
      const int groups = attention_head_groups(a, plan_.split.attention_head_group);
      const OpShape core = attention_core_shape(a, groups, seqs, span_, S_);
      const PerRank ring = ring_attention(l, phase, p);
      for (int g = 0; g < groups; ++g) {
        last = compute_all(what(StagePart::kAttention, StageOp::kCore).at_head_group(g), OpKind::kAttention, phase, l,
                           core_flops / groups, 0, core, {last});
      }
      if (first_pass && plan_.keep_attention_results) {
        PerRank save(static_cast<std::size_t>(P_));
        for (int r = 0; r < P_; ++r) {
          Stage s = make(what(StagePart::kAttention, StageOp::kOlseD2h), OpKind::kD2h, phase, r_[static_cast<std::size_t>(r)].d2h, r, l);
          s.bytes = olse;
          s.deps.push_back(last[static_cast<std::size_t>(r)]);
          save[static_cast<std::size_t>(r)] = add(std::move(s));
          host_alloc(save[static_cast<std::size_t>(r)], r, olse);
        }
        olse_saved_[l] = save;
      }
      // The output projection waits for the ring's last piece too; the ring's buffers live until it ends.
      last = output_projection({last, ring});
      if (!ring.empty()) ring_buffers_free(l, phase, last);
    }
  } else {
    const GdnCallShape calls = gdn_call_shape(seqs, S_, plan_.split.gdn_chunk_tokens);
    const int chunks = calls.pieces;
    const OpShape core = gdn_core_shape(m_.gdn, seqs, S_, chunks);
    op_calls_ = calls.calls;  // the backend's calls in each piece's stage
    for (int c = 0; c < chunks; ++c) {
      // Each chunk hands its FP32 recurrent state to the next (stream order carries it).
      last = compute_all(what(StagePart::kGdn, StageOp::kCore).at_chunk(c), OpKind::kGdn, phase, l, f.mixing_core.total() / chunks,
                         gdn_core_hbm_bytes(m_.gdn, core.seqs, core.seq_len, false), core, {last});
    }
    op_calls_ = 1;
    last = output_projection({gdn_state_chain(l, phase, last, chunks)});
  }
  return last;
}

Bytes Lowering::moe_activation_on_rank(std::int64_t tokens, int l, int r) const {
  // The routed part lives where the assignments are processed: the receiving rank's share.
  if (!ep_ || E_ == 1) return moe_activation_bytes(m_, l, tokens);
  return moe_activation_bytes_at_load(m_, l, tokens, rank_load(l)[static_cast<std::size_t>(r)]);
}

namespace {

// Per-rank bytes of one all-to-all of `tokens` tokens per rank: each rank sends its k·tokens
// assignments ((P−1)/P of them leave the GPU) and receives its load's share; the larger of the
// two directions sets its time.
std::vector<Bytes> a2a_bytes_per_rank(const ModelSpec& m, std::int64_t tokens, int P, const std::vector<double>& load) {
  const Bytes send = ep_a2a_bytes(m.moe.top_k, tokens, m.hidden, kBf16Bytes, P) / 2;
  std::vector<Bytes> out;
  for (const double f : load) out.push_back(std::max(send, static_cast<Bytes>(static_cast<double>(send) * f)));
  return out;
}

}  // namespace

Lowering::MoeRound Lowering::moe_dispatch_half(int l, Phase phase, std::int64_t tokens, const WindowUse& w,
                                               const PerRank& input, int chunk) {
  const MoeFlops f = moe_flops(m_, l, tokens);
  const MoeTraffic t = moe_hbm_bytes(m_, l, tokens);
  OpShape dense;
  dense.tokens = tokens;
  dense.k = m_.hidden;
  MoeRound round;
  round.tokens = tokens;
  round.chunk = chunk;
  round.pre = compute_all(what(StagePart::kMoe, StageOp::kRouterShared).at_chunk(chunk), OpKind::kGemm, phase, l,
                          f.router + f.shared_expert + f.dense_mlp, t.pre, dense, {input, w.ready});
  if (!ep_ || E_ == 1 || !m_.moe_layer(l)) return round;
  const std::vector<double>& load = rank_load(l);
  round.dispatch = collective_each(what(StagePart::kMoe, StageOp::kA2aDispatch).at_chunk(chunk), OpKind::kAllToAll, phase, l,
                                   a2a_bytes_per_rank(m_, tokens, E_, load), round.pre, Over::kGroup);
  collective_operators(round.dispatch, what(StagePart::kMoe, StageOp::kA2aDispatch), phase, l, routed_experts_shape(m_, tokens, ep_, E_));
  for (int r = 0; r < P_; ++r) {
    gpu_alloc(round.dispatch[static_cast<std::size_t>(r)], r, a2a_buffer_bytes_at_load(m_, l, tokens, load[static_cast<std::size_t>(r)]),
              false, MemoryUse::kDispatch);
  }
  return round;
}

PerRank Lowering::moe_expert_half(int l, Phase phase, const MoeRound& round, const WindowUse& w) {
  const MoeTraffic t = moe_hbm_bytes(m_, l, round.tokens);
  if (!m_.moe_layer(l)) {
    // A dense layer: its MLP ran with the router's GEMMs; the residual add is left.
    OpShape add;
    add.tokens = round.tokens;
    return compute_all(what(StagePart::kMoe, StageOp::kCombine).at_chunk(round.chunk), OpKind::kElementwise, phase, l, 0, t.combine,
                       add, {round.pre});
  }
  const MoeFlops f = moe_flops(m_, l, round.tokens);
  const OpShape experts = routed_experts_shape(m_, round.tokens, ep_, E_);
  const int chunk = round.chunk;
  if (round.dispatch.empty()) {
    return compute_all(what(StagePart::kMoe, StageOp::kExperts).at_chunk(chunk), OpKind::kExpertGemm, phase, l, f.routed_experts,
                       t.experts + t.combine, experts, {round.pre, w.ready});
  }
  // The slowest rank (the largest received share) sets the pace of the return all-to-all.
  const std::vector<double>& load = rank_load(l);
  const PerRank exp = compute_loaded(what(StagePart::kMoe, StageOp::kExperts).at_chunk(chunk), OpKind::kExpertGemm, phase, l,
                                     f.routed_experts, t.experts, experts, load, {round.dispatch, w.ready, round.fetched});
  const PerRank ret = collective_each(what(StagePart::kMoe, StageOp::kA2aReturn).at_chunk(chunk), OpKind::kAllToAll, phase, l,
                                      a2a_bytes_per_rank(m_, round.tokens, E_, load), exp, Over::kGroup);
  collective_operators(ret, what(StagePart::kMoe, StageOp::kA2aReturn), phase, l, experts);
  for (int r = 0; r < P_; ++r) {
    gpu_free(ret[static_cast<std::size_t>(r)], r, a2a_buffer_bytes_at_load(m_, l, round.tokens, load[static_cast<std::size_t>(r)]),
             MemoryUse::kDispatch);
  }
  OpShape combine;
  combine.tokens = round.tokens;
  return compute_all(what(StagePart::kMoe, StageOp::kCombine).at_chunk(chunk), OpKind::kElementwise, phase, l, 0, t.combine, combine, {ret});
}

PerRank Lowering::moe_forward(int l, Phase phase, std::int64_t tokens, const WindowUse& w, const PerRank& input,
                              bool retained) {
  const PerRank fetched = llep_fetch(l, phase, w.ready);
  PerRank x = input;
  moe_retained_ = retained;  // its stages build the graphs the backward uses (Stage::ops)
  const auto finish = [&](const MoeRound& round) {
    const PerRank out = moe_expert_half(l, phase, round, w);
    for (int r = 0; r < P_; ++r) {
      const Bytes act = moe_activation_on_rank(round.tokens, l, r);
      gpu_alloc(out[static_cast<std::size_t>(r)], r, act, false, MemoryUse::kDispatch);
      if (!retained) gpu_free(out[static_cast<std::size_t>(r)], r, act, MemoryUse::kDispatch);  // retained: the backward frees
    }
    return out;
  };
  int c = 0;
  if (llep_) {
    // PipelinedLLEP: round c+1's router and dispatch are issued before round c's experts, so the
    // dispatch of one round overlaps the expert GEMMs of the previous one (two rounds in flight).
    std::optional<MoeRound> previous;
    for (const std::int64_t t : moe_chunks(tokens)) {
      MoeRound round = moe_dispatch_half(l, phase, t, w, input, c++);
      round.fetched = fetched;
      if (previous) x = finish(*previous);
      previous = std::move(round);
    }
    x = finish(*previous);
  } else {
    for (const std::int64_t t : moe_chunks(tokens)) {
      MoeRound round = moe_dispatch_half(l, phase, t, w, x, c++);
      x = finish(round);
    }
  }
  moe_retained_ = false;
  if (!fetched.empty()) {
    for (int r = 0; r < P_; ++r) gpu_free(x[static_cast<std::size_t>(r)], r, llep_weight_bytes(l, r), MemoryUse::kDispatch);
  }
  return x;
}

Bytes Lowering::llep_expert_bytes(int l) const {
  return working_weight_bytes(params_.layers[static_cast<std::size_t>(l)].routed_experts / std::max(1, m_.moe.experts));
}

Bytes Lowering::llep_weight_bytes(int l, int r) const {
  return llep_expert_bytes(l) * routing_[static_cast<std::size_t>(l)].fetched[static_cast<std::size_t>(r)];
}

Bytes Lowering::llep_gradient_bytes(int l, int r) const {
  const ParamCount per_expert = params_.layers[static_cast<std::size_t>(l)].routed_experts / std::max(1, m_.moe.experts);
  return gradient_bytes(per_expert) * routing_[static_cast<std::size_t>(l)].fetched[static_cast<std::size_t>(r)];
}

std::vector<Bytes> Lowering::llep_exchange_bytes(int l) const {
  const LlepBalance& b = routing_[static_cast<std::size_t>(l)];
  if (!llep_ || b.spilled_experts == 0 || !m_.moe_layer(l)) return {};
  // Each rank sends the experts it lends and receives those it fetches (or their gradients back).
  std::vector<Bytes> bytes;
  for (int r = 0; r < P_; ++r) {
    bytes.push_back(llep_expert_bytes(l) * std::max(b.fetched[static_cast<std::size_t>(r)], b.lent[static_cast<std::size_t>(r)]));
  }
  return bytes;
}

PerRank Lowering::llep_fetch(int l, Phase phase, const PerRank& after) {
  const std::vector<Bytes> bytes = llep_exchange_bytes(l);
  if (bytes.empty()) return {};
  // Helpers receive the spilled experts' BF16 weights from their owners over the fabric; in the
  // backward each with a zeroed gradient beside it, which the experts' backward adds into.
  const PerRank out = collective_each(what(StagePart::kLlep, StageOp::kFetch), OpKind::kAllToAll, phase, l, bytes, after, Over::kGroup);
  for (int r = 0; r < P_; ++r) {
    const Bytes held = llep_weight_bytes(l, r) + (phase == Phase::kBackward ? llep_gradient_bytes(l, r) : 0);
    gpu_alloc(out[static_cast<std::size_t>(r)], r, held, false, MemoryUse::kDispatch);
  }
  return out;
}

PerRank Lowering::llep_gradient_return(int l, const PerRank& after) {
  const std::vector<Bytes> bytes = llep_exchange_bytes(l);
  if (bytes.empty()) return after;
  // The spilled experts' BF16 gradients go back to their owners over the fabric; the expert
  // gradients' D2H waits for it. The owners' add (three passes over one expert's BF16 gradient
  // per helper, ~10 µs) is not priced, and it does not hold up the mixing backward.
  const PerRank back =
      collective_each(what(StagePart::kLlep, StageOp::kGradReturn), OpKind::kAllToAll, Phase::kBackward, l, bytes, after, Over::kGroup);
  for (int r = 0; r < P_; ++r) {
    gpu_free(back[static_cast<std::size_t>(r)], r, llep_weight_bytes(l, r) + llep_gradient_bytes(l, r), MemoryUse::kDispatch);
  }
  return back;
}

PerRank Lowering::moe_forward_chunk(int l, Phase phase, std::int64_t tokens, const WindowUse& w, const PerRank& input,
                                    int chunk, const PerRank& fetched) {
  MoeRound round = moe_dispatch_half(l, phase, tokens, w, input, chunk);
  round.fetched = fetched;
  return moe_expert_half(l, phase, round, w);
}

PerRank Lowering::moe_backward_chunk(int l, std::int64_t tokens, const PerRank& ready, int chunk, const PerRank& fetched) {
  const MoeFlops f = moe_flops(m_, l, tokens);
  const MoeTraffic t = moe_hbm_bytes(m_, l, tokens);
  const Bytes input_grad = moe_input_grad_bytes(m_, tokens);
  OpShape dense;
  dense.tokens = tokens;
  dense.k = m_.hidden;
  if (!m_.moe_layer(l)) {
    // A dense layer: the MLP's backward alone.
    const PerRank out = compute_all(what(StagePart::kMoe, StageOp::kRouterSharedBwd).at_chunk(chunk), OpKind::kGemm, Phase::kBackward, l,
                                    kMatmulBackwardRatio * f.dense_mlp, kMemoryBackwardRatio * (t.pre + t.combine), dense, {ready});
    for (int r = 0; r < P_; ++r) {
      gpu_alloc(out[static_cast<std::size_t>(r)], r, input_grad, false, MemoryUse::kDispatch);
      gpu_free(out[static_cast<std::size_t>(r)], r, input_grad, MemoryUse::kDispatch);
    }
    return out;
  }
  const OpShape experts = routed_experts_shape(m_, tokens, ep_, E_);
  const bool over_ranks = ep_ && E_ > 1;
  const std::vector<double> balanced(static_cast<std::size_t>(P_), 1.0);
  const std::vector<double>& load = over_ranks ? rank_load(l) : balanced;
  // The normalized input's gradient, from the first backward that adds into it (the router's,
  // through the routing weights, at the gradient dispatch) to the norm's backward: input_grad.
  PerRank exp;
  if (over_ranks) {
    const PerRank dispatch = collective_each(what(StagePart::kMoe, StageOp::kA2aGradDispatch).at_chunk(chunk), OpKind::kAllToAll,
                                             Phase::kBackward, l, a2a_bytes_per_rank(m_, tokens, E_, load), ready, Over::kGroup);
    collective_operators(dispatch, what(StagePart::kMoe, StageOp::kA2aGradDispatch), Phase::kBackward, l, experts);
    exp = compute_loaded(what(StagePart::kMoe, StageOp::kExpertsBwd).at_chunk(chunk), OpKind::kExpertGemm, Phase::kBackward, l,
                         kMatmulBackwardRatio * f.routed_experts, kMemoryBackwardRatio * t.experts, experts, load,
                         {dispatch, fetched});
    for (int r = 0; r < P_; ++r) {
      const Bytes buffers = a2a_buffer_bytes_at_load(m_, l, tokens, load[static_cast<std::size_t>(r)]);
      gpu_alloc(dispatch[static_cast<std::size_t>(r)], r, buffers + input_grad, false, MemoryUse::kDispatch);
    }
  } else {
    exp = compute_all(what(StagePart::kMoe, StageOp::kExpertsBwd).at_chunk(chunk), OpKind::kExpertGemm, Phase::kBackward, l,
                      kMatmulBackwardRatio * f.routed_experts, kMemoryBackwardRatio * t.experts, experts, {ready});
    for (int r = 0; r < P_; ++r) gpu_alloc(exp[static_cast<std::size_t>(r)], r, input_grad, false, MemoryUse::kDispatch);
  }
  // The expert backward's activation gradients, one expert's rows at a time: the largest expert's
  // (its share of every rank's assignments under EP).
  const Bytes work = expert_grad_workspace_bytes(m_, l, tokens, ep_ ? E_ : 1, largest_share_[static_cast<std::size_t>(l)]);
  for (int r = 0; r < P_; ++r) {
    gpu_alloc(exp[static_cast<std::size_t>(r)], r, work, false, MemoryUse::kDispatch);
    gpu_free(exp[static_cast<std::size_t>(r)], r, work, MemoryUse::kDispatch);
  }
  if (over_ranks) {
    exp = collective_each(what(StagePart::kMoe, StageOp::kA2aGradReturn).at_chunk(chunk), OpKind::kAllToAll, Phase::kBackward, l,
                          a2a_bytes_per_rank(m_, tokens, E_, load), exp, Over::kGroup);
    collective_operators(exp, what(StagePart::kMoe, StageOp::kA2aGradReturn), Phase::kBackward, l, experts);
    for (int r = 0; r < P_; ++r) {
      gpu_free(exp[static_cast<std::size_t>(r)], r, a2a_buffer_bytes_at_load(m_, l, tokens, load[static_cast<std::size_t>(r)]),
               MemoryUse::kDispatch);
    }
  }
  const PerRank out = compute_all(what(StagePart::kMoe, StageOp::kRouterSharedBwd).at_chunk(chunk), OpKind::kGemm, Phase::kBackward, l,
                                  kMatmulBackwardRatio * (f.router + f.shared_expert + f.dense_mlp),
                                  kMemoryBackwardRatio * (t.pre + t.combine), dense, {exp});
  for (int r = 0; r < P_; ++r) gpu_free(out[static_cast<std::size_t>(r)], r, input_grad, MemoryUse::kDispatch);
  return out;
}

PerRank Lowering::mixing_backward(int l, std::int64_t seqs, const PerRank& ready) {
  const LayerKind kind = m_.layer_kinds[static_cast<std::size_t>(l)];
  const LayerFlops f = layer_flops(m_, l, seqs, S_);
  const StagePart part = is_attention(kind) ? StagePart::kAttention : StagePart::kGdn;
  PerRank last = compute_all(what(part, StageOp::kOutBwd), OpKind::kGemm, Phase::kBackward, l, kMatmulBackwardRatio * f.mixing_output, 0,
                             output_projection_shape(m_, kind, seqs * S_), {ready});
  PerRank ring;  // context parallelism: the K/V pieces and their gradients around the core
  // What one core backward call makes and frees before it returns, on each rank's stage.
  const auto held_by_call = [&](const PerRank& call, Bytes bytes) {
    for (int r = 0; r < P_; ++r) {
      gpu_alloc(call[static_cast<std::size_t>(r)], r, bytes, false, MemoryUse::kActivations);
      gpu_free(call[static_cast<std::size_t>(r)], r, bytes, MemoryUse::kActivations);
    }
  };
  // The attention's dO, gate, dQ, dK, dV (in head groups: the sums over the groups) from here to
  // the projections' backward; a head group's own gradients live in its core call's stage.
  Bytes gradients_held = 0;
  if (is_attention(kind)) {
    const AttentionSpec& a = m_.attention(kind);
    const int groups = attention_head_groups(a, plan_.split.attention_head_group);
    const OpShape core = attention_core_shape(a, groups, seqs, span_, S_);
    const Flops fwd = attention_core_flops(l, seqs) / groups;
    const AttentionBackwardBytes grads = attention_backward_bytes(a, m_.hidden, seqs, S_, plan_.split.attention_head_group);
    gradients_held = grads.held;
    for (int r = 0; r < P_; ++r) gpu_alloc(last[static_cast<std::size_t>(r)], r, gradients_held, true, MemoryUse::kActivations);
    ring = ring_attention(l, Phase::kBackward, last);
    for (int g = groups - 1; g >= 0; --g) {
      // Without O/LSE kept, a partitioned backward needs each group's softmax statistics again:
      // its forward is recomputed right before its backward.
      if (groups > 1 && !plan_.keep_attention_results) {
        last = compute_all(what(StagePart::kAttention, StageOp::kCoreRefwd).at_head_group(g), OpKind::kAttention, Phase::kRecompute, l, fwd, 0,
                           core, {last});
      }
      last = compute_all(what(StagePart::kAttention, StageOp::kCoreBwd).at_head_group(g), OpKind::kAttention, Phase::kBackward, l,
                         kAttentionBackwardRatio * fwd, 0, core, {last});
      held_by_call(last, grads.per_call);
    }
  } else {
    const GdnCallShape calls = gdn_call_shape(seqs, S_, plan_.split.gdn_chunk_tokens);
    const int chunks = calls.pieces;
    const OpShape core = gdn_core_shape(m_.gdn, seqs, S_, chunks);
    // Each piece's backward call holds its recomputed WY factors and chunk states, their
    // gradients and the inputs' gradients until it returns.
    const Bytes workspace = gdn_backward_bytes(m_.gdn, seqs, S_, plan_.split.gdn_chunk_tokens);
    op_calls_ = calls.calls;
    for (int c = chunks - 1; c >= 0; --c) {
      last = compute_all(what(StagePart::kGdn, StageOp::kCoreBwd).at_chunk(c), OpKind::kGdn, Phase::kBackward, l,
                         kGdnBackwardRatio * f.mixing_core.total() / chunks, gdn_core_hbm_bytes(m_.gdn, core.seqs, core.seq_len, true),
                         core, {last});
      held_by_call(last, workspace);
    }
    op_calls_ = 1;
    last = gdn_state_chain(l, Phase::kBackward, last, chunks);
  }
  OpShape proj;
  proj.tokens = seqs * S_;
  proj.k = m_.hidden;
  const Bytes bytes = kMemoryBackwardRatio * mixing_hbm_bytes(m_, l, seqs * S_);
  const PerRank out = compute_all(what(part, StageOp::kProjBwd), OpKind::kGemm, Phase::kBackward, l,
                                  kMatmulBackwardRatio * (f.mixing_projection - f.mixing_output), bytes, proj, {last, ring});
  if (!ring.empty()) ring_buffers_free(l, Phase::kBackward, out);
  for (int r = 0; r < P_; ++r) gpu_free(out[static_cast<std::size_t>(r)], r, gradients_held, MemoryUse::kActivations);
  return out;
}

PerRank Lowering::gdn_state_chain(int l, Phase phase, const PerRank& local, int chunks) {
  if (C_ <= 1) return local;
  // Context parallelism of Gated DeltaNet: each GPU ran its piece from a zero state. The pieces'
  // final FP32 states then pass along the sequence's GPUs in order (in backward, the state
  // gradients from the last piece to the first), each GPU folding its piece's state into the one
  // it received before passing it on: C − 1 hops one after another, a step of the sequence's GPUs
  // each. Then every GPU corrects its piece with the state it received (q·S over its tokens,
  // 2·tokens·H_v·d_k·d_v FLOPs; in backward the queries' and the state's gradients, twice that);
  // the first GPU of the chain, which receives none, is priced alike.
  const GdnSpec& g = m_.gdn;
  const bool backward = phase == Phase::kBackward;
  PerRank arrived = local;
  for (int step = 0; step + 1 < C_; ++step) {
    arrived = collective_all(what(StagePart::kGdn, backward ? StageOp::kGradPass : StageOp::kPass).at_ring_step(step),
                             OpKind::kAllGather, phase, l, gdn_state_bytes(g, seqs_), arrived, Over::kContext);
  }
  const Flops correction = (backward ? 2.0 : 1.0) * gdn_state_correction_flops(g, N_);
  context_chain_ = true;  // the backend runs the whole chain here (Stage::ops)
  const PerRank out = compute_all(what(StagePart::kGdn, backward ? StageOp::kCoreBwd : StageOp::kCore).at_chunk(chunks), OpKind::kGdn,
                                  phase, l, correction, 0, gdn_core_shape(g, seqs_, S_, 1), {arrived, local});
  context_chain_ = false;
  return out;
}

Flops Lowering::attention_core_flops(int l, std::int64_t seqs) const { return context_parallel_core_flops(m_, l, seqs, span_, C_); }

PerRank Lowering::ring_attention(int l, Phase phase, const PerRank& after) {
  if (C_ <= 1) return {};
  // Ring attention (context parallelism): every piece's K/V visits the other C − 1 GPUs of its
  // sequence, sent while the core works on the piece before it; NCCL-style, as an all-gather over
  // the sequence's GPUs of C − 1 pieces per member, beside the core. In backward the pieces pass
  // again and each piece's K/V gradient, summed on its way, comes back (a reduce-scatter).
  const AttentionSpec& a = m_.attention(m_.layer_kinds[static_cast<std::size_t>(l)]);
  const Bytes wire = static_cast<Bytes>(C_ - 1) * ring_kv_bytes(a, N_);
  PerRank ring = collective_all(what(StagePart::kAttention, StageOp::kAllGather), OpKind::kAllGather, phase, l, wire, after,
                                Over::kContext);
  collective_operators(ring, what(StagePart::kAttention, StageOp::kAllGather), phase, l, OpShape{});
  const bool backward = phase == Phase::kBackward;
  for (int r = 0; r < P_; ++r) {
    gpu_alloc(ring[static_cast<std::size_t>(r)], r, ring_attention_buffer_bytes(a, N_, backward), false, MemoryUse::kActivations);
  }
  if (backward) {
    ring = collective_all(what(StagePart::kAttention, StageOp::kReduceScatter), OpKind::kReduceScatter, phase, l, wire, ring,
                          Over::kContext);
  }
  return ring;
}

void Lowering::ring_buffers_free(int l, Phase phase, const PerRank& until) {
  const AttentionSpec& a = m_.attention(m_.layer_kinds[static_cast<std::size_t>(l)]);
  for (int r = 0; r < P_; ++r) {
    gpu_free(until[static_cast<std::size_t>(r)], r, ring_attention_buffer_bytes(a, N_, phase == Phase::kBackward),
             MemoryUse::kActivations);
  }
}

void Lowering::decoder_forward(int l, Phase phase, bool original) {
  const WindowUse w = deliver_weights(StagePart::kWeights, phase, l, common_params(l), expert_params_h2d(l),
                                      expert_params_on_gpu(l), expert_allgather(l));
  const PerRank input = last_compute_;
  const Bytes boundary = boundary_bytes(1, seqs_, S_, m_.hidden);
  if (original) {
    switch (plan_.boundaries.place(l)) {
      case BoundaryPolicy::Place::kHost: {
        PerRank save(static_cast<std::size_t>(P_));
        for (int r = 0; r < P_; ++r) {
          Stage s = make(what(StagePart::kBoundary, StageOp::kD2h), OpKind::kD2h, phase, r_[static_cast<std::size_t>(r)].d2h, r, l);
          s.bytes = boundary;
          if (input[static_cast<std::size_t>(r)] >= 0) s.deps.push_back(input[static_cast<std::size_t>(r)]);
          save[static_cast<std::size_t>(r)] = add(std::move(s));
          host_alloc(save[static_cast<std::size_t>(r)], r, boundary);
        }
        host_boundaries_[l] = save;
        break;
      }
      case BoundaryPolicy::Place::kGpu:
        for (int r = 0; r < P_; ++r) gpu_alloc(input[static_cast<std::size_t>(r)], r, boundary, true, MemoryUse::kBoundaries);
        gpu_boundaries_[l] = {input, boundary};
        break;
      case BoundaryPolicy::Place::kRegenerated:
        break;
    }
  }
  const bool retained = ep_ && plan_.is_moe_retained(l);
  const LayerKind kind = m_.layer_kinds[static_cast<std::size_t>(l)];
  const bool reuse_o = !original && plan_.keep_attention_results && is_attention(kind);
  const std::int64_t sb = live_seqs();
  PerRank x = input;
  for (std::int64_t done = 0; done < seqs_; done += sb) {
    sub_batch_ = sb < seqs_ ? static_cast<int>(done / sb) : -1;
    const std::int64_t seqs = std::min(sb, seqs_ - done);
    const Bytes mix_act = mixing_activation_bytes(m_, l, seqs, S_, plan_.split.attention_head_group, plan_.split.gdn_chunk_tokens);
    const PerRank mix = mixing_forward(l, phase, seqs, w, x, original, reuse_o);
    for (int r = 0; r < P_; ++r) {
      gpu_alloc(mix[static_cast<std::size_t>(r)], r, mix_act, false, MemoryUse::kActivations);
      gpu_free(mix[static_cast<std::size_t>(r)], r, mix_act, MemoryUse::kActivations);
    }
    x = moe_forward(l, phase, seqs * S_, w, mix, retained);
  }
  sub_batch_ = -1;
  release_window(w, x);
}

PerRank Lowering::boundary_for_backward(int l) {
  const Bytes boundary = boundary_bytes(1, seqs_, S_, m_.hidden);
  const auto place = plan_.boundaries.place(l);
  // Already on the GPU: held there, regenerated, or loaded from the host to start a regeneration
  // run (it stays for its own backward).
  if (gpu_boundaries_.count(l)) return gpu_boundaries_.at(l).first;
  if (place == BoundaryPolicy::Place::kHost) {
    PerRank load(static_cast<std::size_t>(P_));
    for (int r = 0; r < P_; ++r) {
      Stage s = make(what(StagePart::kBoundary, StageOp::kH2d), OpKind::kH2d, Phase::kBackward, r_[static_cast<std::size_t>(r)].h2d, r, l);
      s.bytes = boundary;
      if (host_boundaries_.count(l)) s.deps.push_back(host_boundaries_.at(l)[static_cast<std::size_t>(r)]);
      // The load overlaps the previous decoder's mixing backward: it waits until that decoder's MoE
      // backward has run (and released its dispatch buffers, the step's usual peak), so it shares the
      // GPU only with the mixing sublayer's gradients (that decoder's own input released already). Loaded only after
      // the whole previous backward, the copy is exposed once per decoder (the Local 4K records at
      // batch 128 and 256 came out 12-13 % slow, left out one at a time); loaded before it, the
      // second buffer sits at every MoE chunk's backward, above the published 512K peaks
      // (traces/paper/README.md). SCO prefetches one whole decoder ahead into a second buffer:
      // its load waits only for the consumer of the buffer before (the decoder two back).
      const PerRank& freed = plan_.flat.selective_checkpoint_offload ? boundary_consumed_before_ : moe_backward_done_;
      if (!freed.empty() && freed[static_cast<std::size_t>(r)] >= 0) s.deps.push_back(freed[static_cast<std::size_t>(r)]);
      load[static_cast<std::size_t>(r)] = add(std::move(s));
      gpu_alloc(load[static_cast<std::size_t>(r)], r, boundary, false, MemoryUse::kBoundaries);
    }
    gpu_boundaries_[l] = {load, boundary};
    return load;
  }
  // Regenerate: no-grad forwards from the nearest kept boundary j < l through decoders j..l−1,
  // holding the last `regenerate_cap` regenerated boundaries on the GPU (reference §4 "Replay"). A
  // starting boundary loaded from the host stays too, for its own backward (not loaded twice): the
  // published 512K replay record (one boundary in two kept) peaks one boundary above the record that
  // keeps them all.
  int j = l - 1;
  while (j > 0 && plan_.boundaries.place(j) == BoundaryPolicy::Place::kRegenerated && !gpu_boundaries_.count(j)) --j;
  if (j < 0) j = 0;
  const bool j_was_held = gpu_boundaries_.count(j) > 0;
  PerRank start;
  if (plan_.boundaries.place(j) == BoundaryPolicy::Place::kRegenerated && !j_was_held) {
    // Decoder 0's input regenerated: gather the embeddings again.
    OpShape shape;
    shape.tokens = N_;
    start = compute_all(what(StagePart::kEmbedding, StageOp::kRegather), OpKind::kElementwise, Phase::kRecompute, -1, 0, boundary, shape, {last_compute_});
    for (int r = 0; r < P_; ++r) gpu_alloc(start[static_cast<std::size_t>(r)], r, boundary, false, MemoryUse::kBoundaries);
    gpu_boundaries_[j] = {start, boundary};
  } else {
    start = boundary_for_backward(j);
  }
  const int cap = std::max(1, plan_.boundaries.regenerate_cap);
  last_compute_ = start;
  for (int d = j; d < l; ++d) {
    decoder_forward(d, Phase::kRecompute, false);
    const int produced = d + 1;  // the input of decoder d+1
    if (produced > l - cap) {
      for (int r = 0; r < P_; ++r) gpu_alloc(last_compute_[static_cast<std::size_t>(r)], r, boundary, true, MemoryUse::kBoundaries);
      gpu_boundaries_[produced] = {last_compute_, boundary};
    }
  }
  return gpu_boundaries_.at(l).first;
}

// The decoder's input is read by the replayed mixing forward only (its input norm and the residual
// add): the norm's backward needs the normalized output, which the projections keep, and the FP32
// 1/rms, not the input (backend/model/model.h model_norm_keeping_output). Released once the last
// sub-batch has read it (`replayed`), it is not beside the MoE backward, the usual peak. The
// published Local peaks say so: holding it, the 512K split and keep records and both 256K records
// came out 1.8-3.2 GiB over (+3.8 to +7.4 %), about a boundary (2 GiB at 512K, 1 GiB at 256K),
// whether they peak in an MoE chunk's backward or in a GDN core's; the replay record's published
// extra boundary is its regeneration's start (boundary_for_backward). Its host copy goes at the
// same point: loaded early to start a regeneration run, it stays on the host until then (the
// published replay record's host memory holds it).
void Lowering::release_input_after_replay(int l, const PerRank& replayed) {
  if (gpu_boundaries_.count(l)) {
    for (int r = 0; r < P_; ++r) gpu_free(replayed[static_cast<std::size_t>(r)], r, gpu_boundaries_.at(l).second, MemoryUse::kBoundaries);
    gpu_boundaries_.erase(l);
  }
  if (host_boundaries_.count(l)) {
    for (int r = 0; r < P_; ++r) host_free(replayed[static_cast<std::size_t>(r)], r, boundary_bytes(1, seqs_, S_, m_.hidden));
  }
}

void Lowering::decoder_backward(int l) {
  // A boundary on the host is loaded after the layer's weights (the weights prefetch into their
  // slot; the boundary waits for its buffer); a regenerated one is produced before them.
  const bool load_after = plan_.boundaries.place(l) == BoundaryPolicy::Place::kHost;
  PerRank input;
  if (!load_after) input = boundary_for_backward(l);
  const WindowUse w = deliver_weights(StagePart::kWeights, Phase::kBackward, l, common_params(l), expert_params_h2d(l),
                                      expert_params_on_gpu(l), expert_allgather(l));
  if (load_after) input = boundary_for_backward(l);
  const bool retained = ep_ && plan_.is_moe_retained(l);
  const LayerKind kind = m_.layer_kinds[static_cast<std::size_t>(l)];
  const bool reuse_o = plan_.keep_attention_results && is_attention(kind);
  const ParamCount common = common_params(l), experts = expert_params_on_gpu(l);
  const std::int64_t sb = live_seqs();
  bool first = true;
  PerRank x = input, last_expert_bwd;
  for (std::int64_t done = 0; done < seqs_; done += sb) {
    sub_batch_ = sb < seqs_ ? static_cast<int>(done / sb) : -1;
    const std::int64_t seqs = std::min(sb, seqs_ - done);
    const Bytes mix_act = mixing_activation_bytes(m_, l, seqs, S_, plan_.split.attention_head_group, plan_.split.gdn_chunk_tokens);
    replaying_ = true;
    const PerRank mix = mixing_forward(l, Phase::kRecompute, seqs, w, x, false, reuse_o);
    replaying_ = false;
    for (int r = 0; r < P_; ++r) gpu_alloc(mix[static_cast<std::size_t>(r)], r, mix_act, false, MemoryUse::kActivations);
    if (done + sb >= seqs_) release_input_after_replay(l, mix);
    x = mix;
    if (first) {
      // Gradient buffer: wait until the buffer of the decoder two back has drained.
      std::vector<PerRank> gate = {x};
      const std::size_t uses = grad_buffer_frees_.size();
      if (uses >= 2) {
        for (const auto& f : grad_buffer_frees_[uses - 2]) gate.push_back(f);
      }
      x = compute_all(what(StagePart::kGrads, StageOp::kBuffer), OpKind::kSync, Phase::kBackward, l, 0, 0, OpShape{}, gate);
      for (int r = 0; r < P_; ++r) gpu_alloc(x[static_cast<std::size_t>(r)], r, gradient_bytes(common + experts), false, MemoryUse::kOptimizer);
      first = false;
    }
    // LLEP: the spilled experts' weights again for the replay and backward (rounds in order here).
    const PerRank fetched = llep_fetch(l, Phase::kBackward, w.ready);
    const auto chunks = moe_chunks(seqs * S_);
    for (int c = static_cast<int>(chunks.size()) - 1; c >= 0; --c) {
      const std::int64_t tokens = chunks[static_cast<std::size_t>(c)];
      PerRank ready = x;
      if (!retained) {
        replaying_ = true;
        ready = moe_forward_chunk(l, Phase::kRecompute, tokens, w, x, c, fetched);
        replaying_ = false;
        for (int r = 0; r < P_; ++r) {
          gpu_alloc(ready[static_cast<std::size_t>(r)], r, moe_activation_on_rank(tokens, l, r), false, MemoryUse::kDispatch);
        }
      }
      x = moe_backward_chunk(l, tokens, ready, c, fetched);
      last_expert_bwd = x;
      for (int r = 0; r < P_; ++r) gpu_free(x[static_cast<std::size_t>(r)], r, moe_activation_on_rank(tokens, l, r), MemoryUse::kDispatch);
    }
    if (!fetched.empty()) last_expert_bwd = llep_gradient_return(l, x);
    moe_backward_done_ = x;
    x = mixing_backward(l, seqs, x);
    for (int r = 0; r < P_; ++r) gpu_free(x[static_cast<std::size_t>(r)], r, mix_act, MemoryUse::kActivations);
  }
  sub_batch_ = -1;
  release_window(w, x);
  // The decoder input is consumed; an O/LSE copy on the host is no longer needed.
  boundary_consumed_before_ = boundary_consumed_;
  boundary_consumed_ = x;
  if (olse_saved_.count(l)) {
    for (int r = 0; r < P_; ++r) host_free(x[static_cast<std::size_t>(r)], r, attention_result_bytes(m_.attention(kind), seqs_, S_));
  }

  std::vector<PerRank> d2h;
  pending_grad_frees_.clear();
  if (streamed_optimizer()) {
    const ParamCount group = common + experts;
    if (ep_) {
      if (plan_.is_resident(l)) {
        resident_update(l, experts, last_expert_bwd);
      } else {
        stream_gradients(StagePart::kExperts, l, experts, last_expert_bwd, expert_replicas(), true, false, experts / D_);
      }
      stream_gradients(StagePart::kCommon, l, common, x, Over::kAll, false, false, common / P_);
    } else if (plan_.param_transfer == ParamTransfer::kShard) {
      stream_gradients(StagePart::kLayer, l, group, x, Over::kAll, false, false, group / P_);
    } else {
      stream_gradients(StagePart::kLayer, l, group, x, Over::kNone, false, true, group / P_);
    }
  } else if (ep_) {
    const bool resident = plan_.is_resident(l);
    if (resident) {
      // Resident shard: GPU AdamW and BF16 refresh on the GPU (over its replicas, each its slice);
      // no H2D, D2H or CPU update.
      resident_update(l, experts, last_expert_bwd);
    } else {
      // With replicas (EP groups), the shard's gradient is reduce-scattered over them first.
      gradients_to_host(StagePart::kExperts, l, experts, last_expert_bwd, expert_replicas(), true, d2h);
    }
    gradients_to_host(StagePart::kCommon, l, common, x, Over::kAll, false, d2h);
    cpu_update(StagePart::kLayer, l, common / P_ + (resident ? 0 : experts / D_), d2h, false, 0);
  } else if (plan_.param_transfer == ParamTransfer::kShard) {
    // Gradients reduced on the GPUs (the mirror of the shard all-gather); each rank updates 1/P.
    gradients_to_host(StagePart::kLayer, l, common + experts, x, Over::kAll, false, d2h);
    cpu_update(StagePart::kLayer, l, (common + experts) / P_, d2h, false, 0);
  } else {
    // BF16 partials accumulated in FP32 in host memory, then each rank updates 1/P.
    gradients_to_host(StagePart::kLayer, l, common + experts, x, Over::kNone, false, d2h);
    cpu_update(StagePart::kLayer, l, (common + experts) / P_, d2h, true, common + experts);
  }
  grad_buffer_frees_.push_back(pending_grad_frees_);
  pending_grad_frees_.clear();
}

}  // namespace oom::lowering
