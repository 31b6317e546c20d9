#include "backend/train/plan_runtime.h"

#include <algorithm>
#include <optional>

#include <fmt/format.h>

#include "backend/runner/graph_runner.h"
#include "costmodel/hardware_spec.h"
#include "costmodel/input_error.h"
#include "costmodel/workload.h"
#include "planner/lowering/step_graph.h"
#include "planner/search/plan_presets.h"

namespace oom::backend {

void check_plan_shape(const Plan& plan, const ModelSpec& model, std::int64_t batch, std::int64_t seq, int ranks,
                      const std::string& file) {
  if (ranks < 1) throw InputError(file, "ranks", std::to_string(ranks), "must be ≥ 1");
  // Fewer sequences than ranks: each sequence over ranks / batch of them (context parallelism).
  if (batch < 1 || (batch % ranks != 0 && ranks % batch != 0)) {
    throw InputError(file, "batch", std::to_string(batch),
                     fmt::format("must be a positive multiple or divisor of the {} ranks (a divisor splits each sequence)", ranks));
  }
  Workload w;
  w.model = model.name;
  w.gpus = ranks;
  w.global_batch = batch;
  w.seq_len = seq;
  validate_plan(plan, model, w, file);
}

void check_plan_for_run(const Plan& plan, const ModelSpec& model, std::int64_t batch, std::int64_t seq, int ranks,
                        const std::string& file) {
  check_plan_shape(plan, model, batch, seq, ranks, file);
  if (const int C = plan.context_parallel(); C > 1) {
    // Zig-zag pieces: 2C equal chunks; a GDN chunk holds its successor's conv context.
    const bool gdn = std::find(model.layer_kinds.begin(), model.layer_kinds.end(), LayerKind::kLinearAttention) != model.layer_kinds.end();
    const std::int64_t chunk = seq / (2 * C), context = gdn ? model.gdn.conv_kernel - 1 : 0;
    if (seq % (2 * C) != 0 || chunk < std::max<std::int64_t>(1, context)) {
      throw InputError(file, "context_parallel_gpus", std::to_string(C),
                       fmt::format("the sequence of {} tokens must split into {} equal chunks (zig-zag pieces) of at least {} tokens", seq,
                                   2 * C, std::max<std::int64_t>(1, context)));
    }
  }
  if (plan.flat.ring_dtp(ranks) && model.tied_embeddings) {
    throw InputError(file, "flat.vocab_projection", "\"ring_dtp\"",
                     "the backend's Ring-DTP shards an LM head of its own; " + model.name + " ties it to the embedding");
  }
  if (plan.ep_replicas(ranks) > 1 && plan.flat.expert_dispatch == ExpertDispatch::kPipelinedLlep) {
    throw InputError(file, "flat.expert_dispatch", "\"pipelined_llep\"",
                     fmt::format("this runtime places PipelinedLLEP's helpers over one EP group of all {} ranks, not in groups of {}",
                                 ranks, plan.ep_group(ranks)));
  }
  if (ranks != 1 && plan.path != ExpertPath::kEp) {
    throw InputError(file, "path", "\"local\"", fmt::format("this runtime executes the local path on 1 rank, not {}", ranks));
  }
  // On its one rank, shard delivery (1/P of the bank, then an all-gather of the rest) is the whole
  // bank copied: param_transfer "shard" and "full" run alike. transfer_chunk_mib sizes the
  // window's copies (ParamWindow), cpu_grad_slots the gradient slots the updates wait on.
  const std::int64_t gdn = plan.split.gdn_chunk_tokens;
  if (gdn > 0 && gdn < seq && seq % gdn != 0) {
    throw InputError(file, "split.gdn_chunk_tokens", std::to_string(gdn),
                     fmt::format("must divide the sequence length {}", seq));
  }
  const std::int64_t sub = plan.split.sub_batch_seqs > 0 ? std::min(plan.split.sub_batch_seqs, batch / ranks) : batch / ranks;
  if (plan.split.moe_chunk_tokens > sub * seq) {
    throw InputError(file, "split.moe_chunk_tokens", std::to_string(plan.split.moe_chunk_tokens),
                     fmt::format("exceeds the {} tokens of a sub-batch", sub * seq));
  }
}

Plan default_run_plan(const ModelSpec& model, std::int64_t batch, std::int64_t seq, int ranks, const std::string& hardware) {
  WorkloadContext ctx;
  ctx.model = model;
  ctx.hardware = load_hardware_spec(hardware);
  ctx.workload.model = model.name;
  ctx.workload.hardware = hardware;
  ctx.workload.gpus = ranks;
  ctx.workload.global_batch = batch;
  ctx.workload.seq_len = seq;
  const ExpertPath path = ranks > 1 ? ExpertPath::kEp : ExpertPath::kLocal;
  // One EP group of all ranks (the runner's): the experts must split over every rank.
  const std::optional<Plan> plan =
      ranks > 1 && model.moe.experts % ranks != 0 ? std::nullopt : preset_plan("base", path, ctx);
  if (!plan) {
    throw InputError("", "--ranks", std::to_string(ranks),
                     fmt::format("the Base EP plan shards the {} experts over the ranks: they must split evenly", model.moe.experts));
  }
  check_plan_for_run(*plan, model, batch, seq, ranks, "the default plan (Base " + std::string(path_name(path)) + ")");
  return *plan;
}

struct PlanTrainer::Impl {
  const ModelSpec& spec;
  Plan plan;
  int ranks = 1;
  int nodes = 1;
  GraphRunner runner;
  std::pair<std::int64_t, std::int64_t> shape{-1, -1};
  RoutingSpec routing;  // PipelinedLLEP's placement of fetched experts (GraphRunner::routing())
  StepGraph graph;      // lowered for `shape` and `routing`

