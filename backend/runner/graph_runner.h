// GraphRunner: executes one rank's share of a lowered StepGraph (planner/lowering/step_graph.h)
// with the LibTorch kernels of backend/model/plan_ops.h and backend/model/model.h. The StepGraph is the
// schedule: the runner adds no stage, drops none, and takes no scheduling decision of its own.
//
//   dispatch    each stage runs the kernel its (part, operator) maps to (attention projections,
//               cores per query-head group, output projection; GDN chunks with their state
//               hand-off; router + shared expert and routed experts per token chunk; boundary and
//               O/LSE copies; gradient D2H, host accumulation, CPU AdamW and publication). A stage
//               of a decoder belongs to the pass its latest `weights.h2d` opened: a forward, a
//               regeneration (a recompute before another decoder's backward) or a backward pass,
//               which says whether its kernels build autograd graphs. Sync stages have no work.
//   data        tensors are keyed by what produced them: a decoder's input on the device (from the
//               previous decoder, a host-kept boundary loaded back, a held one, a regeneration or
//               the embedding's regather), its sub-batch and token-chunk intermediates, the kept
//               O/LSE per sub-batch, the gradient flowing into each decoder's output.
//   resources   compute-stream and copy stages run on the driving thread in graph order (weights
//               on the ParamWindow's copy stream on CUDA, other copies on the compute stream);
//               the CPU-update and host-prep stages run on one worker thread in graph order; a
//               stage that depends on a worker stage waits for it (the StepGraph's CPU gradient
//               slots and window reuse are such dependencies).
//   clipping    with max_grad_norm > 0 the worker stages wait for the whole backward (the global
//               norm scales every update); the StepGraph does not model clipping.
//   trace       with tracing on, every executed stage under its own key, operator kind and
//               resource name: the measured trace has the prediction's keys by construction.
//
//   over ranks  an EP plan on P ranks (a RankGroup): rank r runs the stages keyed g<r> on rows
//               [r·B/P, (r+1)·B/P) of the global batch and owns experts [r·E/P, (r+1)·E/P). A
//               dispatch all-to-all sends each (token, slot) pair's normalized row to its expert's
//               owner (counts exchanged first), the owner runs its experts on the rows it received,
//               the return sends their outputs back and the combine weighs them in; backward sends
//               the returned rows' gradients to the owners and the input gradients back, in the
//               graph's a2a_grad stages. A reduce_scatter sums a group's gradient over the ranks
//               (an all-reduce; each rank keeps using its 1/P, cut as ⌈n/P⌉ pieces of the group's
//               ranges), whose D2H, CPU AdamW and publication cover that slice; expert gradients
//               are complete on their owner. The host masters, moments and working copies are
//               the node's one host state (share_host_state across rank processes), so every rank
//               reads what the others updated; the step ends with a barrier. Each rank's loss is its
//               token mean divided by P, so the ranks' gradients sum to the global mean's.
//   FLAT        logits in the plan's blocks of vocab_chunk_tokens; OffloadStreamAdamW's buckets
//               (each part's gradient sent, updated and published piece by piece); SCO (every
//               boundary on the host); over ranks Ring-DTP: rank r holds head rows [r·V/P,
//               (r+1)·V/P), the ranks' normalized hidden-state blocks go round at the pass stages
//               with their online log-sum-exp, then with their gradient, which the last grad_pass
//               takes home. Over ranks PipelinedLLEP: the graph is lowered with the previous
//               step's routing histogram (routing()), which places the spilled experts (LLEP's
//               least-loaded rule); at llep.fetch each helper receives its copies from their
//               owners (again for the replay), every dispatch round balances its actual rows over
//               owners and copies (balanced_dispatch_splits), and llep.grad_return adds the
//               helpers' gradients of the copies into the owners' expert gradients.
//   memory      weights are leaves per tensor (and per expert) whose gradients accumulate in
//               place into one flat gradient per block; the embedding and head are on the device
//               only while a stage uses them; on a CPU standing in for a GPU every device-side
//               allocation is counted (backend/runtime/device_memory.h) and the trace keeps each GPU
//               stage's own peak.
// Exactness: losses and gradients equal the plain reference (tests/backend/plan_runtime_test.cc,
// tests/backend/dist_ep_test.cc over ranks).
// Where: backend/runner/, one file per mechanism (backend/README.md lists them); a stage's
// (part, operator) maps to its handler in the one table of backend/runner/handlers.cc.
// Not thread-safe: one thread drives run().
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include "backend/dist/rank_group.h"
#include "backend/runtime/runtime.h"
#include "backend/runtime/state.h"
#include "costmodel/routing.h"
#include "planner/lowering/step_graph.h"
#include "planner/plan/plan.h"
#include "traces/trace.h"

