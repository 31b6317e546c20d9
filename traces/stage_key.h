// StageKey: the structured identity of one stage of a training step, shared by the lowering
// (planner/), the executors (analytic, SimGrid, LibTorch) and every reader of a Trace.
//
// A key says whose work a stage is and which piece of the step it is: the rank, the phase, the
// micro-batch (baseline systems with gradient accumulation), the decoder, the part of the model or
// of the update pipeline, the sub-batch, the repeat (the same work done again in one phase: a
// decoder's forward repeated to regenerate several boundaries), the chunk (MoE routing round or GDN
// sequence chunk), the attention head group, the ring step (Ring-DTP), the gradient bucket, and
// the operator. Indices that do not apply are −1. A collective across nodes is preceded by its
// join, the instant every member's input is ready: the collective's key with ".join" after it.
//
// The key has exactly one text form, written by format_stage_key() and read by parse_stage_key():
//
//   g<rank>.<phase>[.mb<m>][.L<decoder>].<part>[.sb<s>][.r<k>][.c<chunk>][.h<group>][.s<step>][.b<bucket>].<op>[.join]
//
// e.g. "g0.fwd.L3.moe.c1.experts", "g2.bwd.L0.attn.h1.core_bwd", "g0.opt.lm_head.b0.cpu_adamw".
// That text is the stage name of a Trace (DESIGN.md "Trace"); no other code builds or takes apart
// stage names. Plain value types; thread-safe to read.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace oom {

// Which part of the step a stage belongs to.
enum class Phase { kForward, kRecompute, kBackward, kOptimizer };
std::string_view phase_name(Phase p);  // "fwd", "recompute", "bwd", "opt"

// The piece of the model, or of the weight/gradient pipeline, a stage works on.
enum class StagePart {
  kEmbedding,  // "embedding": token embedding gather / gradient scatter, its weights and update
  kLmHead,     // "lm_head": vocabulary projection and loss, its weights and update
  kAttention,  // "attn": softmax-attention mixing of a decoder
  kGdn,        // "gdn": Gated DeltaNet mixing of a decoder
  kMixing,     // "mixing": tensor-parallel exchanges around a decoder's mixing (Megatron)
  kMoe,        // "moe": router, shared expert, routed experts and their all-to-all
  kLlep,       // "llep": PipelinedLLEP's expert fetch and gradient return
  kExperts,    // "experts": a decoder's routed-expert bank as one transfer/update group
  kCommon,     // "common": a decoder's non-expert parameters as one transfer/update group
  kLayer,      // "layer": a whole decoder's parameters as one transfer/update group
  kWeights,    // "weights": the decoder's parameter window (H2D, all-gather, readiness)
  kGrads,      // "grads": gradient buffers, their reduction and D2H (baselines, window slots)
  kBoundary,   // "boundary": a checkpoint boundary (decoder input) moving to or from the host
  kModel,      // "model": every parameter of the rank as one group (an optimizer step over all of them)
};
inline constexpr int kStageParts = 14;
std::string_view stage_part_name(StagePart p);

// The operator a stage runs.
enum class StageOp {
  kProj,               // "proj": input projections (and norms, RoPE, conv) of the mixing
  kProjBwd,            // "proj_bwd"
  kCore,               // "core": attention or GDN core, forward
  kCoreRefwd,          // "core_refwd": a partitioned attention's per-group re-forward in backward
  kCoreBwd,            // "core_bwd"
  kOut,                // "out": the mixing's output projection, after its core (or from kept O)
  kOutBwd,             // "out_bwd"
  kOlseH2d,            // "olse_h2d": kept O/LSE back to the GPU
  kOlseD2h,            // "olse_d2h": O/LSE kept on the host
  kRouterShared,       // "router_shared": router and shared expert
  kRouterSharedBwd,    // "router_shared_bwd"
  kA2aDispatch,        // "a2a_dispatch": EP token dispatch
  kA2aReturn,          // "a2a_return"
  kA2aGradDispatch,    // "a2a_grad_dispatch"
  kA2aGradReturn,      // "a2a_grad_return"
  kExperts,            // "experts": routed-expert GEMMs
  kExpertsBwd,         // "experts_bwd"
  kCombine,            // "combine": weighted sum of the returned expert outputs
  kDispatch,           // "dispatch": Megatron's token dispatch
  kReturn,             // "return"
  kFetch,              // "fetch": LLEP helpers receive spilled experts' weights
  kGradReturn,         // "grad_return": LLEP helpers send those experts' gradients back
  kGather,             // "gather": embedding lookup
  kScatter,            // "scatter": embedding gradient
  kRegather,           // "regather": embedding lookup repeated for a regeneration
  kLoss,               // "loss": vocabulary projection and loss, forward
  kBackward,           // "backward": its backward
  kPass,               // "pass": Ring-DTP hands a block to the next GPU
  kGradPass,           // "grad_pass"
  kDone,               // "done": a join (all gradients of a group ready, ring finished)
  kReady,              // "ready": weights usable on every rank
  kBuffer,             // "buffer": a gradient buffer slot acquired
  kH2d,                // "h2d"
  kD2h,                // "d2h"
  kAllGather,          // "allgather"
  kReduceScatter,      // "reduce_scatter"
  kGradD2h,            // "grad_d2h"
  kGradH2d,            // "grad_h2d"
  kInputD2h,           // "input_d2h": KT-FT routed-expert inputs to the CPU
  kOutputH2d,          // "output_h2d": KT-FT expert outputs back
  kCpu,                // "cpu": KT-FT CPU expert forward
  kCpuBwd,             // "cpu_bwd"
  kHostAccumulate,     // "host_accumulate"
  kCpuAdamW,           // "cpu_adamw"
  kPublish,            // "publish": BF16 weights staged for the next step
  kGpuAdamW,           // "gpu_adamw"
};
inline constexpr int kStageOps = 46;
std::string_view stage_op_name(StageOp o);
// The backward of a forward compute operator (proj → proj_bwd, core → core_bwd, router_shared →
// router_shared_bwd, experts → experts_bwd); any other operator is returned as it is.
StageOp backward_op(StageOp o);

struct StageKey {
  int rank = 0;
  Phase phase = Phase::kForward;
  int micro_batch = -1;  // "mb<m>": baseline systems' gradient-accumulation micro-batch
  int decoder = -1;      // "L<l>": decoder index; −1 for embedding, LM head, step-level work
  StagePart part = StagePart::kLayer;
  int sub_batch = -1;    // "sb<s>": sub-batch of complete sequences (a run that executes them one by one)
  int repeat = -1;       // "r<k>": the k-th repetition (k ≥ 1) of work already done in the same phase
  int chunk = -1;        // "c<c>": MoE routing round / token chunk, or GDN sequence chunk
  int head_group = -1;   // "h<g>": attention query-head group
  int ring_step = -1;    // "s<k>": Ring-DTP step
  int bucket = -1;       // "b<b>": gradient bucket of a streamed update
  StageOp op = StageOp::kProj;
  bool join = false;     // "join": the join before the collective keyed by the rest (its first member's)
  bool operator==(const StageKey&) const = default;
};

// The one text form (see above).
std::string format_stage_key(const StageKey& k);
// Reads the form format_stage_key() writes, and only that (format_stage_key(*parse) == text);
// nullopt for anything else.
std::optional<StageKey> parse_stage_key(std::string_view text);
// What readers of traces say of a stage name parse_stage_key() refuses.
inline constexpr const char* kNotAStageKey = "is not a stage key (g<rank>.<phase>[.L<decoder>].<part>[...].<op>[.join])";

}  // namespace oom
