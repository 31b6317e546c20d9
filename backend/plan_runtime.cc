#include "backend/plan_runtime.h"

#include <cmath>
#include <functional>
#include <map>

#include <fmt/format.h>
#include <torch/torch.h>

#include "backend/job_queue.h"
#include "backend/plan_ops.h"
#include "backend/stage_recorder.h"
#include "costmodel/input_error.h"
#include "planner/lowering/step_graph.h"

#ifdef OOM_BACKEND_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace oom::backend {

void check_plan_shape(const Plan& plan, const ModelSpec& model, std::int64_t batch, std::int64_t seq, int ranks,
                      const std::string& file) {
  if (ranks < 1) throw InputError(file, "ranks", std::to_string(ranks), "must be ≥ 1");
  if (batch < 1 || batch % ranks != 0) {
    throw InputError(file, "batch", std::to_string(batch), fmt::format("must be a positive multiple of the {} ranks", ranks));
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
  if (model.router_aux_loss_coef > 0) {
    throw InputError(model.name, "router_aux_loss_coef", fmt::format("{}", model.router_aux_loss_coef),
                     "the plan runtime trains without the load-balancing loss (the streamed trainer adds it)");
  }
  refuse_flat_not_executed(plan, file);
  if (plan.path == ExpertPath::kEp) {
    throw InputError(file, "path", "\"ep\"",
                     fmt::format("the EP path runs over rank processes (oom train --ranks P); this run has {} rank", ranks));
  }
  if (ranks != 1) {
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

namespace {

constexpr const char* kCompute = "gpu0.compute";
constexpr const char* kH2d = "gpu0.h2d";
constexpr const char* kD2h = "gpu0.d2h";
constexpr const char* kCpu = "numa0.cpu_update.r0";
constexpr const char* kPrep = "numa0.host_prep.r0";

// Brings a device gradient into the host slot; returns a function that waits for the copy.
std::function<void()> gradient_to_host(at::Tensor& slot, const at::Tensor& grad) {
  if (grad.device().is_cpu()) {
    slot = grad;  // already in host memory: adopt it
    return [] {};
  }
#ifdef OOM_BACKEND_CUDA
  slot.copy_(grad, /*non_blocking=*/true);
  auto done = std::make_shared<at::cuda::CUDAEvent>();
  done->record(c10::cuda::getCurrentCUDAStream(grad.device().index()));
  return [done] { done->synchronize(); };
#else
  OOM_ASSERT(false, "CUDA gradient in a build without CUDA");
#endif
}

at::Tensor to_host(const at::Tensor& x, bool pinned) {
  if (x.device().is_cpu()) return x;  // fresh tensors, never modified in place
  auto h = at::empty(x.sizes(), x.options().device(at::kCPU).pinned_memory(pinned));
  h.copy_(x, /*non_blocking=*/true);
  return h;
}

// autograd backward over the (output, gradient) pairs whose gradient is defined.
void backward_defined(const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& grads) {
  std::vector<at::Tensor> o, g;
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    if (outputs[i].defined() && grads[i].defined() && outputs[i].requires_grad()) {
      o.push_back(outputs[i]);
      g.push_back(grads[i]);
    }
  }
  if (!o.empty()) torch::autograd::backward(o, g);
}

at::Tensor leaf(const at::Tensor& t) { return t.defined() ? t.detach().requires_grad_(true) : t; }
at::Tensor grad_of(const at::Tensor& t) { return t.defined() ? t.grad() : t; }

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
  }
#else
  (void)device;
#endif
  return cb;
}

struct OLse {
  at::Tensor out, lse;  // [b, H, S, d], [b, H, S] FP32 on the host
};

}  // namespace

struct PlanTrainer::Impl {
  HostState& st;
  TrainerConfig cfg;
  Plan plan;
  at::Device dev;
  ParamWindow window;
  StageRecorder rec;
  JobQueue worker;
  Trace trace;
  bool tracing = false;
  const ModelSpec& spec;
  std::pair<std::int64_t, std::int64_t> checked_shape{-1, -1};

  // Per step.
  at::Tensor tok;
  BlockWeights outer;
  std::int64_t sb = 1;                          // sequences per sub-batch
  int sub_batch = -1;                           // the sub-batch being run (−1: the whole batch), for stage keys
  std::map<int, std::vector<OLse>> olse;        // layer → per sub-batch
  std::map<int, at::Tensor> held;               // boundaries on the device (held or regenerated)
  std::map<int, at::Tensor> host;               // boundaries kept on the host
  std::vector<int> update_jobs;                 // worker job index per host gradient sent

