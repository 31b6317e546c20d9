// What each rank of a multi-rank run executes (rank_train.h): run_rank_worker() for the processes
// `oom train --ranks P` starts (the job file, a FileStore in the job folder) and
// train_torchrun_rank() for torchrun's (its environment, a TCPStore), both through one body,
// run_rank(): data, state, the communicator, the plan's share through PlanTrainer, checkpoints,
// progress and the result. The parent's side, which writes the job and reads the result, is
// rank_train.cc; what both read is rank_job.h.
#include "backend/dist/rank_train.h"

#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <stdexcept>

#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "backend/data/data.h"
#include "backend/dist/failure_watch.h"
#include "backend/dist/launcher.h"
#include "backend/dist/process_group.h"
#include "backend/dist/rank_job.h"
#include "backend/io/hf_checkpoint.h"
#include "backend/runtime/device_memory.h"
#include "backend/runtime/shared_state.h"
#include "backend/runtime/state.h"
#include "backend/runtime/threads.h"
#include "backend/train/checkpoint.h"
#include "backend/train/plan_runtime.h"
#include "backend/train/train.h"

#ifdef OOM_BACKEND_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif
#include "costmodel/atomic_file.h"
#include "costmodel/input_error.h"
#include "costmodel/model_spec.h"
#include "costmodel/routing.h"
#include "costmodel/version.h"
#include "planner/plan/plan.h"
#include "traces/merge.h"
#include "traces/trace.h"

