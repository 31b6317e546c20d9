// Checkpoint boundaries: a decoder input kept on the host (D2H) and loaded back (H2D), and the order
// the driving thread issues the stages in, where SCO loads a boundary as early as a GPU's copy
// engine would.
#include "backend/runner/runner.h"

#include <algorithm>

#include <torch/torch.h>

#include "backend/runtime/device_memory.h"
#include "backend/runtime/host_copies.h"
#include "costmodel/input_error.h"

namespace oom::backend::runner {

void Runner::boundary_d2h(const Stage& s) { host[s.layer] = to_host(act.at(s.layer), st.pinned()); }

void Runner::boundary_h2d(const Stage& s) {
  act[s.layer] = load_to_device(host.at(s.layer), dev);
  origin[s.layer] = Origin::kLoaded;
}

// This rank's stages in the order the driving thread issues them: the graph's, except that under
// SCO a boundary's load is issued as soon as the stages it depends on have run and the backward
// has begun (into the second buffer, while the decoder after it computes its backward), as a GPU's
// copy engine prefetches it.
std::vector<StageId> Runner::issue_order(const StepGraph& g, const std::vector<const Handler*>& handlers) const {
  std::vector<StageId> order;
  const bool prefetch = plan.flat.selective_checkpoint_offload;
  std::vector<char> issued(g.stages.size(), 0);
  std::vector<StageId> waiting;
  bool backward = false;
  if (prefetch) {
    for (const Stage& s : g.stages) {
      if (s.key.rank == R && (handlers[static_cast<std::size_t>(s.id)]->flags & kLoadsBoundary)) waiting.push_back(s.id);
    }
  }
  const auto ready = [&](StageId id) {
    if (!backward) return false;
    for (const StageId d : g.stage(id).deps) {
      if (g.stage(d).key.rank == R && !issued[static_cast<std::size_t>(d)]) return false;
    }
    return true;
  };
  const auto issue = [&](StageId id) {
    order.push_back(id);
    issued[static_cast<std::size_t>(id)] = 1;
    backward = backward || g.stage(id).phase == Phase::kBackward;
    for (auto it = waiting.begin(); it != waiting.end();) {
      if (ready(*it)) {
        const StageId w = *it;
        waiting.erase(it);
        order.push_back(w);
        issued[static_cast<std::size_t>(w)] = 1;
        it = waiting.begin();  // a load issued may make another ready
      } else {
        ++it;
      }
    }
  };
  for (const Stage& s : g.stages) {
    if (s.key.rank != R || issued[static_cast<std::size_t>(s.id)]) continue;
    if (prefetch && (handlers[static_cast<std::size_t>(s.id)]->flags & kLoadsBoundary)) {
      if (!ready(s.id)) continue;  // issued after its last dependency
      const auto it = std::find(waiting.begin(), waiting.end(), s.id);
      if (it != waiting.end()) waiting.erase(it);
    }
    issue(s.id);
  }
  OOM_ASSERT(waiting.empty(), "a boundary load whose dependencies never ran");
  return order;
}

}  // namespace oom::backend::runner
