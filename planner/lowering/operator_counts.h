// Operators the LibTorch backend dispatches for a compute stage (Stage::ops).
//
// On a device that runs each operator on the dispatching thread (the CPU backend), a small
// model's step is mostly dispatch: the stages of a tiny MoE issue 20 to 10,000 ATen calls each,
// and a call costs microseconds whatever its FLOPs (backend/README.md). The counts follow the
// backend's kernels (backend/model/plan_ops.cc, backend/model/model.cc): a fixed number per stage and pass
// for each part, plus what its loops repeat: the attention core per 64-query block, the GDN core
// per 32-token kernel chunk, the routed experts per expert that receives tokens. The numbers are
// the backend's own, counted with `oom train --plan P --trace` (TraceStage::ops, nested calls
// included) on the four tiny models; tests/backend check them against fresh counts.
#pragma once

#include <cstdint>

#include "costmodel/model_spec.h"
#include "planner/lowering/step_graph.h"

namespace oom {

// How the stage's pass runs in the backend: a forward without autograd (the first forward, a
// boundary's regeneration), the replay right before a decoder's backward (under autograd), or the
// backward.
enum class OperatorPass { kForward, kReplay, kBackward };

// The operators of one compute stage `op` of `part` in decoder `layer` (−1: embedding, LM head)
// over `shape`; `first_in_layer`: the stage opens its decoder's pass (its weights are prepared
// there, once per pass, whatever the sub-batches). 0 for parts the backend does not run this way.
std::int64_t backend_operators(const ModelSpec& m, int layer, StagePart part, StageOp op, OperatorPass pass,
                               const OpShape& shape, bool first_in_layer);

}  // namespace oom
