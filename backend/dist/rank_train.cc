#include "backend/dist/rank_train.h"

#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <stdexcept>

#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "backend/checkpoint.h"
#include "backend/data.h"
#include "backend/device_memory.h"
#include "backend/dist/ep_trainer.h"
#include "backend/dist/launcher.h"
#include "backend/io/hf_checkpoint.h"
#include "backend/plan_runtime.h"
#include "backend/shared_state.h"
#include "backend/state.h"
#include "backend/threads.h"
#include "backend/train.h"
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

void check(const TrainOptions& o, const RanksOptions& r, const ModelSpec& spec) {
  const std::string P = std::to_string(r.ranks);
  if (r.ranks < 1) throw InputError("", "--ranks", P, "must be ≥ 1");
  if (o.reference) throw InputError("", "--reference", "true", "the reference trainer runs in one process");
  if (o.bf16 && o.plan.empty()) {
    throw InputError("", "--bf16", "true", "the multi-rank trainer keeps FP32 working weights without a plan (--plan)");
  }
  if (o.bf16 && (!o.checkpoint_dir.empty() || !o.resume_dir.empty())) {
    throw InputError("", "--bf16", "true", "multi-rank checkpoints keep FP32 working weights");
  }
  if (o.device_memory && o.plan.empty()) throw InputError("", "--device-memory", "true", "device memory is measured for a plan (--plan)");
  if (o.accumulate != 1) {
    throw InputError("", "--accumulate", std::to_string(o.accumulate), "the multi-rank trainer runs one micro-batch per step");
  }
  resolve_lr_schedule(o.lr_schedule, o.lr, o.min_lr, o.warmup_steps, o.decay_steps,
                      std::max<std::int64_t>(o.steps, o.warmup_steps));
  if (!o.log.empty()) throw InputError("", "--log", o.log, "the step log is written by the single-process trainer");
  if (o.checkpoint_every < 0) throw InputError("", "--checkpoint-every", std::to_string(o.checkpoint_every), "must be ≥ 0");
  if (o.steps < 0) throw InputError("", "--steps", std::to_string(o.steps), "must be ≥ 0");
  if (o.seq < 2) throw InputError("", "--seq", std::to_string(o.seq), "must be ≥ 2");
  if (o.batch < 1 || o.batch % r.ranks != 0) {
    throw InputError("", "--batch", std::to_string(o.batch), "must be a positive multiple of --ranks " + P);
  }
  if (!(o.lr > 0)) throw InputError("", "--lr", std::to_string(o.lr), "must be > 0");
  if (spec.router_aux_loss_coef > 0) {
    throw InputError(spec.name, "router_aux_loss_coef", fmt::format("{}", spec.router_aux_loss_coef),
                     "the multi-rank trainer trains without the load-balancing loss (the streamed trainer adds it)");
  }
  if (r.expert_parallel && spec.moe.experts % r.ranks != 0) {
    throw InputError(o.model, "num_experts", std::to_string(spec.moe.experts),
                     "expert parallelism needs a multiple of --ranks " + P);
  }
  if (r.delivery != "full" && r.delivery != "shard") {
    throw InputError("", "--delivery", r.delivery, "must be full or shard");
  }
  if (r.moe_chunk_tokens < 0) throw InputError("", "--moe-chunk", std::to_string(r.moe_chunk_tokens), "must be ≥ 0");
  if (!(r.timeout_s > 0)) throw InputError("", "--rank-timeout", std::to_string(r.timeout_s), "must be > 0");
  if (spec.vocab < 256) throw InputError("", "vocab_size", std::to_string(spec.vocab), "byte-level training needs ≥ 256");
  if (!o.trace.empty() && o.plan.empty()) throw InputError("", "--trace", o.trace, "a trace needs --plan");
}

nlohmann::json optional_layers(const std::optional<std::vector<int>>& layers) {
  return layers ? nlohmann::json(*layers) : nlohmann::json(nullptr);
}

