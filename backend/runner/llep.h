// PipelinedLLEP over ranks: the graph is lowered with the previous step's routing histogram
// (GraphRunner::routing()), which places the spilled experts (LLEP's least-loaded rule); at
// llep.fetch each helper receives its copies from their owners (again for the replay), every
// dispatch round balances its actual rows over owners and copies (balanced_dispatch_splits, in
// moe.cc), and llep.grad_return adds the helpers' gradients of the copies into the owners' expert
// gradients. The runner's methods are in llep.cc.
#pragma once

#include <utility>
#include <vector>

#include "costmodel/routing.h"

namespace oom::backend::runner {

// The placement of fetched experts comes from the routing the graph was lowered with: the
// histogram of the previous step's forward dispatches (uniform before the first, so nothing is
// fetched). Per decoder: the (expert, helper) pairs by expert then helper.
struct LlepPlacement {
  RoutingSpec llep_routing;
  std::vector<std::vector<std::pair<int, int>>> llep_spills;
};

}  // namespace oom::backend::runner
