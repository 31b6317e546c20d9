// Context parallelism (Plan context_parallel_gpus = C > 1, Runner::cp_ranks; README.md's cluster
// section): each sequence of the global batch split over C consecutive ranks. Rank R holds piece p = R mod C of
// sequence R / C as zig-zag chunks: of the sequence's 2C equal chunks, chunks p and 2C − 1 − p
// (which balances the causal mask), in that order; RoPE sees the tokens' places in the sequence.
// Every linear operator, the MoE and the loss work on the piece as they do on whole sequences.
// Attention: the lowering's all-gather stage brings the other pieces' K/V (the sequence's K/V in
// order), each query chunk attends over it from its place; in backward the K/V gradients of the
// whole sequence go back to their pieces' ranks summed (the reduce-scatter the lowering prices,
// run when the core's backward has made them: at the projections' backward). Gated DeltaNet: the
// FP32 recurrent state and the conv's left context pass along the sequence's chunks in order
// (rank 0, 1, …, C − 1, C − 1, …, 0), each chunk run from the state it received, which is exact;
// in backward the state and context gradients pass back in reverse. The lowering prices C − 1 hops
// and a correction after a zero-state run of each piece; the chain runs in the correction's stage
// (gdn.core or gdn.core_bwd at the chunk after the pieces: its operators are the GDN's), the
// pieces' and the hops' stages have no work, so the stage keys stay the lowering's.
// Every collective is an all-to-all over all ranks in which only a sequence's ranks exchange rows:
// every rank calls them in the same order.
#include "backend/runner/runner.h"

#include <tuple>

#include <torch/torch.h>

#include "backend/runner/block_grad.h"
#include "backend/runtime/device_memory.h"

