#include "planner/search/mixing_levels.h"

#include <algorithm>
#include <numeric>

namespace oom {

std::vector<int> attention_head_group_levels(const ModelSpec& m) {
  int per_kv = 0;
  bool grouped_kv = false;
  for (LayerKind k : {LayerKind::kFullAttention, LayerKind::kSlidingAttention, LayerKind::kLatentAttention}) {
    if (m.count(k) == 0) continue;
    const AttentionSpec& a = m.attention(k);
    per_kv = std::gcd(per_kv, a.heads / std::max(1, a.kv_heads));
    grouped_kv = grouped_kv || a.kv_heads > 1;
  }
  std::vector<int> levels;
  for (int g = grouped_kv ? per_kv : per_kv / 2; g >= 1; --g) {
    if (per_kv % g == 0) levels.push_back(g);
  }
  return levels;
}

std::vector<std::int64_t> gdn_piece_levels(const WorkloadContext& ctx, const std::vector<std::int64_t>& candidates) {
  std::vector<std::int64_t> levels;
  if (ctx.model.count(LayerKind::kLinearAttention) == 0) return levels;
  const std::int64_t S = ctx.workload.seq_len, N = ctx.workload.seqs_per_gpu() * S;
  std::vector<std::int64_t> c = candidates;
  std::sort(c.rbegin(), c.rend());
  c.erase(std::unique(c.begin(), c.end()), c.end());
  for (std::int64_t x : c) {
    if (x > 0 && (x < S || (x % S == 0 && x < N))) levels.push_back(x);
  }
  return levels;
}

}  // namespace oom
