// The step: its checks and per-step setup, the dispatch of each stage to its handler on the driving
// thread or the worker, the bookkeeping that ends passes and releases gradients, the step's result.
#include "backend/runner/runner.h"

#include <algorithm>
#include <cmath>
#include <map>

#include <fmt/format.h>
#include <torch/torch.h>

#include "backend/runtime/device_memory.h"
#include "costmodel/input_error.h"

#ifdef OOM_BACKEND_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace oom::backend::runner {

namespace {

StageRecorder::Callbacks recorder_callbacks(const at::Device& device) {
  StageRecorder::Callbacks cb;
#ifdef OOM_BACKEND_CUDA
  if (device.is_cuda()) {
    cb.sync = [] { c10::cuda::device_synchronize(); };
    const int index = device.index();
    cb.device_bytes = [index] {
      const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(index);
      return static_cast<Bytes>(stats.allocated_bytes[0].current);
    };
    cb.device_peak = [index] {
      const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(index);
      return static_cast<Bytes>(stats.allocated_bytes[0].peak);
    };
    cb.device_mark = [index] { c10::cuda::CUDACachingAllocator::resetPeakStats(index); };
  }
#endif
  if (!device.is_cuda() && device_memory::emulated()) {
    // A CPU standing in for a GPU: the bytes its device-side allocations hold (backend/runtime/device_memory.h).
    cb.device_bytes = [] { return device_memory::current_bytes(); };
    cb.device_peak = [] { return device_memory::peak_bytes(); };
    cb.device_mark = [] { device_memory::reset_peak(); };
  }
  return cb;
}

}  // namespace

Runner::Runner(HostState& s, TrainerConfig c, Plan p, at::Device d, RankGroup* g)
    : st(s), cfg(c), plan(std::move(p)), dev(d), window(s, d, plan.transfer_chunk_mib * kMiB), rec(recorder_callbacks(d)),
      spec(s.spec()), group(g), R(g ? g->rank() : 0), P(g ? g->size() : 1) {
  ep_group = group;
  if (g != nullptr) {
    ep_size = plan.ep_group(P);  // all P ranks but for EP groups (the Local path: all of them)
    replicas = P / ep_size;
    ep_rank = R % ep_size;
    replica = R / ep_size;
  }
  if (replicas > 1) {
    // Every rank makes the sub-groups in one order: the EP groups, then the replica sets.
    std::vector<int> members;
    for (int k = 0; k < ep_size; ++k) members.push_back(replica * ep_size + k);
    ep_sub = g->sub_group(members, fmt::format("ep-group-{}-of-{}", replica, replicas));
    members.clear();
    for (int k = 0; k < replicas; ++k) members.push_back(k * ep_size + ep_rank);
    replica_sub = g->sub_group(members, fmt::format("ep-replicas-{}-of-{}", ep_rank, ep_size));
    ep_group = ep_sub.get();
    replica_group = replica_sub.get();
  }
  experts_local = spec.moe.experts / ep_size;
  expert0 = ep_rank * experts_local;
}

void Runner::run_stage(StageId id, const Handler& h) {
  const Stage& s = graph->stage(id);
  if (h.on_worker()) {
    auto job = worker_job(s, h);
    if (cfg.max_grad_norm > 0) {
      deferred.push_back(std::move(job));
    } else {
      jobs[id] = worker.submit(std::move(job));
    }
    return;
  }
  for (const StageId d : s.deps) {
    const auto j = jobs.find(d);
    if (j != jobs.end()) worker.wait_done(j->second);
  }
  // The driving thread runs the GPU resources' stages: what they allocate is the device's
  // (host buffers they fill say so where they are allocated).
  device_memory::OnDevice on_device;
  device_memory::Tagged use(h.use);
  if (h.join()) {
    // A join: recorded as the instant its dependencies are done.
    rec.stage(s.key, std::string(op_kind_name(s.op)), graph->resource(s.resource).name);
    return;
  }
  auto scope = rec.stage(s.key, std::string(op_kind_name(s.op)), graph->resource(s.resource).name);
  bool grad_mode = (h.flags & kBuildsGraph) != 0;
  if (in_pass(s)) {
    const Pass& p = pass_of(s);
    grad_mode = s.key.part != StagePart::kLlep &&
                (p.kind == PassKind::kBackward || (s.key.part == StagePart::kMoe && moe_graph(p)));
  }
  at::AutoGradMode mode(grad_mode);
  h.run(*this, s);
  if (h.flags & kOpensPass) return;  // the pass has not started
  if (in_pass(s) && last_use[static_cast<std::size_t>(open_pass.at(s.layer))] == id) end_pass(open_pass.at(s.layer));
  for (const bool head : {false, true}) {
    if (last_outer_use[head ? 1 : 0] == id) outer_grad(head) = at::Tensor();  // its D2H has it
  }
  if (ep() && reads_expert_gradient(s, h) && last_expert_use[static_cast<std::size_t>(backward_pass.at(s.layer))] == id) {
    release_expert_gradient(s.layer);
  }
  if (reads_layer_gradient(s, h)) {
    const StageId pid = backward_pass.at(s.layer);
    if (last_grad_use[static_cast<std::size_t>(pid)] == id) {
      passes.erase(pid);
      backward_pass.erase(s.layer);
      retained_weights.erase(s.layer);
      reduced.erase({StagePart::kCommon, s.layer});
      reduced.erase({StagePart::kExperts, s.layer});
    }
  }
}

