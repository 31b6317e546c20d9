#include "planner/lowering/operator_counts.h"

#include <algorithm>
#include <cmath>

namespace oom {
namespace {

constexpr std::int64_t kQueryBlock = 64;       // backend ModelSpec::attention_query_block
constexpr std::int64_t kGdnKernelChunk = 32;   // oom train --gdn-chunk default

std::int64_t blocks(std::int64_t n, std::int64_t block) { return std::max<std::int64_t>(1, (n + block - 1) / block); }

// Experts of `local` (of the model's `experts`) that receive at least one of `assignments`
// token–expert assignments when the router spreads them evenly. The assignments are those the
// `local` experts process; the router drew them from experts/local times as many over all experts
// (on the Local path local = experts): local·(1 − (1 − 1/experts)^(assignments·experts/local)), at
// least one.
double experts_hit(std::int64_t local, std::int64_t experts, std::int64_t assignments) {
  if (local <= 0) return 0;
  if (assignments <= 0) return static_cast<double>(local);
  const double l = static_cast<double>(local), e = static_cast<double>(std::max(local, experts));
  return std::max(1.0, l * (1 - std::pow(1 - 1 / e, static_cast<double>(assignments) * e / l)));
}

// Calls of the attention core a stage makes and the queries of each: one over the sequence's
// queries, or under context parallelism one per zig-zag chunk of the rank's piece.
struct CoreCalls {
  double calls = 1;
  std::int64_t queries = 0;
};
CoreCalls core_calls(const OperatorRun& run, const OpShape& shape) {
  if (run.context_ranks <= 1) return {1, shape.seq_len};
  const std::int64_t piece = shape.seqs > 0 ? shape.tokens / shape.seqs : shape.seq_len / run.context_ranks;
  return {2, std::max<std::int64_t>(1, piece / 2)};
}

// A MoE stage over EP ranks (backend/runner/moe.cc) with `hit` of the rank's experts receiving
// rows and `peers` ranks in its EP group; `shared`, `dense`: 1 with a shared expert, with Gemma
// 4's dense MLP and norms around the branches. The owner runs its experts without autograd, one
// after another (plan_ops::expert_forward, expert_backward); where a backward follows (a replay,
// a retained forward) the rows and activations are kept, so the forward frees less. The dispatch
// gathers the group's counts (per peer) and turns each owned expert's rows into an index; the
// forward's also logs the step's routing. The return's rows become a leaf where a graph is built.
// The combine weighs the returned rows and adds them into the chunk's output with the other
// branches (written in a forward, from the graph's values for a retained one; a replay writes
// nothing). The gradient dispatch runs the combination's backward for the returned rows'
// gradients (through Gemma 4's norms).
double ep_operators(StageOp op, const OperatorRun& run, double hit, double peers, double shared, double dense) {
  const bool graph = run.pass == OperatorPass::kReplay || run.moe_retained;
  switch (op) {
    case StageOp::kA2aDispatch: return (run.pass == OperatorPass::kForward ? 49 : 46) + 2 * peers + 2 * hit;
    case StageOp::kExperts: return 17 + (graph ? 41 : 47) * hit;
    case StageOp::kA2aReturn: return graph ? 3 : 1;
    case StageOp::kCombine:
      if (run.pass == OperatorPass::kReplay) return 12;
      return run.moe_retained ? 27 + 6 * shared + 79 * dense : 23 + shared + 77 * dense;
    case StageOp::kA2aGradDispatch: return 98 + 352 * dense;
    case StageOp::kExpertsBwd: return 13 + 79 * hit;
    case StageOp::kA2aGradReturn: return 9;
    default: return 0;
  }
}

}  // namespace

std::int64_t backend_operators(const ModelSpec& m, int layer, StagePart part, StageOp op, const OperatorRun& run,
                               const OpShape& shape) {
  const bool fwd = run.pass == OperatorPass::kForward, replay = run.pass == OperatorPass::kReplay;
  const bool first_in_layer = run.first_in_layer;
  const bool gemma = m.gemma4();
  const bool gelu = m.activation.rfind("gelu", 0) == 0;
  const LayerKind kind = layer >= 0 && layer < static_cast<int>(m.layer_kinds.size()) ? m.layer_kinds[static_cast<std::size_t>(layer)]
                                                                                    : LayerKind::kFullAttention;
  double n = 0;
  switch (part) {
    case StagePart::kAttention: {
      const AttentionSpec& a = m.attention(kind);
      const double qk = a.qk_norm ? 1 : 0;
      const double g = gemma ? 1 : 0;
      switch (op) {
        case StageOp::kProj:
          // Norm, Q/K/V projections, RoPE; the weights' preparation once per decoder pass.
          n = fwd ? 173 + 74 * qk + (first_in_layer ? 40 + 36 * qk : 0)
                  : 183 + 76 * qk + (first_in_layer ? 200 + 186 * qk : 0);
          break;
        case StageOp::kProjBwd: n = 330 + 230 * qk; break;
        case StageOp::kCore:
        case StageOp::kCoreRefwd: {
          // Under context parallelism the two chunks' outputs and LSEs are concatenated.
          const CoreCalls c = core_calls(run, shape);
          const double qb = static_cast<double>(blocks(c.queries, kQueryBlock));
          n = c.calls * (34 + (96 + (a.window_tokens > 0 ? 3 : 0)) * qb) + (c.calls > 1 ? 1 : 0);
          break;
        }
        case StageOp::kCoreBwd: {
          // Under context parallelism the chunks' inputs are cut out, their K/V gradients summed.
          const CoreCalls c = core_calls(run, shape);
          n = c.calls * (36 + 240 * static_cast<double>(blocks(c.queries, kQueryBlock))) + (c.calls > 1 ? 17 : 0);
          break;
        }
        case StageOp::kOut: n = (fwd ? 22 : 28) + 23 * g; break;
        case StageOp::kOutBwd: n = 55 + 80 * g; break;
        case StageOp::kAllGather:
          // Context parallelism: the sequence's K and V from its ranks, put in token order (leaves
          // under autograd); the backward's gather finds the replay's and runs nothing.
          n = replay ? 32 : fwd ? 24 : 0;
          break;
        default: break;
      }
      break;
    }
    case StagePart::kGdn: {
      // Under context parallelism the chain stage runs the core on each chunk of the piece; the
      // pieces' stages run nothing (backend/runner/context.cc).
      const bool chain = run.context_ranks > 1;
      const double calls = chain ? (run.context_chain ? 2 : 0) : 1;
      const double k = static_cast<double>(blocks(chain ? shape.seq_len / 2 : shape.seq_len, kGdnKernelChunk));
      switch (op) {
        case StageOp::kProj: n = fwd ? 83 + (first_in_layer ? 80 : 0) : 93 + (first_in_layer ? 396 : 0); break;
        case StageOp::kProjBwd: n = 254; break;
        case StageOp::kCore: n = calls * (60 + 278 * k); break;
        case StageOp::kCoreBwd: n = calls * (60 + 1245 * k); break;
        case StageOp::kOut: n = fwd ? 48 : 54; break;
        case StageOp::kOutBwd: n = 146; break;
        default: break;
      }
      break;
    }
    case StagePart::kMoe: {
      const double shared = m.moe.shared_expert_intermediate > 0 ? 1 : 0;
      const double dense = gemma ? 1 : 0;  // Gemma 4's dense MLP beside the experts, with its own norms
      const double hit = experts_hit(shape.experts, m.moe.experts, shape.tokens);
      if (run.experts_over_ranks && m.moe_layer(layer) && op != StageOp::kRouterShared && op != StageOp::kRouterSharedBwd) {
        n = ep_operators(op, run, hit, static_cast<double>(m.moe.experts / std::max<std::int64_t>(1, shape.experts)), shared, dense);
        break;
      }
      switch (op) {
        case StageOp::kRouterShared: n = (replay ? 48 : 46) + 55 * shared + 84 * dense; break;
        case StageOp::kRouterSharedBwd: n = 105 + 200 * shared + 364 * dense; break;
        case StageOp::kExperts: n = replay ? 31 + 46 * hit : 41 + (52 + (gelu ? 10 : 0)) * hit; break;
        case StageOp::kExpertsBwd: n = 74 + (135 + (gelu ? 55 : 0)) * hit; break;
        case StageOp::kCombine: n = 10; break;
        default: break;
      }
      break;
    }
    case StagePart::kEmbedding:
      n = op == StageOp::kScatter ? 14 : 10;
      break;
    case StagePart::kLmHead:
      n = op == StageOp::kBackward ? 168 + 300 * (gemma ? 1 : 0) : 82 + 11 * (gemma ? 1 : 0);
      break;
    default:
      break;
  }
  return static_cast<std::int64_t>(std::llround(n));
}

}  // namespace oom