  Impl(HostState& s, TrainerConfig c, Plan p, at::Device d)
      : st(s), cfg(c), plan(std::move(p)), dev(d), window(s, d, plan.transfer_chunk_mib * kMiB), rec(recorder_callbacks(d)), spec(s.spec()) {}

  bool attention(int l) const { return spec.layer_kinds[static_cast<std::size_t>(l)] != LayerKind::kLinearAttention; }
  // A recorded stage of rank 0 keyed as the lowering keys it, in the sub-batch being run.
  StageRecorder::Scope stage(Phase phase, int l, const StageWhat& what, const char* kind,
                             const char* resource = kCompute) {
    StageKey k = what.key(0, phase, l);
    k.sub_batch = sub_batch;
    return rec.stage(k, kind, resource);
  }
  std::vector<std::pair<std::int64_t, std::int64_t>> ranges(std::int64_t total, std::int64_t chunk) const {
    if (chunk <= 0 || chunk >= total) return {{0, total}};
    std::vector<std::pair<std::int64_t, std::int64_t>> r;
    for (std::int64_t a = 0; a < total; a += chunk) r.push_back({a, std::min(chunk, total - a)});
    return r;
  }

  // ---- attention ----
  at::Tensor attention_forward(int l, Phase phase, const BlockWeights& w, const at::Tensor& x, int sub,
                               bool original) {
    const LayerKind kind = spec.layer_kinds[static_cast<std::size_t>(l)];
    const AttentionSpec& a = spec.attention(kind);
    plan_ops::AttentionInputs in;
    {
      auto s = stage(phase, l, what(StagePart::kAttention, StageOp::kProj), "gemm");
      in = plan_ops::attention_inputs(model_norm(x, w["input_norm"], spec), w, spec, kind);
    }
    at::Tensor out;
    if (!original && plan.keep_attention_results) {
      auto s = stage(phase, l, what(StagePart::kAttention, StageOp::kOlseH2d), "h2d", kH2d);
      out = olse.at(l)[static_cast<std::size_t>(sub)].out.to(dev);
    } else {
      const int G = plan_ops::attention_groups(a, plan.split.attention_head_group);
      std::vector<at::Tensor> outs, lses;
      for (int g = 0; g < G; ++g) {
        auto s = stage(phase, l, what(StagePart::kAttention, StageOp::kCore).at_head_group(g), "attention");
        auto r = attention_core(plan_ops::query_group(in.q, a.kv_heads, G, g), in.k, in.v, a.window_tokens,
                                cfg.model.attention_query_block, attention_scale(spec, a));
        outs.push_back(r.out);
        lses.push_back(r.lse.unsqueeze(-1));
      }
      out = plan_ops::merge_groups(outs, a.kv_heads);
      if (original && plan.keep_attention_results) {
        auto s = stage(phase, l, what(StagePart::kAttention, StageOp::kOlseD2h), "d2h", kD2h);
        olse[l].push_back({to_host(out, st.pinned()), to_host(plan_ops::merge_groups(lses, a.kv_heads).squeeze(-1), st.pinned())});
      }
    }
    auto s = stage(phase, l, what(StagePart::kAttention, StageOp::kProj), "gemm");
    return x + post_mixing(plan_ops::attention_output(out, in.gate, w, x.scalar_type()), w, spec);
  }