namespace oom::backend::dist {
namespace {

namespace fs = std::filesystem;
using rank_job::check;
using rank_job::field;
using rank_job::saved_llep_routing;
using rank_job::shared_state_path;

// A rank's device, made current before any other CUDA call of the rank ("cuda:N"), so that the
// rank's context, streams and pinned memory are its GPU's and no rank makes a context on GPU 0.
std::string use_device(const std::string& device) {
#ifdef OOM_BACKEND_CUDA
  const at::Device d(device);
  if (d.is_cuda() && d.has_index()) c10::cuda::set_device(d.index());
#endif
  return device;
}

}  // namespace

namespace {

// What one rank's run gives back (every rank computes the same losses).
struct RankRun {
  std::vector<double> losses, grad_norms;
  double tokens_per_s = 0.0;
  std::int64_t first_step = 1, last_step = 0;
  std::vector<std::vector<std::int64_t>> dispatch_rows;  // this rank's sends, last step
  std::string backend;
  std::vector<std::int64_t> device_peaks;  // with device_memory: every rank's device peak
  std::vector<std::int64_t> device_use_peaks;  // and each use's own peak, the most on any rank
  std::vector<std::vector<std::int64_t>> step_use_peaks;  // the same per step
  std::vector<nlohmann::json> step_routing;  // a plan over ranks: each step's routing histogram (routing_to_json)
};

// How a rank trains: its share of the plan's StepGraph (the graph runner) on the host state the
// ranks of its node share through the file `shared_state`, its last step's trace (trace_to_json)
// in `trace` when that is not empty.
struct RankPlan {
  Plan plan;
  std::string shared_state;
  std::string trace;
  bool gather_trace = false;  // every rank's trace goes to rank 0, which writes `trace` merged (torchrun)
  bool node_leader = false;  // makes its node's state file (the first rank of its node)
  int nodes = 1;             // > 1: NodeStateSync keeps the nodes' states equal
};

// The body every rank runs, however it was started: data, state (seeded, weights, or resumed),
// the communicator, the trainer, checkpoints and weights (rank 0 writes them). `on_step` is called
// on rank 0 after every step.
// Every rank's `mine` at rank 0, merged into one trace (merge_rank_traces) and written to `path`;
// a collective over the process group, so ranks on other nodes need no shared folder.
void gather_traces(Communicator& comm, const Trace& mine, const std::string& path) {
  const std::string text = trace_to_json(mine).dump();
  const at::Tensor lengths = comm.all_gather_counts({static_cast<std::int64_t>(text.size())});
  const std::int64_t longest = lengths.max().item<std::int64_t>();
  at::Tensor bytes = at::zeros({longest}, at::kByte);
  std::memcpy(bytes.data_ptr(), text.data(), text.size());
  const at::Tensor all = comm.all_gather(bytes.to(comm.device())).to(at::kCPU).contiguous();  // [ranks × longest]
  if (comm.rank() != 0) return;
  std::vector<Trace> ranks;
  for (int k = 0; k < comm.size(); ++k) {
    const char* at = reinterpret_cast<const char*>(all.data_ptr<std::uint8_t>()) + static_cast<std::ptrdiff_t>(k) * longest;
    const std::string from = fmt::format("rank {}'s trace", k);
    ranks.push_back(trace_from_json(nlohmann::json::parse(at, at + lengths[k][0].item<std::int64_t>()), from));
  }
  write_file_atomically(path, with_oom_version(trace_to_chrome_json(merge_rank_traces(ranks))).dump() + "\n");
}

// Each entry's most over the ranks (a collective: every rank calls it with as many entries).
std::vector<std::int64_t> most_on_any_rank(RankGroup& comm, const std::vector<std::int64_t>& mine) {
  const at::Tensor all = comm.all_gather_counts(mine);  // [ranks, entries]
  std::vector<std::int64_t> most(mine.size(), 0);
  for (std::int64_t k = 0; k < all.size(0); ++k) {
    for (std::int64_t u = 0; u < all.size(1); ++u) most[static_cast<std::size_t>(u)] = std::max(most[static_cast<std::size_t>(u)], all[k][u].item<std::int64_t>());
  }
  return most;
}

RankRun run_rank(const TrainOptions& o, const RanksOptions& r, int rank, CommOptions co,
                 const std::function<void(const StepReport&)>& on_step, const RankPlan& rp) {
  const ModelSpec spec = run_model_spec(o.model, o.weights);
  check(o, r, spec);
  if (rank < 0 || rank >= r.ranks) throw InputError("", "--rank", std::to_string(rank), "out of range");
  set_compute_threads(o.threads > 0 ? o.threads : 1);
  const at::Device device(use_device(resolve_device(o.device, co.cuda_device)));
  co.cuda = device.is_cuda();
  if (co.cuda) co.cuda_device = device.index();

  const auto data = open_training_data(o.data, o.seq);
  data->check_vocab(spec.vocab);
  data->seed(o.seed);
  HostState state(spec, {o.bf16 ? WorkingPrecision::kBFloat16 : WorkingPrecision::kFloat32, {}});
  load_initial_weights(state, o.weights, o.seed);
  std::optional<nlohmann::json> saved_run;
  if (!o.resume_dir.empty()) {
    if (rp.nodes > 1 && !fs::exists(checkpoint_file(o.resume_dir))) {
      throw InputError(checkpoint_file(o.resume_dir),
                       "this node has no copy of the checkpoint: every node resumes from the one its LOCAL_RANK 0 wrote into "
                       "its --checkpoint folder (copy a node's folder here, or put it on a filesystem every node mounts)");
    }
    saved_run = resume_training(o, state, *data);
  }
  const LrSchedule schedule = run_lr_schedule(o, state.step, saved_run ? &*saved_run : nullptr, checkpoint_file(o.resume_dir));
  co.rank = rank;
  co.world_size = r.ranks;
  co.timeout_s = r.timeout_s;
  Communicator comm(co);
  if (saved_run && rp.nodes > 1) {
    // Each node read its own copy: every rank must have resumed the same checkpoint.
    const CheckpointStamp mine = checkpoint_stamp(o.resume_dir);
    const at::Tensor all = comm.all_gather_counts({mine.step, static_cast<std::int64_t>(mine.payload_fnv1a64)});  // collective
    const int per_node = r.ranks / rp.nodes;
    for (std::int64_t k = 1; k < all.size(0); ++k) {
      if (all[k][0].item<std::int64_t>() == all[0][0].item<std::int64_t>() && all[k][1].item<std::int64_t>() == all[0][1].item<std::int64_t>()) continue;
      throw InputError(checkpoint_file(o.resume_dir), "payload_fnv1a64", fmt::format("{:016x}", static_cast<std::uint64_t>(all[k][1].item<std::int64_t>())),
                       fmt::format("rank {} (node {}) resumed another checkpoint (step {}) than rank 0 (node 0: step {}, {:016x}): every "
                                   "node's copy must be the same file",
                                   k, k / per_node, all[k][0].item<std::int64_t>(), all[0][0].item<std::int64_t>(),
                                   static_cast<std::uint64_t>(all[0][1].item<std::int64_t>())));
    }
  }
  {
    // One host state for the node: rank 0's (every rank initialized the same one) in a file
    // every rank maps; unlinked once all have it.
    if (rp.node_leader) {
      ::unlink(rp.shared_state.c_str());
      share_host_state(state, rp.shared_state, /*create=*/true);
    }
    comm.barrier();
    if (!rp.node_leader) share_host_state(state, rp.shared_state, /*create=*/false);
    comm.barrier();
    if (rp.node_leader) ::unlink(rp.shared_state.c_str());
  }

  TrainerConfig cfg;
  cfg.adam.lr = o.lr;
  cfg.adam.weight_decay = o.weight_decay;
  cfg.max_grad_norm = o.max_grad_norm;
  cfg.model.gdn_chunk_tokens = o.gdn_chunk_tokens;
  cfg.adam_threads = o.threads > 0 ? o.threads : 1;
  // A CPU rank standing in for a GPU measures its device side (backend/runtime/device_memory.h), from
  // before the runner: its weight window allocates the device's slots.
  const bool measured = o.device_memory && comm.device().is_cpu();
  const device_memory::Emulation emulation(measured);
  const auto planned = std::make_unique<PlanTrainer>(state, cfg, rp.plan, comm.device(), &comm, rp.nodes);
  std::optional<NodeStateSync> nodes;
  if (rp.nodes > 1) nodes.emplace(state, comm, comm.device(), rp.node_leader);

  // PipelinedLLEP places the next step's fetched experts by the last step's routing histogram: the
  // checkpoint keeps it, and a resumed run starts from it (a checkpoint without one: uniform).
  const bool llep = rp.plan.flat.expert_dispatch == ExpertDispatch::kPipelinedLlep;
  if (llep && saved_run) {
    if (auto routing = saved_llep_routing(*saved_run, spec, checkpoint_file(o.resume_dir))) planned->set_routing(std::move(*routing));
  }
  const auto checkpoint_run_with = [&](const TrainingData& d) {
    nlohmann::json run = checkpoint_run(o, d);
    run["lr_schedule"] = lr_schedule_to_json(schedule);
    if (llep) run["llep_routing"] = routing_to_json(planned->routing());
    return run;
  };
  // A node's shared state is the whole state (over several nodes NodeStateSync made them equal
  // after the step): each node's leader writes the checkpoint file into its --checkpoint folder
  // once every rank finished the step (the runner ends each step with a barrier), so every node
  // holds a copy; the copies are the same bytes (on a folder the nodes share, each replaces the
  // file atomically with the same content). No rank updates the state before the files are
  // written (a barrier after them).
  const auto checkpoint = [&] {
    if (rp.node_leader) save_checkpoint(o.checkpoint_dir, state, checkpoint_run_with(*data));
    comm.barrier();
  };
  RankRun run;
  run.first_step = state.step + 1;
  std::int64_t device_peak = -1;
  std::vector<std::int64_t> use_peaks(static_cast<std::size_t>(kMemoryUses), 0);
  const auto t0 = std::chrono::steady_clock::now();
  std::int64_t tokens = 0;
  if (o.steps == 0 && !o.checkpoint_dir.empty()) checkpoint();
  for (int i = 0; i < o.steps; ++i) {
    const auto ts = std::chrono::steady_clock::now();
    const Batch b = data->next(o.batch);
    const double lr = lr_at(schedule, state.step + 1);
    planned->set_lr(lr);
    if (!rp.trace.empty() && i + 1 == o.steps) planned->set_tracing(true);
    if (nodes) nodes->before_step();
    const StepStats st = planned->step(b.tokens, b.targets);
    if (nodes) nodes->after_step();  // collective
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - ts).count();
    if (measured) {
      device_peak = std::max<std::int64_t>(device_peak, planned->last_device_peak());
      const auto uses = planned->last_use_peaks();
      for (std::size_t u = 0; u < uses.size(); ++u) use_peaks[u] = std::max<std::int64_t>(use_peaks[u], uses[u]);
      run.step_use_peaks.push_back(most_on_any_rank(comm, std::vector<std::int64_t>(uses.begin(), uses.end())));  // collective
    }
    if (rp.plan.path == ExpertPath::kEp) run.step_routing.push_back(routing_to_json(planned->last_step_routing()));
    tokens += b.tokens.numel();
    run.losses.push_back(st.loss);
    run.grad_norms.push_back(st.grad_norm);
    if (rank == 0 && on_step) {
      StepReport report{state.step, i, o.steps, st.loss, static_cast<double>(b.tokens.numel()) / dt,
                        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()};
      report.lr = lr;
      report.tokens = b.tokens.numel();
      report.grad_norm = st.grad_norm;
      on_step(report);
    }
    if (checkpoint_due(o, i)) checkpoint();
  }
  const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!r.save_weights.empty() && rank == 0) save_final_weights(state, r.save_weights, o.model, o.weights, o.save_bf16);
  run.tokens_per_s = total > 0 ? static_cast<double>(tokens) / total : 0.0;
  run.last_step = state.step;
  run.dispatch_rows = planned->last_dispatch();
  if (!rp.trace.empty() && o.steps > 0) {
    if (rp.gather_trace) {
      gather_traces(comm, planned->last_trace(), rp.trace);  // collective
    } else {
      write_file_atomically(fmt::format("{}.rank{}.json", rp.trace, rank), trace_to_json(planned->last_trace()).dump());
    }
  }
  run.backend = comm.backend();
  if (measured) {
    const at::Tensor peaks = comm.all_gather_counts({device_peak});  // collective: every rank's
    for (std::int64_t k = 0; k < peaks.size(0); ++k) run.device_peaks.push_back(peaks[k][0].item<std::int64_t>());
    run.device_use_peaks = most_on_any_rank(comm, use_peaks);
  }
  comm.barrier();
  return run;
}

