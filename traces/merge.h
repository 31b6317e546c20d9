// Merging the traces of one step's ranks, each recorded by its own process (oom train --ranks P).
#pragma once

#include <vector>

#include "traces/trace.h"

namespace oom {

// One step's trace from the traces of its ranks: every stage, the memory timelines by device (a
// device two ranks report, such as a NUMA node they share, gets both sample series and the larger
// peak), the per-GPU peaks of the "gpu<i>" timelines in index order and the NUMA peaks in name
// order; finalized. Stage ids are renumbered in rank order.
Trace merge_rank_traces(const std::vector<Trace>& ranks);

}  // namespace oom
