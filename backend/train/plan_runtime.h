// PlanTrainer: one training step executed as a Plan says (planner/plan/plan.h), on the Local path of
// one rank: the plan is lowered to its StepGraph (planner/lowering/step_graph.h, once per batch
// shape) and the graph runner (backend/runner/graph_runner.h) executes that graph's stages, so the run
// follows the schedule the simulator predicts, stage for stage, and its trace has the same keys.
//
// What each Plan field does here (reference §4 "Split–Keep–Replay"), as the lowering schedules it:
//   split.sub_batch_seqs      every decoder runs its forward and its backward on sub-batches of
//                             complete sequences; weight gradients accumulate over sub-batches.
//   split.attention_head_group the attention core runs per group of g query heads of one GQA
//                             group over complete sequences with that group's shared K/V head
//                             (g = the heads per KV group runs each GQA group apart); in backward
//                             each group's core is re-run (or, with kept O/LSE, differentiated from
//                             them) and its K/V and input gradients accumulate in FP32.
//   split.gdn_chunk_tokens    the GDN recurrence runs over sequence chunks, handing its FP32 state
//                             forward; backward rematerializes the chunks in reverse order from their
//                             saved start states and hands the state derivative backward.
//   split.moe_chunk_tokens    router, shared expert, dense MLP and routed experts run per token chunk;
//                             backward recomputes and differentiates one chunk at a time.
//   keep_attention_results    the original forward keeps each attention layer's O and LSE on the host;
//                             replays use O instead of the core, backward differentiates the core
//                             from O/LSE (flash-attention backward) without recomputing it.
//   boundaries                a decoder's input is kept on the host, held on the compute device, or
//                             regenerated before its backward by no-grad forwards from the nearest
//                             kept boundary, holding at most regenerate_cap regenerated ones.
//   cpu_grad_slots            at most this many gradients of a kind (routed experts; the rest) wait
//                             for their CPU update at once, in as many host buffers, reused in turn.
//   transfer_chunk_mib        the size of the parameter window's H2D copies (CUDA).
// The EP path runs on one rank or, with a RankGroup, as one rank process of P (resident and
// retained decoders, routing rounds, dispatch all-to-alls); check_plan_for_run() rejects a plan
// this runtime cannot execute. Every training launch runs here: a run without a plan runs
// default_run_plan().
//
// Exactness: losses and parameters equal the plain trainer's (backend/train/plain_trainer.h) within FP32
// rounding for every mechanism (tests/backend/plan_runtime_test.cc).
// Tracing (set_tracing(true)): the step's stages with their lowering names, kinds and resources,
// host RSS and device allocator samples (backend/measure/stage_recorder.h); on CUDA the device is
// synchronized at every stage boundary while tracing.
// Not thread-safe: one thread drives step(); the CPU updates run on an internal worker thread.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include "backend/dist/rank_group.h"
#include "backend/runtime/runtime.h"
#include "backend/runtime/state.h"
#include "planner/lowering/step_graph.h"
#include "planner/plan/plan.h"
#include "traces/trace.h"

namespace oom::backend {

// The checks every backend runtime shares (this one and the multi-rank trainer): `ranks` ≥ 1, a
// batch that splits over them, and validate_plan() for a run of `ranks` GPUs with batch × seq
// tokens. Throws one InputError naming `file` and the field.
void check_plan_shape(const Plan& plan, const ModelSpec& model, std::int64_t batch, std::int64_t seq, int ranks,
                      const std::string& file);

// Checks, before any work, that `plan` can run on `model` with batch × seq tokens per step on
// `ranks` ranks: validate_plan() (layer indices, partitions that divide, path-specific fields),
// then this runtime's own rules: the Local path on one rank, Ring-DTP only on an LM head
// that is not tied to the embedding,
// a GDN chunk that divides the sequence, a MoE chunk within the tokens of a sub-batch. Throws one
// InputError naming `file` (or the model) and the field.
void check_plan_for_run(const Plan& plan, const ModelSpec& model, std::int64_t batch, std::int64_t seq, int ranks,
                        const std::string& file);

// The plan a run executes when it is given none (`oom train` or `oom train --ranks P` without
// --plan, and torchrun without it): the Base preset (planner/search/plan_presets.h) of the Local path
// on one rank, of the EP path over `ranks` ≥ 2 ranks (no resident or retained decoders, one
// routing round up to 64K tokens, full delivery), for `model` with batch × seq tokens per step on
// the machine the configs/hardware file `hardware` describes. Base rather than what `oom plan`
// searches: it is fixed per path, costs no pricing, and depends on the hardware only through its
// GPUs per node (EP groups). Then check_plan_for_run(). Throws InputError naming --ranks when the
// experts do not split over the ranks, or as check_plan_for_run() does.
Plan default_run_plan(const ModelSpec& model, std::int64_t batch, std::int64_t seq, int ranks, const std::string& hardware);

class PlanTrainer {
 public:
  // `state` must outlive the trainer. Preconditions: check_plan_for_run() accepted the plan for the
  // batches step() will see (step() re-checks their shape and throws InputError otherwise). With a
  // `group` of P ranks this process runs rank group->rank()'s share of an EP plan's graph for P
  // GPUs; `state` is then the host state the ranks share (share_host_state, backend/runtime/shared_state.h).
  // Over `nodes` nodes (torchrun's --nnodes) the graph places P / nodes ranks on each node.
  PlanTrainer(HostState& state, TrainerConfig config, Plan plan, at::Device device = at::kCPU, RankGroup* group = nullptr,
              int nodes = 1);
  ~PlanTrainer();
  PlanTrainer(const PlanTrainer&) = delete;
  PlanTrainer& operator=(const PlanTrainer&) = delete;

  // One step (config.accumulate must be 1: accumulation over a plan is its sub-batches, which sum
  // their weight gradients; train() gives the K·B sequences with split.sub_batch_seqs ≤ B).
  StepStats step(const at::Tensor& tokens, const at::Tensor& targets);
  // The learning rate of the following steps.
  void set_lr(double lr);
  // Records the next steps' stage timelines (see last_trace()).
  void set_tracing(bool on);
  // The timeline of the latest traced step (engine "torch").
  const Trace& last_trace() const;
  // Over ranks: the rows this rank sent in every forward dispatch of the last step.
  const std::vector<std::vector<std::int64_t>>& last_dispatch() const;
  // GraphRunner::last_device_peak and last_use_peaks.
  Bytes last_device_peak() const;
  std::array<Bytes, kMemoryUses> last_use_peaks() const;
  // GraphRunner::routing and set_routing: what a checkpoint keeps of a PipelinedLLEP run.
  const RoutingSpec& routing() const;
  void set_routing(RoutingSpec routing);
  // GraphRunner::last_step_routing.
  const RoutingSpec& last_step_routing() const;
  // The host gradient buffers held between steps and their bytes (GraphRunner::host_gradient_buffers).
  std::pair<int, std::int64_t> host_gradient_buffers() const;
  // GraphRunner::capture_gradients.
  void capture_gradients(std::vector<at::Tensor>* blocks);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace oom::backend
