// The flat ranges {start, length} of a parameter group: a decoder's routed-expert bank
// ("experts"), the rest of it ("common"), the whole decoder ("layer"; on the EP path a resident
// decoder's experts are updated on the device, so its CPU update is the common part), the LM
// head group or the embeddings; over ranks, the slice of a summed group and the experts this rank
// owns; under OffloadStreamAdamW, one bucket of them.
#include "backend/runner/runner.h"

#include <algorithm>

#include <torch/torch.h>

#include "costmodel/input_error.h"

namespace oom::backend::runner {

// Outer-block parameter ranges: the LM head group (final norm, untied head) and the embeddings.
std::pair<std::int64_t, std::int64_t> Runner::outer_range(bool head) const {
  const auto& e = st.layout().blocks[0].at("embed");
  const auto total = st.layout().blocks[0].numel;
  if (head) return e.offset == 0 ? std::pair{e.numel(), total - e.numel()} : std::pair{std::int64_t{0}, e.offset};
  return {e.offset, e.numel()};
}

// Whole groups, as every rank holds them (what a reduce_scatter sums).
Ranges Runner::whole_ranges(StagePart part, int layer) const {
  if (part == StagePart::kEmbedding || part == StagePart::kLmHead) return {outer_range(part == StagePart::kLmHead)};
  const BlockLayout& b = st.layout().blocks[static_cast<std::size_t>(1 + layer)];
  const std::int64_t e0 = b.at("experts.gate").offset, e1 = b.at("experts.down").offset + b.at("experts.down").numel();
  if (part == StagePart::kExperts) return {{e0, e1 - e0}};
  if (part == StagePart::kCommon || (ep() && plan.is_resident(layer))) return {{0, e0}, {e1, b.numel - e1}};
  return {{0, b.numel}};
}

// Elements [lo, hi) of the concatenated ranges.
Ranges Runner::cut(const Ranges& ranges, std::int64_t lo, std::int64_t hi) {
  Ranges out;
  std::int64_t at_ = 0;
  for (const auto& [a, len] : ranges) {
    const std::int64_t from = std::max(lo, at_), to = std::min(hi, at_ + len);
    if (from < to) out.push_back({a + from - at_, to - from});
    at_ += len;
  }
  return out;
}

std::int64_t Runner::count(const Ranges& ranges) {
  std::int64_t n = 0;
  for (const auto& r : ranges) n += r.second;
  return n;
}

// Rank R's 1/P of a summed group: the concatenated ranges cut into P pieces of ⌈n/P⌉.
Ranges Runner::slice(const Ranges& ranges) const {
  const std::int64_t n = count(ranges), cap = (n + P - 1) / P, lo = std::min(n, R * cap), hi = std::min(n, lo + cap);
  return cut(ranges, lo, hi);
}

// Bucket `bucket` of a streamed group's ranges: even pieces, the last taking the remainder (as the
// lowering cuts them); the whole group for bucket −1.
Ranges Runner::bucket_ranges(StagePart part, int layer, int bucket) const {
  const Ranges all = group_ranges(part, layer);
  if (bucket < 0) return all;
  const std::int64_t pieces = buckets.at({part, layer}), n = count(all), each = n / pieces;
  const std::int64_t lo = bucket * each, hi = bucket + 1 == pieces ? n : lo + each;
  return cut(all, lo, hi);
}

// The owned experts' rows of a decoder's expert tensors.
Ranges Runner::owned_experts(int layer) const {
  const BlockLayout& b = st.layout().blocks[static_cast<std::size_t>(1 + layer)];
  Ranges out;
  for (const char* name : {"experts.gate", "experts.up", "experts.down"}) {
    const auto& e = b.at(name);
    const std::int64_t per = e.numel() / spec.moe.experts;
    out.push_back({e.offset + expert0 * per, experts_local * per});
  }
  return out;
}

// EP groups: this replica's 1/replicas of a shard's ranges (the concatenated ranges cut into pieces
// of ⌈n/replicas⌉), which its host updates; the whole ranges without replicas.
Ranges Runner::replica_slice(const Ranges& ranges) const {
  if (replicas == 1) return ranges;
  const std::int64_t n = count(ranges), cap = (n + replicas - 1) / replicas, lo = std::min(n, replica * cap), hi = std::min(n, lo + cap);
  return cut(ranges, lo, hi);
}

// The ranges rank R sends and updates of a group: on one rank the whole group; over ranks its
// slice of a summed group (embedding, LM head, a decoder's common part) and its own experts (with
// EP groups its replica's slice of them).
// Ring-DTP: the head rows of this rank's vocabulary shard, and (rank 0 only, so the shared host
// state is updated once) the final norm, whose gradient is summed over the ranks.
Ranges Runner::ring_head_ranges() const {
  const BlockLayout& b = st.layout().blocks[0];
  const auto& head = b.at("lm_head");
  const std::int64_t per = shard_rows() * spec.hidden;
  Ranges out;
  if (R == 0) out.push_back({b.at("final_norm").offset, b.at("final_norm").numel()});
  out.push_back({head.offset + R * per, per});
  return out;
}

Ranges Runner::group_ranges(StagePart part, int layer) const {
  if (part == StagePart::kLmHead && ring_dtp()) return ring_head_ranges();
  if (!dist()) return whole_ranges(part, layer);
  if (part == StagePart::kExperts) return replica_slice(owned_experts(layer));
  if (part != StagePart::kLayer) return slice(whole_ranges(part, layer));
  OOM_ASSERT(ep(), "the local path runs on one rank");
  Ranges out = slice(whole_ranges(StagePart::kCommon, layer));
  if (!plan.is_resident(layer)) {
    const Ranges own = replica_slice(owned_experts(layer));
    out.insert(out.end(), own.begin(), own.end());
  }
  return out;
}

int Runner::block_of(StagePart part, int layer) { return part == StagePart::kEmbedding || part == StagePart::kLmHead ? 0 : 1 + layer; }

}  // namespace oom::backend::runner
