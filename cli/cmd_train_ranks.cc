// `oom train --ranks P` (P rank processes running a plan through the graph runner,
// backend/dist/rank_train.h) and the hidden
// `oom rank-worker` command each rank process runs.
#include <memory>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "backend/dist/rank_train.h"
#include "cli/cli.h"
#include "costmodel/input_error.h"
#include "costmodel/units.h"

namespace oom::cli {

struct TrainRanksOptions {
  backend::dist::RanksOptions ranks;
  bool given = false;
  CLI::App* cmd = nullptr;
  std::string removed;  // the value of an option the plan replaced (see kRemovedOptions)
};

namespace {

// Options of the schedules the graph runner replaced, each with the Plan field that now says it
// (planner/plan/plan.h): refused with one line, so a script that passes one learns where it went.
struct RemovedOption {
  const char* name;
  const char* message;
};
constexpr RemovedOption kRemovedOptions[] = {
    {"--delivery", "removed: a plan's param_transfer (full or shard) sets the delivery (oom plan ..., then --plan)"},
    {"--moe-chunk", "removed: a plan's routing_chunk_tokens sets the tokens per dispatch round (oom plan ..., then --plan)"},
    {"--streamed-experts", "removed: a plan's resident_layers lists the decoders whose expert shards stay on the device (the default plan: none)"},
    {"--no-expert-parallel", "removed: the ranks run an EP plan, its experts sharded over them"},
};

}  // namespace

std::shared_ptr<TrainRanksOptions> add_train_ranks_options(CLI::App* cmd) {
  auto o = std::make_shared<TrainRanksOptions>();
  o->cmd = cmd;
  o->ranks.ranks = 1;
  auto& r = o->ranks;
  const char* group = "Multi-rank (--ranks P ≥ 2: P processes on this host; or under torchrun, one rank per process)";
  cmd->add_option("--ranks", r.ranks, "Rank processes (experts sharded over them, batch split)")
      ->capture_default_str()->group(group);
  for (const RemovedOption& removed : kRemovedOptions) {
    const std::string name(removed.name);
    if (name == "--delivery" || name == "--moe-chunk") {
      cmd->add_option(name, o->removed, removed.message)->group("");
    } else {
      cmd->add_flag(name, removed.message)->group("");
    }
  }
  cmd->add_option("--rank-timeout", r.timeout_s, "Seconds a rendezvous or collective may wait for a peer")
      ->capture_default_str()->group(group);
  cmd->add_option("--deadline", r.deadline_s, "Seconds the whole run may take (0 = no limit)")
      ->capture_default_str()->group(group);
  return o;
}

namespace {

void print_ranks_result(const backend::dist::RanksResult& result, int ranks, bool json, Io io) {
  if (json) {
    nlohmann::json j;
    j["losses"] = result.train.losses;
    j["grad_norms"] = result.train.grad_norms;
    j["tokens_per_s"] = result.train.tokens_per_s;
    j["first_step"] = result.train.first_step;
    j["last_step"] = result.train.last_step;
    j["trainer"] = result.train.trainer;
    j["ranks"] = ranks;
    j["backend"] = result.backend;
    j["last_dispatch_rows"] = result.last_dispatch_rows;
    if (!result.device_peaks.empty()) {
      j["device_peak_gib"] = to_gib(result.train.device_peak_bytes);
      nlohmann::json per_rank = nlohmann::json::array();
      for (const auto peak : result.device_peaks) per_rank.push_back(to_gib(peak));
      j["device_peaks_gib"] = per_rank;
    }
    if (!result.train.device_use_peak_bytes.empty()) j["device_use_peaks_gib"] = device_use_peaks_json(result.train.device_use_peak_bytes);
    io.out << j.dump() << "\n";
  } else {
    io.out << fmt::format("{} ranks ({}): {} steps, {:.0f} tokens/s\n", ranks, result.backend,
                          result.train.losses.size(), result.train.tokens_per_s);
    for (std::size_t k = 0; k < result.device_peaks.size(); ++k) {
      io.out << fmt::format("rank {} device peak: {:.3f} MiB\n", k,
                            static_cast<double>(result.device_peaks[k]) / static_cast<double>(kMiB));
    }
    if (!result.train.device_use_peak_bytes.empty()) io.out << device_use_peaks_line(result.train.device_use_peak_bytes) << "\n";
  }
}

void print_step(std::ostream& lines, const backend::StepReport& r) {
  lines << fmt::format("step {:>5}  loss {:.4f}  lr {:.3e}  tokens/s {:>9.0f}  {:.1f} s\n", r.step, r.loss, r.lr,
                       r.tokens_per_s, r.elapsed_s);
  lines.flush();
}

}  // namespace

bool run_train_ranks(const backend::TrainOptions& options, const TrainRanksOptions& o_in, bool json, Io io) {
  for (const RemovedOption& removed : kRemovedOptions) {
    if (o_in.cmd->count(removed.name) > 0) {
      throw InputError("", removed.name, o_in.removed.empty() ? "true" : o_in.removed, removed.message);
    }
  }
  TrainRanksOptions o = o_in;
  o.ranks.save_weights = options.save_weights;  // rank 0 writes the final weights
  // Started by torchrun (or any launcher that sets PyTorch's rank environment): this process is one
  // rank; rank 0 prints, the others stay quiet.
  if (const auto env = backend::dist::torchrun_env()) {
    if (o.cmd->count("--deadline") > 0) {
      throw InputError("", "--deadline", o.cmd->get_option("--deadline")->as<std::string>(),
                       "torchrun supervises the ranks; drop the option");
    }
    std::ostream& lines = json ? io.err : io.out;
    const auto result = backend::dist::train_torchrun_rank(options, o.ranks, *env,
                                                          [&](const backend::StepReport& r) { print_step(lines, r); });
    if (env->rank == 0) print_ranks_result(result, env->world_size, json, io);
    return true;
  }
  if (o.ranks.ranks <= 1) {
    for (const char* name : {"--rank-timeout", "--deadline"}) {
      if (o.cmd->count(name) > 0) {
        throw InputError("", name, o.cmd->get_option(name)->as<std::string>(), "needs --ranks ≥ 2");
      }
    }
    if (o.ranks.ranks < 1) throw InputError("", "--ranks", std::to_string(o.ranks.ranks), "must be ≥ 1");
    return false;
  }
  std::ostream& lines = json ? io.err : io.out;
  const auto result = backend::dist::train_ranks(options, o.ranks, [&](const backend::StepReport& r) { print_step(lines, r); });
  print_ranks_result(result, o.ranks.ranks, json, io);
  return true;
}

void add_rank_worker_command(CLI::App& app, Io io) {
  auto job = std::make_shared<std::string>();
  auto rank = std::make_shared<int>(-1);
  auto* cmd = app.add_subcommand("rank-worker", "One rank of `oom train --ranks P` (started by it)");
  cmd->group("");  // not listed in --help
  cmd->add_option("--job", *job, "Job file written by oom train --ranks")->required();
  cmd->add_option("--rank", *rank, "This process's rank")->required();
  cmd->callback([job, rank] { backend::dist::run_rank_worker(*job, *rank); });
}

}  // namespace oom::cli
