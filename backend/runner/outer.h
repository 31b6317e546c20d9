// The outer block of the graph runner: the embedding and the LM head. Their weights are on the
// device only while a stage uses them, as the lowering delivers them (the embedding for its gather
// and a regather, the head from its H2D to the end of its backward); their gradient lives in its
// two groups' ranges, each allocated by the first backward that adds into it and released after the
// last stage that reads it. The loss runs in the plan's logits blocks (FLAT's vocab_chunk_tokens).
// The runner's methods are in outer.cc; Ring-DTP's loss is in ring_dtp.h.
#pragma once

#include <array>

#include <ATen/ATen.h>

#include "backend/model/model.h"
#include "planner/lowering/step_graph.h"

namespace oom::backend::runner {

struct OuterBlock {
  at::Tensor outer_flat;  // the outer block's weights on the device (undefined while none is there)
  BlockWeights outer;     // its tensors as leaves
  // The outer block's gradient in its two groups' ranges (outer_range): the LM head group's and the
  // embeddings', each allocated (zeroed) by the first backward that adds into it and released after
  // the last stage that reads it (last_outer_use), as the lowering holds them.
  at::Tensor head_grad, embed_grad;
  std::array<StageId, 2> last_outer_use{-1, -1};  // [0] embeddings, [1] LM head group
  at::Tensor hL, loss;  // the head's input as a leaf, until its backward; this rank's loss
};

}  // namespace oom::backend::runner
