#include "planner/search/head_groups.h"

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

}  // namespace oom