  // Recompute (with autograd on leaves), MoE backward, then the mixing backward. Returns dx.
  at::Tensor attention_backward(int l, const BlockWeights& w, const at::Tensor& x, const at::Tensor& dy, int sub) {
    const LayerKind kind = spec.layer_kinds[static_cast<std::size_t>(l)];
    const AttentionSpec& a = spec.attention(kind);
    const int G = plan_ops::attention_groups(a, plan.split.attention_head_group);
    const bool keep = plan.keep_attention_results;
    auto x_l = leaf(x);
    plan_ops::AttentionInputs in;
    {
      auto s = stage(Phase::kRecompute, l, what(StagePart::kAttention, StageOp::kProj), "gemm");
      in = plan_ops::attention_inputs(model_norm(x_l, w["input_norm"], spec), w, spec, kind);
    }
    // K/V leaves in FP32: their gradients accumulate over the query-head groups in FP32.
    auto q_l = leaf(in.q), k_l = leaf(in.k.to(at::kFloat)), v_l = leaf(in.v.to(at::kFloat)), gate_l = leaf(in.gate);
    at::Tensor out, lse, out_graph;
    if (keep) {
      auto s = stage(Phase::kRecompute, l, what(StagePart::kAttention, StageOp::kOlseH2d), "h2d", kH2d);
      const OLse& kept = olse.at(l)[static_cast<std::size_t>(sub)];
      out = kept.out.to(dev);
      lse = kept.lse.to(dev);
    } else if (G == 1) {
      auto s = stage(Phase::kRecompute, l, what(StagePart::kAttention, StageOp::kCore).at_head_group(0), "attention");
      out_graph = attention_core(q_l, k_l, v_l, a.window_tokens, cfg.model.attention_query_block, attention_scale(spec, a)).out;
      out = out_graph.detach();
    } else {
      at::NoGradGuard no_grad;
      std::vector<at::Tensor> outs;
      for (int g = 0; g < G; ++g) {
        auto s = stage(Phase::kRecompute, l, what(StagePart::kAttention, StageOp::kCore).at_head_group(g), "attention");
        outs.push_back(attention_core(plan_ops::query_group(q_l, a.kv_heads, G, g), k_l, v_l, a.window_tokens,
                                      cfg.model.attention_query_block, attention_scale(spec, a)).out);
      }
      out = plan_ops::merge_groups(outs, a.kv_heads);
    }
    auto out_l = leaf(out);
    at::Tensor mixed;
    {
      auto s = stage(Phase::kRecompute, l, what(StagePart::kAttention, StageOp::kProj), "gemm");
      mixed = post_mixing(plan_ops::attention_output(out_l, gate_l, w, x.scalar_type()), w, spec);
    }
    const auto dh = moe_backward(l, w, x + mixed.detach(), dy);
    {
      auto s = stage(Phase::kBackward, l, what(StagePart::kAttention, StageOp::kProjBwd), "gemm");
      mixed.backward(dh);
    }
    const auto dout = out_l.grad();
    at::Tensor dq, dk, dv;
    if (keep) {
      dq = at::zeros(q_l.sizes(), q_l.options().dtype(at::kFloat));
      dk = at::zeros(k_l.sizes(), k_l.options().dtype(at::kFloat));
      dv = at::zeros(v_l.sizes(), v_l.options().dtype(at::kFloat));
      const auto B = q_l.size(0), H = q_l.size(1), S = q_l.size(2), d = q_l.size(3);
      const auto per = H / a.kv_heads, gh = per / G;
      for (int g = G - 1; g >= 0; --g) {
        auto s = stage(Phase::kBackward, l, what(StagePart::kAttention, StageOp::kCoreBwd).at_head_group(g), "attention");
        auto grads = plan_ops::attention_core_backward(
            plan_ops::query_group(in.q.detach(), a.kv_heads, G, g), in.k.detach(), in.v.detach(),
            plan_ops::query_group(out, a.kv_heads, G, g),
            plan_ops::query_group(lse.unsqueeze(-1), a.kv_heads, G, g).squeeze(-1),
            plan_ops::query_group(dout, a.kv_heads, G, g), a.window_tokens, cfg.model.attention_query_block, attention_scale(spec, a));
        dq.view({B, a.kv_heads, per, S, d}).narrow(2, g * gh, gh).copy_(grads.dq.reshape({B, a.kv_heads, gh, S, d}));
        dk.add_(grads.dk.to(at::kFloat));
        dv.add_(grads.dv.to(at::kFloat));
      }
      dq = dq.to(q_l.scalar_type());
    } else if (G == 1) {
      auto s = stage(Phase::kBackward, l, what(StagePart::kAttention, StageOp::kCoreBwd).at_head_group(0), "attention");
      out_graph.backward(dout);
      dq = q_l.grad(), dk = k_l.grad(), dv = v_l.grad();
    } else {
      for (int g = G - 1; g >= 0; --g) {
        at::Tensor og;
        {
          auto s = stage(Phase::kRecompute, l, what(StagePart::kAttention, StageOp::kCoreRefwd).at_head_group(g), "attention");
          og = attention_core(plan_ops::query_group(q_l, a.kv_heads, G, g), k_l, v_l, a.window_tokens,
                              cfg.model.attention_query_block, attention_scale(spec, a)).out;
        }
        auto s = stage(Phase::kBackward, l, what(StagePart::kAttention, StageOp::kCoreBwd).at_head_group(g), "attention");
        og.backward(plan_ops::query_group(dout, a.kv_heads, G, g));  // K/V gradients accumulate over groups
      }
      dq = q_l.grad(), dk = k_l.grad(), dv = v_l.grad();
    }
    {
      auto s = stage(Phase::kBackward, l, what(StagePart::kAttention, StageOp::kProjBwd), "gemm");
      backward_defined({in.q, in.k, in.v, in.gate}, {dq, dk.to(in.k.scalar_type()), dv.to(in.v.scalar_type()), grad_of(gate_l)});
    }
    return dh + x_l.grad();
  }