// The NUMA node whose memory this rank's host work uses: the node of its CPU-update resource.
std::string Runner::host_timeline_name(const StepGraph& g) const {
  for (const Stage& s : g.stages) {
    if (s.key.rank != R || s.op != OpKind::kCpuAdamW) continue;
    const std::string& name = g.resource(s.resource).name;
    return name.substr(0, name.find('.'));
  }
  return "numa0";
}

StepStats Runner::run(const StepGraph& g, const at::Tensor& tokens, const at::Tensor& targets) {
  if (cfg.accumulate != 1) {
    throw InputError("", "--accumulate", std::to_string(cfg.accumulate),
                     "the plan runtime runs one micro-batch per step (a plan splits a step with split.sub_batch_seqs)");
  }
  OOM_ASSERT(g.gpus == P, "the graph was lowered for another rank count");
  // Context parallelism: fewer sequences than ranks, each over cp_ranks of them (context.cc).
  cp_ranks = ep() ? std::max(1, plan.context_parallel()) : 1;
  OOM_ASSERT(cp_ranks > 1 ? tokens.size(0) * cp_ranks == P : tokens.size(0) % P == 0, "the batch splits over the ranks");
  worker.wait_all();  // a step that threw may have left updates queued
  clear_step();
  graph = &g;
  dispatch_log.clear();
  if (llep()) place_fetched_experts(g);
  routed_pairs.assign(static_cast<std::size_t>(spec.layers), std::vector<double>(static_cast<std::size_t>(spec.moe.experts), 0.0));
  // Rank R trains its share of the global batch's sequences.
  B = cp_ranks > 1 ? 1 : tokens.size(0) / P, S = tokens.size(1) / cp_ranks;
  sb = plan.split.sub_batch_seqs > 0 ? std::min(plan.split.sub_batch_seqs, B) : B;
  // Each pass ends at the last stage that belongs to it.
  std::vector<const Handler*> handlers(g.stages.size(), nullptr);
  last_use.assign(g.stages.size(), -1);
  last_grad_use.assign(g.stages.size(), -1);
  last_outer_use = {-1, -1};
  last_expert_use.assign(g.stages.size(), -1);
  {
    std::map<int, StageId> latest;
    for (const Stage& s : g.stages) {
      if (s.key.rank != R) continue;
      const Handler& h = handler_of(s);  // before any work: a graph the runner cannot run changes nothing
      handlers[static_cast<std::size_t>(s.id)] = &h;
      if (s.key.op == StageOp::kGradD2h && s.key.bucket >= 0) {
        int& n = buckets[{s.key.part, s.key.decoder}];
        n = std::max(n, s.key.bucket + 1);
      }
      if (h.flags & kOpensPass) latest[s.layer] = s.id;
      if (in_pass(s)) last_use[static_cast<std::size_t>(latest.at(s.layer))] = s.id;
      if (reads_layer_gradient(s, h)) last_grad_use[static_cast<std::size_t>(latest.at(s.layer))] = s.id;
      if (reads_expert_gradient(s, h)) last_expert_use[static_cast<std::size_t>(latest.at(s.layer))] = s.id;
      if (s.layer < 0 && (h.flags & kReadsOuterGrad)) {
        last_outer_use[s.key.part == StagePart::kLmHead ? 1 : 0] = s.id;
      }
    }
  }
  if (tracing && dist()) rec.set_names(fmt::format("gpu{}", R), host_timeline_name(g));
  device_memory::reset_peak();
  device_memory::reset_use_peaks();
#ifdef OOM_BACKEND_CUDA
  if (dev.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(dev.index());
#endif
  rec.start_step(tracing);
  if (cp_ranks > 1) {
    take_piece(tokens, targets);
  } else {
    tok = device_memory::to_device(tokens.narrow(0, R * B, B), dev);
    tgt = device_memory::to_device(targets.narrow(0, R * B, B), dev);
  }
  sq_norm = at::Tensor();
  coef = 1.0;
  next_backward = spec.layers - 1;
  for (const StageId id : issue_order(g, handlers)) run_stage(id, *handlers[static_cast<std::size_t>(id)]);
  StepStats stats;
  // Over ranks: the global mean loss, and the norm of every rank's sent slices and own experts,
  // each summed on the device and read once (the step's two host synchronisations).
  const auto over_ranks = [&](const at::Tensor& v) {
    at::Tensor t = v.reshape({1});
    t = t.device() == dev ? t.clone() : t.to(dev);  // on the group's device
    if (dist()) group->all_reduce_sum(t);
    return t;
  };
  at::Tensor step_loss, step_sq_norm;
  {
    device_memory::OnDevice on_device;  // the device's tensors (a CPU standing in for one tells them apart)
    step_loss = over_ranks(loss.detach().to(at::kDouble) / P);
    if (balance_on()) step_loss = step_loss + (load_balance_grad(), balance_loss);  // the same on every rank
    if (cfg.max_grad_norm > 0) {
      step_sq_norm = over_ranks(sq_norm.defined() ? sq_norm.to(at::kDouble) : at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(dev)));
    }
  }
  stats.loss = step_loss.item<double>();
  if (cfg.max_grad_norm > 0) {
    stats.grad_norm = std::sqrt(step_sq_norm.item<double>());
    coef = clip_coefficient(stats.grad_norm, cfg.max_grad_norm);
    for (auto& update : deferred_device) update();
    for (auto& job : deferred) worker.submit(std::move(job));
  }
  worker.wait_all();
  OOM_ASSERT(passes.empty() && ready.empty() && host_grad.empty(), "every pass ended and every gradient was updated");
  if (dist() && ep()) {
    if (replica_group != nullptr) {
      // Each EP group counted its own tokens: the step's histogram sums the groups' (one
      // all-reduce and one copy back for every layer).
      std::vector<double> flat;
      for (const auto& layer : routed_pairs) flat.insert(flat.end(), layer.begin(), layer.end());
      auto t = at::tensor(flat, at::TensorOptions().dtype(at::kDouble)).to(dev);
      replica_group->all_reduce_sum(t);
      const at::Tensor h = t.cpu().contiguous();
      const double* summed = h.data_ptr<double>();
      for (auto& layer : routed_pairs) {
        std::copy(summed, summed + layer.size(), layer.begin());
        summed += layer.size();
      }
    }
    step_routing = RoutingSpec{};
    step_routing.kind = RoutingKind::kHistogram;
    step_routing.counts = routed_pairs;
    for (auto& layer : step_routing.counts) {
      if (std::all_of(layer.begin(), layer.end(), [](double n) { return n == 0; })) std::fill(layer.begin(), layer.end(), 1.0);
    }
    if (llep()) llep_routing = step_routing;  // the next step's placement follows this step's routing
  }
  // Every rank's updates of the shared host state are done before any rank's next step reads it.
  if (dist()) group->barrier();
  ++st.step;
  clear_step();
  if (tracing) trace = rec.finish();
  return stats;
}

void Runner::clear_step() {
  deferred.clear();
  deferred_device.clear();
  retained_moe.clear();
  balance_stats = balance_grad = at::Tensor();
  balance_loss = at::Tensor();
  ring = Ring{};
  retained_weights.clear();
  reduced.clear();
  host_grad.clear();
  buckets.clear();
  grads_sent = {0, 0};
  jobs.clear();
  ready.clear();
  act.clear();
  origin.clear();
  host.clear();
  olse.clear();
  dgrad.clear();
  passes.clear();
  open_pass.clear();
  backward_pass.clear();
  tok = tgt = outer_flat = head_grad = embed_grad = hL = loss = positions = pieces_order = sequence_order = at::Tensor();
  outer = BlockWeights();
  graph = nullptr;
}

}  // namespace oom::backend::runner
