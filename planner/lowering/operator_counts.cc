#include "planner/lowering/operator_counts.h"

#include <algorithm>
#include <cmath>

namespace oom {
namespace {

constexpr std::int64_t kQueryBlock = 64;       // backend ModelSpec::attention_query_block
constexpr std::int64_t kGdnKernelChunk = 32;   // oom train --gdn-chunk default

std::int64_t blocks(std::int64_t n, std::int64_t block) { return std::max<std::int64_t>(1, (n + block - 1) / block); }

// Experts of `experts` that receive at least one of `assignments` token–expert assignments when
// the router spreads them evenly: E·(1 − (1 − 1/E)^n), at least one.
double experts_hit(std::int64_t experts, std::int64_t assignments) {
  if (experts <= 0) return 0;
  if (assignments <= 0) return static_cast<double>(experts);
  const double e = static_cast<double>(experts);
  return std::max(1.0, e * (1 - std::pow(1 - 1 / e, static_cast<double>(assignments))));
}

}  // namespace

std::int64_t backend_operators(const ModelSpec& m, int layer, StagePart part, StageOp op, OperatorPass pass,
                               const OpShape& shape, bool first_in_layer) {
  const bool fwd = pass == OperatorPass::kForward, replay = pass == OperatorPass::kReplay;
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
          const double qb = static_cast<double>(blocks(shape.seq_len, kQueryBlock));
          n = 34 + (96 + (a.window_tokens > 0 ? 3 : 0)) * qb;
          break;
        }
        case StageOp::kCoreBwd: n = 36 + 240 * static_cast<double>(blocks(shape.seq_len, kQueryBlock)); break;
        case StageOp::kOut: n = (fwd ? 22 : 28) + 23 * g; break;
        case StageOp::kOutBwd: n = 55 + 80 * g; break;
        default: break;
      }
      break;
    }
    case StagePart::kGdn: {
      const double k = static_cast<double>(blocks(shape.seq_len, kGdnKernelChunk));
      switch (op) {
        case StageOp::kProj: n = fwd ? 83 + (first_in_layer ? 80 : 0) : 93 + (first_in_layer ? 396 : 0); break;
        case StageOp::kProjBwd: n = 254; break;
        case StageOp::kCore: n = 60 + 278 * k; break;
        case StageOp::kCoreBwd: n = 60 + 1245 * k; break;
        case StageOp::kOut: n = fwd ? 48 : 54; break;
        case StageOp::kOutBwd: n = 146; break;
        default: break;
      }
      break;
    }
    case StagePart::kMoe: {
      const double shared = m.moe.shared_expert_intermediate > 0 ? 1 : 0;
      const double dense = gemma ? 1 : 0;  // Gemma 4's dense MLP beside the experts, with its own norms
      const double hit = experts_hit(shape.experts, shape.tokens);
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