  // ---- Gated DeltaNet ----
  at::Tensor gdn_forward(int l, Phase phase, const BlockWeights& w, const at::Tensor& x) {
    plan_ops::GdnInputs in;
    {
      auto s = stage(phase, l, what(StagePart::kGdn, StageOp::kProj), "gemm");
      in = plan_ops::gdn_inputs(model_norm(x, w["input_norm"], spec), w, spec);
    }
    const GdnSpec& g = spec.gdn;
    auto state = at::zeros({x.size(0), g.value_heads, g.key_head_dim, g.value_head_dim}, x.options().dtype(at::kFloat));
    std::vector<at::Tensor> outs;
    int c = 0;
    for (const auto& [s0, C] : ranges(x.size(1), plan.split.gdn_chunk_tokens)) {
      auto s = stage(phase, l, what(StagePart::kGdn, StageOp::kCore).at_chunk(c++), "gdn");
      outs.push_back(plan_ops::gdn_core(in, s0, C, w, spec, cfg.model.gdn_chunk_tokens, state));
    }
    auto s = stage(phase, l, what(StagePart::kGdn, StageOp::kProj), "gemm");
    return x + plan_ops::gdn_output(outs.size() == 1 ? outs[0] : at::cat(outs, 2), in.z, w, spec, x.scalar_type());
  }

  at::Tensor gdn_backward(int l, const BlockWeights& w, const at::Tensor& x, const at::Tensor& dy) {
    auto x_l = leaf(x);
    plan_ops::GdnInputs in;
    {
      auto s = stage(Phase::kRecompute, l, what(StagePart::kGdn, StageOp::kProj), "gemm");
      in = plan_ops::gdn_inputs(model_norm(x_l, w["input_norm"], spec), w, spec);
    }
    const plan_ops::GdnInputs lin{leaf(in.qkv), leaf(in.z), leaf(in.beta), leaf(in.g)};
    const auto chunks = ranges(x.size(1), plan.split.gdn_chunk_tokens);
    const GdnSpec& g = spec.gdn;
    std::vector<at::Tensor> starts, outs;
    {
      at::NoGradGuard no_grad;
      auto state = at::zeros({x.size(0), g.value_heads, g.key_head_dim, g.value_head_dim}, x.options().dtype(at::kFloat));
      for (std::size_t c = 0; c < chunks.size(); ++c) {
        auto s = stage(Phase::kRecompute, l, what(StagePart::kGdn, StageOp::kCore).at_chunk(c), "gdn");
        starts.push_back(state);  // gdn_chunk replaces the state tensor, so this one stays the chunk's start
        outs.push_back(plan_ops::gdn_core(lin, chunks[c].first, chunks[c].second, w, spec, cfg.model.gdn_chunk_tokens, state));
      }
    }
    auto o_l = leaf(outs.size() == 1 ? outs[0] : at::cat(outs, 2));
    at::Tensor mixed;
    {
      auto s = stage(Phase::kRecompute, l, what(StagePart::kGdn, StageOp::kProj), "gemm");
      mixed = plan_ops::gdn_output(o_l, lin.z, w, spec, x.scalar_type());
    }
    const auto dh = moe_backward(l, w, x + mixed.detach(), dy);
    {
      auto s = stage(Phase::kBackward, l, what(StagePart::kGdn, StageOp::kProjBwd), "gemm");
      mixed.backward(dh);
    }
    const auto dout = o_l.grad();
    at::Tensor dstate;  // derivative of the loss by the state a chunk hands to the next
    for (int c = static_cast<int>(chunks.size()) - 1; c >= 0; --c) {
      auto s = stage(Phase::kBackward, l, what(StagePart::kGdn, StageOp::kCoreBwd).at_chunk(c), "gdn");
      const auto [s0, C] = chunks[static_cast<std::size_t>(c)];
      auto start = leaf(starts[static_cast<std::size_t>(c)]);
      auto state = start;
      const auto out = plan_ops::gdn_core(lin, s0, C, w, spec, cfg.model.gdn_chunk_tokens, state);
      backward_defined({out, state}, {dout.narrow(2, s0, C), dstate});
      dstate = start.grad();
    }
    {
      auto s = stage(Phase::kBackward, l, what(StagePart::kGdn, StageOp::kProjBwd), "gemm");
      backward_defined({in.qkv, in.z, in.beta, in.g}, {grad_of(lin.qkv), grad_of(lin.z), grad_of(lin.beta), grad_of(lin.g)});
    }
    return dh + x_l.grad();
  }

