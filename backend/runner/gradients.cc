// The gradient and optimizer pipeline (gradients.h).
#include "backend/runner/runner.h"

#include <algorithm>

#include <torch/torch.h>

#include "backend/runtime/device_memory.h"
#include "backend/runtime/host_copies.h"
#include "costmodel/input_error.h"

namespace oom::backend::runner {

// Adds Σ g² over the ranges of a gradient, on the device (a BlockGrad) or in one host tensor, to the
// step's sq_norm where the gradient is, without reading it back: each range's norm taken in
// sixteenths (the FP32 copy a reduction of a BF16 range takes is a sixteenth of the range's), so
// both reduce alike and neither copies a whole range to FP32; each norm squared in FP64.
at::Tensor Runner::range_of(const BlockGrad& grad, std::int64_t a, std::int64_t n) { return grad.range(a, n); }

at::Tensor Runner::range_of(const at::Tensor& grad, std::int64_t a, std::int64_t n) { return grad.narrow(0, a, n); }

template <typename Grad>
void Runner::add_sq_norm(const Grad& grad, const Ranges& ranges) {
  std::vector<at::Tensor> norms;
  for (const auto& [a, n] : ranges) {
    const std::int64_t piece = std::max<std::int64_t>(1, (n + 15) / 16);
    const at::Tensor r = range_of(grad, a, n);
    for (std::int64_t i = 0; i < n; i += piece) {
      norms.push_back(at::linalg_vector_norm(r.narrow(0, i, std::min(piece, n - i)), 2, at::OptionalIntArrayRef{}, false, at::kFloat));
    }
  }
  if (norms.empty()) return;
  const at::Tensor sum = at::stack(norms).to(at::kDouble).square().sum();
  sq_norm = sq_norm.defined() ? sq_norm + sum : sum;  // a host sum (0-dim) adds to a device one as a scalar
}

// The host buffer of gradient `index` of a kind, in block coordinates (at least `numel` long).
at::Tensor Runner::grad_buffer(int kind, int index, std::int64_t numel, const at::TensorOptions& options) {
  const auto fresh = [&] {
    device_memory::OnHost on_host;
    return at::empty({numel}, options.device(at::kCPU).pinned_memory(st.pinned()));
  };
  if (cfg.max_grad_norm > 0) return fresh();
  auto& pool = grad_pool[static_cast<std::size_t>(kind)];
  pool.resize(static_cast<std::size_t>(std::max(1, plan.cpu_grad_slots)));
  at::Tensor& buf = pool[static_cast<std::size_t>(index) % pool.size()];
  if (!buf.defined() || buf.numel() < numel || buf.scalar_type() != options.dtype().toScalarType()) buf = fresh();
  return buf;
}

// capture_gradients(): the ranges of block b's gradient this rank sends or updates, copied.
template <typename Grad>
void Runner::capture(int b, const Ranges& ranges, const Grad& grad) {
  if (captured == nullptr) return;
  captured->resize(static_cast<std::size_t>(st.blocks()));
  at::Tensor& c = (*captured)[static_cast<std::size_t>(b)];
  device_memory::OnHost on_host;
  if (!c.defined()) c = at::zeros({st.layout().blocks[static_cast<std::size_t>(b)].numel}, at::kFloat);
  for (const auto& [a, n] : ranges) c.narrow(0, a, n).copy_(range_of(grad, a, n));
}

// A parameter group's gradient (or one bucket of it) into a host buffer (a whole decoder's adopted
// as is on a CPU device).
void Runner::send_gradient(StagePart part, int layer, int bucket, const BlockGrad& grad) {
  const int b = block_of(part, layer);
  const Ranges ranges = bucket_ranges(part, layer, bucket);
  const GradKey key{part, layer, bucket};
  if (cfg.max_grad_norm > 0) add_sq_norm(grad, ranges);
  capture(b, ranges, grad);
  const int kind = part == StagePart::kExperts ? 1 : 0;
  const int index = grads_sent[static_cast<std::size_t>(kind)]++;
  const at::Tensor& first = grad.parts.front().second;
  // A decoder's whole gradient (the Local path: one part, the block).
  const bool whole_block = part == StagePart::kLayer && grad.parts.size() == 1 && grad.parts.front().first == 0 &&
                           first.numel() == grad.numel;
  if (whole_block && first.device().is_cpu() && !device_memory::emulated()) {
    host_grad[key] = first;
    ready[key] = [] {};
    return;
  }
  at::Tensor buf = grad_buffer(kind, index, grad.numel, first.options());
  host_grad[key] = buf;
  if (whole_block && bucket < 0) {
    at::Tensor whole = buf.narrow(0, 0, grad.numel);
    ready[key] = gradient_to_host(whole, first);
    return;
  }
  std::vector<std::function<void()>> waits;
  for (const auto& [a, n] : ranges) {
    if (n == 0) continue;
    const auto& [base, t] = grad.part_of(a, n);
    waits.push_back(range_to_host(buf, a, n, t, base));
  }
  ready[key] = [waits] {
    for (const auto& w : waits) w();
  };
}

// Decoder l's weight gradient so far (a retained MoE's forward graphs add into it too): the parts
// a stage sends are complete when the graph sends them.
const BlockGrad& Runner::layer_grad(int l) { return passes.at(backward_pass.at(l)).grad; }

// EP: decoder l's experts' gradient has left (D2H or the device update): its parts go, with the
// leaves' views of them.
void Runner::release_expert_gradient(int l) {
  Pass& p = passes.at(backward_pass.at(l));
  const auto [e0, n] = whole_ranges(StagePart::kExperts, l).front();
  p.grad.release(e0, e0 + n);
  detach_gradient(p.w, e0, e0 + n);
  if (const auto kept = retained_weights.find(l); kept != retained_weights.end()) detach_gradient(kept->second, e0, e0 + n);
}

// The host gradients a CPU update reads, with the ranges each covers; taken from host_grad (the
// update owns them until it is done). A decoder's EP update reads its common part and, when
// streamed, its own experts, which were sent apart (a dense decoder has none to send); a
// bucket's update reads that bucket.
std::vector<std::pair<Ranges, at::Tensor>> Runner::take_host_gradients(StagePart part, int layer, int bucket) {
  std::vector<std::pair<Ranges, at::Tensor>> out;
  const auto take = [&](StagePart from) {
    const auto it = host_grad.find({from, layer, bucket});
    OOM_ASSERT(it != host_grad.end(), "a CPU update before its gradient's D2H");
    out.push_back({bucket_ranges(from, layer, bucket), it->second});
    host_grad.erase(it);
  };
  if (part == StagePart::kLayer && ep() && bucket < 0) {
    take(StagePart::kCommon);
    if (!plan.is_resident(layer) && spec.moe_layer(layer)) take(StagePart::kExperts);
  } else {
    take(part);
  }
  return out;
}

void Runner::update_ranges(int b, const Ranges& ranges, const at::Tensor& grad) {
  for (const auto& [a, n] : ranges) {
    auto p = st.master(b).narrow(0, a, n);
    auto m = st.exp_avg(b).narrow(0, a, n);
    auto v = st.exp_avg_sq(b).narrow(0, a, n);
    cpu_adamw_step(p, grad.narrow(0, a, n), m, v, cfg.adam, st.step + 1, coef, cfg.adam_threads);
  }
}

void Runner::publish_ranges(int b, const Ranges& ranges) {
  for (const auto& [a, n] : ranges) st.working(b).narrow(0, a, n).copy_(st.master(b).narrow(0, a, n));
}

// The wait for a gradient's copy, taken by the first stage that consumes it (the host
// accumulation, else the update); empty when already taken.
std::function<void()> Runner::take_ready(StagePart part, int layer, int bucket) {
  const auto it = ready.find({part, layer, bucket});
  if (it == ready.end()) return {};
  auto fn = std::move(it->second);
  ready.erase(it);
  return fn;
}

// The worker's part of a stage: timed under its key on its resource.
std::function<void()> Runner::worker_job(const Stage& s, const Handler& h) {
  const StageKey key = s.key;
  const std::string kind(op_kind_name(s.op)), resource = graph->resource(s.resource).name;
  std::vector<std::function<void()>> waits;
  if (h.flags & kWaitsGradCopy) {
    // A decoder's update reads the gradients of its parts (the EP path sends experts and common apart).
    for (const StagePart part : {key.part, StagePart::kExperts, StagePart::kCommon}) {
      if (part == key.part || key.part == StagePart::kLayer) {
        if (auto w = take_ready(part, key.decoder, key.bucket)) waits.push_back(std::move(w));
      }
    }
  }
  auto work = h.job(*this, s);
  return [this, key, kind, resource, work = std::move(work), waits = std::move(waits)] {
    for (const auto& w : waits) w();
    auto scope = rec.stage(key, kind, resource);
    work();
  };
}

// The worker stages' work (Handler::job).
std::function<void()> Runner::host_accumulate_job() {
  return [] {};  // one rank: its partial is the sum; the D2H into the host buffer is the accumulation
}

std::function<void()> Runner::cpu_adamw_job(const Stage& s) {
  const int b = block_of(s.key.part, s.key.decoder);
  auto grads = take_host_gradients(s.key.part, s.key.decoder, s.key.bucket);
  return [this, b, grads = std::move(grads)] {
    for (const auto& [r, g] : grads) update_ranges(b, r, g);
  };
}

std::function<void()> Runner::publish_job(const Stage& s) {
  const int b = block_of(s.key.part, s.key.decoder);
  const Ranges ranges = bucket_ranges(s.key.part, s.key.decoder, s.key.bucket);
  return [this, b, ranges] { publish_ranges(b, ranges); };
}

// A decoder's gradient, or its experts' or common part's.
void Runner::layer_grad_d2h(const Stage& s) {
  const auto summed = reduced.find({s.key.part, s.layer});
  send_gradient(s.key.part, s.layer, s.key.bucket, summed != reduced.end() ? summed->second : layer_grad(s.layer));
}

// Every rank's gradient of the group summed (an all-reduce: each rank then sends and updates its
// 1/P, as a reduce-scatter would leave it).
void Runner::reduce_scatter(const Stage& s) {
  const bool outer_part = s.layer < 0;
  for (const auto& [a, n] : whole_ranges(s.key.part, s.layer)) {
    auto v = outer_part ? outer_grad_range(a, n) : layer_grad(s.layer).range(a, n);
    group->all_reduce_sum(v);
  }
  if (!outer_part) reduced[{s.key.part, s.layer}] = layer_grad(s.layer);
}

// EP groups: the shard's gradient summed over its replicas (an all-reduce: each replica then sends or
// updates its slice, as a reduce-scatter would leave it).
void Runner::expert_reduce_scatter(const Stage& s) {
  OOM_ASSERT(replica_group != nullptr, "an expert reduce-scatter without EP-group replicas");
  for (const auto& [a, n] : owned_experts(s.layer)) {
    auto v = layer_grad(s.layer).range(a, n);
    replica_group->all_reduce_sum(v);
  }
  reduced[{StagePart::kExperts, s.layer}] = layer_grad(s.layer);
}

// A resident expert bank's update where its gradient is (the compute device), with its working
// copy refreshed.
void Runner::gpu_adamw(const Stage& s) {
  const int b = 1 + s.layer;
  const Ranges ranges = group_ranges(StagePart::kExperts, s.layer);
  at::Tensor grad;
  {
    // The ranges in block coordinates on the host (on a CPU device, the parts themselves).
    const BlockGrad& g = layer_grad(s.layer);
    device_memory::OnHost on_host;
    grad = at::empty({g.numel}, g.parts.front().second.options().device(at::kCPU));
    for (const auto& [a, n] : ranges) grad.narrow(0, a, n).copy_(g.range(a, n));
  }
  capture(b, ranges, grad);
  auto update = [this, b, ranges, grad] {
    update_ranges(b, ranges, grad);
    publish_ranges(b, ranges);
  };
  if (cfg.max_grad_norm > 0) {
    add_sq_norm(grad, ranges);
    deferred_device.push_back(std::move(update));
  } else {
    update();
  }
}

}  // namespace oom::backend::runner