namespace oom::backend::runner {

namespace {

at::Tensor time_rows(const at::Tensor& t, std::int64_t t0, std::int64_t n) { return t.defined() ? t.narrow(2, t0, n) : t; }

}  // namespace

// Places of piece p's tokens in their sequence of `seq` tokens: chunks p and 2C − 1 − p.
at::Tensor Runner::piece_positions(std::int64_t seq, int p) const {
  const std::int64_t h = seq / (2 * cp_ranks);
  const auto opts = at::TensorOptions().dtype(at::kLong);
  return at::cat({at::arange(p * h, (p + 1) * h, opts), at::arange((2 * cp_ranks - 1 - p) * h, (2 * cp_ranks - p) * h, opts)});
}

void Runner::take_piece(const at::Tensor& tokens, const at::Tensor& targets) {
  const std::int64_t seq = tokens.size(1);
  cp_piece = R % cp_ranks;
  positions = piece_positions(seq, cp_piece);
  std::vector<at::Tensor> all;
  for (int p = 0; p < cp_ranks; ++p) all.push_back(piece_positions(seq, p));
  pieces_order = at::cat(all).to(dev);            // row i of the gathered pieces is token pieces_order[i]
  sequence_order = at::argsort(pieces_order);     // token t is row sequence_order[t] of the gathered pieces
  const auto at_rank = [&](const at::Tensor& t) { return t.narrow(0, R / cp_ranks, 1).index_select(1, positions); };
  tok = device_memory::to_device(at_rank(tokens), dev);
  tgt = device_memory::to_device(at_rank(targets), dev);
  positions = positions.to(dev);
}

// Rows [n, …] from each of the sequence's ranks, [cp_ranks·n, …] in piece order. `to` ≥ 0: only rank
// `to` of the sequence (its place) receives, from `from` alone; the others send and receive nothing.
at::Tensor Runner::sequence_exchange(const at::Tensor& rows, int from, int to) {
  const int first = R - cp_piece;
  const std::int64_t n = rows.size(0);
  std::vector<std::int64_t> send(static_cast<std::size_t>(P), 0), recv(static_cast<std::size_t>(P), 0);
  std::vector<at::Tensor> out;
  for (int q = 0; q < cp_ranks; ++q) {
    const bool sends = to < 0 || (cp_piece == from && q == to);
    const bool receives = to < 0 || (cp_piece == to && q == from);
    if (sends) {
      send[static_cast<std::size_t>(first + q)] = n;
      out.push_back(rows);
    }
    if (receives) recv[static_cast<std::size_t>(first + q)] = n;
  }
  auto sizes = rows.sizes().vec();
  sizes[0] = 0;
  const auto input = out.empty() ? at::empty(sizes, rows.options()) : at::cat(out, 0);
  return group->all_to_all(input, send, recv);
}

// K or V of the piece [B, Hkv, S, d] → the sequence's [B, Hkv, cp_ranks·S, d] in token order.
at::Tensor Runner::gather_sequence(const at::Tensor& t) {
  const auto rows = t.permute({2, 0, 1, 3}).contiguous();  // [S, B, Hkv, d]
  return sequence_exchange(rows).index_select(0, sequence_order).permute({1, 2, 0, 3});
}

// The sequence's gradient [B, Hkv, cp_ranks·S, d] of every rank → the sum over the sequence's ranks of
// this piece's rows [B, Hkv, S, d].
at::Tensor Runner::scatter_sequence(const at::Tensor& t) {
  const auto rows = t.permute({2, 0, 1, 3}).index_select(0, pieces_order).contiguous();  // [cp_ranks·S, B, Hkv, d] by piece
  const std::int64_t n = rows.size(0) / cp_ranks;
  const int first = R - cp_piece;
  std::vector<std::int64_t> send(static_cast<std::size_t>(P), 0), recv(static_cast<std::size_t>(P), 0);
  for (int q = 0; q < cp_ranks; ++q) send[static_cast<std::size_t>(first + q)] = recv[static_cast<std::size_t>(first + q)] = n;
  auto sizes = rows.sizes().vec();
  sizes[0] = n;
  sizes.insert(sizes.begin(), cp_ranks);
  return group->all_to_all(rows, send, recv).view(sizes).sum(0).permute({1, 2, 0, 3});
}

void Runner::attn_gather(const Stage& st_, Pass& p) {
  Sub& s = sub_of(p, st_.key);
  if (s.kf.defined()) return;  // a backward's second gather: the replay's pieces are here
  if (p.kind != PassKind::kBackward) {
    s.kf = gather_sequence(s.in.k);
    s.vf = gather_sequence(s.in.v);
    return;
  }
  at::NoGradGuard no_grad;
  s.kf = leaf(gather_sequence(s.k_l.detach()));
  s.vf = leaf(gather_sequence(s.v_l.detach()));
}

AttentionOutput Runner::piece_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int l) {
  const std::int64_t h = S / 2;
  std::vector<at::Tensor> outs, lses;
  for (int half = 0; half < 2; ++half) {
    const std::int64_t from = half == 0 ? cp_piece * h : (2 * cp_ranks - 1 - cp_piece) * h;
    auto r = attention_core(q.narrow(2, half * h, h), k, v, attn(l).window_tokens, cfg.model.attention_query_block, scale(l), from);
    outs.push_back(r.out);
    lses.push_back(r.lse);
  }
  return {at::cat(outs, 2), at::cat(lses, 2)};
}

plan_ops::AttentionGrads Runner::piece_attention_backward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                          const at::Tensor& out, const at::Tensor& lse, const at::Tensor& dout, int l) {
  const std::int64_t h = S / 2;
  plan_ops::AttentionGrads sum;
  std::vector<at::Tensor> dq;
  for (int half = 0; half < 2; ++half) {
    const std::int64_t from = half == 0 ? cp_piece * h : (2 * cp_ranks - 1 - cp_piece) * h;
    const auto g = plan_ops::attention_core_backward(q.narrow(2, half * h, h), k, v, out.narrow(2, half * h, h), lse.narrow(2, half * h, h),
                                                     dout.narrow(2, half * h, h), attn(l).window_tokens, cfg.model.attention_query_block,
                                                     scale(l), from);
    dq.push_back(g.dq);
    sum.dk = sum.dk.defined() ? sum.dk + g.dk : g.dk;
    sum.dv = sum.dv.defined() ? sum.dv + g.dv : g.dv;
  }
  sum.dq = at::cat(dq, 2);
  return sum;
}

namespace {

// The sequence's rank that holds chunk j of 2C: j for the first half, 2C − 1 − j for the second.
int holder(int j, int C) { return j < C ? j : 2 * C - 1 - j; }

}  // namespace

