// The public face of the graph runner: its machinery is backend/runner/ (runner.h for the whole,
// handlers.cc for the table of stages' handlers, one file per mechanism).
#include "backend/runner/graph_runner.h"

#include <torch/torch.h>

#include "backend/model/recompute.h"
#include "backend/runner/runner.h"
#include "backend/runtime/device_memory.h"
#include "costmodel/hardware_spec.h"
#include "costmodel/workload.h"

namespace oom::backend {

StepGraph lower_for_run(const Plan& plan, const ModelSpec& model, std::int64_t batch, std::int64_t seq, int ranks,
                        const RoutingSpec& routing, int nodes) {
  WorkloadContext ctx;
  ctx.workload.model = model.name;
  ctx.workload.hardware = "h100-sxm-node";
  ctx.workload.gpus = ranks;
  ctx.workload.global_batch = batch;
  ctx.workload.seq_len = seq;
  ctx.workload.routing = routing;
  ctx.model = model;
  ctx.hardware = load_hardware_spec(ctx.workload.hardware);
  if (nodes > 1) {
    ctx.workload.nodes = nodes;
    ctx.workload.gpus_per_node = ranks / nodes;
    ctx.hardware = with_gpus_per_node(with_nodes(std::move(ctx.hardware), nodes, "", "nodes"), ranks / nodes, "", "gpus_per_node");
  }
  return lower(plan, ctx);
}

struct GraphRunner::Impl : runner::Runner {
  using Runner::Runner;
};

GraphRunner::GraphRunner(HostState& state, TrainerConfig config, Plan plan, at::Device device, RankGroup* group)
    : impl_(std::make_unique<Impl>(state, config, std::move(plan), device, group)) {}
GraphRunner::~GraphRunner() = default;
StepStats GraphRunner::run(const StepGraph& graph, const at::Tensor& tokens, const at::Tensor& targets) {
  const LeanKernels lean;  // stages run on this thread; recomputations in the backward need no scope
  return impl_->run(graph, tokens, targets);
}
void GraphRunner::set_lr(double lr) { impl_->cfg.adam.lr = lr; }
void GraphRunner::set_tracing(bool on) { impl_->tracing = on; }
const Trace& GraphRunner::last_trace() const { return impl_->trace; }
const std::vector<std::vector<std::int64_t>>& GraphRunner::last_dispatch() const { return impl_->dispatch_log; }
const RoutingSpec& GraphRunner::routing() const { return impl_->llep_routing; }
const RoutingSpec& GraphRunner::last_step_routing() const { return impl_->step_routing; }
void GraphRunner::set_routing(RoutingSpec routing) { impl_->llep_routing = std::move(routing); }
Bytes GraphRunner::last_device_peak() const {
  return impl_->tracing ? impl_->trace.gpu_peak_bytes.at(0) : device_memory::peak_bytes();
}
std::array<Bytes, kMemoryUses> GraphRunner::last_use_peaks() const { return device_memory::use_peak_bytes(); }
void GraphRunner::capture_gradients(std::vector<at::Tensor>* blocks) { impl_->captured = blocks; }
std::pair<int, std::int64_t> GraphRunner::host_gradient_buffers() const {
  std::pair<int, std::int64_t> out{0, 0};
  for (const auto& pool : impl_->grad_pool) {
    for (const auto& b : pool) {
      if (!b.defined()) continue;
      ++out.first;
      out.second += static_cast<std::int64_t>(b.nbytes());
    }
  }
  return out;
}

}  // namespace oom::backend
