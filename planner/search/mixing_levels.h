// The levels both planners partition the mixing sublayers by (Plan split.attention_head_group and
// split.gdn_chunk_tokens), each list coarsest first.
#pragma once

#include <cstdint>
#include <vector>

#include "costmodel/model_spec.h"
#include "costmodel/workload.h"

namespace oom {

// Largest first: g query heads of one KV group, g dividing the query heads per KV group of every
// attention kind the model has (full, sliding window, latent), as validate_plan requires. The
// whole group (g = heads per KV group) only where some kind has several KV heads, so that whole
// groups run apart; one query head per group is the finest. Empty for a model without softmax
// attention. Multi-head Latent Attention has a K and V per query head (after kv_b): its heads run
// one at a time at the finest level.
std::vector<int> attention_head_group_levels(const ModelSpec& m);

// Longest first, the GDN pieces of `candidates` that partition a GPU's sequences: a piece of one
// sequence (below seq_len, the FP32 state handed from piece to piece) or a whole number of
// sequences (a multiple of seq_len below the tokens per GPU: reference §4's GDN sub-batches of
// complete sequences). Empty for a model without Gated DeltaNet.
std::vector<std::int64_t> gdn_piece_levels(const WorkloadContext& ctx, const std::vector<std::int64_t>& candidates);

}  // namespace oom