  // ---- MoE ----
  at::Tensor moe_forward(int l, Phase phase, const BlockWeights& w, const at::Tensor& h) {
    const auto h2 = h.reshape({-1, h.size(-1)});
    auto y2 = at::empty_like(h2);
    int c = 0;
    for (const auto& [t0, n] : ranges(h2.size(0), plan.split.moe_chunk_tokens)) {
      const auto hc = h2.narrow(0, t0, n);
      FfnInputs in;
      at::Tensor routed;
      Routing r;
      plan_ops::DenseTerms d;
      {
        auto s = stage(phase, l, what(StagePart::kMoe, StageOp::kRouterShared).at_chunk(c), "gemm");
        in = ffn_inputs(hc, w, spec);
        r = route_layer(in.router, w, spec);
        d = plan_ops::dense_terms(in.dense, w, spec);
      }
      {
        auto s = stage(phase, l, what(StagePart::kMoe, StageOp::kExperts).at_chunk(c), "expert_gemm");
        routed = routed_experts(in.experts, r, w, spec);
      }
      y2.narrow(0, t0, n).copy_(ffn_output(hc, routed, d.shared, d.dense, w, spec));
      ++c;
    }
    return y2.view(h.sizes());
  }

  // Per token chunk in reverse: recompute, then differentiate; returns dL/dh for y = h + moe(h).
  at::Tensor moe_backward(int l, const BlockWeights& w, const at::Tensor& h, const at::Tensor& dy) {
    const auto h2 = h.reshape({-1, h.size(-1)});
    const auto dy2 = dy.reshape({-1, dy.size(-1)});
    auto dh2 = at::empty_like(h2);
    const auto chunks = ranges(h2.size(0), plan.split.moe_chunk_tokens);
    for (int c = static_cast<int>(chunks.size()) - 1; c >= 0; --c) {
      const auto [t0, n] = chunks[static_cast<std::size_t>(c)];
      auto hc = leaf(h2.narrow(0, t0, n));
      // Router, experts and dense MLP read one normalized input, except Gemma 4's (its router reads
      // the residual and each branch has its own norm): the experts' input is a leaf either way.
      const bool one_input = !spec.gemma4();
      FfnInputs in;
      at::Tensor xn_l, routed;
      plan_ops::DenseTerms d;
      Routing r;
      {
        auto s = stage(Phase::kRecompute, l, what(StagePart::kMoe, StageOp::kRouterShared).at_chunk(c), "gemm");
        in = ffn_inputs(hc, w, spec);
        xn_l = leaf(in.experts);
        r = route_layer(one_input ? xn_l : in.router, w, spec);
        d = plan_ops::dense_terms(one_input ? xn_l : in.dense, w, spec);
      }
      {
        auto s = stage(Phase::kRecompute, l, what(StagePart::kMoe, StageOp::kExperts).at_chunk(c), "expert_gemm");
        routed = routed_experts(xn_l, r, w, spec);
      }
      const auto dyc = dy2.narrow(0, t0, n);
      if (one_input) {
        {
          auto s = stage(Phase::kBackward, l, what(StagePart::kMoe, StageOp::kExpertsBwd).at_chunk(c), "expert_gemm");
          routed.backward(dyc);
        }
        {
          auto s = stage(Phase::kBackward, l, what(StagePart::kMoe, StageOp::kRouterSharedBwd).at_chunk(c), "gemm");
          backward_defined({d.shared, d.dense}, {dyc, dyc});
          in.experts.backward(xn_l.grad());
        }
        dh2.narrow(0, t0, n).copy_(dyc + hc.grad());
        continue;
      }
      auto routed_l = leaf(routed);
      {
        auto s = stage(Phase::kBackward, l, what(StagePart::kMoe, StageOp::kRouterSharedBwd).at_chunk(c), "gemm");
        ffn_output(hc, routed_l, d.shared, d.dense, w, spec).backward(dyc);
      }
      {
        auto s = stage(Phase::kBackward, l, what(StagePart::kMoe, StageOp::kExpertsBwd).at_chunk(c), "expert_gemm");
        routed.backward(routed_l.grad());
        in.experts.backward(xn_l.grad());
      }
      dh2.narrow(0, t0, n).copy_(hc.grad());
    }
    return dh2.view(h.sizes());
  }

