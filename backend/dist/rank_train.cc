// The parent's side of `oom train --ranks P` (rank_train.h): the options checked, the ranks' plan,
// the job folder and file, the rank processes started and supervised, rank 0's progress forwarded
// and the result read. What each rank executes is rank_run.cc; what both read is rank_job.h.
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

}  // namespace

namespace rank_job {

void check(const TrainOptions& o, const RanksOptions& r, const ModelSpec& spec) {
  const std::string P = std::to_string(r.ranks);
  if (r.ranks < 1) throw InputError("", "--ranks", P, "must be ≥ 1");
  if (o.reference) throw InputError("", "--reference", "true", "the reference trainer runs in one process");
  if (o.bf16 && (!o.checkpoint_dir.empty() || !o.resume_dir.empty())) {
    throw InputError("", "--bf16", "true", "multi-rank checkpoints keep FP32 working weights");
  }
  if (o.accumulate != 1) {
    throw InputError("", "--accumulate", std::to_string(o.accumulate), "the multi-rank trainer runs one micro-batch per step");
  }
  resolve_lr_schedule(o.lr_schedule, o.lr, o.min_lr, o.warmup_steps, o.decay_steps,
                      std::max<std::int64_t>(o.steps, o.warmup_steps));
  if (!o.log.empty()) throw InputError("", "--log", o.log, "the step log is written by the single-process trainer");
  if (o.checkpoint_every < 0) throw InputError("", "--checkpoint-every", std::to_string(o.checkpoint_every), "must be ≥ 0");
  if (o.steps < 0) throw InputError("", "--steps", std::to_string(o.steps), "must be ≥ 0");
  if (o.seq < 2) throw InputError("", "--seq", std::to_string(o.seq), "must be ≥ 2");
  if (o.batch < 1 || (o.batch % r.ranks != 0 && r.ranks % o.batch != 0)) {
    throw InputError("", "--batch", std::to_string(o.batch),
                     "must be a positive multiple or divisor of --ranks " + P + " (a divisor splits each sequence: context parallelism)");
  }
  if (!(o.lr > 0)) throw InputError("", "--lr", std::to_string(o.lr), "must be > 0");
  if (!(r.timeout_s > 0)) throw InputError("", "--rank-timeout", std::to_string(r.timeout_s), "must be > 0");
  if (spec.vocab < 256) throw InputError("", "vocab_size", std::to_string(spec.vocab), "byte-level training needs ≥ 256");
}

// The file the rank processes of a node share their host state through, named `name`: in
// /dev/shm where there is one (memory, not disk), else in `fallback_dir`. Removed once every rank
// mapped it.
std::string shared_state_path(const std::string& name, const std::string& fallback_dir) {
  const fs::path shm("/dev/shm");
  std::error_code ec;
  if (fs::is_directory(shm, ec)) return (shm / name).string();
  return (fs::path(fallback_dir) / name).string();
}

}  // namespace rank_job

namespace {

nlohmann::json job_json(const TrainOptions& o, const RanksOptions& r, const Plan& plan, const std::string& dir) {
  return {{"model", o.model}, {"data", o.data}, {"weights", o.weights}, {"steps", o.steps}, {"seq", o.seq},
          {"batch", o.batch}, {"lr", o.lr}, {"weight_decay", o.weight_decay}, {"max_grad_norm", o.max_grad_norm},
          {"seed", o.seed}, {"threads", o.threads}, {"gdn_chunk_tokens", o.gdn_chunk_tokens}, {"device", o.device},
          {"lr_schedule", o.lr_schedule}, {"warmup_steps", o.warmup_steps}, {"decay_steps", o.decay_steps},
          {"min_lr", o.min_lr}, {"device_memory", o.device_memory}, {"bf16", o.bf16},
          {"ranks", r.ranks}, {"timeout_s", r.timeout_s}, {"save_weights", r.save_weights}, {"save_bf16", o.save_bf16},
          {"checkpoint_dir", o.checkpoint_dir}, {"checkpoint_every", o.checkpoint_every}, {"resume_dir", o.resume_dir},
          {"plan", plan_to_json(plan)}, {"plan_file", o.plan},
          {"trace", o.trace.empty() ? "" : (fs::path(dir) / "trace").string()},
          {"shared_state", shared_state_path(fmt::format("oom-state-{}-{}", getpid(), fs::path(dir).filename().string()), dir)},
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

}  // namespace

Plan ranks_plan(const TrainOptions& o, int ranks, const std::string& hardware) {
  const ModelSpec spec = run_model_spec(o.model, o.weights);
  if (o.plan.empty()) return default_run_plan(spec, o.batch, o.seq, ranks, hardware);
  const Plan plan = load_plan(o.plan);
  const std::string& file = o.plan;
  if (plan.path != ExpertPath::kEp) {
    throw InputError(file, "path", "\"local\"",
                     fmt::format("the local path's splits and boundaries run on one rank (oom train --plan without --ranks), not {}", ranks));
  }
  if (ranks < 2) throw InputError(file, "path", "\"ep\"", "the EP path needs --ranks P ≥ 2");
  check_plan_for_run(plan, spec, o.batch, o.seq, ranks, file);
  return plan;
}

namespace rank_job {

// The PipelinedLLEP routing histogram a checkpoint's run object keeps (run.llep_routing), checked
// against the model; none when the checkpoint has none. Throws InputError naming `file` and the field.
std::optional<RoutingSpec> saved_llep_routing(const nlohmann::json& run, const ModelSpec& spec, const std::string& file) {
  if (!run.contains("llep_routing")) return std::nullopt;
  RoutingSpec routing = routing_from_json(run["llep_routing"], file, "run.llep_routing");
  check_routing(routing, spec.moe.experts, spec.layers, file, "run.llep_routing");
  return routing;
}

}  // namespace rank_job

RanksResult train_ranks(const TrainOptions& o, const RanksOptions& r_in,
                        const std::function<void(const StepReport&)>& on_step) {
  const RanksOptions& r = r_in;
  const ModelSpec spec = run_model_spec(o.model, o.weights);
  if (r.ranks < 1) throw InputError("", "--ranks", std::to_string(r.ranks), "must be ≥ 1");
  // --device cuda without a GPU: one error before any process starts. The ranks' plan is lowered
  // for the machine rank 0's device stands for; a plan that does not fit is an error naming its file.
  const Plan plan = ranks_plan(o, r.ranks, run_hardware(resolve_device(o.device)));
  check(o, r, spec);
  check_final_weights(spec, r.save_weights);
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
  const auto jj = job_json(resolved, r, plan, dir);
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
    fs::remove(jj["shared_state"].get<std::string>(), ec);
  }
  if (!launched.ok) throw std::runtime_error(launched.message + " (logs in " + dir + ")");

  const std::string result_path = jj["result"];
  std::ifstream in(result_path);
  const auto res = nlohmann::json::parse(in, nullptr, false);
  if (res.is_discarded()) throw std::runtime_error("rank 0 finished without a readable " + result_path);
  RanksResult out;
  out.train.losses = field<std::vector<double>>(res, "losses", result_path);
  out.train.grad_norms = field<std::vector<double>>(res, "grad_norms", result_path);
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

}  // namespace oom::backend::dist
