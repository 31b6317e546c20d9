// `oom train --ranks P`: one training run spread over P rank processes, and the rank side of it.
//
// train_ranks() (the parent) checks the options and the model against the rank count and chooses
// the plan (ranks_plan) before any process starts, writes a job file into a job folder, starts P copies of the `oom` program as
// `oom rank-worker --job FILE --rank r` (backend/dist/launcher.h: one log per rank, a failing rank
// stops the others, an optional overall deadline) and forwards rank 0's per-step progress.
// run_rank_worker() (each child) joins the others through a FileStore in the job folder (Gloo over
// 127.0.0.1), maps the host state rank 0 shares (backend/runtime/shared_state.h), runs its share of the
// plan's StepGraph through the graph runner (PlanTrainer with the group) on the same global batches
// the single-process trainer would draw, and rank 0 writes the result (and, if asked, the final
// weights as safetensors). Every rank uses one LibTorch thread unless `threads` says otherwise.
// train_torchrun_rank() is the same rank body for processes that torchrun started: only the
// rendezvous differs (a TCPStore instead of the job folder's FileStore).
// No LibTorch types in this header: the `oom` command includes it.
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include "backend/train/train.h"
#include "costmodel/routing.h"
#include "planner/plan/plan.h"

namespace oom::backend::dist {

struct RanksOptions {
  int ranks = 2;
  double timeout_s = 120.0;       // rendezvous and every collective
  double deadline_s = 0.0;        // the whole run; 0 = none
  std::string worker_program;     // program started per rank; empty = the running executable
  std::string save_weights;       // safetensors file for the final weights; empty = none
  std::string job_dir;            // empty = a fresh folder under $TMPDIR (removed after success)
};

// The plan P = `ranks` rank processes run: the options' --plan file (an EP plan, P ≥ 2), else
// default_run_plan() for P ranks on `hardware` (Base EP: the experts sharded over the ranks, every
// expert shard updated through the host state, one routing round, full delivery). Checked against
// the model and the run (check_plan_for_run with P GPUs); throws one InputError naming the plan
// file (or --ranks) and the field.
Plan ranks_plan(const TrainOptions& options, int ranks, const std::string& hardware);

struct RanksResult {
  TrainResult train;
  // Rows rank 0 sent to each rank in every dispatch all-to-all of the last step (layer, chunk order).
  std::vector<std::vector<std::int64_t>> last_dispatch_rows;
  std::string backend;  // "gloo" (or "nccl")
  // With --device-memory on CPU ranks: each rank's device peak (train.device_peak_bytes: the most).
  std::vector<std::int64_t> device_peaks;
  // With --device-memory: per step, each memory use's own peak (MemoryUse order), the most on any rank.
  std::vector<std::vector<std::int64_t>> step_use_peaks;
  // A plan on the EP path: per step, its routing histogram (every rank's assignments per decoder
  // and expert). Under PipelinedLLEP step s + 1 places its fetched experts by step s's.
  std::vector<RoutingSpec> step_routing;
};

// Runs the training on `ranks.ranks` processes. Throws InputError for bad options (before any
// process starts) and std::runtime_error naming the rank when a rank fails (the others stopped).
RanksResult train_ranks(const TrainOptions& options, const RanksOptions& ranks,
                        const std::function<void(const StepReport&)>& on_step = {});

// The body of `oom rank-worker`: runs rank `rank` of the job in `job_path`. Throws on failure.
void run_rank_worker(const std::string& job_path, int rank);

// The environment torchrun (or any launcher that follows PyTorch's convention) gives each rank.
struct TorchrunEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;  // LOCAL_WORLD_SIZE: the ranks on this node (unset: WORLD_SIZE)
  int group_rank = 0;        // GROUP_RANK: this node's index (unset: RANK / LOCAL_WORLD_SIZE)
  std::string run_id;        // TORCHELASTIC_RUN_ID as a file name ("none" when unset)
  std::string master_addr;
  int master_port = 0;
  bool agent_store = false;  // TORCHELASTIC_USE_AGENT_STORE=True: torchrun's agent serves the store
};

// The torchrun environment of this process: nullopt when WORLD_SIZE is unset; an InputError naming
// the variable when one is missing or malformed (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
// GROUP_RANK, MASTER_ADDR, MASTER_PORT).
std::optional<TorchrunEnv> torchrun_env();

// Runs this process as rank env.rank of a torchrun job of env.world_size ranks: the same training
// as train_ranks() with P = WORLD_SIZE (ranks.ranks must be 1, i.e. not given, or equal to it):
// the same plan (ranks_plan), each rank's share of its StepGraph through the graph runner, with
// the rendezvous through a TCPStore served by rank 0 at MASTER_ADDR:MASTER_PORT. The ranks of a
// node (GROUP_RANK; LOCAL_WORLD_SIZE ranks each, which must divide WORLD_SIZE) share their node's
// host state, a file in /dev/shm named by MASTER_PORT, TORCHELASTIC_RUN_ID and the node, made by
// its LOCAL_RANK 0; over several nodes NodeStateSync (backend/runtime/shared_state.h) makes the nodes'
// states equal after every step. A run killed before every rank of a node mapped its file leaves
// that file behind. Each rank uses GPU LOCAL_RANK with --device cuda (NCCL). on_step is called on rank 0
// only. Every rank returns the same losses; each node's LOCAL_RANK 0 writes its node's copy of the
// checkpoints (into --checkpoint as its node sees it; a --resume reads each node's own copy, and
// the ranks check that they resumed the same one), rank 0 the final weights. A rank that fails
// publishes its failure through the store, and every other rank, told by its FailureWatch
// (failure_watch.h), prints one line naming it and ends its process with status 1.
RanksResult train_torchrun_rank(const TrainOptions& options, const RanksOptions& ranks, const TorchrunEnv& env,
                                const std::function<void(const StepReport&)>& on_step = {});

}  // namespace oom::backend::dist