int env_int(const char* name, const char* value) {
  try {
    std::size_t used = 0;
    const int v = std::stoi(value, &used);
    if (used == std::string(value).size() && v >= 0) return v;
  } catch (const std::exception&) {
  }
  throw InputError("", name, value, "expected a non-negative integer (torchrun's environment)");
}

}  // namespace

void run_rank_worker(const std::string& job_path, int rank) {
  // A rank must not outlive its supervisor.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() == 1) throw std::runtime_error("the supervising process is gone");
  std::ifstream in(job_path);
  if (!in) throw InputError(job_path, "", "", "cannot read the job file");
  const auto j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.is_object()) throw InputError(job_path, "", "", "not a JSON object");

  TrainOptions o;
  o.model = field<std::string>(j, "model", job_path);
  o.data = field<std::string>(j, "data", job_path);
  o.weights = field<std::string>(j, "weights", job_path);
  o.steps = field<int>(j, "steps", job_path);
  o.seq = field<int>(j, "seq", job_path);
  o.batch = field<int>(j, "batch", job_path);
  o.lr = field<double>(j, "lr", job_path);
  o.weight_decay = field<double>(j, "weight_decay", job_path);
  o.max_grad_norm = field<double>(j, "max_grad_norm", job_path);
  o.seed = field<std::uint64_t>(j, "seed", job_path);
  o.threads = field<int>(j, "threads", job_path);
  o.gdn_chunk_tokens = field<std::int64_t>(j, "gdn_chunk_tokens", job_path);
  o.device = field<std::string>(j, "device", job_path);
  o.device_memory = field<bool>(j, "device_memory", job_path);
  o.bf16 = field<bool>(j, "bf16", job_path);
  o.lr_schedule = field<std::string>(j, "lr_schedule", job_path);
  o.warmup_steps = field<std::int64_t>(j, "warmup_steps", job_path);
  o.decay_steps = field<std::int64_t>(j, "decay_steps", job_path);
  o.min_lr = field<double>(j, "min_lr", job_path);
  o.checkpoint_dir = field<std::string>(j, "checkpoint_dir", job_path);
  o.checkpoint_every = field<int>(j, "checkpoint_every", job_path);
  o.resume_dir = field<std::string>(j, "resume_dir", job_path);
  RanksOptions r;
  r.ranks = field<int>(j, "ranks", job_path);
  r.timeout_s = field<double>(j, "timeout_s", job_path);
  r.save_weights = field<std::string>(j, "save_weights", job_path);
  o.save_bf16 = field<bool>(j, "save_bf16", job_path);
  RankPlan rp;
  if (!j.contains("plan")) throw InputError(job_path, "plan", "missing", "the job file lacks it");
  rp.plan = plan_from_json(j.at("plan"), job_path, "plan");
  o.plan = field<std::string>(j, "plan_file", job_path);
  rp.shared_state = field<std::string>(j, "shared_state", job_path);
  rp.trace = field<std::string>(j, "trace", job_path);
  o.trace = rp.trace;
  rp.node_leader = rank == 0;  // one node

  CommOptions co;
  co.store_path = field<std::string>(j, "store", job_path);
  // One GPU per rank on this host (--device cuda).
  co.cuda_device = rank;
  const std::string progress = field<std::string>(j, "progress", job_path);
  std::ofstream progress_out;
  if (rank == 0) progress_out.open(progress, std::ios::app);
  const RankRun run = run_rank(o, r, rank, co, [&](const StepReport& s) {
    const nlohmann::json line = {{"step", s.step}, {"index", s.index}, {"steps", s.steps}, {"loss", s.loss},
                                 {"tokens_per_s", s.tokens_per_s}, {"elapsed_s", s.elapsed_s}, {"lr", s.lr},
                                 {"tokens", s.tokens}, {"grad_norm", s.grad_norm}};
    progress_out << line.dump() << "\n";
    progress_out.flush();
  }, rp);
  if (rank == 0) {
    const nlohmann::json res = {{"losses", run.losses},
                                {"grad_norms", run.grad_norms},
                                {"tokens_per_s", run.tokens_per_s},
                                {"first_step", run.first_step},
                                {"last_step", run.last_step},
                                {"trainer", "ranks"},
                                {"backend", run.backend},
                                {"last_dispatch_rows", run.dispatch_rows},
                                {"device_peaks", run.device_peaks},
                                {"device_use_peaks", run.device_use_peaks},
                                {"step_use_peaks", run.step_use_peaks},
                                {"step_routing", run.step_routing}};
    write_file_atomically(field<std::string>(j, "result", job_path), res.dump());
  }
}

