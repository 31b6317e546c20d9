// One host state for the rank processes of a node: the modeled node's ranks share host memory
// (each updates its slice of a group's master, every rank reads the whole), and so do the rank
// processes of `oom train --ranks P --plan EP.json` (backend/dist/rank_train.h).
#pragma once

#include <string>

#include "backend/state.h"

namespace oom::backend {

// Moves the masters, both moments and the working copies of every block of `state` into one file
// mapped MAP_SHARED. `create`: make the file (0600; it must not exist) and copy the state into it;
// otherwise map the file another process made for the same model and drop the state's own buffers
// (its values are the file's). Gradient slots stay private. The mapping lives as long as the
// tensors; the file may be unlinked once every process mapped it. Throws std::runtime_error naming
// the file when it cannot be made or mapped or has another size.
void share_host_state(HostState& state, const std::string& path, bool create);

}  // namespace oom::backend
