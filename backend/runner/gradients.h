// The gradient and optimizer pipeline of the graph runner: each parameter group's gradient (or one
// OffloadStreamAdamW bucket of it) summed over ranks where the plan says (reduce_scatter), sent to
// a host buffer (cpu_grad_slots per kind, reused in the order the lowering numbers the D2H stages),
// updated by CPU AdamW and published on the one worker thread, or for a resident expert bank
// updated where it is (gpu_adamw); with clipping every update waits for the global norm. The
// ranges each group, slice and bucket covers are in param_ranges.cc; the runner's methods here in
// gradients.cc.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <tuple>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include "backend/runner/block_grad.h"
#include "planner/lowering/step_graph.h"

namespace oom::backend::runner {

// The flat ranges {start, length} of a parameter group in its block's coordinates.
using Ranges = std::vector<std::pair<std::int64_t, std::int64_t>>;
// A gradient on its way to an update: (part, decoder, bucket), bucket −1 for a whole group.
using GradKey = std::tuple<StagePart, int, int>;

struct GradientPipeline {
  std::map<std::pair<StagePart, int>, BlockGrad> reduced;  // gradients summed over ranks (reduce_scatter)
  std::map<GradKey, std::function<void()>> ready;          // gradient copies to wait for
  std::map<std::pair<StagePart, int>, int> buckets;        // a streamed part's gradient buckets (OffloadStreamAdamW)
  // Host gradient buffers: cpu_grad_slots per kind (routed experts; everything else), used in the
  // order the lowering numbers the gradient D2H stages. The D2H of gradient k depends on the update
  // that consumed gradient k − cpu_grad_slots of its kind, so the buffer is free when it is reused.
  // With clipping every update waits for the norm, so each gradient gets its own buffer.
  std::array<std::vector<at::Tensor>, 2> grad_pool;
  std::array<int, 2> grads_sent{0, 0};
  std::map<GradKey, at::Tensor> host_grad;      // a group's (or bucket's) gradient on the host until its update
  std::vector<at::Tensor>* captured = nullptr;  // capture_gradients()
  std::map<StageId, int> jobs;                  // worker stages → job index
  std::vector<std::function<void()>> deferred;         // clipping: worker stages held for the norm
  std::vector<std::function<void()>> deferred_device;  // clipping: device updates held for the norm
  // Σ g² of what this rank sent, a 0-dim FP64 tensor on the device (undefined before the first):
  // the step reads it once, for the clipping norm, when every gradient has been sent.
  at::Tensor sq_norm;
  double coef = 1.0;                            // the clipping coefficient of the updates
};

}  // namespace oom::backend::runner