  Impl(HostState& s, TrainerConfig c, Plan p, at::Device d, RankGroup* g, int n)
      : spec(s.spec()), plan(p), ranks(g ? g->size() : 1), nodes(n), runner(s, c, std::move(p), d, g) {}

  StepStats step(const at::Tensor& tokens, const at::Tensor& targets) {
    if (tokens.dim() != 2 || !targets.sizes().equals(tokens.sizes())) {
      throw InputError("", "tokens", std::to_string(tokens.dim()) + " dimensions", "expected [batch, seq] tokens and targets of one shape");
    }
    const std::pair<std::int64_t, std::int64_t> now{tokens.size(0), tokens.size(1)};
    if (now != shape) check_plan_for_run(plan, spec, now.first, now.second, ranks, "plan");
    if (now != shape || runner.routing() != routing) {
      routing = runner.routing();
      graph = lower_for_run(plan, spec, now.first, now.second, ranks, routing, nodes);
      shape = now;
    }
    return runner.run(graph, tokens, targets);
  }
};

PlanTrainer::PlanTrainer(HostState& state, TrainerConfig config, Plan plan, at::Device device, RankGroup* group, int nodes)
    : impl_(std::make_unique<Impl>(state, config, std::move(plan), device, group, nodes)) {}
PlanTrainer::~PlanTrainer() = default;
StepStats PlanTrainer::step(const at::Tensor& tokens, const at::Tensor& targets) { return impl_->step(tokens, targets); }
void PlanTrainer::set_lr(double lr) { impl_->runner.set_lr(lr); }
void PlanTrainer::set_tracing(bool on) { impl_->runner.set_tracing(on); }
const Trace& PlanTrainer::last_trace() const { return impl_->runner.last_trace(); }
const std::vector<std::vector<std::int64_t>>& PlanTrainer::last_dispatch() const { return impl_->runner.last_dispatch(); }
Bytes PlanTrainer::last_device_peak() const { return impl_->runner.last_device_peak(); }
std::array<Bytes, kMemoryUses> PlanTrainer::last_use_peaks() const { return impl_->runner.last_use_peaks(); }
const RoutingSpec& PlanTrainer::routing() const { return impl_->runner.routing(); }
const RoutingSpec& PlanTrainer::last_step_routing() const { return impl_->runner.last_step_routing(); }
void PlanTrainer::set_routing(RoutingSpec routing) { impl_->runner.set_routing(std::move(routing)); }
std::pair<int, std::int64_t> PlanTrainer::host_gradient_buffers() const { return impl_->runner.host_gradient_buffers(); }
void PlanTrainer::capture_gradients(std::vector<at::Tensor>* blocks) { impl_->runner.capture_gradients(blocks); }

}  // namespace oom::backend