std::optional<std::vector<int>> optional_layers(const nlohmann::json& j, const char* key, const std::string& path) {
  if (!j.contains(key)) throw InputError(path, key, "missing", "the job file lacks it");
  if (j.at(key).is_null()) return std::nullopt;
  try {
    return j.at(key).get<std::vector<int>>();
  } catch (const nlohmann::json::exception&) {
    throw InputError(path, key, j.at(key).dump(), "has the wrong type");
  }
}

// The file the rank processes of a plan run share their host state through: in /dev/shm where
// there is one (memory, not disk), else in the job folder. Removed once every rank mapped it.
std::string shared_state_path(const std::string& dir) {
  const fs::path shm("/dev/shm");
  std::error_code ec;
  const std::string name = fmt::format("oom-state-{}-{}", getpid(), fs::path(dir).filename().string());
  if (fs::is_directory(shm, ec)) return (shm / name).string();
  return (fs::path(dir) / "state").string();
}

nlohmann::json job_json(const TrainOptions& o, const RanksOptions& r, const std::string& dir) {
  return {{"model", o.model}, {"data", o.data}, {"weights", o.weights}, {"steps", o.steps}, {"seq", o.seq},
          {"batch", o.batch}, {"lr", o.lr}, {"weight_decay", o.weight_decay}, {"max_grad_norm", o.max_grad_norm},
          {"seed", o.seed}, {"threads", o.threads}, {"gdn_chunk_tokens", o.gdn_chunk_tokens}, {"device", o.device},
          {"lr_schedule", o.lr_schedule}, {"warmup_steps", o.warmup_steps}, {"decay_steps", o.decay_steps},
          {"min_lr", o.min_lr}, {"device_memory", o.device_memory}, {"bf16", o.bf16},
          {"ranks", r.ranks}, {"expert_parallel", r.expert_parallel}, {"delivery", r.delivery},
          {"resident_experts", r.resident_experts}, {"moe_chunk_tokens", r.moe_chunk_tokens},
          {"cpu_grad_slots", r.cpu_grad_slots},
          {"timeout_s", r.timeout_s}, {"save_weights", r.save_weights}, {"save_bf16", o.save_bf16},
          {"checkpoint_dir", o.checkpoint_dir}, {"checkpoint_every", o.checkpoint_every}, {"resume_dir", o.resume_dir},
          {"plan", o.plan.empty() ? nlohmann::json(nullptr) : plan_to_json(load_plan(o.plan))},
          {"plan_file", o.plan},
          {"trace", o.trace.empty() ? "" : (fs::path(dir) / "trace").string()},
          {"shared_state", o.plan.empty() ? "" : shared_state_path(dir)},
          {"resident_layers", optional_layers(r.resident_layers)},
          {"moe_retained_layers", optional_layers(r.moe_retained_layers)},
          {"store", (fs::path(dir) / "store").string()}, {"progress", (fs::path(dir) / "progress.jsonl").string()},
          {"result", (fs::path(dir) / "result.json").string()}};
}

std::string make_job_dir(const RanksOptions& r) {
  if (!r.job_dir.empty()) {
    fs::create_directories(r.job_dir);
    fs::remove(fs::path(r.job_dir) / "store");
    fs::remove(fs::path(r.job_dir) / "progress.jsonl");
    fs::remove(fs::path(r.job_dir) / "result.json");
    return r.job_dir;
  }
  const char* tmp = std::getenv("TMPDIR");
  std::string templ = (fs::path(tmp && *tmp ? tmp : "/tmp") / "oom-ranks-XXXXXX").string();
  if (mkdtemp(templ.data()) == nullptr) throw std::runtime_error("cannot create a job folder under " + templ);
  return templ;
}

// Reads the complete lines appended to the progress file since `offset`.
void forward_progress(const std::string& path, std::streamoff& offset,
                      const std::function<void(const StepReport&)>& on_step) {
  std::ifstream in(path);
  if (!in) return;
  in.seekg(offset);
  std::string line;
  while (std::getline(in, line)) {
    if (in.eof()) break;  // a line still being written
    offset = in.tellg();
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !on_step) continue;
    StepReport report{j.value("step", std::int64_t{0}), j.value("index", 0), j.value("steps", 0), j.value("loss", 0.0),
                      j.value("tokens_per_s", 0.0), j.value("elapsed_s", 0.0)};
    report.lr = j.value("lr", 0.0);
    report.tokens = j.value("tokens", std::int64_t{0});
    report.grad_norm = j.value("grad_norm", 0.0);
    on_step(report);
  }
}