// The (state, conv context) pair as one row per sequence, handed from the holder of one chunk to the
// next's; returns what this rank received (the pair it gave where it holds both chunks).
std::pair<at::Tensor, at::Tensor> Runner::hand_state(const at::Tensor& state, const at::Tensor& context, int from, int to) {
  if (from == to) return {state, context};
  const std::int64_t n = state.size(0), a = state[0].numel();
  const auto row = at::cat({state.reshape({n, -1}), context.reshape({n, -1})}, 1);
  const auto got = sequence_exchange(row, from, to);
  if (cp_piece != to) return {state, context};
  return {got.narrow(1, 0, a).reshape(state.sizes()), got.narrow(1, a, got.size(1) - a).reshape(context.sizes())};
}

void Runner::gdn_chain(const Stage& st_, Pass& p) {
  Sub& s = sub_of(p, st_.key);
  const bool bwd = p.kind == PassKind::kBackward;
  const plan_ops::GdnInputs& in = bwd ? s.glin : s.gin;
  const GdnSpec& g = spec.gdn;
  const std::int64_t h = S / 2, K = g.conv_kernel, conv_dim = 2 * g.key_dim() + g.value_dim();
  const auto f32 = in.qkv.options().dtype(at::kFloat);
  at::Tensor state = at::zeros({s.n, g.value_heads, g.key_head_dim, g.value_head_dim}, f32);
  at::Tensor context = at::zeros({s.n, conv_dim, K - 1}, f32);
  at::NoGradGuard no_grad;  // a backward recomputes each chunk from its kept start
  std::vector<at::Tensor> outs(2);
  s.starts.assign(2, at::Tensor());
  s.contexts.assign(2, at::Tensor());
  for (int j = 0; j < 2 * cp_ranks; ++j) {
    if (j > 0) std::tie(state, context) = hand_state(state, context, holder(j - 1, cp_ranks), holder(j, cp_ranks));
    if (holder(j, cp_ranks) != cp_piece) continue;
    const int half = j < cp_ranks ? 0 : 1;
    const plan_ops::GdnInputs mine{time_rows(in.qkv, half * h, h), in.z, time_rows(in.beta, half * h, h), time_rows(in.g, half * h, h)};
    s.starts[static_cast<std::size_t>(half)] = state;
    s.contexts[static_cast<std::size_t>(half)] = context;
    outs[static_cast<std::size_t>(half)] = plan_ops::gdn_core(mine, 0, h, p.w, spec, cfg.model.gdn_chunk_tokens, state, context);
    context = mine.qkv.narrow(2, h - (K - 1), K - 1);  // the next chunk's left context
  }
  s.outs = outs;
}

void Runner::gdn_grad_chain(const Stage& st_, Pass& p) {
  Sub& s = sub_of(p, st_.key);
  const GdnSpec& g = spec.gdn;
  const std::int64_t h = S / 2, K = g.conv_kernel;
  at::Tensor dstate = at::zeros_like(s.starts[0]), dcontext = at::zeros_like(s.contexts[0]);
  for (int j = 2 * cp_ranks - 1; j >= 0; --j) {
    if (j < 2 * cp_ranks - 1) std::tie(dstate, dcontext) = hand_state(dstate, dcontext, holder(j + 1, cp_ranks), holder(j, cp_ranks));
    if (holder(j, cp_ranks) != cp_piece) continue;
    const int half = j < cp_ranks ? 0 : 1;
    const plan_ops::GdnInputs mine{time_rows(s.glin.qkv, half * h, h), s.glin.z, time_rows(s.glin.beta, half * h, h),
                                   time_rows(s.glin.g, half * h, h)};
    auto start = leaf(s.starts[static_cast<std::size_t>(half)]);
    auto context = leaf(s.contexts[static_cast<std::size_t>(half)]);
    auto state = start;
    const auto out = plan_ops::gdn_core(mine, 0, h, p.w, spec, cfg.model.gdn_chunk_tokens, state, context);
    // The chunk's outputs and end state, and its last K − 1 channels, which the next chunk read as
    // its left context.
    const bool last = j == 2 * cp_ranks - 1;  // the sequence's last chunk: nothing read its end
    backward_defined({out, state, mine.qkv.narrow(2, h - (K - 1), K - 1)},
                     {s.dout.narrow(2, half * h, h), last ? at::Tensor() : dstate, last ? at::Tensor() : dcontext});
    dstate = start.grad().defined() ? start.grad() : at::zeros_like(start);
    dcontext = context.grad().defined() ? context.grad() : at::zeros_like(context);
  }
}

}  // namespace oom::backend::runner
