// Ring-DTP's loss and backward over ranks (ring_dtp.h).
#include "backend/runner/runner.h"

#include <torch/torch.h>

#include "backend/runtime/device_memory.h"
#include "costmodel/memory.h"

namespace oom::backend::runner {

// One ring hop: every rank sends `t` (rows) to the next rank and returns what the previous sent.
at::Tensor Runner::ring_hop(const at::Tensor& t, int to_offset) {
  std::vector<std::int64_t> send(static_cast<std::size_t>(P), 0), recv(static_cast<std::size_t>(P), 0);
  send[static_cast<std::size_t>((R + to_offset) % P)] = t.size(0);
  recv[static_cast<std::size_t>((R - to_offset % P + P) % P)] = t.size(0);  // blocks are equal: B/P sequences each
  return group->all_to_all(t.contiguous(), send, recv);
}

at::Tensor Runner::head_shard() const { return outer["lm_head"].narrow(0, R * shard_rows(), shard_rows()).detach(); }

std::int64_t Runner::logits_block() const { return plan.flat.logits_block_tokens(ring.x.size(0)); }

// Passes `t` on round the ring with the other tensors of a hop, all in flight at once (each
// step's receive buffers are allocated before its send buffers are released).
void Runner::ring_hop_all(std::initializer_list<at::Tensor*> ts) {
  std::vector<at::Tensor> next;
  for (at::Tensor* t : ts) next.push_back(ring_hop(*t));
  std::size_t i = 0;
  for (at::Tensor* t : ts) *t = std::move(next[i++]);
}

// Step s: the block held meets the shard held (hidden blocks circulating: rank r − s's block and
// this rank's shard; head shards circulating: this rank's block and rank r − s's shard); after the
// last step each block's log-sum-exp is complete and its mean cross-entropy is its rank's loss.
void Runner::ring_loss(const Stage& st_) {
  if (st_.key.ring_step == 0) {
    hL = leaf(act.at(spec.layers));
    act.erase(spec.layers);
    device_memory::Tagged hidden(MemoryUse::kActivations);  // this rank's own block, normed
    ring.xn = model_norm(hL, outer["final_norm"], spec);
    ring.x = ring.xn.detach().reshape({-1, spec.hidden});
    ring.t = tgt.reshape({-1});
    ring.state = plan_ops::ring_lse_start(ring.x.size(0), ring.x.options());
    ring.weights = ring_dtp_hops(spec, ring.x.size(0), P).weights_move;
    ring.w = head_shard();
    ring.owner = R;
  }
  at::NoGradGuard no_grad;
  plan_ops::ring_fold(ring.state, ring.x, ring.w, ring.owner * shard_rows(), ring.t, spec.final_logit_softcap, logits_block());
  if (st_.key.ring_step == P - 1) {
    ring.lse = plan_ops::ring_lse(ring.state);
    loss = (ring.lse - ring.state.target).mean();
    if (ring.weights) ring.w = at::Tensor();  // the shard passing through is done with
  }
}

void Runner::ring_pass() {
  at::NoGradGuard no_grad;
  if (ring.weights) {
    ring_hop_all({&ring.w});
    ring.owner = (ring.owner + P - 1) % P;  // from rank r − 1
    return;
  }
  ring_hop_all({&ring.x, &ring.t, &ring.state.max, &ring.state.sum, &ring.state.target});
}

// Step s: the gradient of the held block against the held shard. The circulating tensor travels
// with its FP32 gradient partial (a hidden block's or a shard's); the resident one's gradient
// stays here. The loss is the mean over all P·n tokens.
void Runner::ring_backward(const Stage& st_) {
  at::NoGradGuard no_grad;
  if (st_.key.ring_step == 0) {
    if (ring.weights) {
      ring.w = head_shard();
      ring.owner = R;
    }
    {
      // This rank's tokens' hidden-state gradient, or the travelling partial.
      device_memory::Tagged use(ring.weights ? MemoryUse::kActivations : MemoryUse::kVocabulary);
      ring.dx = at::zeros(ring.x.sizes(), ring.x.options().dtype(at::kFloat));
    }
    // This rank's shard's gradient, or the travelling partial.
    device_memory::Tagged use(ring.weights ? MemoryUse::kVocabulary : MemoryUse::kOptimizer);
    ring.dshard = at::zeros({shard_rows(), spec.hidden}, ring.x.options().dtype(at::kFloat));
  }
  const double scale = 1.0 / static_cast<double>(ring.x.size(0) * P);
  plan_ops::ring_backward(ring.x, ring.w, ring.owner * shard_rows(), ring.t, ring.lse, scale, spec.final_logit_softcap,
                          logits_block(), ring.dx, ring.dshard);
}

// After each step but the last the circulating tensor moves on with its partial; after the last
// the partial goes home (hidden blocks: the block held then is rank r + 2 − P's; shards: rank
// r + 1's), and the hidden-state gradient flows back through the final norm into the last
// decoder's output; the shard's gradient and the norm's (summed over the ranks) are complete.
void Runner::ring_grad_pass(const Stage& st_) {
  if (st_.key.ring_step + 1 < P) {
    at::NoGradGuard no_grad;
    if (ring.weights) {
      ring_hop_all({&ring.w, &ring.dshard});
      ring.owner = (ring.owner + P - 1) % P;
    } else {
      ring_hop_all({&ring.x, &ring.t, &ring.lse, &ring.dx});
    }
    return;
  }
  at::Tensor home, shard_grad;
  {
    at::NoGradGuard no_grad;
    ring.w = at::Tensor();
    if (ring.weights) {
      shard_grad = ring_hop(ring.dshard, 1);  // to rank r + 1, the shard's owner
      home = ring.dx;
    } else {
      home = ring_hop(ring.dx, 2);  // to rank r + 2 − P ≡ r + 2, the block's owner
      shard_grad = ring.dshard;
    }
    ring.dx = ring.dshard = at::Tensor();
  }
  outer_gradient(true);
  {
    at::NoGradGuard no_grad;
    auto rows = outer_grad_range(st.layout().blocks[0].at("lm_head").offset, spec.vocab * spec.hidden)
                    .view({spec.vocab, spec.hidden})
                    .narrow(0, R * shard_rows(), shard_rows());
    rows.add_(shard_grad.to(rows.scalar_type()));
    shard_grad = at::Tensor();
  }
  {
    device_memory::Tagged hidden(MemoryUse::kActivations);  // the final norm's backward
    ring.xn.backward(home.view(ring.xn.sizes()).to(ring.xn.scalar_type()));
  }
  dgrad[spec.layers] = hL.grad();
  const auto& norm = st.layout().blocks[0].at("final_norm");
  auto norm_grad = outer_grad_range(norm.offset, norm.numel());
  group->all_reduce_sum(norm_grad);
  hL = at::Tensor();
  ring = Ring{};
  drop_outer();
}

}  // namespace oom::backend::runner