std::optional<TorchrunEnv> torchrun_env() {
  const char* world = std::getenv("WORLD_SIZE");
  if (world == nullptr) return std::nullopt;
  const auto need = [](const char* name) -> const char* {
    const char* v = std::getenv(name);
    if (v == nullptr || *v == '\0') throw InputError("", name, "unset", "torchrun sets it with WORLD_SIZE");
    return v;
  };
  TorchrunEnv e;
  e.world_size = env_int("WORLD_SIZE", world);
  if (e.world_size < 1) throw InputError("", "WORLD_SIZE", world, "must be ≥ 1");
  e.rank = env_int("RANK", need("RANK"));
  if (e.rank >= e.world_size) throw InputError("", "RANK", std::to_string(e.rank), "must be below WORLD_SIZE " + std::string(world));
  const char* local = std::getenv("LOCAL_RANK");
  e.local_rank = local != nullptr ? env_int("LOCAL_RANK", local) : e.rank;
  const char* local_world = std::getenv("LOCAL_WORLD_SIZE");
  e.local_world_size = local_world != nullptr ? env_int("LOCAL_WORLD_SIZE", local_world) : e.world_size;
  const char* group = std::getenv("GROUP_RANK");
  e.group_rank = group != nullptr ? env_int("GROUP_RANK", group) : e.rank / std::max(1, e.local_world_size);
  const char* run_id = std::getenv("TORCHELASTIC_RUN_ID");
  e.run_id = run_id != nullptr ? run_id : "none";
  for (char& c : e.run_id) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_') c = '_';  // a file name
  }
  e.master_addr = need("MASTER_ADDR");
  e.master_port = env_int("MASTER_PORT", need("MASTER_PORT"));
  const char* agent = std::getenv("TORCHELASTIC_USE_AGENT_STORE");
  e.agent_store = agent != nullptr && std::string(agent) == "True";
  if (e.master_port < 1 || e.master_port > 65535) {
    throw InputError("", "MASTER_PORT", std::to_string(e.master_port), "must be in [1, 65535]");
  }
  return e;
}

