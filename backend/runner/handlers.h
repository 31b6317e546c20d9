// The one table of the graph runner: a stage's handler by its (part, operator) (handlers.cc). A
// handler names the work (a Runner method in the mechanism's file), the memory use its device
// allocations are tagged with, whether it runs on the driving thread or the CPU-update worker, and
// what the driving thread's bookkeeping needs to know of it. Adding an operator is one row.
#pragma once

#include <functional>
#include <initializer_list>

#include "planner/lowering/step_graph.h"

namespace oom::backend::runner {

struct Runner;

// Which stages of a (part, operator) a handler takes: Ring-DTP's loss and backward have a ring
// step, the plain ones none; an expert bank's or a common part's CPU update and publication are a
// streamed bucket's (OffloadStreamAdamW) only.
enum class Variant { kAny, kRing, kWhole, kBucket };

// What the driving thread needs to know of a stage's handler besides its work.
enum HandlerFlag : unsigned {
  kBuildsGraph = 1u << 0,      // outside a decoder pass: its kernels build autograd graphs
  kOpensPass = 1u << 1,        // weights.h2d: opens a pass of its decoder
  kLoadsBoundary = 1u << 2,    // a boundary load, issued early under SCO (issue_order)
  kReadsLayerGrad = 1u << 3,   // of a decoder: reads its weight gradient (the backward pass lives on)
  kReadsExpertGrad = 1u << 4,  // of a decoder: reads its experts' gradient (EP)
  kReadsOuterGrad = 1u << 5,   // of the embedding or LM head: reads its group's gradient
  kWaitsGradCopy = 1u << 6,    // a worker stage that waits for its gradients' copies to the host
};

constexpr unsigned part_set(std::initializer_list<StagePart> ps) {
  unsigned m = 0;
  for (const StagePart p : ps) m |= 1u << static_cast<unsigned>(p);
  return m;
}

// A stage's work by its (part, operator). A driving-thread stage runs `run`; a worker stage's `job`
// runs on the driving thread in graph order and returns the work the worker thread does, timed
// under the stage's key; a join (a sync stage) has neither and is recorded as an instant.
struct Handler {
  unsigned parts = 0;  // the StageParts it takes (part_set())
  StageOp op = StageOp::kDone;
  Variant variant = Variant::kAny;
  MemoryUse use = MemoryUse::kOther;  // what its device allocations hold (memory model's tag)
  unsigned flags = 0;                 // HandlerFlag
  void (*run)(Runner&, const Stage&) = nullptr;
  std::function<void()> (*job)(Runner&, const Stage&) = nullptr;
  bool join() const { return run == nullptr && job == nullptr; }
  bool on_worker() const { return job != nullptr; }
};

// The handler of a stage; std::logic_error naming the stage when the runner has none.
const Handler& handler_of(const Stage& s);
// The stages that read a decoder's weight gradient: its backward pass lives until the last of them.
inline bool reads_layer_gradient(const Stage& s, const Handler& h) { return s.layer >= 0 && (h.flags & kReadsLayerGrad) != 0; }
// The stages that read a decoder's experts' gradient (EP): their D2H and the device update.
inline bool reads_expert_gradient(const Stage& s, const Handler& h) { return s.layer >= 0 && (h.flags & kReadsExpertGrad) != 0; }

}  // namespace oom::backend::runner