template <typename T>
T field(const nlohmann::json& j, const char* key, const std::string& path) {
  if (!j.contains(key)) throw InputError(path, key, "missing", "the job file lacks it");
  try {
    return j.at(key).get<T>();
  } catch (const nlohmann::json::exception&) {
    throw InputError(path, key, j.at(key).dump(), "has the wrong type");
  }
}

}  // namespace

void apply_ep_plan(const TrainOptions& o, RanksOptions& r) {
  const Plan plan = load_plan(o.plan);
  const ModelSpec spec = run_model_spec(o.model, o.weights);
  const std::string& file = o.plan;
  if (plan.path != ExpertPath::kEp) {
    throw InputError(file, "path", "\"local\"",
                     fmt::format("the local path's splits and boundaries run on one rank (oom train --plan without --ranks), not {}", r.ranks));
  }
  if (r.ranks < 2) throw InputError(file, "path", "\"ep\"", "the EP path needs --ranks P ≥ 2");
  check_plan_for_run(plan, spec, o.batch, o.seq, r.ranks, file);
  r.expert_parallel = true;
  r.delivery = plan.param_transfer == ParamTransfer::kShard ? "shard" : "full";
  r.moe_chunk_tokens = plan.routing_chunk_tokens;
  r.resident_layers = plan.resident_layers;
  r.moe_retained_layers = plan.moe_retained_layers;
  r.cpu_grad_slots = plan.cpu_grad_slots;
}

namespace {

// Under torchrun the ranks may span hosts, so they share no host state and run EpTrainer
// (backend/dist/ep_trainer.h) with the plan's EP settings; what it does not execute is refused.
void refuse_what_ep_trainer_does_not_run(const TrainOptions& o) {
  const Plan plan = load_plan(o.plan);
  const std::string& file = o.plan;
  const auto unsupported = [&](const char* field, const std::string& value) {
    throw InputError(file, field, value,
                     "under torchrun the ranks run unsplit operators and keep every boundary on the host (oom train --ranks P runs the whole plan)");
  };
  if (plan.split.attention_head_group != 0) unsupported("split.attention_head_group", std::to_string(plan.split.attention_head_group));
  if (plan.split.gdn_chunk_tokens != 0) unsupported("split.gdn_chunk_tokens", std::to_string(plan.split.gdn_chunk_tokens));
  if (plan.split.moe_chunk_tokens != 0) unsupported("split.moe_chunk_tokens", std::to_string(plan.split.moe_chunk_tokens));
  if (plan.split.sub_batch_seqs != 0) unsupported("split.sub_batch_seqs", std::to_string(plan.split.sub_batch_seqs));
  if (plan.keep_attention_results) unsupported("keep_attention_results", "true");
  if (!plan.boundaries.host_kept_all) unsupported("boundaries.host_kept", "a list");
  if (!plan.boundaries.gpu_held.empty()) unsupported("boundaries.gpu_held", std::to_string(plan.boundaries.gpu_held.front()));
  if (plan.flat.expert_dispatch != ExpertDispatch::kStandard) unsupported("flat.expert_dispatch", "\"pipelined_llep\"");
  if (plan.flat.selective_checkpoint_offload) unsupported("flat.checkpoint_offload", "\"sco\"");
  if (plan.flat.vocab_projection != VocabProjection::kChunked) unsupported("flat.vocab_projection", "\"ring_dtp\"");
  if (plan.flat.optimizer_bucket_mib != 0) unsupported("flat.optimizer_bucket_mib", std::to_string(plan.flat.optimizer_bucket_mib));
  if (plan.flat.vocab_chunk_tokens != FlatSchedules{}.vocab_chunk_tokens) {
    unsupported("flat.vocab_chunk_tokens", std::to_string(plan.flat.vocab_chunk_tokens));
  }
}

// The PipelinedLLEP routing histogram a checkpoint's run object keeps (run.llep_routing), checked
// against the model; none when the checkpoint has none. Throws InputError naming `file` and the field.
std::optional<RoutingSpec> saved_llep_routing(const nlohmann::json& run, const ModelSpec& spec, const std::string& file) {
  if (!run.contains("llep_routing")) return std::nullopt;
  RoutingSpec routing = routing_from_json(run["llep_routing"], file, "run.llep_routing");
  check_routing(routing, spec.moe.experts, spec.layers, file, "run.llep_routing");
  return routing;
}

}  // namespace

