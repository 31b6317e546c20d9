// Operators the LibTorch backend dispatches for a stage (Stage::ops).
//
// On a device that runs each operator on the dispatching thread (the CPU backend), a small
// model's step is mostly dispatch: the stages of a tiny MoE issue 20 to 10,000 ATen calls each,
// and a call costs microseconds whatever its FLOPs (backend/README.md). The counts follow the
// backend's kernels (backend/model/, backend/runner/): a fixed number per stage and pass for
// each part, plus what its loops repeat: the attention core per 64-query block
// (under context parallelism twice, once per zig-zag chunk of the piece), the GDN core per 32-token
// kernel chunk (under context parallelism in the stage that runs the sequence's chain, per chunk of
// the piece), the routed experts per expert that receives tokens (on the Local path the rank's
// autograd over every expert; over EP ranks the owner's kernels on the rows it received, the
// all-to-alls' bookkeeping per EP-group peer and per owned expert, a combine after the return).
// The numbers are the backend's own, counted with `oom train --plan P --trace` (TraceStage::ops,
// nested calls included) on the four tiny models, over four EP ranks too, and on tiny-moe with
// EP groups of 2 and with context parallelism; tests/backend check them against fresh counts.
#pragma once

#include <cstdint>

#include "costmodel/model_spec.h"
#include "planner/lowering/step_graph.h"

namespace oom {

// How the stage's pass runs in the backend: a forward without autograd (the first forward, a
// boundary's regeneration), the replay right before a decoder's backward (under autograd), or the
// backward.
enum class OperatorPass { kForward, kReplay, kBackward };

// How the backend runs a stage beyond its shape: its pass and the mechanisms that change which
// loops run.
struct OperatorRun {
  OperatorPass pass = OperatorPass::kForward;
  // The stage opens its decoder's pass: its weights are prepared there, once per pass, whatever
  // the sub-batches.
  bool first_in_layer = true;
  // Routed experts over several EP ranks: a rank runs its own experts on the rows it received
  // (shape.experts of them; shape.tokens the assignments it received), the all-to-alls carry the
  // routing's bookkeeping, and a combine follows the return.
  bool experts_over_ranks = false;
  // The forward of a retained MoE (EP): it builds the graphs its backward uses, as a replay does.
  bool moe_retained = false;
  // Ranks per sequence (context parallelism): each rank's piece is two zig-zag chunks.
  int context_ranks = 1;
  // Under context parallelism, the GDN core stage that runs the sequence's chain (both chunks of
  // the piece, shape.seq_len the piece's tokens); the pieces' own core stages run nothing.
  bool context_chain = false;
};

// The operators of one stage `op` of `part` in decoder `layer` (−1: embedding, LM head) over
// `shape`: compute stages, and the bookkeeping on the dispatching thread of the MoE all-to-alls
// over EP ranks and of the context-parallel K/V gather; 0 for parts the backend does not run
// this way.
std::int64_t backend_operators(const ModelSpec& m, int layer, StagePart part, StageOp op, const OperatorRun& run,
                               const OpShape& shape);

}  // namespace oom