  // ---- decoders ----
  at::Tensor decoder_forward(int l, Phase phase, const at::Tensor& x, bool original) {
    at::Tensor wflat;
    {
      auto s = stage(phase, l, what(StagePart::kWeights, StageOp::kH2d), "h2d", kH2d);
      wflat = window.acquire(1 + l);
    }
    const auto w = block_views(st.layout().blocks[static_cast<std::size_t>(1 + l)], wflat);
    std::vector<at::Tensor> ys;
    int sub = 0;
    const auto subs = ranges(x.size(0), sb);
    const int outer_sub = sub_batch;
    for (const auto& [b0, n] : subs) {
      sub_batch = subs.size() > 1 ? sub : -1;
      const auto xi = x.narrow(0, b0, n);
      const auto h = attention(l) ? attention_forward(l, phase, w, xi, sub, original) : gdn_forward(l, phase, w, xi);
      ys.push_back(moe_forward(l, phase, w, h));
      ++sub;
    }
    sub_batch = outer_sub;
    window.release(1 + l);
    return ys.size() == 1 ? ys[0] : at::cat(ys, 0);
  }

  // Returns dL/dx; the layer's flat weight gradient in `wgrad`.
  at::Tensor decoder_backward(int l, const at::Tensor& x, const at::Tensor& dy, at::Tensor& wgrad) {
    at::Tensor wflat;
    {
      auto s = stage(Phase::kBackward, l, what(StagePart::kWeights, StageOp::kH2d), "h2d", kH2d);
      wflat = leaf(window.acquire(1 + l));
    }
    const auto w = block_views(st.layout().blocks[static_cast<std::size_t>(1 + l)], wflat);
    auto dx = at::empty_like(x);
    int sub = 0;
    const auto subs = ranges(x.size(0), sb);
    for (const auto& [b0, n] : subs) {
      sub_batch = subs.size() > 1 ? sub : -1;
      const auto xi = x.narrow(0, b0, n), dyi = dy.narrow(0, b0, n);
      dx.narrow(0, b0, n).copy_(attention(l) ? attention_backward(l, w, xi, dyi, sub) : gdn_backward(l, w, xi, dyi));
      ++sub;
    }
    sub_batch = -1;
    window.release(1 + l);
    wgrad = wflat.grad();
    return dx;
  }

  // The input of decoder l for its backward: loaded, held, or regenerated (reference §4 "Replay").
  at::Tensor boundary_for_backward(int l) {
    using Place = BoundaryPolicy::Place;
    const auto& bp = plan.boundaries;
    if (bp.place(l) == Place::kHost) {
      auto s = stage(Phase::kBackward, l, what(StagePart::kBoundary, StageOp::kH2d), "h2d", kH2d);
      return host.at(l).to(dev);
    }
    if (held.count(l)) return held.at(l);
    int j = l - 1;
    while (j > 0 && bp.place(j) == Place::kRegenerated && !held.count(j)) --j;
    j = std::max(j, 0);
    at::Tensor start;
    if (bp.place(j) == Place::kRegenerated && !held.count(j)) {
      auto s = stage(Phase::kRecompute, -1, what(StagePart::kEmbedding, StageOp::kRegather), "elementwise");
      at::NoGradGuard no_grad;
      start = embed(tok, outer, spec);
      if (j == l) return start;
    } else {
      start = boundary_for_backward(j);
    }
    const int cap = std::max(1, bp.regenerate_cap);
    at::NoGradGuard no_grad;
    at::Tensor h = start;
    for (int d = j; d < l; ++d) {
      h = decoder_forward(d, Phase::kRecompute, h, false);
      if (d + 1 > l - cap) held[d + 1] = h;
    }
    return held.at(l);
  }

  // Outer-block parameter ranges: the LM head group (final norm, untied head) and the embeddings.
  std::pair<std::int64_t, std::int64_t> outer_range(bool head) const {
    const auto& e = st.layout().blocks[0].at("embed");
    const auto total = st.layout().blocks[0].numel;
    if (head) return e.offset == 0 ? std::pair{e.numel(), total - e.numel()} : std::pair{std::int64_t{0}, e.offset};
    return {e.offset, e.numel()};
  }