RanksResult train_ranks(const TrainOptions& o, const RanksOptions& r_in,
                        const std::function<void(const StepReport&)>& on_step) {
  RanksOptions r = r_in;
  if (!o.plan.empty()) apply_ep_plan(o, r);
  const ModelSpec spec = run_model_spec(o.model, o.weights);
  check(o, r, spec);
  check_final_weights(spec, r.save_weights);
  resolve_device(o.device);  // --device cuda without a GPU: one error before any process starts
  {
    // Data and checkpoint errors before any process starts.
    const auto probe = open_training_data(o.data.empty() ? default_corpus_path() : o.data, o.seq);
    probe->check_vocab(spec.vocab);
    if (!o.resume_dir.empty()) {
      HostState state(spec);
      const auto run = resume_training(o, state, *probe);
      run_lr_schedule(o, state.step, &run, checkpoint_file(o.resume_dir));
      saved_llep_routing(run, spec, checkpoint_file(o.resume_dir));
    }
  }
  TrainOptions resolved = o;
  if (resolved.data.empty()) resolved.data = default_corpus_path();
  const std::string dir = make_job_dir(r);
  const std::string job = (fs::path(dir) / "job.json").string();
  const auto jj = job_json(resolved, r, dir);
  write_file_atomically(job, jj.dump(2));
  const std::string program = r.worker_program.empty() ? self_executable() : r.worker_program;
  std::vector<std::vector<std::string>> argv;
  LaunchOptions lo;
  lo.deadline_s = r.deadline_s;
  lo.secondary_failure_marker = "a peer rank died or stalled";
  for (int k = 0; k < r.ranks; ++k) {
    argv.push_back({program, "rank-worker", "--job", job, "--rank", std::to_string(k)});
    lo.log_paths.push_back((fs::path(dir) / ("rank-" + std::to_string(k) + ".log")).string());
  }
  std::streamoff offset = 0;
  const std::string progress = jj["progress"];
  lo.poll = [&] { forward_progress(progress, offset, on_step); };
  const auto launched = run_ranks(argv, lo);
  {
    // Rank 0 unlinks the shared state once every rank mapped it; not when a rank failed before.
    std::error_code ec;
    if (!jj["shared_state"].get<std::string>().empty()) fs::remove(jj["shared_state"].get<std::string>(), ec);
  }
  if (!launched.ok) throw std::runtime_error(launched.message + " (logs in " + dir + ")");

  const std::string result_path = jj["result"];
  std::ifstream in(result_path);
  const auto res = nlohmann::json::parse(in, nullptr, false);
  if (res.is_discarded()) throw std::runtime_error("rank 0 finished without a readable " + result_path);
  RanksResult out;
  out.train.losses = field<std::vector<double>>(res, "losses", result_path);
  out.train.tokens_per_s = field<double>(res, "tokens_per_s", result_path);
  out.train.first_step = field<std::int64_t>(res, "first_step", result_path);
  out.train.last_step = field<std::int64_t>(res, "last_step", result_path);
  out.train.trainer = field<std::string>(res, "trainer", result_path);
  out.last_dispatch_rows = field<std::vector<std::vector<std::int64_t>>>(res, "last_dispatch_rows", result_path);
  out.backend = field<std::string>(res, "backend", result_path);
  out.device_peaks = field<std::vector<std::int64_t>>(res, "device_peaks", result_path);
  for (const std::int64_t peak : out.device_peaks) out.train.device_peak_bytes = std::max(out.train.device_peak_bytes, peak);
  out.train.device_use_peak_bytes = field<std::vector<std::int64_t>>(res, "device_use_peaks", result_path);
  out.step_use_peaks = field<std::vector<std::vector<std::int64_t>>>(res, "step_use_peaks", result_path);
  const auto routing = field<std::vector<nlohmann::json>>(res, "step_routing", result_path);
  for (std::size_t i = 0; i < routing.size(); ++i) {
    out.step_routing.push_back(routing_from_json(routing[i], result_path, fmt::format("step_routing[{}]", i)));
  }
  if (!o.trace.empty() && o.steps > 0) {
    std::vector<Trace> ranks_traces;
    for (int k = 0; k < r.ranks; ++k) {
      const std::string path = fmt::format("{}.rank{}.json", jj["trace"].get<std::string>(), k);
      std::ifstream tin(path);
      const auto tj = nlohmann::json::parse(tin, nullptr, false);
      if (tj.is_discarded()) throw std::runtime_error("rank " + std::to_string(k) + " finished without a readable " + path);
      ranks_traces.push_back(trace_from_json(tj, path));
    }
    write_file_atomically(o.trace, with_oom_version(trace_to_chrome_json(merge_rank_traces(ranks_traces))).dump() + "\n");
  }
  if (r.job_dir.empty()) {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  return out;
}

namespace {

// What one rank's run gives back (every rank computes the same losses).
struct RankRun {
  std::vector<double> losses;
  double tokens_per_s = 0.0;
  std::int64_t first_step = 1, last_step = 0;
  std::vector<std::vector<std::int64_t>> dispatch_rows;  // this rank's sends, last step
  std::string backend;
  std::vector<std::int64_t> device_peaks;  // with device_memory: every rank's device peak
  std::vector<std::int64_t> device_use_peaks;  // and each use's own peak, the most on any rank
  std::vector<std::vector<std::int64_t>> step_use_peaks;  // the same per step
  std::vector<nlohmann::json> step_routing;  // a plan over ranks: each step's routing histogram (routing_to_json)
};

// How a rank trains: with `plan`, its share of the plan's StepGraph (the graph runner) on the host
// state the ranks share through the file `shared_state`, its last step's trace (trace_to_json) in
// `trace` when that is not empty; without, EpTrainer with the options' EP settings.
struct RankPlan {
  std::optional<Plan> plan;
  std::string shared_state;
  std::string trace;
};

// The body every rank runs, however it was started: data, state (seeded, weights, or resumed),
// the communicator, the trainer, checkpoints and weights (rank 0 writes them). `on_step` is called
// on rank 0 after every step.
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
                 const std::function<void(const StepReport&)>& on_step, const RankPlan& rp = {}) {
  const ModelSpec spec = run_model_spec(o.model, o.weights);
  check(o, r, spec);
  if (rank < 0 || rank >= r.ranks) throw InputError("", "--rank", std::to_string(rank), "out of range");
  set_compute_threads(o.threads > 0 ? o.threads : 1);
  const at::Device device(resolve_device(o.device, co.cuda_device));
  co.cuda = device.is_cuda();
  if (co.cuda) co.cuda_device = device.index();

  const auto data = open_training_data(o.data, o.seq);
  data->check_vocab(spec.vocab);
  data->seed(o.seed);
  // BF16 working weights only with a plan (check()): the graph runner runs them.
  HostState state(spec, {o.bf16 ? WorkingPrecision::kBFloat16 : WorkingPrecision::kFloat32, {}});
  load_initial_weights(state, o.weights, o.seed);
  std::optional<nlohmann::json> saved_run;
  if (!o.resume_dir.empty()) saved_run = resume_training(o, state, *data);
  const LrSchedule schedule = run_lr_schedule(o, state.step, saved_run ? &*saved_run : nullptr, checkpoint_file(o.resume_dir));
  co.rank = rank;
  co.world_size = r.ranks;
  co.timeout_s = r.timeout_s;
  Communicator comm(co);
  if (rp.plan) {
    // One host state for the node: rank 0's (every rank initialized the same one) in a file
    // every rank maps; unlinked once all have it.
    if (rank == 0) {
      ::unlink(rp.shared_state.c_str());
      share_host_state(state, rp.shared_state, /*create=*/true);
    }
    comm.barrier();
    if (rank != 0) share_host_state(state, rp.shared_state, /*create=*/false);
    comm.barrier();
    if (rank == 0) ::unlink(rp.shared_state.c_str());
  }

  EpConfig cfg;
  cfg.trainer.adam.lr = o.lr;
  cfg.trainer.adam.weight_decay = o.weight_decay;
  cfg.trainer.max_grad_norm = o.max_grad_norm;
  cfg.trainer.model.gdn_chunk_tokens = o.gdn_chunk_tokens;
  cfg.trainer.adam_threads = o.threads > 0 ? o.threads : 1;
  cfg.delivery = r.delivery == "shard" ? Delivery::kShard : Delivery::kFull;
  cfg.expert_parallel = r.expert_parallel;
  cfg.resident_experts = r.resident_experts;
  cfg.moe_chunk_tokens = r.moe_chunk_tokens;
  cfg.resident_layers = r.resident_layers;
  cfg.moe_retained_layers = r.moe_retained_layers;
  cfg.cpu_grad_slots = r.cpu_grad_slots;
  // The trainer's interface here: EpTrainer, or the graph runner over the shared state.
  std::unique_ptr<EpTrainer> ep;
  // A CPU rank standing in for a GPU measures its device side (backend/device_memory.h), from
  // before the runner: its weight window allocates the device's slots.
  const bool measured = rp.plan && o.device_memory && comm.device().is_cpu();
  const device_memory::Emulation emulation(measured);
  std::unique_ptr<PlanTrainer> planned;
  if (rp.plan) {
    planned = std::make_unique<PlanTrainer>(state, cfg.trainer, *rp.plan, comm.device(), &comm);
  } else {
    ep = std::make_unique<EpTrainer>(state, cfg, comm, comm.device());
  }
  struct {
    EpTrainer* ep;
    PlanTrainer* planned;
    HostState& state;
    std::int64_t steps() const { return ep ? ep->steps() : state.step; }
    void set_lr(double lr) { ep ? ep->set_lr(lr) : planned->set_lr(lr); }
    StepStats step(const at::Tensor& t, const at::Tensor& y) { return ep ? ep->step(t, y) : planned->step(t, y); }
    // The shared state already is the whole state.
    void export_state(HostState& out) {
      if (ep) ep->export_state(out);
    }
    std::vector<at::Tensor> gather_flat_params() {
      if (ep) return ep->gather_flat_params();
      std::vector<at::Tensor> out;
      for (int b = 0; b < state.blocks(); ++b) out.push_back(state.master(b).clone());
      return out;
    }
    std::vector<std::vector<std::int64_t>> last_dispatch() const {
      if (planned) return planned->last_dispatch();
      std::vector<std::vector<std::int64_t>> out;
      for (const auto& d : ep->last_dispatch()) out.push_back(d.send_rows);
      return out;
    }
  } trainer{ep.get(), planned.get(), state};

  // PipelinedLLEP places the next step's fetched experts by the last step's routing histogram: the
  // checkpoint keeps it, and a resumed run starts from it (a checkpoint without one: uniform).
  const bool llep = rp.plan && rp.plan->flat.expert_dispatch == ExpertDispatch::kPipelinedLlep;
  if (llep && saved_run) {
    if (auto routing = saved_llep_routing(*saved_run, spec, checkpoint_file(o.resume_dir))) planned->set_routing(std::move(*routing));
  }
  const auto checkpoint_run_with = [&](const TrainingData& d) {
    nlohmann::json run = checkpoint_run(o, d);
    run["lr_schedule"] = lr_schedule_to_json(schedule);
    if (llep) run["llep_routing"] = routing_to_json(planned->routing());
    return run;
  };
  // Every rank gathers (collective); rank 0 writes the one checkpoint file.
  const auto checkpoint = [&] {
    trainer.export_state(state);
    if (rank == 0) save_checkpoint(o.checkpoint_dir, state, checkpoint_run_with(*data));
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
    const double lr = lr_at(schedule, trainer.steps() + 1);
    trainer.set_lr(lr);
    if (planned && !rp.trace.empty() && i + 1 == o.steps) planned->set_tracing(true);
    const StepStats st = trainer.step(b.tokens, b.targets);
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - ts).count();
    if (measured) {
      device_peak = std::max<std::int64_t>(device_peak, planned->last_device_peak());
      const auto uses = planned->last_use_peaks();
      for (std::size_t u = 0; u < uses.size(); ++u) use_peaks[u] = std::max<std::int64_t>(use_peaks[u], uses[u]);
      run.step_use_peaks.push_back(most_on_any_rank(comm, std::vector<std::int64_t>(uses.begin(), uses.end())));  // collective
    }
    if (planned && rp.plan->path == ExpertPath::kEp) run.step_routing.push_back(routing_to_json(planned->last_step_routing()));
    tokens += b.tokens.numel();
    run.losses.push_back(st.loss);
    if (rank == 0 && on_step) {
      StepReport report{trainer.steps(), i, o.steps, st.loss, static_cast<double>(b.tokens.numel()) / dt,
                        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()};
      report.lr = lr;
      report.tokens = b.tokens.numel();
      report.grad_norm = st.grad_norm;
      on_step(report);
    }
    if (checkpoint_due(o, i)) checkpoint();
  }
  const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!r.save_weights.empty()) {
    const auto flats = trainer.gather_flat_params();  // collective: every rank takes part
    if (rank == 0) {
      for (int b = 0; b < state.blocks(); ++b) state.master(b).copy_(flats[static_cast<std::size_t>(b)]);
      save_final_weights(state, r.save_weights, o.model, o.weights, o.save_bf16);
    }
  }
  run.tokens_per_s = total > 0 ? static_cast<double>(tokens) / total : 0.0;
  run.last_step = trainer.steps();
  run.dispatch_rows = trainer.last_dispatch();
  if (planned && !rp.trace.empty() && o.steps > 0) {
    write_file_atomically(fmt::format("{}.rank{}.json", rp.trace, rank), trace_to_json(planned->last_trace()).dump());
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
  r.expert_parallel = field<bool>(j, "expert_parallel", job_path);
  r.delivery = field<std::string>(j, "delivery", job_path);
  r.resident_experts = field<bool>(j, "resident_experts", job_path);
  r.moe_chunk_tokens = field<std::int64_t>(j, "moe_chunk_tokens", job_path);
  r.cpu_grad_slots = field<int>(j, "cpu_grad_slots", job_path);
  r.timeout_s = field<double>(j, "timeout_s", job_path);
  r.save_weights = field<std::string>(j, "save_weights", job_path);
  o.save_bf16 = field<bool>(j, "save_bf16", job_path);
  r.resident_layers = optional_layers(j, "resident_layers", job_path);
  r.moe_retained_layers = optional_layers(j, "moe_retained_layers", job_path);
  RankPlan rp;
  if (!j.contains("plan")) throw InputError(job_path, "plan", "missing", "the job file lacks it");
  if (!j.at("plan").is_null()) {
    rp.plan = plan_from_json(j.at("plan"), job_path, "plan");
    o.plan = field<std::string>(j, "plan_file", job_path);
    rp.shared_state = field<std::string>(j, "shared_state", job_path);
    rp.trace = field<std::string>(j, "trace", job_path);
    o.trace = rp.trace;
  }

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
  if (!o_in.plan.empty()) {
    apply_ep_plan(o_in, r);
    refuse_what_ep_trainer_does_not_run(o_in);
  }
  if (!o_in.trace.empty()) {
    throw InputError("", "--trace", o_in.trace, "under torchrun the ranks record no trace (oom train --ranks P does)");
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
  const RankRun run = run_rank(o, r, env.rank, co, on_step);
  RanksResult out;
  out.train.losses = run.losses;
  out.train.tokens_per_s = run.tokens_per_s;
  out.train.first_step = run.first_step;
  out.train.last_step = run.last_step;
  out.train.trainer = "ranks";
  out.last_dispatch_rows = run.dispatch_rows;
  out.backend = run.backend;
  return out;
}

}  // namespace oom::backend::dist
