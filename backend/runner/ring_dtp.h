// Ring-DTP over ranks: rank r holds head rows [r·V/P, (r+1)·V/P). Whichever is smaller circulates
// (costmodel ring_dtp_hops decides, as the lowering prices it): the ranks' normalized hidden-state
// blocks go round past the resident head shards at the pass stages with their online log-sum-exp,
// then with their FP32 gradient partial, which the last grad_pass takes home; or the head shards go
// round past the resident blocks, then with their FP32 gradient partial, which a last hop takes to
// the shard's owner. The runner's methods are in ring_dtp.cc.
#pragma once

#include <ATen/ATen.h>

#include "backend/model/plan_ops.h"

namespace oom::backend::runner {

// This rank's normalized hidden states (with their graph to the head's input), the block it holds
// (hidden states, targets, cross-entropy state, log-sum-exp, gradient so far) and its head shard's
// gradient.
struct Ring {
  bool weights = false;              // head shards circulate (else hidden-state blocks)
  at::Tensor xn, x, t, lse, dx, dshard;
  at::Tensor w;                      // the head shard computed against: this rank's, or one passing
  int owner = 0;                     // whose shard w is
  plan_ops::RingLse state;
};

}  // namespace oom::backend::runner
