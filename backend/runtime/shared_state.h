// One host state for the rank processes of a node: the modeled node's ranks share host memory
// (each updates its slice of a group's master, every rank reads the whole), and so do the rank
// processes of `oom train --ranks P` and of a torchrun node (backend/dist/rank_train.h).
// NodeStateSync keeps the states of several nodes equal, one state per node.
#pragma once

#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "backend/dist/rank_group.h"
#include "backend/runtime/state.h"

namespace oom::backend {

// Moves the masters, both moments and the working copies of every block of `state` into one file
// mapped MAP_SHARED. `create`: make the file (0600; it must not exist) and copy the state into it;
// otherwise map the file another process made for the same model and drop the state's own buffers
// (its values are the file's). Gradient slots stay private. With CUDA each process pins its mapping
// in place (backend/runtime/pinned_host.h), so the shared state's copies are asynchronous too. The mapping lives as long as the
// tensors; the file may be unlinked once every process mapped it. Throws std::runtime_error naming
// the file when it cannot be made or mapped or has another size.
void share_host_state(HostState& state, const std::string& path, bool create);

// Ranks on several nodes, one host state per node (the ranks of a node share theirs): during a
// step each rank updates its slice of the common parts and its own experts in its node's state,
// so after it every node holds its own ranks' updates only. after_step() brings every node's
// masters and moments to the whole update: each node's leader contributes the elements the step
// changed in its state (against the snapshot before_step() took), every rank takes part in two
// all-reduces per tensor (values and change counts; an element changed on one node is copied
// exactly, zeros add nothing), the leaders write them back and republish the working copies, and
// a barrier ends it. An element changed on two nodes is a std::logic_error (slices are disjoint).
// Costs, per step: a snapshot of the masters and moments on each leader, and all-reduces of twice
// their size over the ranks. Collectives on `device` (CUDA tensors for NCCL).
class NodeStateSync {
 public:
  // `state` and `group` must outlive it. `leader`: this rank writes its node's state.
  NodeStateSync(HostState& state, RankGroup& group, at::Device device, bool leader);
  void before_step();
  void after_step();  // collective: every rank calls it after every step

 private:
  HostState& state_;
  RankGroup& group_;
  at::Device device_;
  bool leader_;
  std::vector<at::Tensor> snapshot_;  // per block: master, exp_avg, exp_avg_sq (leader only)
};

}  // namespace oom::backend