  void update_range(int block, std::int64_t a, std::int64_t n, const at::Tensor& grad, double scale) {
    auto p = st.master(block).narrow(0, a, n);
    auto m = st.exp_avg(block).narrow(0, a, n);
    auto v = st.exp_avg_sq(block).narrow(0, a, n);
    cpu_adamw_step(p, grad.narrow(0, a, n), m, v, cfg.adam, st.step + 1, scale, cfg.adam_threads);
  }

  // Queues the CPU update (and publication) of a parameter group; returns the worker job index.
  // `publish` false: the working copy is republished later (publish_range).
  int submit_update(StagePart group, int layer, int block, std::int64_t a, std::int64_t n,
                    std::function<void()> ready, double scale, bool publish = true) {
    return worker.submit([this, group, layer, block, a, n, ready = std::move(ready), scale, publish] {
      ready();
      {
        auto s = rec.stage(what(group, StageOp::kCpuAdamW).key(0, Phase::kOptimizer, layer), "cpu_adamw", kCpu);
        update_range(block, a, n, st.grad_slot(block), scale);
      }
      if (publish) publish_range(group, layer, block, a, n);
    });
  }
  void publish_range(StagePart group, int layer, int block, std::int64_t a, std::int64_t n) {
    auto s = rec.stage(what(group, StageOp::kPublish).key(0, Phase::kOptimizer, layer), "host_prep", kPrep);
    st.working(block).narrow(0, a, n).copy_(st.master(block).narrow(0, a, n));
  }

  // CPU gradient slots: the gradient about to be sent waits for the update `slots` gradients back.
  void wait_for_slot() {
    const int i = static_cast<int>(update_jobs.size());
    const int slots = std::max(1, plan.cpu_grad_slots);
    if (i >= slots) worker.wait_done(update_jobs[static_cast<std::size_t>(i - slots)]);
  }

  StepStats step(const at::Tensor& tokens, const at::Tensor& targets);
};