RanksResult train_torchrun_rank(const TrainOptions& o_in, const RanksOptions& r_in, const TorchrunEnv& env,
                                const std::function<void(const StepReport&)>& on_step) {
  if (r_in.ranks != 1 && r_in.ranks != env.world_size) {
    throw InputError("", "--ranks", std::to_string(r_in.ranks),
                     "torchrun's WORLD_SIZE is " + std::to_string(env.world_size) + "; drop --ranks under torchrun");
  }
  RanksOptions r = r_in;
  r.ranks = env.world_size;
  if (env.local_world_size < 1 || env.world_size % env.local_world_size != 0) {
    throw InputError("", "LOCAL_WORLD_SIZE", std::to_string(env.local_world_size),
                     fmt::format("must divide WORLD_SIZE {} (every node runs as many ranks)", env.world_size));
  }
  if (o_in.device_memory) {
    throw InputError("", "--device-memory", "true", "under torchrun the ranks measure no device memory (oom train --ranks P does)");
  }
  TrainOptions o = o_in;
  if (o.data.empty()) o.data = default_corpus_path();
  CommOptions co;
  co.master_addr = env.master_addr;
  co.master_port = env.master_port;
  co.rank0_serves_store = !env.agent_store;
  co.cuda_device = env.local_rank;
  co.rank = env.rank;
  co.world_size = r.ranks;
  co.timeout_s = r.timeout_s;
  // The store first, and the failure watch on it: from here on a rank that fails, or dies, is
  // named to every other rank within seconds (failure_watch.h).
  co.store = connect_store(co);
  FailureWatchOptions fw;
  fw.rank = env.rank;
  fw.world_size = env.world_size;
  fw.node = env.group_rank;
  fw.master_addr = env.master_addr;
  fw.master_port = env.master_port;
  fw.serves_store = env.rank == 0 && co.rank0_serves_store;
  fw.store_rank = co.rank0_serves_store ? 0 : -1;
  const char* restart = std::getenv("TORCHELASTIC_RESTART_COUNT");
  fw.run = env.run_id + "-" + (restart != nullptr ? restart : "0");
  fw.timeout_s = r.timeout_s;
  FailureWatch watch(fw);
  RankRun run;
  try {
    // Every rank lowers the same plan (the default one is a function of the model, the batch and
    // the hardware its GPU stands for) and maps the state rank 0 shares under a name of this job.
    RankPlan rp;
    rp.plan = ranks_plan(o, r.ranks, run_hardware(use_device(resolve_device(o.device, env.local_rank))));
    const char* tmp = std::getenv("TMPDIR");
    rp.shared_state = shared_state_path(fmt::format("oom-state-torchrun-{}-{}-node{}", env.master_port, env.run_id, env.group_rank),
                                        tmp != nullptr && *tmp != '\0' ? tmp : "/tmp");
    rp.node_leader = env.local_rank == 0;
    rp.nodes = env.world_size / env.local_world_size;
    rp.trace = o.trace;
    rp.gather_trace = true;
    run = run_rank(o, r, env.rank, co, on_step, rp);
  } catch (const std::exception& e) {
    watch.on_failure(e);
    throw;
  }
  watch.finish();
  RanksResult out;
  out.train.losses = run.losses;
  out.train.grad_norms = run.grad_norms;
  out.train.tokens_per_s = run.tokens_per_s;
  out.train.first_step = run.first_step;
  out.train.last_step = run.last_step;
  out.train.trainer = "ranks";
  out.last_dispatch_rows = run.dispatch_rows;
  out.backend = run.backend;
  return out;
}

}  // namespace oom::backend::dist