namespace oom::backend {

// The StepGraph the backend runs for `plan` on `model` with batch × seq tokens per step on `ranks`
// ranks (its first `decoder_layers` decoders when > 0): lower() on the model as given (a truncated
// or test model needs no config file) and a node spec whose structure is the lowering's (its
// timings are not used). Preconditions: check_plan_for_run() accepted the plan.
// `routing` is the workload's routing model, which places PipelinedLLEP's fetched experts
// (GraphRunner::routing()). Over `nodes` > 1 nodes (torchrun's --nnodes) the ranks fill
// ranks / nodes GPUs of each node, and each node's host work runs on its own sockets.
StepGraph lower_for_run(const Plan& plan, const ModelSpec& model, std::int64_t batch, std::int64_t seq, int ranks = 1,
                        const RoutingSpec& routing = {}, int nodes = 1);

class GraphRunner {
 public:
  // `state` must outlive the runner; `plan` is the plan the graphs were lowered from. With a
  // `group` of P > 1 ranks (which must outlive the runner) this process is rank group->rank() of
  // an EP plan: see "over ranks" above.
  GraphRunner(HostState& state, TrainerConfig config, Plan plan, at::Device device = at::kCPU, RankGroup* group = nullptr);
  ~GraphRunner();
  GraphRunner(const GraphRunner&) = delete;
  GraphRunner& operator=(const GraphRunner&) = delete;

  // One training step: this rank's stages of `graph` on the global batch tokens/targets int64
  // [B, S] (host), the graph lowered for exactly this shape and rank count. Increments
  // state.step. A stage with no kernel here is a std::logic_error naming it, thrown before any
  // work. Over ranks every rank calls it with the same batch; the loss (and norm) returned are
  // the global ones.
  StepStats run(const StepGraph& graph, const at::Tensor& tokens, const at::Tensor& targets);
  void set_lr(double lr);
  void set_tracing(bool on);
  // The timeline of the latest traced step (engine "torch").
  const Trace& last_trace() const;
  // Over ranks: the rows this rank sent to each rank in every forward dispatch of the last step
  // (layer, then chunk order).
  const std::vector<std::vector<std::int64_t>>& last_dispatch() const;
  // The most the device side held during the last step, on a CPU standing in for a GPU
  // (backend/runtime/device_memory.h): a traced step's from its trace (each stage marks its own peak, so
  // the meter holds only the last stage's), else the meter's.
  Bytes last_device_peak() const;
  // Each memory use's own peak over the last step on a CPU standing in for a GPU, as the memory
  // model tags its bytes (dispatch, vocabulary, boundaries, optimizer, activations, other): what
  // FLAT's schedules bound, measured (backend/runtime/device_memory.h). Zeros when nothing is emulated.
  std::array<Bytes, kMemoryUses> last_use_peaks() const;
  // The routing the next step's graph must be lowered with (lower_for_run): under PipelinedLLEP
  // the histogram of the last step's forward dispatches, over every rank and round, which places
  // the experts the helpers fetch (uniform before the first step: nothing fetched); else uniform.
  const RoutingSpec& routing() const;
  // EP over ranks: the histogram of the last step's forward dispatches (every rank's assignments
  // per decoder and expert; a decoder with none counts one per expert), whatever the dispatch;
  // uniform before the first step and on one rank.
  const RoutingSpec& last_step_routing() const;
  // Restores the routing the next step is lowered with: a resumed run's, from the checkpoint that
  // saved routing() (run.llep_routing), so it fetches what the uninterrupted run fetches.
  void set_routing(RoutingSpec routing);
  // The host gradient buffers this runner holds between steps (without clipping at most
  // cpu_grad_slots per kind: routed experts, everything else; a whole decoder's gradient on a CPU
  // device is adopted, not copied) and their bytes.
  std::pair<int, std::int64_t> host_gradient_buffers() const;
  // From the next step on, every gradient this rank sends to the host (or updates on the device:
  // its slice of a resident expert bank) is also copied into
  // (*blocks)[b] (FP32, one flat tensor per block, zero where nothing was sent); null stops it.
  // For checks: the host gradient buffers themselves are reused.
  void capture_gradients(std::vector<at::Tensor>* blocks);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace oom::backend