StepStats PlanTrainer::Impl::step(const at::Tensor& tokens, const at::Tensor& targets) {
  if (cfg.accumulate != 1) {
    throw InputError("", "--accumulate", std::to_string(cfg.accumulate),
                     "the plan runtime runs one micro-batch per step (a plan splits a step with split.sub_batch_seqs)");
  }
  if (tokens.dim() != 2 || !targets.sizes().equals(tokens.sizes())) {
    throw InputError("", "tokens", std::to_string(tokens.dim()) + " dimensions", "expected [batch, seq] tokens and targets of one shape");
  }
  const std::pair<std::int64_t, std::int64_t> shape{tokens.size(0), tokens.size(1)};
  if (shape != checked_shape) {
    check_plan_for_run(plan, spec, shape.first, shape.second, 1, "plan");
    checked_shape = shape;
  }
  const int L = spec.layers;
  const bool clip = cfg.max_grad_norm > 0;
  rec.start_step(tracing);
  sb = plan.split.sub_batch_seqs > 0 ? plan.split.sub_batch_seqs : tokens.size(0);
  olse.clear();
  held.clear();
  host.clear();
  update_jobs.clear();
  tok = tokens.to(dev);
  const auto tgt = targets.to(dev);

  at::Tensor outer_flat;
  {
    auto s = stage(Phase::kForward, -1, what(StagePart::kEmbedding, StageOp::kH2d), "h2d", kH2d);
    outer_flat = leaf(st.working(0).to(dev));
  }
  outer = block_views(st.layout().blocks[0], outer_flat);
  at::Tensor x0;
  {
    auto s = stage(Phase::kForward, -1, what(StagePart::kEmbedding, StageOp::kGather), "elementwise");
    x0 = embed(tok, outer, spec);
  }
  at::Tensor h = x0.detach();
  {
    at::NoGradGuard no_grad;
    for (int l = 0; l < L; ++l) {
      switch (plan.boundaries.place(l)) {
        case BoundaryPolicy::Place::kHost: {
          auto s = stage(Phase::kForward, l, what(StagePart::kBoundary, StageOp::kD2h), "d2h", kD2h);
          host[l] = to_host(h, st.pinned());
          break;
        }
        case BoundaryPolicy::Place::kGpu:
          held[l] = h;
          break;
        case BoundaryPolicy::Place::kRegenerated:
          break;
      }
      h = decoder_forward(l, Phase::kForward, h, true);
    }
  }
  auto hL = leaf(h);
  at::Tensor loss;
  {
    auto s = stage(Phase::kForward, -1, what(StagePart::kLmHead, StageOp::kLoss), "gemm");
    loss = head_loss(hL, tgt, outer, spec);
  }
  {
    auto s = stage(Phase::kBackward, -1, what(StagePart::kLmHead, StageOp::kBackward), "gemm");
    loss.backward();
  }
  at::Tensor g = hL.grad();
  const auto head = outer_range(true), emb = outer_range(false);
  std::vector<double> sq_norm(static_cast<std::size_t>(st.blocks()), 0.0);
  std::vector<std::function<void()>> grad_ready(static_cast<std::size_t>(st.blocks()));
  std::function<void()> head_ready;
  {
    auto s = stage(Phase::kBackward, -1, what(StagePart::kLmHead, StageOp::kGradD2h), "d2h", kD2h);
    head_ready = gradient_to_host(st.grad_slot(0), outer_flat.grad());
  }
  // The LM head's update overlaps the decoders' backward; its working copy is republished after
  // the embedding backward (on a CPU device the step's outer weights are that very buffer).
  if (!clip) update_jobs.push_back(submit_update(StagePart::kLmHead, -1, 0, head.first, head.second, head_ready, 1.0, false));

  for (int l = L - 1; l >= 0; --l) {
    const auto x = boundary_for_backward(l);
    at::Tensor wgrad;
    g = decoder_backward(l, x, g, wgrad);
    held.erase(l);
    host.erase(l);
    olse.erase(l);
    const int b = 1 + l;
    if (!clip) wait_for_slot();
    std::function<void()> ready;
    {
      auto s = stage(Phase::kBackward, l, what(StagePart::kLayer, StageOp::kGradD2h), "d2h", kD2h);
      ready = gradient_to_host(st.grad_slot(b), wgrad);
    }
    if (clip) {
      sq_norm[static_cast<std::size_t>(b)] = wgrad.to(at::kFloat).pow(2).sum().item<double>();
      grad_ready[static_cast<std::size_t>(b)] = std::move(ready);
    } else {
      update_jobs.push_back(submit_update(StagePart::kLayer, l, b, 0, st.layout().blocks[static_cast<std::size_t>(b)].numel, ready, 1.0));
    }
  }
  {
    auto s = stage(Phase::kBackward, -1, what(StagePart::kEmbedding, StageOp::kScatter), "elementwise");
    x0.backward(g);
  }
  if (!clip) worker.wait_done(update_jobs.front());  // the head update read the slot before it is replaced
  std::function<void()> outer_ready;
  {
    auto s = stage(Phase::kBackward, -1, what(StagePart::kEmbedding, StageOp::kGradD2h), "d2h", kD2h);
    outer_ready = gradient_to_host(st.grad_slot(0), outer_flat.grad());
  }
  StepStats stats;
  stats.loss = loss.item<double>();
  if (clip) {
    sq_norm[0] = outer_flat.grad().to(at::kFloat).pow(2).sum().item<double>();
    double total = 0;
    for (double v : sq_norm) total += v;
    stats.grad_norm = std::sqrt(total);
    const double coef = clip_coefficient(stats.grad_norm, cfg.max_grad_norm);
    for (int b = st.blocks() - 1; b >= 1; --b) {
      submit_update(StagePart::kLayer, b - 1, b, 0, st.layout().blocks[static_cast<std::size_t>(b)].numel,
                    grad_ready[static_cast<std::size_t>(b)], coef);
    }
    submit_update(StagePart::kLmHead, -1, 0, head.first, head.second, outer_ready, coef);
    submit_update(StagePart::kEmbedding, -1, 0, emb.first, emb.second, [] {}, coef);
  } else {
    worker.submit([this, head] { publish_range(StagePart::kLmHead, -1, 0, head.first, head.second); });
    submit_update(StagePart::kEmbedding, -1, 0, emb.first, emb.second, outer_ready, 1.0);
  }
  worker.wait_all();
  ++st.step;
  held.clear();
  tok = at::Tensor();
  outer = BlockWeights();
  if (tracing) trace = rec.finish();
  return stats;
}

PlanTrainer::PlanTrainer(HostState& state, TrainerConfig config, Plan plan, at::Device device)
    : impl_(std::make_unique<Impl>(state, config, std::move(plan), device)) {}
PlanTrainer::~PlanTrainer() = default;
StepStats PlanTrainer::step(const at::Tensor& tokens, const at::Tensor& targets) { return impl_->step(tokens, targets); }
void PlanTrainer::set_lr(double lr) { impl_->cfg.adam.lr = lr; }
void PlanTrainer::set_tracing(bool on) { impl_->tracing = on; }
const Trace& PlanTrainer::last_trace() const { return impl_->trace; }

}  // namespace oom::backend
