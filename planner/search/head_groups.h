// The attention head groups (Plan split.attention_head_group) both planners partition the
// attention sublayers by.
#pragma once

#include <vector>

#include "costmodel/model_spec.h"

namespace oom {

// Largest first: g query heads of one KV group, g dividing the query heads per KV group of every
// attention kind the model has (full, sliding window, latent), as validate_plan requires. The
// whole group (g = heads per KV group) only where some kind has several KV heads, so that whole
// groups run apart; one query head per group is the finest. Empty for a model without softmax
// attention. Multi-head Latent Attention has a K and V per query head (after kv_b): its heads run
// one at a time at the finest level.
std::vector<int> attention_head_group_levels(const ModelSpec& m);

}  // namespace oom
