#include "backend/graph_runner.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <map>
#include <set>
#include <stdexcept>
#include <tuple>

#include <fmt/format.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/torch.h>

#include "backend/device_memory.h"
#include "backend/host_copies.h"
#include "backend/job_queue.h"
#include "backend/plan_ops.h"
#include "backend/recompute.h"
#include "backend/stage_recorder.h"
#include "costmodel/hardware_spec.h"
#include "costmodel/input_error.h"
#include "costmodel/memory.h"
#include "costmodel/workload.h"

#ifdef OOM_BACKEND_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace oom::backend {

StepGraph lower_for_run(const Plan& plan, const ModelSpec& model, std::int64_t batch, std::int64_t seq, int ranks,
                        const RoutingSpec& routing) {
  WorkloadContext ctx;
  ctx.workload.model = model.name;
  ctx.workload.hardware = "h100-sxm-node";
  ctx.workload.gpus = ranks;
  ctx.workload.global_batch = batch;
  ctx.workload.seq_len = seq;
  ctx.workload.routing = routing;
  ctx.model = model;
  ctx.hardware = load_hardware_spec(ctx.workload.hardware);
  return lower(plan, ctx);
}

namespace {

// The kernels a stage can map to.
enum class Kernel {
  kNone,  // sync: no work
  kOuterH2d, kGather, kRegather, kScatter, kLoss, kHeadBackward, kOuterGradD2h,
  kBoundaryD2h, kBoundaryH2d, kWeightsH2d,
  kMixProj, kAttnCore, kAttnCoreRefwd, kOlseD2h, kOlseH2d, kMixOut, kMixOutBwd, kMixCoreBwd, kMixProjBwd, kGdnCore,
  kRouterShared, kExperts, kExpertsBwd, kRouterSharedBwd,
  kA2aDispatch, kA2aReturn, kCombine, kA2aGradDispatch, kA2aGradReturn, kReduceScatter,
  kLayerGradD2h, kPartGradD2h, kGpuAdamW, kHostAccumulate, kCpuAdamW, kPublish,
  kRingLoss, kRingPass, kRingBackward, kRingGradPass,  // Ring-DTP
  kLlepFetch, kLlepGradReturn,                         // PipelinedLLEP
};

// The table from (part, operator) to kernel; kNone for sync stages, nullopt for work this
// runner has no kernel for.
std::optional<Kernel> kernel_of(const Stage& s) {
  if (s.op == OpKind::kSync) return Kernel::kNone;
  using P = StagePart;
  using O = StageOp;
  const P p = s.key.part;
  const bool mixing = p == P::kAttention || p == P::kGdn;
  switch (s.key.op) {
    case O::kH2d:
      if (p == P::kEmbedding || p == P::kLmHead) return Kernel::kOuterH2d;
      if (p == P::kBoundary) return Kernel::kBoundaryH2d;
      if (p == P::kWeights) return Kernel::kWeightsH2d;
      break;
    case O::kD2h:
      if (p == P::kBoundary) return Kernel::kBoundaryD2h;
      break;
    case O::kGather: if (p == P::kEmbedding) return Kernel::kGather; break;
    case O::kRegather: if (p == P::kEmbedding) return Kernel::kRegather; break;
    case O::kScatter: if (p == P::kEmbedding) return Kernel::kScatter; break;
    case O::kLoss:
      if (p == P::kLmHead) return s.key.ring_step >= 0 ? Kernel::kRingLoss : Kernel::kLoss;
      break;
    case O::kBackward:
      if (p == P::kLmHead) return s.key.ring_step >= 0 ? Kernel::kRingBackward : Kernel::kHeadBackward;
      break;
    case O::kPass: if (p == P::kLmHead) return Kernel::kRingPass; break;
    case O::kGradPass: if (p == P::kLmHead) return Kernel::kRingGradPass; break;
    case O::kGradD2h:
      if (p == P::kEmbedding || p == P::kLmHead) return Kernel::kOuterGradD2h;
      if (p == P::kLayer) return Kernel::kLayerGradD2h;
      if (p == P::kExperts || p == P::kCommon) return Kernel::kPartGradD2h;
      break;
    case O::kGpuAdamW: if (p == P::kExperts) return Kernel::kGpuAdamW; break;
    case O::kProj: if (mixing) return Kernel::kMixProj; break;
    case O::kCore:
      if (p == P::kAttention) return Kernel::kAttnCore;
      if (p == P::kGdn) return Kernel::kGdnCore;
      break;
    case O::kCoreRefwd: if (p == P::kAttention) return Kernel::kAttnCoreRefwd; break;
    case O::kCoreBwd: if (mixing) return Kernel::kMixCoreBwd; break;
    case O::kOlseD2h: if (p == P::kAttention) return Kernel::kOlseD2h; break;
    case O::kOlseH2d: if (p == P::kAttention) return Kernel::kOlseH2d; break;
    case O::kOut: if (mixing) return Kernel::kMixOut; break;
    case O::kOutBwd: if (mixing) return Kernel::kMixOutBwd; break;
    case O::kProjBwd: if (mixing) return Kernel::kMixProjBwd; break;
    case O::kRouterShared: if (p == P::kMoe) return Kernel::kRouterShared; break;
    case O::kExperts: if (p == P::kMoe) return Kernel::kExperts; break;
    case O::kExpertsBwd: if (p == P::kMoe) return Kernel::kExpertsBwd; break;
    case O::kRouterSharedBwd: if (p == P::kMoe) return Kernel::kRouterSharedBwd; break;
    case O::kA2aDispatch: if (p == P::kMoe) return Kernel::kA2aDispatch; break;
    case O::kA2aReturn: if (p == P::kMoe) return Kernel::kA2aReturn; break;
    case O::kCombine: if (p == P::kMoe) return Kernel::kCombine; break;
    case O::kA2aGradDispatch: if (p == P::kMoe) return Kernel::kA2aGradDispatch; break;
    case O::kA2aGradReturn: if (p == P::kMoe) return Kernel::kA2aGradReturn; break;
    case O::kFetch: if (p == P::kLlep) return Kernel::kLlepFetch; break;
    case O::kGradReturn: if (p == P::kLlep) return Kernel::kLlepGradReturn; break;
    case O::kReduceScatter:
      if (p == P::kEmbedding || p == P::kLmHead || p == P::kCommon) return Kernel::kReduceScatter;
      break;
    case O::kHostAccumulate: if (p == P::kLayer) return Kernel::kHostAccumulate; break;
    // A streamed update (OffloadStreamAdamW) updates and publishes each bucket of a part on its own.
    case O::kCpuAdamW:
      if (p == P::kLayer || p == P::kEmbedding || p == P::kLmHead) return Kernel::kCpuAdamW;
      if ((p == P::kExperts || p == P::kCommon) && s.key.bucket >= 0) return Kernel::kCpuAdamW;
      break;
    case O::kPublish:
      if (p == P::kLayer || p == P::kEmbedding || p == P::kLmHead) return Kernel::kPublish;
      if ((p == P::kExperts || p == P::kCommon) && s.key.bucket >= 0) return Kernel::kPublish;
      break;
    default: break;
  }
  return std::nullopt;
}

// The kernel of a stage this runner must run; std::logic_error naming the stage when it has none.
Kernel runnable_kernel(const Stage& s) {
  const auto k = kernel_of(s);
  if (!k) throw std::logic_error(fmt::format("the graph runner has no kernel for stage {} ({})", s.name, op_kind_name(s.op)));
  return *k;
}

// The memory model's use (MemoryUse) of what a stage's kernel allocates on the device; tensors
// whose role differs from their stage's are tagged where they are made or retagged when their role
// is known (the decoder outputs and hidden-state gradients: activations; gradients: optimizer; held
// and regenerated decoder inputs: boundaries). The loss stages run the final norm (activations)
// around the cross-entropy, which counts its logits blocks as the vocabulary's (model.h).
MemoryUse memory_use_of(Kernel k) {
  switch (k) {
    case Kernel::kRingLoss:
    case Kernel::kRingPass:
    case Kernel::kRingBackward:
    case Kernel::kRingGradPass: return MemoryUse::kVocabulary;
    case Kernel::kBoundaryH2d:
    case Kernel::kRegather: return MemoryUse::kBoundaries;
    case Kernel::kRouterShared:
    case Kernel::kExperts:
    case Kernel::kExpertsBwd:
    case Kernel::kRouterSharedBwd:
    case Kernel::kA2aDispatch:
    case Kernel::kA2aReturn:
    case Kernel::kCombine:
    case Kernel::kA2aGradDispatch:
    case Kernel::kA2aGradReturn:
    case Kernel::kLlepFetch:
    case Kernel::kLlepGradReturn: return MemoryUse::kDispatch;
    case Kernel::kScatter:
    case Kernel::kOuterGradD2h:
    case Kernel::kLayerGradD2h:
    case Kernel::kPartGradD2h:
    case Kernel::kReduceScatter:
    case Kernel::kGpuAdamW: return MemoryUse::kOptimizer;
    case Kernel::kLoss:
    case Kernel::kHeadBackward:
    case Kernel::kGather:
    case Kernel::kMixProj:
    case Kernel::kAttnCore:
    case Kernel::kAttnCoreRefwd:
    case Kernel::kGdnCore:
    case Kernel::kOlseH2d:
    case Kernel::kMixOut:
    case Kernel::kMixOutBwd:
    case Kernel::kMixCoreBwd:
    case Kernel::kMixProjBwd: return MemoryUse::kActivations;
    default: return MemoryUse::kOther;
  }
}

bool on_worker(Kernel k) { return k == Kernel::kHostAccumulate || k == Kernel::kCpuAdamW || k == Kernel::kPublish; }
// The stages that read a decoder's weight gradient: its backward pass lives until the last of them.
bool reads_layer_gradient(const Stage& s, Kernel k) {
  return s.layer >= 0 &&
         (k == Kernel::kLayerGradD2h || k == Kernel::kPartGradD2h || k == Kernel::kGpuAdamW || k == Kernel::kReduceScatter);
}
// The stages that read a decoder's experts' gradient (EP): their D2H and the device update.
bool reads_expert_gradient(const Stage& s, Kernel k) {
  return s.layer >= 0 && ((k == Kernel::kPartGradD2h && s.key.part == StagePart::kExperts) || k == Kernel::kGpuAdamW);
}
// A stage key's sub-batch (0 when the batch runs whole).
std::size_t sub_index(const StageKey& k) { return static_cast<std::size_t>(std::max(k.sub_batch, 0)); }
bool in_pass(const Stage& s) {
  const StagePart p = s.key.part;
  return s.layer >= 0 && (p == StagePart::kAttention || p == StagePart::kGdn || p == StagePart::kMoe || p == StagePart::kLlep);
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

// The tensors of a flat block as leaves. With their gradients attached to the slices of one flat
// gradient (attach_gradient), autograd adds each weight's gradient into its slice in place, where
// differentiating views of one flat leaf would materialize a block-size gradient per view.
constexpr const char* kExpertBanks[] = {"experts.gate", "experts.up", "experts.down"};
BlockWeights leaf_views(const BlockLayout& layout, const at::Tensor& flat) {
  BlockWeights w = block_views(layout, flat);
  for (auto& t : w.tensors) t = leaf(t);
  for (const char* bank : kExpertBanks) {
    if (!layout.has(bank) || layout.at(bank).numel() == 0) continue;  // none, or a dense layer's empty bank
    const at::Tensor& all = w[bank];
    auto& each = w.experts[bank];
    for (std::int64_t e = 0; e < all.size(0); ++e) each.push_back(leaf(all.select(0, e)));
  }
  return w;
}
// A block's gradient on the device in block coordinates: the ranges this rank accumulates, each
// its own flat allocation (a decoder's whole block on the Local path; on the EP path its common
// part and this rank's experts of each bank, so that the experts' gradient leaves when its D2H or
// update is done and no rank holds the others' experts' gradients).
struct BlockGrad {
  std::vector<std::pair<std::int64_t, at::Tensor>> parts;  // (first element, flat tensor), by offset
  std::int64_t numel = 0;                                  // the block's elements
  bool defined() const { return !parts.empty(); }
  // The part that holds elements [a, a + n) (n > 0).
  const std::pair<std::int64_t, at::Tensor>& part_of(std::int64_t a, std::int64_t n) const {
    for (const auto& p : parts) {
      if (a >= p.first && a + n <= p.first + p.second.numel()) return p;
    }
    OOM_ASSERT(false, "a gradient range outside the parts this rank holds");
    return parts.front();
  }
  // Elements [a, a + n): they lie in one part.
  at::Tensor range(std::int64_t a, std::int64_t n) const {
    if (n == 0) return parts.front().second.narrow(0, 0, 0);  // an empty range (a group without its tail)
    const auto& [base, t] = part_of(a, n);
    return t.narrow(0, a - base, n);
  }
  bool holds(std::int64_t a, std::int64_t n) const {
    if (n == 0) return true;
    for (const auto& [base, t] : parts) {
      if (a >= base && a + n <= base + t.numel()) return true;
    }
    return false;
  }
  // Zeroed parts like `like`: one per range of each group, a group's adjacent ranges in one.
  using Ranges = std::vector<std::pair<std::int64_t, std::int64_t>>;
  static BlockGrad zeros(std::int64_t numel, const std::vector<Ranges>& groups, const at::TensorOptions& like) {
    BlockGrad g;
    g.numel = numel;
    for (Ranges ranges : groups) {
      std::sort(ranges.begin(), ranges.end());
      Ranges merged;
      for (const auto& [a, n] : ranges) {
        if (n <= 0) continue;
        if (!merged.empty() && merged.back().first + merged.back().second == a) {
          merged.back().second += n;
        } else {
          merged.push_back({a, n});
        }
      }
      for (const auto& [a, n] : merged) g.parts.push_back({a, at::zeros({n}, like)});
    }
    std::sort(g.parts.begin(), g.parts.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
    return g;
  }
  // Drops the parts within [a0, a1).
  void release(std::int64_t a0, std::int64_t a1) {
    std::erase_if(parts, [&](const auto& p) { return p.first >= a0 && p.first + p.second.numel() <= a1; });
  }
};
// Each leaf's gradient: its view of `grad` where grad holds its elements (autograd adds into it
// in place); leaves whose elements this rank does not accumulate get none.
void attach_gradient(BlockWeights& leaves, const BlockGrad& grad) {
  const auto& entries = leaves.layout->entries;
  for (std::size_t i = 0; i < leaves.tensors.size(); ++i) {
    const ParamEntry& e = entries[i];
    if (grad.holds(e.offset, e.numel())) leaves.tensors[i].mutable_grad() = grad.range(e.offset, e.numel()).view(e.shape);
  }
  for (auto& [bank, each] : leaves.experts) {
    const ParamEntry& e = leaves.layout->at(bank);
    const std::int64_t per = e.numel() / static_cast<std::int64_t>(each.size());
    for (std::size_t x = 0; x < each.size(); ++x) {
      const std::int64_t a = e.offset + static_cast<std::int64_t>(x) * per;
      if (grad.holds(a, per)) each[x].mutable_grad() = grad.range(a, per).view(each[x].sizes());
    }
  }
}
// Takes the gradients off the leaves whose elements lie in [a0, a1) (their part is released).
void detach_gradient(BlockWeights& leaves, std::int64_t a0, std::int64_t a1) {
  const auto& entries = leaves.layout->entries;
  for (std::size_t i = 0; i < leaves.tensors.size(); ++i) {
    if (entries[i].offset >= a0 && entries[i].offset + entries[i].numel() <= a1) leaves.tensors[i].mutable_grad() = at::Tensor();
  }
  for (auto& [bank, each] : leaves.experts) {
    const ParamEntry& e = leaves.layout->at(bank);
    if (e.offset < a0 || e.offset + e.numel() > a1) continue;
    for (auto& t : each) t.mutable_grad() = at::Tensor();
  }
}
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
    cb.device_peak = [index] {
      const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(index);
      return static_cast<Bytes>(stats.allocated_bytes[0].peak);
    };
    cb.device_mark = [index] { c10::cuda::CUDACachingAllocator::resetPeakStats(index); };
  }
#endif
  if (!device.is_cuda() && device_memory::emulated()) {
    // A CPU standing in for a GPU: the bytes its device-side allocations hold (backend/device_memory.h).
    cb.device_bytes = [] { return device_memory::current_bytes(); };
    cb.device_peak = [] { return device_memory::peak_bytes(); };
    cb.device_mark = [] { device_memory::reset_peak(); };
  }
  return cb;
}

// Piece `index` of `total` cut in pieces of `size` (the last takes the remainder; size ≤ 0 or
// ≥ total: one piece). Returns {start, length}.
std::pair<std::int64_t, std::int64_t> piece(std::int64_t total, std::int64_t size, int index) {
  if (size <= 0 || size >= total) return {0, total};
  const std::int64_t a = std::int64_t{index} * size;
  OOM_ASSERT(a < total, "piece index beyond the extent");
  return {a, std::min(size, total - a)};
}

// Rows [b0, b0 + n) of a batch-first tensor (undefined stays undefined).
at::Tensor batch_rows(const at::Tensor& t, std::int64_t b0, std::int64_t n) { return t.defined() ? t.narrow(0, b0, n) : t; }

plan_ops::GdnInputs gdn_rows(const plan_ops::GdnInputs& in, std::int64_t b0, std::int64_t n) {
  return {batch_rows(in.qkv, b0, n), batch_rows(in.z, b0, n), batch_rows(in.beta, b0, n), batch_rows(in.g, b0, n)};
}

struct OLse {
  at::Tensor out, lse;  // [b, H, S, d] in the activations' dtype, [b, H, S] FP32, on the host
};

enum class PassKind { kForward, kRegenerate, kBackward };

// One token chunk of a sub-batch's MoE.
struct Chunk {
  at::Tensor hc, xn_l, routed, comb;
  FfnInputs in;
  Routing r;
  plan_ops::DenseTerms d;
  // Over ranks (EP): the chunk's (token, slot) pairs sorted by expert, the rows sent to and
  // received from each rank, the received rows (as received until the experts run), the outputs
  // to return, the returned rows (a leaf at the source in a graph), and in backward the gradients
  // coming back to the owner, going out from it, and coming back to the source. The owner runs its
  // experts without autograd (plan_ops::expert_forward) on the received rows in the experts' order
  // (`order`: each expert's rows of recv_x in turn); where a backward follows it keeps them (xs)
  // and their activations.
  at::Tensor tokens_sorted, weights_sorted, recv_x, y_recv, back, dy_recv, d_recv, dxn, order, xs;
  plan_ops::ExpertActivations acts;
  torch::autograd::edge_list dense_edges;  // the shared expert's and dense MLP's graphs (keep_dense_graphs)
  std::vector<std::int64_t> send, recv;
  std::vector<at::Tensor> expert_rows;  // per owned expert: its rows of recv_x (undefined: none)
  std::map<int, at::Tensor> fetched_rows;  // PipelinedLLEP: per fetched expert, its rows of recv_x
};

using plan_ops::ExpertWeights;

// One sub-batch of a decoder pass.
struct Sub {
  std::int64_t b0 = 0, n = 0;
  at::Tensor x, x_l;  // input rows; their leaf in a backward pass
  plan_ops::AttentionInputs in;
  at::Tensor q_l, k_l, v_l, gate_l;
  plan_ops::GdnInputs gin, glin;
  at::Tensor state, dstate;
  std::vector<at::Tensor> starts, outs, lses;  // GDN chunk start states / per group or chunk outputs
  at::Tensor out_graph, group_graph, out, lse, out_l, mixed, h, dh, dout, dq, dk, dv;
  std::map<int, Chunk> chunks;
};

struct Pass {
  int l = -1;
  PassKind kind = PassKind::kForward;
  bool started = false;
  at::Tensor wflat, x, y, dy;  // weights; input; output (forward) or input gradient (backward); output gradient
  BlockGrad grad;              // a backward pass: the weights' gradient
  BlockWeights w;
  std::map<int, ExpertWeights> fetched;  // PipelinedLLEP: the other ranks' experts this rank computes
  std::map<int, at::Tensor> fetched_grad;  // a backward: their gradients (gate, up, down in one row)
  std::map<int, Sub> subs;
};

}  // namespace

struct GraphRunner::Impl {
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
  RankGroup* group = nullptr;  // null: one rank
  int R = 0, P = 1;            // this rank, the ranks
  int experts_local = 0, expert0 = 0;  // EP over ranks: owned experts [expert0, expert0 + experts_local)

  // Per step.
  const StepGraph* graph = nullptr;
  std::int64_t B = 0, S = 0, sb = 0;
  at::Tensor tok, tgt, outer_flat, hL, loss;
  // The outer block's gradient in its two groups' ranges (outer_range): the LM head group's and the
  // embeddings', each allocated (zeroed) by the first backward that adds into it and released after
  // the last stage that reads it (last_outer_use), as the lowering holds them.
  at::Tensor head_grad, embed_grad;
  std::array<StageId, 2> last_outer_use{-1, -1};  // [0] embeddings, [1] LM head group
  std::vector<StageId> last_expert_use;  // per backward pass (EP): the last stage reading its experts' gradient
  BlockWeights outer;
  std::map<int, at::Tensor> act;               // decoder → its input on the device (L: the head's)
  // Where a decoder's input on the device came from, which says how long it stays (as the lowering
  // keeps it: a regathered embedding output, a host boundary loaded to start a regeneration and
  // the regenerated inputs within regenerate_cap of the next backward stay).
  enum class Origin { kForward, kLoaded, kRegather, kRegenerated };
  std::map<int, Origin> origin;
  std::map<int, at::Tensor> host;              // host-kept boundaries
  std::map<int, std::vector<OLse>> olse;       // kept O/LSE per sub-batch
  std::map<int, at::Tensor> dgrad;             // decoder → dL/d(its input) (L: the head's input)
  std::map<StageId, Pass> passes;              // by the weights stage that opened them
  std::map<int, StageId> open_pass;            // decoder → its latest pass
  std::map<int, StageId> backward_pass;        // decoder → its backward pass (until its gradient leaves)
  std::vector<StageId> last_use;               // weights stage → the pass's last stage
  std::vector<StageId> last_grad_use;          // backward weights stage → the last stage reading its gradient
  // EP: MoE chunks whose forward graph is retained for the backward (decoder, chunk), and the
  // forward weights those graphs differentiate into.
  std::map<std::pair<int, int>, Chunk> retained_moe;
  std::map<int, BlockWeights> retained_weights;  // decoder → the leaves its retained MoE graphs differentiate into
  std::map<std::pair<StagePart, int>, BlockGrad> reduced;  // gradients summed over ranks (reduce_scatter)
  // Ring-DTP: this rank's normalized hidden states (with their graph to the head's input), the
  // block it holds (hidden states, targets, cross-entropy state, log-sum-exp, gradient so far) and
  // its head shard's gradient.
  // Ring-DTP (costmodel ring_dtp_hops decides, as the lowering prices it): the ranks' hidden-state
  // blocks circulate past the resident head shards, or the head shards past the resident blocks.
  struct Ring {
    bool weights = false;              // head shards circulate (else hidden-state blocks)
    at::Tensor xn, x, t, lse, dx, dshard;
    at::Tensor w;                      // the head shard computed against: this rank's, or one passing
    int owner = 0;                     // whose shard w is
    plan_ops::RingLse state;
  } ring;
  std::vector<std::vector<std::int64_t>> dispatch_log;      // rows sent per forward dispatch (layer, chunk order)
  // PipelinedLLEP. The placement of fetched experts comes from the routing the graph was lowered
  // with: the histogram of the previous step's forward dispatches (uniform before the first, so
  // nothing is fetched). Per decoder: the (expert, helper) pairs by expert then helper; the step's
  // global (token, expert) pairs per decoder and expert.
  RoutingSpec llep_routing;
  RoutingSpec step_routing;  // EP over ranks: the last step's routing histogram (uniform before one)
  std::vector<std::vector<std::pair<int, int>>> llep_spills;
  std::vector<std::vector<double>> routed_pairs;
  std::vector<std::function<void()>> deferred_device;  // clipping: device updates held for the norm
  // A gradient on its way to an update: (part, decoder, bucket), bucket −1 for a whole group.
  using GradKey = std::tuple<StagePart, int, int>;
  std::map<GradKey, std::function<void()>> ready;  // gradient copies to wait for
  std::map<std::pair<StagePart, int>, int> buckets;  // a streamed part's gradient buckets (OffloadStreamAdamW)
  // Host gradient buffers: cpu_grad_slots per kind (routed experts; everything else), used in the
  // order the lowering numbers the gradient D2H stages. The D2H of gradient k depends on the update
  // that consumed gradient k − cpu_grad_slots of its kind, so the buffer is free when it is reused.
  // With clipping every update waits for the norm, so each gradient gets its own buffer.
  std::array<std::vector<at::Tensor>, 2> grad_pool;
  std::array<int, 2> grads_sent{0, 0};
  std::map<GradKey, at::Tensor> host_grad;  // a group's (or bucket's) gradient on the host until its update
  std::vector<at::Tensor>* captured = nullptr;                // capture_gradients()
  std::map<StageId, int> jobs;                 // worker stages → job index
  std::vector<std::function<void()>> deferred; // clipping: worker stages held for the norm
  std::vector<double> sq_norm;
  double coef = 1.0;
  int next_backward = 0;                       // the decoder whose backward comes next

  Impl(HostState& s, TrainerConfig c, Plan p, at::Device d, RankGroup* g)
      : st(s), cfg(c), plan(std::move(p)), dev(d), window(s, d, plan.transfer_chunk_mib * kMiB), rec(recorder_callbacks(d)),
        spec(s.spec()), group(g), R(g ? g->rank() : 0), P(g ? g->size() : 1) {
    experts_local = spec.moe.experts / P;
    expert0 = R * experts_local;
  }

  bool ep() const { return plan.path == ExpertPath::kEp; }
  bool llep() const { return ep() && P > 1 && plan.flat.expert_dispatch == ExpertDispatch::kPipelinedLlep; }
  int owner_of(int expert) const { return expert / experts_local; }
  bool ring_dtp() const { return plan.flat.ring_dtp(P); }
  std::int64_t shard_rows() const { return spec.vocab / P; }  // Ring-DTP: head rows per rank
  // One ring hop: every rank sends `t` (rows) to the next rank and returns what the previous sent.
  at::Tensor ring_hop(const at::Tensor& t, int to_offset = 1) {
    std::vector<std::int64_t> send(static_cast<std::size_t>(P), 0), recv(static_cast<std::size_t>(P), 0);
    send[static_cast<std::size_t>((R + to_offset) % P)] = t.size(0);
    recv[static_cast<std::size_t>((R - to_offset % P + P) % P)] = t.size(0);  // blocks are equal: B/P sequences each
    return group->all_to_all(t.contiguous(), send, recv);
  }
  bool dist() const { return P > 1; }
  bool retained(int l) const { return ep() && plan.is_moe_retained(l); }
  bool attention(int l) const { return spec.layer_kinds[static_cast<std::size_t>(l)] != LayerKind::kLinearAttention; }
  const AttentionSpec& attn(int l) const { return spec.attention(spec.layer_kinds[static_cast<std::size_t>(l)]); }
  int groups(int l) const { return plan_ops::attention_groups(attn(l), plan.split.attention_head_group); }
  double scale(int l) const { return attention_scale(spec, attn(l)); }

  // Outer-block parameter ranges: the LM head group (final norm, untied head) and the embeddings.
  std::pair<std::int64_t, std::int64_t> outer_range(bool head) const {
    const auto& e = st.layout().blocks[0].at("embed");
    const auto total = st.layout().blocks[0].numel;
    if (head) return e.offset == 0 ? std::pair{e.numel(), total - e.numel()} : std::pair{std::int64_t{0}, e.offset};
    return {e.offset, e.numel()};
  }
  // The flat ranges {start, length} of a parameter group: a decoder's routed-expert bank
  // ("experts"), the rest of it ("common"), the whole decoder ("layer"; on the EP path a resident
  // decoder's experts are updated on the device, so its CPU update is the common part), the LM
  // head group or the embeddings.
  using Ranges = std::vector<std::pair<std::int64_t, std::int64_t>>;
  // Whole groups, as every rank holds them (what a reduce_scatter sums).
  Ranges whole_ranges(StagePart part, int layer) const {
    if (part == StagePart::kEmbedding || part == StagePart::kLmHead) return {outer_range(part == StagePart::kLmHead)};
    const BlockLayout& b = st.layout().blocks[static_cast<std::size_t>(1 + layer)];
    const std::int64_t e0 = b.at("experts.gate").offset, e1 = b.at("experts.down").offset + b.at("experts.down").numel();
    if (part == StagePart::kExperts) return {{e0, e1 - e0}};
    if (part == StagePart::kCommon || (ep() && plan.is_resident(layer))) return {{0, e0}, {e1, b.numel - e1}};
    return {{0, b.numel}};
  }
  // Elements [lo, hi) of the concatenated ranges.
  static Ranges cut(const Ranges& ranges, std::int64_t lo, std::int64_t hi) {
    Ranges out;
    std::int64_t at_ = 0;
    for (const auto& [a, len] : ranges) {
      const std::int64_t from = std::max(lo, at_), to = std::min(hi, at_ + len);
      if (from < to) out.push_back({a + from - at_, to - from});
      at_ += len;
    }
    return out;
  }
  static std::int64_t count(const Ranges& ranges) {
    std::int64_t n = 0;
    for (const auto& r : ranges) n += r.second;
    return n;
  }
  // Rank R's 1/P of a summed group: the concatenated ranges cut into P pieces of ⌈n/P⌉.
  Ranges slice(const Ranges& ranges) const {
    const std::int64_t n = count(ranges), cap = (n + P - 1) / P, lo = std::min(n, R * cap), hi = std::min(n, lo + cap);
    return cut(ranges, lo, hi);
  }
  // Bucket `bucket` of a streamed group's ranges: even pieces, the last taking the remainder (as the
  // lowering cuts them); the whole group for bucket −1.
  Ranges bucket_ranges(StagePart part, int layer, int bucket) const {
    const Ranges all = group_ranges(part, layer);
    if (bucket < 0) return all;
    const std::int64_t pieces = buckets.at({part, layer}), n = count(all), each = n / pieces;
    const std::int64_t lo = bucket * each, hi = bucket + 1 == pieces ? n : lo + each;
    return cut(all, lo, hi);
  }
  // The owned experts' rows of a decoder's expert tensors.
  Ranges owned_experts(int layer) const {
    const BlockLayout& b = st.layout().blocks[static_cast<std::size_t>(1 + layer)];
    Ranges out;
    for (const char* name : {"experts.gate", "experts.up", "experts.down"}) {
      const auto& e = b.at(name);
      const std::int64_t per = e.numel() / spec.moe.experts;
      out.push_back({e.offset + expert0 * per, experts_local * per});
    }
    return out;
  }
  // The ranges rank R sends and updates of a group: on one rank the whole group; over ranks its
  // slice of a summed group (embedding, LM head, a decoder's common part) and its own experts.
  // Ring-DTP: the head rows of this rank's vocabulary shard, and (rank 0 only, so the shared host
  // state is updated once) the final norm, whose gradient is summed over the ranks.
  Ranges ring_head_ranges() const {
    const BlockLayout& b = st.layout().blocks[0];
    const auto& head = b.at("lm_head");
    const std::int64_t per = shard_rows() * spec.hidden;
    Ranges out;
    if (R == 0) out.push_back({b.at("final_norm").offset, b.at("final_norm").numel()});
    out.push_back({head.offset + R * per, per});
    return out;
  }
  Ranges group_ranges(StagePart part, int layer) const {
    if (part == StagePart::kLmHead && ring_dtp()) return ring_head_ranges();
    if (!dist()) return whole_ranges(part, layer);
    if (part == StagePart::kExperts) return owned_experts(layer);
    if (part != StagePart::kLayer) return slice(whole_ranges(part, layer));
    OOM_ASSERT(ep(), "the local path runs on one rank");
    Ranges out = slice(whole_ranges(StagePart::kCommon, layer));
    if (!plan.is_resident(layer)) {
      const Ranges own = owned_experts(layer);
      out.insert(out.end(), own.begin(), own.end());
    }
    return out;
  }
  static int block_of(StagePart part, int layer) { return part == StagePart::kEmbedding || part == StagePart::kLmHead ? 0 : 1 + layer; }

  // ---- passes ----
  Pass& pass_of(const Stage& s) {
    const auto it = open_pass.find(s.layer);
    OOM_ASSERT(it != open_pass.end(), "a decoder stage before its weights");
    Pass& p = passes.at(it->second);
    if (!p.started) start_pass(p);
    return p;
  }
  void start_pass(Pass& p) {
    const auto w = window.acquire(1 + p.l);
    // A retained MoE's forward graph differentiates into the forward's weights; on a GPU those sit
    // in a window slot the next decoders reuse, so the graph keeps its own copy of the weights it
    // reads: the feed-forward half's, with this rank's experts.
    const bool keep = p.kind == PassKind::kForward && retained(p.l);
    const BlockLayout& layout = st.layout().blocks[static_cast<std::size_t>(1 + p.l)];
    p.wflat = w;
    p.w = p.kind == PassKind::kBackward || keep ? leaf_views(layout, p.wflat) : block_views(layout, p.wflat);
    if (keep && (dev.is_cuda() || device_memory::emulated())) {
      device_memory::Tagged weights(MemoryUse::kOther);
      keep_feed_forward_weights(p.w);
    }
    if (p.kind == PassKind::kBackward) {
      // The decoder's gradient; a retained MoE's forward weights differentiate into it too.
      device_memory::Tagged gradient(MemoryUse::kOptimizer);
      p.grad = ep() ? BlockGrad::zeros(layout.numel, {whole_ranges(StagePart::kCommon, p.l), owned_experts(p.l)}, p.wflat.options())
                    : BlockGrad::zeros(layout.numel, {{{0, layout.numel}}}, p.wflat.options());
      attach_gradient(p.w, p.grad);
      const auto kept = retained_weights.find(p.l);
      if (kept != retained_weights.end()) attach_gradient(kept->second, p.grad);
    }
    p.x = act.at(p.l);
    // A decoder input the plan holds on the device for the backward is a checkpoint boundary.
    if (p.kind == PassKind::kForward && plan.boundaries.place(p.l) == BoundaryPolicy::Place::kGpu) {
      device_memory::retag(p.x, MemoryUse::kBoundaries);
    }
    if (p.kind == PassKind::kBackward) p.dy = dgrad.at(p.l + 1);
    p.started = true;
  }
  // The pass's output (the decoder's output, or in a backward its input gradient), allocated when
  // its first rows are written: a backward writes it at its last stage only.
  static at::Tensor& output_of(Pass& p) {
    if (!p.y.defined()) {
      device_memory::Tagged hidden(MemoryUse::kActivations);
      p.y = at::empty_like(p.x);
    }
    return p.y;
  }
  // The retained graph's own copies of the feed-forward weights (leaves, gradients attached later).
  void keep_feed_forward_weights(BlockWeights& w) const {
    const auto& entries = w.layout->entries;
    for (std::size_t i = 0; i < entries.size(); ++i) {
      const std::string& name = entries[i].name;
      const bool mixing = name.rfind("attn.", 0) == 0 || name.rfind("gdn.", 0) == 0 || name == "input_norm";
      const bool bank = w.experts.count(name) > 0;
      if (!mixing && !bank) w.tensors[i] = leaf(w.tensors[i].detach().clone());
    }
    for (auto& [bank, each] : w.experts) {
      for (int e = expert0; e < expert0 + experts_local; ++e) {
        auto& t = each[static_cast<std::size_t>(e)];
        t = leaf(t.detach().clone());
      }
    }
  }
  void end_pass(StageId id) {
    Pass& p = passes.at(id);
    OOM_ASSERT(p.y.defined(), "a decoder pass ended before writing its output");
    window.release(1 + p.l);
    const int l = p.l;
    const int cap = std::max(1, plan.boundaries.regenerate_cap);
    const bool held = plan.boundaries.place(l) == BoundaryPolicy::Place::kGpu;
    switch (p.kind) {
      case PassKind::kForward:
        act[l + 1] = p.y;
        if (!held) act.erase(l);
        if (retained(l)) retained_weights[l] = p.w;
        break;
      case PassKind::kRegenerate: {
        act[l + 1] = p.y;
        device_memory::retag(p.y, MemoryUse::kBoundaries);
        origin[l + 1] = Origin::kRegenerated;
        const Origin from = origin.count(l) ? origin.at(l) : Origin::kForward;
        if (!held && from == Origin::kRegenerated && l <= next_backward - cap) act.erase(l);
        break;
      }
      case PassKind::kBackward:
        dgrad[l] = p.y;
        // The pass lives on for its weight gradient only.
        p.x = p.y = p.dy = at::Tensor();
        p.subs.clear();
        p.fetched.clear();
        dgrad.erase(l + 1);
        act.erase(l);
        host.erase(l);
        olse.erase(l);
        next_backward = l - 1;
        backward_pass[l] = id;
        return;  // the pass lives on until its weight gradient leaves
    }
    passes.erase(id);
  }
  Sub& sub_of(Pass& p, const StageKey& k) {
    const int i = static_cast<int>(sub_index(k));
    auto [it, fresh] = p.subs.try_emplace(i);
    Sub& s = it->second;
    if (fresh) {
      s.b0 = std::int64_t{i} * sb;
      s.n = std::min(sb, B - s.b0);
      s.x = p.x.narrow(0, s.b0, s.n);
      if (p.kind == PassKind::kBackward) s.x_l = leaf(s.x);
    }
    return s;
  }
  // A chunk's context; in the backward of a retained MoE, the one its forward kept.
  Chunk& chunk_of(const Pass& p, Sub& s, const StageKey& k) {
    if (!s.chunks.count(k.chunk) && p.kind == PassKind::kBackward) {
      const auto kept = retained_moe.find({p.l, k.chunk});
      if (kept != retained_moe.end()) {
        s.chunks[k.chunk] = std::move(kept->second);
        retained_moe.erase(kept);
      }
    }
    return s.chunks[k.chunk];
  }
  // The tokens {first, count} of a sub-batch a MoE chunk covers: the Local path's
  // split.moe_chunk_tokens, the EP path's dispatch rounds of routing_chunk_tokens.
  std::pair<std::int64_t, std::int64_t> chunk_tokens(const Sub& s, const StageKey& k) const {
    return piece(s.n * S, ep() ? plan.routing_chunk_tokens : plan.split.moe_chunk_tokens, k.chunk);
  }
  static at::Tensor rows(const at::Tensor& t, const Sub& s, std::pair<std::int64_t, std::int64_t> tokens) {
    const auto r = t.narrow(0, s.b0, s.n);
    return r.reshape({-1, r.size(-1)}).narrow(0, tokens.first, tokens.second);
  }

  // ---- mixing ----
  void mix_proj(const Stage& st_, Pass& p) {
    Sub& s = sub_of(p, st_.key);
    const int l = p.l;
    const bool bwd = p.kind == PassKind::kBackward;
    const auto& x = bwd ? s.x_l : s.x;
    // In a backward the input norm keeps its output, not the decoder input (released by mix_out).
    const auto xn = bwd ? model_norm_keeping_output(x, p.w["input_norm"], spec) : model_norm(x, p.w["input_norm"], spec);
    if (attention(l)) {
      s.in = plan_ops::attention_inputs(xn, p.w, spec, spec.layer_kinds[static_cast<std::size_t>(l)]);
      if (bwd) {
        // K/V leaves in FP32: their gradients accumulate over the query-head groups in FP32.
        s.q_l = leaf(s.in.q), s.k_l = leaf(s.in.k.to(at::kFloat)), s.v_l = leaf(s.in.v.to(at::kFloat)), s.gate_l = leaf(s.in.gate);
      }
      s.outs.assign(static_cast<std::size_t>(groups(l)), at::Tensor());
      s.lses = s.outs;
    } else {
      s.gin = plan_ops::gdn_inputs(xn, p.w, spec);
      if (bwd) s.glin = {leaf(s.gin.qkv), leaf(s.gin.z), leaf(s.gin.beta), leaf(s.gin.g)};
      const GdnSpec& g = spec.gdn;
      s.state = at::zeros({s.n, g.value_heads, g.key_head_dim, g.value_head_dim}, x.options().dtype(at::kFloat).requires_grad(false));
    }
  }
  void attn_core(const Stage& st_, Pass& p) {
    Sub& s = sub_of(p, st_.key);
    const int l = p.l, G = groups(l), g = st_.key.head_group;
    const AttentionSpec& a = attn(l);
    if (p.kind != PassKind::kBackward) {
      auto r = attention_core(plan_ops::query_group(s.in.q, G, g), plan_ops::kv_group(s.in.k, G, g), plan_ops::kv_group(s.in.v, G, g),
                              a.window_tokens, cfg.model.attention_query_block, scale(l));
      s.outs[static_cast<std::size_t>(g)] = r.out;
      s.lses[static_cast<std::size_t>(g)] = r.lse.unsqueeze(-1);
    } else if (G == 1) {
      s.out_graph = attention_core(s.q_l, s.k_l, s.v_l, a.window_tokens, cfg.model.attention_query_block, scale(l)).out;
      s.outs[0] = s.out_graph.detach();
    } else {
      at::NoGradGuard no_grad;  // the groups' statistics are recomputed per group in backward
      s.outs[static_cast<std::size_t>(g)] =
          attention_core(plan_ops::query_group(s.q_l, G, g), plan_ops::kv_group(s.k_l, G, g), plan_ops::kv_group(s.v_l, G, g), a.window_tokens,
                         cfg.model.attention_query_block, scale(l))
              .out;
    }
  }
  void olse_d2h(const Stage& st_, Pass& p) {
    Sub& s = sub_of(p, st_.key);
    // O as the model keeps it, in the activations' dtype (BF16 in a BF16 run; o_proj reads it so,
    // and the flash-style backward as a flash kernel does); the LSE stays FP32. The groups' FP32
    // outputs go.
    s.out = plan_ops::merge_groups(s.outs).to(s.x.scalar_type());
    const auto lse = plan_ops::merge_groups(s.lses).squeeze(-1);
    s.outs.clear();
    s.lses.clear();
    auto& kept = olse[p.l];
    kept.resize(sub_index(st_.key) + 1);
    kept[sub_index(st_.key)] = {to_host(s.out, st.pinned()), to_host(lse, st.pinned())};
  }
  void olse_h2d(const Stage& st_, Pass& p) {
    Sub& s = sub_of(p, st_.key);
    const OLse& kept = olse.at(p.l).at(sub_index(st_.key));
    s.out = device_memory::to_device(kept.out, dev);
    if (p.kind == PassKind::kBackward) s.lse = device_memory::to_device(kept.lse, dev);
  }
  // The sequences [first, first + count) of each GDN core call over `n` sequences: as many a call
  // as the lowering prices a piece with (costmodel gdn_call_shape: C/S with whole-sequence pieces,
  // else all of them).
  std::vector<std::pair<std::int64_t, std::int64_t>> gdn_call_rows(std::int64_t n) const {
    const std::int64_t per = gdn_call_shape(n, S, plan.split.gdn_chunk_tokens).call_seqs;
    std::vector<std::pair<std::int64_t, std::int64_t>> rows;
    for (std::int64_t b0 = 0; b0 < n; b0 += per) rows.emplace_back(b0, std::min(per, n - b0));
    return rows;
  }
  // One GDN piece's recurrence over the sub-batch's sequences, a call per gdn_call_rows entry;
  // `state` [n, Hv, dk, dv] in, the end states out.
  at::Tensor gdn_calls(const plan_ops::GdnInputs& in, std::int64_t s0, std::int64_t C, const Pass& p, at::Tensor& state) {
    const auto calls = gdn_call_rows(in.qkv.size(0));
    if (calls.size() == 1) return plan_ops::gdn_core(in, s0, C, p.w, spec, cfg.model.gdn_chunk_tokens, state);
    std::vector<at::Tensor> outs, ends;
    for (const auto& [b0, m] : calls) {
      at::Tensor end = state.narrow(0, b0, m);
      outs.push_back(plan_ops::gdn_core(gdn_rows(in, b0, m), s0, C, p.w, spec, cfg.model.gdn_chunk_tokens, end));
      ends.push_back(end);
    }
    state = at::cat(ends, 0);
    return at::cat(outs, 0);
  }
  void gdn_core(const Stage& st_, Pass& p) {
    Sub& s = sub_of(p, st_.key);
    const auto [s0, C] = piece(S, plan.split.gdn_chunk_tokens, st_.key.chunk);
    if (p.kind != PassKind::kBackward) {
      s.outs.push_back(gdn_calls(s.gin, s0, C, p, s.state));
      return;
    }
    at::NoGradGuard no_grad;
    s.starts.push_back(s.state);  // gdn_core replaces the state tensor, so this one stays the chunk's start
    s.outs.push_back(gdn_calls(s.glin, s0, C, p, s.state));
  }
  void mix_out(const Stage& st_, Pass& p) {
    Sub& s = sub_of(p, st_.key);
    const int l = p.l;
    const auto dtype = s.x.scalar_type();
    const bool bwd = p.kind == PassKind::kBackward;
    if (attention(l)) {
      if (!s.out.defined()) s.out = plan_ops::merge_groups(s.outs);
      if (bwd) {
        s.out_l = leaf(s.out);
        s.mixed = post_mixing(plan_ops::attention_output(s.out_l, s.gate_l, p.w, dtype), p.w, spec);
      } else {
        s.mixed = post_mixing(plan_ops::attention_output(s.out, s.in.gate, p.w, dtype), p.w, spec);
      }
    } else {
      const auto o = s.outs.size() == 1 ? s.outs[0] : at::cat(s.outs, 2);
      if (bwd) {
        s.out_l = leaf(o);
        s.mixed = plan_ops::gdn_output(s.out_l, s.glin.z, p.w, spec, dtype);
      } else {
        s.mixed = plan_ops::gdn_output(o, s.gin.z, p.w, spec, dtype);
      }
    }
    s.h = s.x + (bwd ? s.mixed.detach() : s.mixed);
    if (bwd) {
      s.dh = at::empty_like(s.x);
      // The replay has read the decoder input for the last time once its last sub-batch is here: the
      // norm kept its output, the residual sum is made, and what is left of the input (this pass's
      // tensors, the leaves the gradient lands on) needs only its shape. Its memory goes now, as
      // the lowering releases the boundary at this stage, not at the end of the decoder's backward.
      if (s.b0 + s.n == B) p.x.storage().unsafeGetStorageImpl()->reset();
    }
  }
  void mix_out_bwd(const Stage& st_, Pass& p) {
    Sub& s = sub_of(p, st_.key);
    s.mixed.backward(s.dh);
    s.dout = s.out_l.grad();
  }
  void mix_core_bwd(const Stage& st_, Pass& p) {
    Sub& s = sub_of(p, st_.key);
    const int l = p.l;
    if (!attention(l)) {
      const auto [s0, C] = piece(S, plan.split.gdn_chunk_tokens, st_.key.chunk);
      const at::Tensor& start0 = s.starts.at(static_cast<std::size_t>(st_.key.chunk));
      // Each call recomputed and differentiated on its own, so one call's autograd graph lives at a time.
      std::vector<at::Tensor> dstarts;
      for (const auto& [b0, m] : gdn_call_rows(start0.size(0))) {
        auto start = leaf(batch_rows(start0, b0, m));
        auto state = start;
        const auto out = plan_ops::gdn_core(gdn_rows(s.glin, b0, m), s0, C, p.w, spec, cfg.model.gdn_chunk_tokens, state);
        backward_defined({out, state}, {batch_rows(s.dout.narrow(2, s0, C), b0, m), batch_rows(s.dstate, b0, m)});
        dstarts.push_back(start.grad());
      }
      const bool all = std::all_of(dstarts.begin(), dstarts.end(), [](const at::Tensor& d) { return d.defined(); });
      s.dstate = dstarts.size() == 1 ? dstarts[0] : all ? at::cat(dstarts, 0) : at::Tensor();
      return;
    }
    const AttentionSpec& a = attn(l);
    const int G = groups(l), g = st_.key.head_group;
    if (plan.keep_attention_results) {
      // Flash-style backward from the kept O/LSE, without recomputing the core.
      if (!s.dq.defined()) {
        s.dq = at::zeros(s.q_l.sizes(), s.q_l.options().dtype(at::kFloat));
        s.dk = at::zeros(s.k_l.sizes(), s.k_l.options().dtype(at::kFloat));
        s.dv = at::zeros(s.v_l.sizes(), s.v_l.options().dtype(at::kFloat));
      }
      auto grads = plan_ops::attention_core_backward(
          plan_ops::query_group(s.in.q.detach(), G, g), plan_ops::kv_group(s.in.k.detach(), G, g), plan_ops::kv_group(s.in.v.detach(), G, g),
          plan_ops::query_group(s.out, G, g), plan_ops::query_group(s.lse.unsqueeze(-1), G, g).squeeze(-1),
          plan_ops::query_group(s.dout, G, g), a.window_tokens, cfg.model.attention_query_block, scale(l));
      plan_ops::query_group(s.dq, G, g).copy_(grads.dq);
      plan_ops::kv_group(s.dk, G, g).add_(grads.dk.to(at::kFloat));  // the group's KV head
      plan_ops::kv_group(s.dv, G, g).add_(grads.dv.to(at::kFloat));
    } else if (G == 1) {
      s.out_graph.backward(s.dout);
    } else {
      s.group_graph.backward(plan_ops::query_group(s.dout, G, g));  // K/V gradients accumulate over groups
    }
  }
  void attn_core_refwd(const Stage& st_, Pass& p) {
    Sub& s = sub_of(p, st_.key);
    const AttentionSpec& a = attn(p.l);
    const int G = groups(p.l), g = st_.key.head_group;
    s.group_graph = attention_core(plan_ops::query_group(s.q_l, G, g), plan_ops::kv_group(s.k_l, G, g), plan_ops::kv_group(s.v_l, G, g),
                                   a.window_tokens, cfg.model.attention_query_block, scale(p.l))
                        .out;
  }
  void mix_proj_bwd(const Stage& st_, Pass& p) {
    Sub& s = sub_of(p, st_.key);
    if (attention(p.l)) {
      at::Tensor dq = s.dq, dk = s.dk, dv = s.dv;
      if (!plan.keep_attention_results) dq = s.q_l.grad(), dk = s.k_l.grad(), dv = s.v_l.grad();
      backward_defined({s.in.q, s.in.k, s.in.v, s.in.gate},
                       {dq.to(s.in.q.scalar_type()), dk.to(s.in.k.scalar_type()), dv.to(s.in.v.scalar_type()), grad_of(s.gate_l)});
    } else {
      backward_defined({s.gin.qkv, s.gin.z, s.gin.beta, s.gin.g},
                       {grad_of(s.glin.qkv), grad_of(s.glin.z), grad_of(s.glin.beta), grad_of(s.glin.g)});
    }
    output_of(p).narrow(0, s.b0, s.n).copy_(s.dh + s.x_l.grad());
    p.subs.erase(static_cast<int>(sub_index(st_.key)));
  }

  // ---- MoE, per token chunk ----
  // Whether a MoE stage of the pass builds autograd graphs: in backward, and in the forward of a
  // retained MoE (EP), whose graph the backward uses instead of a recompute.
  bool moe_graph(const Pass& p) const { return p.kind == PassKind::kBackward || (p.kind == PassKind::kForward && retained(p.l)); }

  void router_shared(const Stage& st_, Pass& p) {
    Sub& s = sub_of(p, st_.key);
    Chunk& c = chunk_of(p, s, st_.key);
    const auto tokens = chunk_tokens(s, st_.key);
    const auto h2 = s.h.reshape({-1, s.h.size(-1)}).narrow(0, tokens.first, tokens.second);
    if (!moe_graph(p)) {
      c.hc = h2;
      c.in = ffn_inputs(c.hc, p.w, spec);
      c.r = route_layer(c.in.router, p.w, spec);
      c.d = plan_ops::dense_terms(c.in.dense, p.w, spec);
      return;
    }
    // Router, experts and dense MLP read one normalized input, except Gemma 4's (its router reads
    // the residual and each branch has its own norm): the experts' input is a leaf either way.
    const bool one_input = !spec.gemma4();
    c.hc = leaf(h2);
    c.in = ffn_inputs(c.hc, p.w, spec);
    c.xn_l = leaf(c.in.experts);
    c.r = route_layer(one_input ? c.xn_l : c.in.router, p.w, spec);
    c.d = plan_ops::dense_terms(one_input ? c.xn_l : c.in.dense, p.w, spec);
    if (p.kind == PassKind::kBackward) keep_dense_graphs(c);
  }
  // Where the chunk's output values are not computed again (a backward's replay never computes
  // them; a retained forward has written them), the shared expert's and the dense MLP's outputs
  // are read only through their graphs, each with the output's gradient (outside Gemma 4, whose
  // norms read their values): the chunk keeps the graphs' edges, not the outputs [T, h].
  void keep_dense_graphs(Chunk& c) const {
    if (spec.gemma4()) return;
    for (at::Tensor* t : {&c.d.shared, &c.d.dense}) {
      if (t->defined() && t->requires_grad()) c.dense_edges.push_back(torch::autograd::impl::gradient_edge(*t));
      *t = at::Tensor();
    }
  }
  // The shared expert's and dense MLP's backward for the output gradient dyc (keep_dense_graphs).
  static void dense_graphs_backward(Chunk& c, const at::Tensor& dyc) {
    if (c.dense_edges.empty()) return;
    const torch::autograd::variable_list grads(c.dense_edges.size(), dyc);
    torch::autograd::Engine::get_default_engine().execute(c.dense_edges, grads, /*keep_graph=*/false, /*create_graph=*/false,
                                                          /*accumulate_grad=*/true);
    c.dense_edges.clear();
  }
  void experts(const Stage& st_, Pass& p) {
    Sub& s = sub_of(p, st_.key);
    Chunk& c = chunk_of(p, s, st_.key);
    if (dist()) {
      owned_experts_forward(c, p);
      return;
    }
    c.routed = routed_experts(moe_graph(p) ? c.xn_l : c.in.experts, c.r, p.w, spec);
    chunk_output(p, s, st_.key, c);
  }
  // A forward chunk's output rows from its routed branch: a retained MoE keeps the chunk (its graph
  // waits for the backward), any other is done with it. In a backward pass the chunk is a replay,
  // kept for the backward stages.
  void chunk_output(Pass& p, Sub& s, const StageKey& k, Chunk& c) {
    if (p.kind == PassKind::kBackward) return;
    auto out = rows(output_of(p), s, chunk_tokens(s, k));
    if (moe_graph(p)) {
      // Retained: the output from the graph's values.
      {
        at::NoGradGuard no_grad;
        const auto dense = c.d.dense.defined() ? c.d.dense.detach() : c.d.dense;
        const auto shared = c.d.shared.defined() ? c.d.shared.detach() : c.d.shared;
        out.copy_(ffn_output(c.hc.detach(), c.routed.detach(), shared, dense, p.w, spec));
      }
      keep_dense_graphs(c);
      retained_moe[{p.l, k.chunk}] = std::move(c);
    } else {
      out.copy_(ffn_output(c.hc, c.routed, c.d.shared, c.d.dense, p.w, spec));
    }
    s.chunks.erase(k.chunk);
  }
  // The gradient of a chunk's output rows dyc with respect to its routed branch, through the
  // combination (whose graph c.comb keeps for the router/shared stage).
  at::Tensor routed_gradient(Chunk& c, const Pass& p, const at::Tensor& dyc) {
    auto routed_l = leaf(c.routed);
    c.comb = ffn_output(c.hc, routed_l, c.d.shared, c.d.dense, p.w, spec);
    return torch::autograd::grad({c.comb}, {routed_l}, {dyc}, /*retain_graph=*/true)[0];
  }
  void experts_bwd(const Stage& st_, Pass& p) {
    Sub& s = sub_of(p, st_.key);
    Chunk& c = chunk_of(p, s, st_.key);
    if (dist()) {
      // The owner: its experts' backward on the rows it received, from their kept activations,
      // the weights' gradients added where they accumulate (this rank's experts' in the decoder's
      // gradient, the fetched ones' in their own); one expert at a time, with its activations'
      // gradients in three buffers of its rows.
      at::NoGradGuard no_grad;
      const auto dys = c.dy_recv.index_select(0, c.order);
      c.dy_recv = at::Tensor();
      auto dxs = at::empty_like(c.xs);
      std::int64_t a = 0;
      for (const ExpertRows& x : experts_of(c, p, true)) {
        const std::int64_t n = x.rows.numel();
        plan_ops::expert_backward(dys.narrow(0, a, n), c.xs.narrow(0, a, n), plan_ops::expert_rows(c.acts, a, n), x.w, x.dw,
                                  spec.activation, plan_ops::expert_activations(n, spec.moe.expert_intermediate, c.xs.options()),
                                  dxs.narrow(0, a, n));
        a += n;
      }
      c.d_recv = at::empty_like(dxs).index_copy_(0, c.order, dxs);  // the rows' gradients as received
      c.xs = at::Tensor();  // the rows and their activations are done with
      c.acts = {};
      return;
    }
    const auto dyc = rows(p.dy, s, chunk_tokens(s, st_.key));
    if (!spec.gemma4()) {
      c.routed.backward(dyc);
      return;
    }
    // Gemma 4 combines the branches through norms: the routed branch's output gradient first, then
    // its backward.
    c.routed.backward(routed_gradient(c, p, dyc));
    c.in.experts.backward(c.xn_l.grad());
  }
  void router_shared_bwd(const Stage& st_, Pass& p) {
    Sub& s = sub_of(p, st_.key);
    Chunk& c = chunk_of(p, s, st_.key);
    const auto tokens = chunk_tokens(s, st_.key);
    const auto dyc = rows(p.dy, s, tokens);
    auto dh = s.dh.reshape({-1, s.dh.size(-1)}).narrow(0, tokens.first, tokens.second);
    if (dist()) {
      // The combination (residual, shared expert, dense MLP), then the experts' input: the
      // gradient its rows got back from their owners plus what the router and the dense branch
      // gave the normalized input. Outside Gemma 4 the combination is a sum: each branch gets the
      // output's gradient, as does the residual.
      if (spec.gemma4()) {
        c.comb.backward(dyc);
      } else {
        dense_graphs_backward(c, dyc);
      }
      const auto g = c.xn_l.grad();
      c.in.experts.backward(g.defined() ? g + c.dxn : c.dxn);
      dh.copy_(spec.gemma4() ? c.hc.grad() : dyc + c.hc.grad());
      s.chunks.erase(st_.key.chunk);
      return;
    }
    if (!spec.gemma4()) {
      dense_graphs_backward(c, dyc);
      c.in.experts.backward(c.xn_l.grad());
      dh.copy_(dyc + c.hc.grad());
    } else {
      c.comb.backward(dyc);
      dh.copy_(c.hc.grad());
    }
    s.chunks.erase(st_.key.chunk);
  }

  // ---- MoE over ranks (EP): dispatch, owned experts, return, combine ----
  // The experts' input of a chunk: the normalized rows (a leaf in a graph).
  static const at::Tensor& expert_input(const Chunk& c) { return c.xn_l.defined() ? c.xn_l : c.in.experts; }
  void a2a_dispatch(const Stage& st_, Pass& p) {
    Sub& s = sub_of(p, st_.key);
    Chunk& c = chunk_of(p, s, st_.key);
    const plan_ops::SortedSlots slots = plan_ops::sort_slots_by_expert(c.r, spec.moe);
    const at::Tensor all_counts = group->all_gather_counts(slots.counts);
    plan_ops::DispatchSplits d = llep() ? plan_ops::balanced_dispatch_splits(all_counts, R, experts_local, llep_spills[static_cast<std::size_t>(p.l)])
                                        : plan_ops::dispatch_splits(all_counts, R, experts_local);
    c.send = std::move(d.send);
    c.recv = std::move(d.recv);
    const auto index = [&](const std::vector<std::int64_t>& r) {
      return r.empty() ? at::Tensor() : at::tensor(r, at::TensorOptions().dtype(at::kLong)).to(dev);
    };
    c.expert_rows.clear();
    for (const auto& r : d.owned_rows) c.expert_rows.push_back(index(r));
    c.fetched_rows.clear();
    for (const auto& [e, r] : d.fetched_rows) c.fetched_rows[e] = index(r);
    if (st_.phase == Phase::kForward) {
      dispatch_log.push_back(c.send);
      // The step's routing histogram, the same on every rank (every rank's counts).
      const auto summed = all_counts.sum(0).contiguous();
      const auto* n = summed.data_ptr<std::int64_t>();
      auto& pairs = routed_pairs[static_cast<std::size_t>(p.l)];
      for (int e = 0; e < spec.moe.experts; ++e) pairs[static_cast<std::size_t>(e)] += static_cast<double>(n[e]);
    }
    c.tokens_sorted = slots.tokens;
    c.weights_sorted = slots.weights;
    if (!d.send_order.empty()) {
      const auto order = index(d.send_order);
      c.tokens_sorted = c.tokens_sorted.index_select(0, order);
      c.weights_sorted = c.weights_sorted.index_select(0, order);
    }
    const auto sent = expert_input(c).detach().index_select(0, c.tokens_sorted);
    c.recv_x = group->all_to_all(sent, c.send, c.recv);
  }
  // The experts a chunk's received rows go to: this rank's, then (PipelinedLLEP) the fetched ones
  // of other ranks. Each with its rows of recv_x, its weights, and with `grads` where its weights'
  // gradients accumulate (this rank's: the decoder's gradient; fetched: their own, llep_fetch).
  struct ExpertRows {
    at::Tensor rows;
    ExpertWeights w, dw;
  };
  std::vector<ExpertRows> experts_of(const Chunk& c, const Pass& p, bool grads) const {
    std::vector<ExpertRows> out;
    for (int j = 0; j < experts_local; ++j) {
      const auto& idx = c.expert_rows[static_cast<std::size_t>(j)];
      if (!idx.defined()) continue;
      const int e = expert0 + j;
      ExpertRows x{idx, own_expert(p, e), {}};
      if (grads) x.dw = {expert_grad(p, "experts.gate", e), expert_grad(p, "experts.up", e), expert_grad(p, "experts.down", e)};
      out.push_back(std::move(x));
    }
    for (const auto& [e, idx] : c.fetched_rows) {
      ExpertRows x{idx, fetched_expert(p, e), {}};
      if (grads) {
        const auto it = p.fetched_grad.find(e);
        OOM_ASSERT(it != p.fetched_grad.end(), "a fetched expert without its gradient");
        x.dw = unpack(it->second, x.w);
      }
      out.push_back(std::move(x));
    }
    return out;
  }
  // Expert e's gradient in bank `name` (this rank's experts are in the decoder gradient's parts).
  at::Tensor expert_grad(const Pass& p, const char* name, int e) const {
    const ParamEntry& b = p.w.layout->at(name);
    const std::int64_t per = b.numel() / spec.moe.experts;
    return p.grad.range(b.offset + e * per, per).view({b.shape[1], b.shape[2]});
  }
  // The owner's experts on the rows it received, without autograd, in the experts' order: where a
  // backward follows (a replay, a retained forward) the rows and their activations are kept for it.
  void owned_experts_forward(Chunk& c, const Pass& p) {
    at::NoGradGuard no_grad;
    const std::vector<ExpertRows> ex = experts_of(c, p, false);
    std::vector<at::Tensor> rows;
    for (const ExpertRows& x : ex) rows.push_back(x.rows);
    c.order = rows.empty() ? at::empty({0}, at::TensorOptions().dtype(at::kLong).device(dev)) : at::cat(rows);
    OOM_ASSERT(c.order.numel() == c.recv_x.size(0), "received rows of no expert this rank computes");
    c.xs = c.recv_x.index_select(0, c.order);
    c.recv_x = at::Tensor();  // the received rows are the experts' rows from here on
    c.acts = plan_ops::expert_activations(c.xs.size(0), spec.moe.expert_intermediate, c.xs.options());
    auto ys = at::empty_like(c.xs);
    std::int64_t a = 0;
    for (const ExpertRows& x : ex) {
      const std::int64_t n = x.rows.numel();
      plan_ops::expert_forward(c.xs.narrow(0, a, n), x.w, spec.activation, plan_ops::expert_rows(c.acts, a, n), ys.narrow(0, a, n));
      a += n;
    }
    c.y_recv = at::empty_like(ys).index_copy_(0, c.order, ys);  // in the order the rows came
    if (!moe_graph(p)) {
      c.xs = c.order = at::Tensor();
      c.acts = {};
    }
  }

  // ---- PipelinedLLEP: the helpers' copies of spilled experts ----
  const ExpertWeights& fetched_expert(const Pass& p, int e) const {
    const auto it = p.fetched.find(e);
    OOM_ASSERT(it != p.fetched.end(), "rows of an expert this rank did not fetch");
    return it->second;
  }
  std::int64_t expert_numel(int l) const {
    const auto& layout = st.layout().blocks[static_cast<std::size_t>(1 + l)];
    std::int64_t n = 0;
    for (const char* bank : kExpertBanks) n += layout.at(bank).numel() / spec.moe.experts;
    return n;
  }
  // Expert e's (gate, up, down) as one row; in reverse, a row as the three shapes of `like`.
  static at::Tensor pack(const ExpertWeights& w) {
    return at::cat({w[0].detach().reshape(-1), w[1].detach().reshape(-1), w[2].detach().reshape(-1)});
  }
  static ExpertWeights unpack(const at::Tensor& row, const ExpertWeights& like) {
    ExpertWeights out;
    std::int64_t at0 = 0;
    for (std::size_t i = 0; i < 3; ++i) {
      const auto n = like[i].numel();
      out[i] = row.narrow(0, at0, n).view(like[i].sizes());
      at0 += n;
    }
    return out;
  }
  ExpertWeights own_expert(const Pass& p, int e) const {
    return {p.w.expert("experts.gate", e).detach(), p.w.expert("experts.up", e).detach(), p.w.expert("experts.down", e).detach()};
  }
  // One exchange over the decoder's (expert, helper) pairs: with `to_helpers` each owner sends
  // make(e) to each helper of e, else each helper sends make(e) to e's owner; returns (expert,
  // row) in the order the rows arrive (by source rank, then pair).
  std::vector<std::pair<int, at::Tensor>> llep_exchange(int l, bool to_helpers, const std::function<at::Tensor(int)>& make,
                                                        const at::TensorOptions& options) {
    const auto& spills = llep_spills[static_cast<std::size_t>(l)];
    const auto from = [&](int e, int h) { return to_helpers ? owner_of(e) : h; };
    const auto to = [&](int e, int h) { return to_helpers ? h : owner_of(e); };
    std::vector<std::int64_t> send(static_cast<std::size_t>(P), 0), recv(static_cast<std::size_t>(P), 0);
    std::vector<at::Tensor> rows;
    for (int d = 0; d < P; ++d) {
      for (const auto& [e, h] : spills) {
        if (from(e, h) != R || to(e, h) != d) continue;
        rows.push_back(make(e));
        ++send[static_cast<std::size_t>(d)];
      }
    }
    std::vector<int> arriving;
    for (int q = 0; q < P; ++q) {
      for (const auto& [e, h] : spills) {
        if (to(e, h) != R || from(e, h) != q) continue;
        arriving.push_back(e);
        ++recv[static_cast<std::size_t>(q)];
      }
    }
    const auto input = rows.empty() ? at::empty({0, expert_numel(l)}, options) : at::stack(rows);
    const auto received = group->all_to_all(input, send, recv);
    std::vector<std::pair<int, at::Tensor>> out;
    for (std::size_t i = 0; i < arriving.size(); ++i) out.emplace_back(arriving[i], received[static_cast<std::int64_t>(i)]);
    return out;
  }
  // The helpers receive the spilled experts' weights from their owners; in a backward each with a
  // zeroed gradient beside it, which the experts' backward adds into (a retained forward's chunks
  // too: their backward runs in this pass).
  void llep_fetch(Pass& p) {
    at::NoGradGuard no_grad;
    const auto arrived = llep_exchange(p.l, true, [&](int e) { return pack(own_expert(p, e)); }, p.wflat.options());
    p.fetched.clear();
    p.fetched_grad.clear();
    for (const auto& [e, row] : arrived) {
      p.fetched[e] = unpack(row, own_expert(p, e));
      if (p.kind == PassKind::kBackward) p.fetched_grad[e] = at::zeros({row.numel()}, p.grad.parts.front().second.options());
    }
  }
  // The helpers send the spilled experts' gradients to their owners, which add them into the
  // experts' gradients; the helpers' copies of those experts and their gradients are done with.
  void llep_grad_return(Pass& p) {
    at::NoGradGuard no_grad;
    const auto gradient = [&](int e) {
      const auto it = p.fetched_grad.find(e);
      OOM_ASSERT(it != p.fetched_grad.end(), "a fetched expert without its gradient");
      return it->second;
    };
    const auto arrived = llep_exchange(p.l, false, gradient, p.grad.parts.front().second.options());
    for (const auto& [e, row] : arrived) {
      const ExpertWeights own{expert_grad(p, "experts.gate", e), expert_grad(p, "experts.up", e), expert_grad(p, "experts.down", e)};
      const ExpertWeights add = unpack(row, own);
      for (std::size_t i = 0; i < 3; ++i) own[i].add_(add[i]);
    }
    p.fetched.clear();
    p.fetched_grad.clear();
  }
  void a2a_return(const Stage& st_, Pass& p) {
    Sub& s = sub_of(p, st_.key);
    Chunk& c = chunk_of(p, s, st_.key);
    const auto back = group->all_to_all(c.y_recv.contiguous(), c.recv, c.send);
    c.y_recv = at::Tensor();  // the outputs have left (the experts' backward reads the kept activations)
    c.back = moe_graph(p) ? leaf(back) : back;
  }
  void combine(const Stage& st_, Pass& p) {
    Sub& s = sub_of(p, st_.key);
    Chunk& c = chunk_of(p, s, st_.key);
    if (!spec.moe_layer(p.l)) {  // a dense layer (DeepSeek's first ones): its MLP alone, no routed branch
      c.routed = at::zeros_like(c.hc);
      return chunk_output(p, s, st_.key, c);
    }
    c.routed = lean_index_add(at::zeros_like(expert_input(c)), c.tokens_sorted,
                              c.back * c.weights_sorted.unsqueeze(1).to(c.back.scalar_type()));
    chunk_output(p, s, st_.key, c);
  }
  void a2a_grad_dispatch(const Stage& st_, Pass& p) {
    Sub& s = sub_of(p, st_.key);
    Chunk& c = chunk_of(p, s, st_.key);
    const auto dyc = rows(p.dy, s, chunk_tokens(s, st_.key));
    // The routed branch's output gradient through the combination (outside Gemma 4 a sum: the
    // output's), then through the weighted sum: the returned rows' gradients (and the routing
    // weights').
    c.routed.backward(spec.gemma4() ? routed_gradient(c, p, dyc) : dyc);
    const auto d_back = c.back.grad().defined() ? c.back.grad() : at::zeros_like(c.back);
    c.dy_recv = group->all_to_all(d_back.contiguous(), c.send, c.recv);
    c.back = c.routed = at::Tensor();  // the returned rows and their gradient are done with
  }
  void a2a_grad_return(const Stage& st_, Pass& p) {
    Sub& s = sub_of(p, st_.key);
    Chunk& c = chunk_of(p, s, st_.key);
    const auto d_sorted = group->all_to_all(c.d_recv, c.recv, c.send);
    c.d_recv = c.order = at::Tensor();  // the received rows' gradient is done with
    c.dxn = at::zeros_like(expert_input(c)).index_add(0, c.tokens_sorted, d_sorted);
  }

  // ---- Ring-DTP: rank r holds head rows [r·V/P, (r+1)·V/P) ----
  at::Tensor head_shard() const { return outer["lm_head"].narrow(0, R * shard_rows(), shard_rows()).detach(); }
  std::int64_t logits_block() const { return plan.flat.logits_block_tokens(ring.x.size(0)); }
  // Passes `t` on round the ring with the other tensors of a hop, all in flight at once (each
  // step's receive buffers are allocated before its send buffers are released).
  void ring_hop_all(std::initializer_list<at::Tensor*> ts) {
    std::vector<at::Tensor> next;
    for (at::Tensor* t : ts) next.push_back(ring_hop(*t));
    std::size_t i = 0;
    for (at::Tensor* t : ts) *t = std::move(next[i++]);
  }
  // Step s: the block held meets the shard held (hidden blocks circulating: rank r − s's block and
  // this rank's shard; head shards circulating: this rank's block and rank r − s's shard); after the
  // last step each block's log-sum-exp is complete and its mean cross-entropy is its rank's loss.
  void ring_loss(const Stage& st_) {
    if (st_.key.ring_step == 0) {
      hL = leaf(act.at(spec.layers));
      act.erase(spec.layers);
      device_memory::Tagged hidden(MemoryUse::kActivations);  // this rank's own block, normed
      ring.xn = model_norm(hL, outer["final_norm"], spec);
      ring.x = ring.xn.detach().reshape({-1, spec.hidden});
      ring.t = tgt.reshape({-1});
      ring.state = plan_ops::ring_lse_start(ring.x.size(0), ring.x.options());
      ring.weights = ring_dtp_hops(spec, ring.x.size(0), P).weights_move;
      ring.w = head_shard();
      ring.owner = R;
    }
    at::NoGradGuard no_grad;
    plan_ops::ring_fold(ring.state, ring.x, ring.w, ring.owner * shard_rows(), ring.t, spec.final_logit_softcap, logits_block());
    if (st_.key.ring_step == P - 1) {
      ring.lse = plan_ops::ring_lse(ring.state);
      loss = (ring.lse - ring.state.target).mean();
      if (ring.weights) ring.w = at::Tensor();  // the shard passing through is done with
    }
  }
  void ring_pass() {
    at::NoGradGuard no_grad;
    if (ring.weights) {
      ring_hop_all({&ring.w});
      ring.owner = (ring.owner + P - 1) % P;  // from rank r − 1
      return;
    }
    ring_hop_all({&ring.x, &ring.t, &ring.state.max, &ring.state.sum, &ring.state.target});
  }
  // Step s: the gradient of the held block against the held shard. The circulating tensor travels
  // with its FP32 gradient partial (a hidden block's or a shard's); the resident one's gradient
  // stays here. The loss is the mean over all P·n tokens.
  void ring_backward(const Stage& st_) {
    at::NoGradGuard no_grad;
    if (st_.key.ring_step == 0) {
      if (ring.weights) {
        ring.w = head_shard();
        ring.owner = R;
      }
      {
        // This rank's tokens' hidden-state gradient, or the travelling partial.
        device_memory::Tagged use(ring.weights ? MemoryUse::kActivations : MemoryUse::kVocabulary);
        ring.dx = at::zeros(ring.x.sizes(), ring.x.options().dtype(at::kFloat));
      }
      // This rank's shard's gradient, or the travelling partial.
      device_memory::Tagged use(ring.weights ? MemoryUse::kVocabulary : MemoryUse::kOptimizer);
      ring.dshard = at::zeros({shard_rows(), spec.hidden}, ring.x.options().dtype(at::kFloat));
    }
    const double scale = 1.0 / static_cast<double>(ring.x.size(0) * P);
    plan_ops::ring_backward(ring.x, ring.w, ring.owner * shard_rows(), ring.t, ring.lse, scale, spec.final_logit_softcap,
                            logits_block(), ring.dx, ring.dshard);
  }
  // After each step but the last the circulating tensor moves on with its partial; after the last
  // the partial goes home (hidden blocks: the block held then is rank r + 2 − P's; shards: rank
  // r + 1's), and the hidden-state gradient flows back through the final norm into the last
  // decoder's output; the shard's gradient and the norm's (summed over the ranks) are complete.
  void ring_grad_pass(const Stage& st_) {
    if (st_.key.ring_step + 1 < P) {
      at::NoGradGuard no_grad;
      if (ring.weights) {
        ring_hop_all({&ring.w, &ring.dshard});
        ring.owner = (ring.owner + P - 1) % P;
      } else {
        ring_hop_all({&ring.x, &ring.t, &ring.lse, &ring.dx});
      }
      return;
    }
    at::Tensor home, shard_grad;
    {
      at::NoGradGuard no_grad;
      ring.w = at::Tensor();
      if (ring.weights) {
        shard_grad = ring_hop(ring.dshard, 1);  // to rank r + 1, the shard's owner
        home = ring.dx;
      } else {
        home = ring_hop(ring.dx, 2);  // to rank r + 2 − P ≡ r + 2, the block's owner
        shard_grad = ring.dshard;
      }
      ring.dx = ring.dshard = at::Tensor();
    }
    outer_gradient(true);
    {
      at::NoGradGuard no_grad;
      auto rows = outer_grad_range(st.layout().blocks[0].at("lm_head").offset, spec.vocab * spec.hidden)
                      .view({spec.vocab, spec.hidden})
                      .narrow(0, R * shard_rows(), shard_rows());
      rows.add_(shard_grad.to(rows.scalar_type()));
      shard_grad = at::Tensor();
    }
    {
      device_memory::Tagged hidden(MemoryUse::kActivations);  // the final norm's backward
      ring.xn.backward(home.view(ring.xn.sizes()).to(ring.xn.scalar_type()));
    }
    dgrad[spec.layers] = hL.grad();
    const auto& norm = st.layout().blocks[0].at("final_norm");
    auto norm_grad = outer_grad_range(norm.offset, norm.numel());
    group->all_reduce_sum(norm_grad);
    hL = at::Tensor();
    ring = Ring{};
    drop_outer();
  }

  // ---- gradients and updates ----
  // Σ g² over the ranges of a gradient, on the device (a BlockGrad) or in one host tensor: each
  // range's norm taken in sixteenths (the FP32 copy a reduction of a BF16 range takes is a
  // sixteenth of the range's), so both reduce alike and neither copies a whole range to FP32.
  static at::Tensor range_of(const BlockGrad& grad, std::int64_t a, std::int64_t n) { return grad.range(a, n); }
  static at::Tensor range_of(const at::Tensor& grad, std::int64_t a, std::int64_t n) { return grad.narrow(0, a, n); }
  template <typename Grad>
  double sq_norm_of(const Grad& grad, const Ranges& ranges) const {
    double sum = 0;
    for (const auto& [a, n] : ranges) {
      const std::int64_t piece = std::max<std::int64_t>(1, (n + 15) / 16);
      const at::Tensor r = range_of(grad, a, n);
      for (std::int64_t i = 0; i < n; i += piece) {
        const double norm =
            at::linalg_vector_norm(r.narrow(0, i, std::min(piece, n - i)), 2, at::OptionalIntArrayRef{}, false, at::kFloat).template item<double>();
        sum += norm * norm;
      }
    }
    return sum;
  }
  // The host buffer of gradient `index` of a kind, in block coordinates (at least `numel` long).
  at::Tensor grad_buffer(int kind, int index, std::int64_t numel, const at::TensorOptions& options) {
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
  // A parameter group's gradient (or one bucket of it) into a host buffer (a whole decoder's adopted
  // as is on a CPU device).
  void send_gradient(StagePart part, int layer, int bucket, const BlockGrad& grad) {
    const int b = block_of(part, layer);
    const Ranges ranges = bucket_ranges(part, layer, bucket);
    const GradKey key{part, layer, bucket};
    if (cfg.max_grad_norm > 0) sq_norm[static_cast<std::size_t>(b)] += sq_norm_of(grad, ranges);
    if (captured != nullptr) {
      captured->resize(static_cast<std::size_t>(st.blocks()));
      at::Tensor& c = (*captured)[static_cast<std::size_t>(b)];
      device_memory::OnHost on_host;
      if (!c.defined()) c = at::zeros({st.layout().blocks[static_cast<std::size_t>(b)].numel}, at::kFloat);
      for (const auto& [a, n] : ranges) c.narrow(0, a, n).copy_(grad.range(a, n));
    }
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
  // The gradient of the LM head group (`head`) or of the embeddings, allocated (zeroed) at the
  // first backward that adds into it; a tied head adds into the embeddings' too.
  at::Tensor& outer_grad(bool head) { return head ? head_grad : embed_grad; }
  void outer_gradient(bool head) {
    device_memory::Tagged gradient(MemoryUse::kOptimizer);
    for (const bool part : {head, head && spec.tied_embeddings ? false : head}) {
      at::Tensor& g = outer_grad(part);
      if (!g.defined()) g = at::zeros({outer_range(part).second}, st.working(0).options().device(dev));
    }
    if (outer_flat.defined()) attach_outer_gradients();
  }
  // The outer leaves' gradients: views of the groups' gradients that exist.
  void attach_outer_gradients() {
    const BlockLayout& layout = st.layout().blocks[0];
    for (std::size_t i = 0; i < layout.entries.size(); ++i) {
      const ParamEntry& e = layout.entries[i];
      const bool head = e.name != "embed";
      const at::Tensor& g = outer_grad(head);
      if (g.defined()) outer.tensors[i].mutable_grad() = g.narrow(0, e.offset - outer_range(head).first, e.numel()).view(e.shape);
    }
  }
  // Elements [a, a + n) of the outer block's gradient, in block coordinates.
  at::Tensor outer_grad_range(std::int64_t a, std::int64_t n) {
    const bool head = a >= outer_range(true).first;
    return outer_grad(head).narrow(0, a - outer_range(head).first, n);
  }
  // The embedding and LM head's weights are on the device only while a stage uses them, as the
  // lowering delivers them: the embedding for its gather (and a regather), the head from its H2D
  // to the end of its backward. `head` copies the head's range, `table` the embedding's.
  void bring_outer(bool head, bool table) {
    if (!outer_flat.defined()) {
      outer_flat = at::empty({st.layout().blocks[0].numel}, st.working(0).options().device(dev));
      outer = leaf_views(st.layout().blocks[0], outer_flat);
      attach_outer_gradients();
    }
    at::NoGradGuard no_grad;
    for (const bool part : {false, true}) {
      if (part ? !head : !table) continue;
      const auto [a, n] = outer_range(part);
      outer_flat.narrow(0, a, n).copy_(st.working(0).narrow(0, a, n), /*non_blocking=*/true);
    }
  }
  void drop_outer() {
    outer_flat = at::Tensor();
    outer = BlockWeights();
  }
  // The embeddings of this rank's tokens, without a graph: the embedding's backward needs only the
  // tokens (scatter_embedding_gradient), so the table leaves the device after the gather.
  void gather_embeddings() {
    if (!outer_flat.defined()) bring_outer(false, true);  // a regather outside the embedding's delivery
    at::NoGradGuard no_grad;
    act[0] = embed(tok, outer, spec);
    drop_outer();
  }
  // The embedding table's gradient from dL/d(embeddings), as autograd computes it (through
  // Gemma 4's √h scale, then embedding_backward), added into the outer gradient's table range.
  void scatter_embedding_gradient() {
    outer_gradient(false);
    at::NoGradGuard no_grad;
    const auto& e = st.layout().blocks[0].at("embed");
    at::Tensor g = dgrad.at(0);
    if (spec.gemma4()) g = g * at::scalar_tensor(std::sqrt(static_cast<double>(spec.hidden)), g.options().dtype(embed_grad.scalar_type()));
    const auto table_grad = at::embedding_backward(g, tok, spec.vocab, /*padding_idx=*/-1, /*scale_grad_by_freq=*/false, /*sparse=*/false);
    outer_grad_range(e.offset, e.numel()).view(e.shape).add_(table_grad);
  }
  // Decoder l's weight gradient so far (a retained MoE's forward graphs add into it too): the parts
  // a stage sends are complete when the graph sends them.
  const BlockGrad& layer_grad(int l) { return passes.at(backward_pass.at(l)).grad; }
  // EP: decoder l's experts' gradient has left (D2H or the device update): its parts go, with the
  // leaves' views of them.
  void release_expert_gradient(int l) {
    Pass& p = passes.at(backward_pass.at(l));
    const auto [e0, n] = whole_ranges(StagePart::kExperts, l).front();
    p.grad.release(e0, e0 + n);
    detach_gradient(p.w, e0, e0 + n);
    if (const auto kept = retained_weights.find(l); kept != retained_weights.end()) detach_gradient(kept->second, e0, e0 + n);
  }
  // The outer block's gradient of the LM head group (`head`) or of the embeddings as a BlockGrad.
  BlockGrad outer_block_grad(bool head) {
    BlockGrad g;
    g.numel = st.layout().blocks[0].numel;
    g.parts.push_back({outer_range(head).first, outer_grad(head)});
    return g;
  }
  // The host gradients a CPU update reads, with the ranges each covers; taken from host_grad (the
  // update owns them until it is done). A decoder's EP update reads its common part and, when
  // streamed, its own experts, which were sent apart; a bucket's update reads that bucket.
  std::vector<std::pair<Ranges, at::Tensor>> take_host_gradients(StagePart part, int layer, int bucket) {
    std::vector<std::pair<Ranges, at::Tensor>> out;
    const auto take = [&](StagePart from) {
      const auto it = host_grad.find({from, layer, bucket});
      OOM_ASSERT(it != host_grad.end(), "a CPU update before its gradient's D2H");
      out.push_back({bucket_ranges(from, layer, bucket), it->second});
      host_grad.erase(it);
    };
    if (part == StagePart::kLayer && ep() && bucket < 0) {
      take(StagePart::kCommon);
      if (!plan.is_resident(layer)) take(StagePart::kExperts);
    } else {
      take(part);
    }
    return out;
  }
  void update_ranges(int b, const Ranges& ranges, const at::Tensor& grad) {
    for (const auto& [a, n] : ranges) {
      auto p = st.master(b).narrow(0, a, n);
      auto m = st.exp_avg(b).narrow(0, a, n);
      auto v = st.exp_avg_sq(b).narrow(0, a, n);
      cpu_adamw_step(p, grad.narrow(0, a, n), m, v, cfg.adam, st.step + 1, coef, cfg.adam_threads);
    }
  }
  void publish_ranges(int b, const Ranges& ranges) {
    for (const auto& [a, n] : ranges) st.working(b).narrow(0, a, n).copy_(st.master(b).narrow(0, a, n));
  }
  // The wait for a gradient's copy, taken by the first stage that consumes it (the host
  // accumulation, else the update); empty when already taken.
  std::function<void()> take_ready(StagePart part, int layer, int bucket) {
    const auto it = ready.find({part, layer, bucket});
    if (it == ready.end()) return {};
    auto fn = std::move(it->second);
    ready.erase(it);
    return fn;
  }
  // The worker's part of a stage: timed under its key on its resource.
  std::function<void()> worker_job(const Stage& s, Kernel k) {
    const StageKey key = s.key;
    const std::string kind(op_kind_name(s.op)), resource = graph->resource(s.resource).name;
    std::vector<std::function<void()>> waits;
    if (k == Kernel::kHostAccumulate || k == Kernel::kCpuAdamW) {
      // A decoder's update reads the gradients of its parts (the EP path sends experts and common apart).
      for (const StagePart part : {key.part, StagePart::kExperts, StagePart::kCommon}) {
        if (part == key.part || key.part == StagePart::kLayer) {
          if (auto w = take_ready(part, key.decoder, key.bucket)) waits.push_back(std::move(w));
        }
      }
    }
    const int b = block_of(key.part, key.decoder);
    const Ranges ranges = bucket_ranges(key.part, key.decoder, key.bucket);
    std::vector<std::pair<Ranges, at::Tensor>> grads;
    if (k == Kernel::kCpuAdamW) grads = take_host_gradients(key.part, key.decoder, key.bucket);
    return [this, key, kind, resource, k, b, ranges, grads = std::move(grads), waits = std::move(waits)] {
      for (const auto& w : waits) w();
      auto scope = rec.stage(key, kind, resource);
      switch (k) {
        case Kernel::kHostAccumulate:
          // One rank: its partial is the sum; the D2H into the host buffer is the accumulation.
          break;
        case Kernel::kCpuAdamW:
          for (const auto& [r, g] : grads) update_ranges(b, r, g);
          break;
        case Kernel::kPublish: publish_ranges(b, ranges); break;
        default: OOM_ASSERT(false, "not a worker kernel");
      }
    };
  }

  void run_stage(StageId id, Kernel k) {
    const Stage& s = graph->stage(id);
    if (on_worker(k)) {
      auto job = worker_job(s, k);
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
    device_memory::Tagged use(memory_use_of(k));
    if (k == Kernel::kNone) {
      // A join: recorded as the instant its dependencies are done.
      rec.stage(s.key, std::string(op_kind_name(s.op)), graph->resource(s.resource).name);
      return;
    }
    if (k == Kernel::kWeightsH2d) {
      // A new pass of the decoder: the copy is issued now, the pass starts at its first kernel.
      auto scope = rec.stage(s.key, std::string(op_kind_name(s.op)), graph->resource(s.resource).name);
      Pass p;
      p.l = s.layer;
      p.kind = s.phase == Phase::kForward ? PassKind::kForward : s.phase == Phase::kRecompute ? PassKind::kRegenerate : PassKind::kBackward;
      passes[id] = std::move(p);
      open_pass[s.layer] = id;
      window.prefetch(1 + s.layer);
      return;
    }
    auto scope = rec.stage(s.key, std::string(op_kind_name(s.op)), graph->resource(s.resource).name);
    bool grad_mode = k == Kernel::kLoss || k == Kernel::kRingLoss || k == Kernel::kGather || k == Kernel::kHeadBackward ||
                     k == Kernel::kScatter;
    if (in_pass(s)) {
      const Pass& p = pass_of(s);
      grad_mode = s.key.part != StagePart::kLlep &&
                  (p.kind == PassKind::kBackward || (s.key.part == StagePart::kMoe && moe_graph(p)));
    }
    at::AutoGradMode mode(grad_mode);
    switch (k) {
      case Kernel::kOuterH2d:
        // The head's part; a tied head is the embedding table itself.
        bring_outer(s.key.part == StagePart::kLmHead, s.key.part == StagePart::kEmbedding || spec.tied_embeddings);
        break;
      case Kernel::kGather:
        gather_embeddings();
        break;
      case Kernel::kRegather:
        gather_embeddings();
        origin[0] = Origin::kRegather;
        break;
      case Kernel::kBoundaryD2h: host[s.layer] = to_host(act.at(s.layer), st.pinned()); break;
      case Kernel::kBoundaryH2d:
        act[s.layer] = device_memory::to_device(host.at(s.layer), dev);
        origin[s.layer] = Origin::kLoaded;
        break;
      case Kernel::kLoss:
        hL = leaf(act.at(spec.layers));
        act.erase(spec.layers);
        // The plan's logits blocks (FLAT's vocab_chunk_tokens; 0: all of this rank's tokens at once).
        loss = head_loss(hL, tgt, outer, spec, plan.flat.logits_block_tokens(hL.size(0) * hL.size(1)));
        break;
      case Kernel::kRingLoss: ring_loss(s); break;
      case Kernel::kRingPass: ring_pass(); break;
      case Kernel::kRingBackward: ring_backward(s); break;
      case Kernel::kRingGradPass: ring_grad_pass(s); break;
      case Kernel::kHeadBackward:
        outer_gradient(true);
        // Over ranks each rank's loss is its tokens' mean: 1/P of it sums to the global mean's gradient.
        (dist() ? loss / P : loss).backward();
        loss = loss.detach();  // its graph's leaves (the head's weights) and their gradients go
        dgrad[spec.layers] = hL.grad();
        hL = at::Tensor();
        drop_outer();
        break;
      case Kernel::kScatter: scatter_embedding_gradient(); break;
      case Kernel::kOuterGradD2h: {
        const bool head = s.key.part == StagePart::kLmHead;
        send_gradient(s.key.part, -1, s.key.bucket, outer_block_grad(head));
        break;
      }
      case Kernel::kLayerGradD2h:
      case Kernel::kPartGradD2h: {
        const auto summed = reduced.find({s.key.part, s.layer});
        send_gradient(s.key.part, s.layer, s.key.bucket, summed != reduced.end() ? summed->second : layer_grad(s.layer));
        break;
      }
      case Kernel::kReduceScatter: {
        // Every rank's gradient of the group summed (an all-reduce: each rank then sends and
        // updates its 1/P, as a reduce-scatter would leave it).
        const bool outer_part = s.layer < 0;
        for (const auto& [a, n] : whole_ranges(s.key.part, s.layer)) {
          auto v = outer_part ? outer_grad_range(a, n) : layer_grad(s.layer).range(a, n);
          group->all_reduce_sum(v);
        }
        if (!outer_part) reduced[{s.key.part, s.layer}] = layer_grad(s.layer);
        break;
      }
      case Kernel::kA2aDispatch: a2a_dispatch(s, pass_of(s)); break;
      case Kernel::kA2aReturn: a2a_return(s, pass_of(s)); break;
      case Kernel::kCombine: combine(s, pass_of(s)); break;
      case Kernel::kA2aGradDispatch: a2a_grad_dispatch(s, pass_of(s)); break;
      case Kernel::kA2aGradReturn: a2a_grad_return(s, pass_of(s)); break;
      case Kernel::kLlepFetch: llep_fetch(pass_of(s)); break;
      case Kernel::kLlepGradReturn: llep_grad_return(pass_of(s)); break;
      case Kernel::kGpuAdamW: {
        // A resident expert bank's update where its gradient is (the compute device), with its
        // working copy refreshed.
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
        auto update = [this, b, ranges, grad] {
          update_ranges(b, ranges, grad);
          publish_ranges(b, ranges);
        };
        if (cfg.max_grad_norm > 0) {
          sq_norm[static_cast<std::size_t>(b)] += sq_norm_of(grad, ranges);
          deferred_device.push_back(std::move(update));
        } else {
          update();
        }
        break;
      }
      case Kernel::kMixProj: mix_proj(s, pass_of(s)); break;
      case Kernel::kAttnCore: attn_core(s, pass_of(s)); break;
      case Kernel::kAttnCoreRefwd: attn_core_refwd(s, pass_of(s)); break;
      case Kernel::kGdnCore: gdn_core(s, pass_of(s)); break;
      case Kernel::kOlseD2h: olse_d2h(s, pass_of(s)); break;
      case Kernel::kOlseH2d: olse_h2d(s, pass_of(s)); break;
      case Kernel::kMixOut: mix_out(s, pass_of(s)); break;
      case Kernel::kMixOutBwd: mix_out_bwd(s, pass_of(s)); break;
      case Kernel::kMixCoreBwd: mix_core_bwd(s, pass_of(s)); break;
      case Kernel::kMixProjBwd: mix_proj_bwd(s, pass_of(s)); break;
      case Kernel::kRouterShared: router_shared(s, pass_of(s)); break;
      case Kernel::kExperts: experts(s, pass_of(s)); break;
      case Kernel::kExpertsBwd: experts_bwd(s, pass_of(s)); break;
      case Kernel::kRouterSharedBwd: router_shared_bwd(s, pass_of(s)); break;
      default: OOM_ASSERT(false, "kernel dispatched to the wrong thread");
    }
    if (in_pass(s) && last_use[static_cast<std::size_t>(open_pass.at(s.layer))] == id) end_pass(open_pass.at(s.layer));
    for (const bool head : {false, true}) {
      if (last_outer_use[head ? 1 : 0] == id) outer_grad(head) = at::Tensor();  // its D2H has it
    }
    if (ep() && reads_expert_gradient(s, k) && last_expert_use[static_cast<std::size_t>(backward_pass.at(s.layer))] == id) {
      release_expert_gradient(s.layer);
    }
    if (reads_layer_gradient(s, k)) {
      const StageId pid = backward_pass.at(s.layer);
      if (last_grad_use[static_cast<std::size_t>(pid)] == id) {
        passes.erase(pid);
        backward_pass.erase(s.layer);
        retained_weights.erase(s.layer);
        reduced.erase({StagePart::kCommon, s.layer});
      }
    }
  }

  // The NUMA node whose memory this rank's host work uses: the node of its CPU-update resource.
  std::string host_timeline_name(const StepGraph& g) const {
    for (const Stage& s : g.stages) {
      if (s.key.rank != R || s.op != OpKind::kCpuAdamW) continue;
      const std::string& name = g.resource(s.resource).name;
      return name.substr(0, name.find('.'));
    }
    return "numa0";
  }
  StepStats run(const StepGraph& g, const at::Tensor& tokens, const at::Tensor& targets);
  // PipelinedLLEP: the (expert, helper) pairs of every decoder from llep_routing, which the graph
  // was lowered with (its fetch stages are exactly the decoders with pairs), and a fresh histogram.
  void place_fetched_experts(const StepGraph& g) {
    const int E = spec.moe.experts, L = spec.layers;
    const std::vector<LlepBalance> balance = ep_layer_balance(llep_routing, E, L, P, true);
    llep_spills.assign(static_cast<std::size_t>(L), {});
    for (int l = 0; l < L; ++l) {
      auto& pairs = llep_spills[static_cast<std::size_t>(l)];
      pairs = balance[static_cast<std::size_t>(l)].spills;
      std::sort(pairs.begin(), pairs.end());
    }
    std::set<int> fetching;
    for (const Stage& s : g.stages) {
      if (s.key.part == StagePart::kLlep && s.key.op == StageOp::kFetch) fetching.insert(s.layer);
    }
    for (int l = 0; l < L; ++l) {
      OOM_ASSERT(fetching.count(l) == (llep_spills[static_cast<std::size_t>(l)].empty() ? 0u : 1u),
                 "the graph was lowered with another routing than the runner's (GraphRunner::routing())");
    }
  }
  // Drops the step's tensors and bookkeeping (also what a step that threw left behind).
  void clear_step();
  // This rank's stages in the order the driving thread issues them: the graph's, except that under
  // SCO a boundary's load is issued as soon as the stages it depends on have run and the backward
  // has begun (into the second buffer, while the decoder after it computes its backward), as a GPU's
  // copy engine prefetches it.
  std::vector<StageId> issue_order(const StepGraph& g, const std::vector<Kernel>& kernels) const {
    std::vector<StageId> order;
    const bool prefetch = plan.flat.selective_checkpoint_offload;
    std::vector<char> issued(g.stages.size(), 0);
    std::vector<StageId> waiting;
    bool backward = false;
    if (prefetch) {
      for (const Stage& s : g.stages) {
        if (s.key.rank == R && kernels[static_cast<std::size_t>(s.id)] == Kernel::kBoundaryH2d) waiting.push_back(s.id);
      }
    }
    const auto ready = [&](StageId id) {
      if (!backward) return false;
      for (const StageId d : g.stage(id).deps) {
        if (g.stage(d).key.rank == R && !issued[static_cast<std::size_t>(d)]) return false;
      }
      return true;
    };
    const auto issue = [&](StageId id) {
      order.push_back(id);
      issued[static_cast<std::size_t>(id)] = 1;
      backward = backward || g.stage(id).phase == Phase::kBackward;
      for (auto it = waiting.begin(); it != waiting.end();) {
        if (ready(*it)) {
          const StageId w = *it;
          waiting.erase(it);
          order.push_back(w);
          issued[static_cast<std::size_t>(w)] = 1;
          it = waiting.begin();  // a load issued may make another ready
        } else {
          ++it;
        }
      }
    };
    for (const Stage& s : g.stages) {
      if (s.key.rank != R || issued[static_cast<std::size_t>(s.id)]) continue;
      if (prefetch && kernels[static_cast<std::size_t>(s.id)] == Kernel::kBoundaryH2d) {
        if (!ready(s.id)) continue;  // issued after its last dependency
        const auto it = std::find(waiting.begin(), waiting.end(), s.id);
        if (it != waiting.end()) waiting.erase(it);
      }
      issue(s.id);
    }
    OOM_ASSERT(waiting.empty(), "a boundary load whose dependencies never ran");
    return order;
  }
};

StepStats GraphRunner::Impl::run(const StepGraph& g, const at::Tensor& tokens, const at::Tensor& targets) {
  if (cfg.accumulate != 1) {
    throw InputError("", "--accumulate", std::to_string(cfg.accumulate),
                     "the plan runtime runs one micro-batch per step (a plan splits a step with split.sub_batch_seqs)");
  }
  OOM_ASSERT(g.gpus == P, "the graph was lowered for another rank count");
  OOM_ASSERT(tokens.size(0) % P == 0, "the batch splits over the ranks");
  worker.wait_all();  // a step that threw may have left updates queued
  clear_step();
  graph = &g;
  dispatch_log.clear();
  if (llep()) place_fetched_experts(g);
  routed_pairs.assign(static_cast<std::size_t>(spec.layers), std::vector<double>(static_cast<std::size_t>(spec.moe.experts), 0.0));
  // Rank R trains its share of the global batch's sequences.
  B = tokens.size(0) / P, S = tokens.size(1);
  sb = plan.split.sub_batch_seqs > 0 ? std::min(plan.split.sub_batch_seqs, B) : B;
  // Each pass ends at the last stage that belongs to it.
  std::vector<Kernel> kernels(g.stages.size());
  last_use.assign(g.stages.size(), -1);
  last_grad_use.assign(g.stages.size(), -1);
  last_outer_use = {-1, -1};
  last_expert_use.assign(g.stages.size(), -1);
  {
    std::map<int, StageId> latest;
    for (const Stage& s : g.stages) {
      if (s.key.rank != R) continue;
      const Kernel k = runnable_kernel(s);  // before any work: a graph the runner cannot run changes nothing
      kernels[static_cast<std::size_t>(s.id)] = k;
      if (s.key.op == StageOp::kGradD2h && s.key.bucket >= 0) {
        int& n = buckets[{s.key.part, s.key.decoder}];
        n = std::max(n, s.key.bucket + 1);
      }
      if (k == Kernel::kWeightsH2d) latest[s.layer] = s.id;
      if (in_pass(s)) last_use[static_cast<std::size_t>(latest.at(s.layer))] = s.id;
      if (reads_layer_gradient(s, k)) last_grad_use[static_cast<std::size_t>(latest.at(s.layer))] = s.id;
      if (reads_expert_gradient(s, k)) last_expert_use[static_cast<std::size_t>(latest.at(s.layer))] = s.id;
      if (s.layer < 0 && (k == Kernel::kOuterGradD2h || k == Kernel::kReduceScatter)) {
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
  tok = device_memory::to_device(tokens.narrow(0, R * B, B), dev);
  tgt = device_memory::to_device(targets.narrow(0, R * B, B), dev);
  sq_norm.assign(static_cast<std::size_t>(st.blocks()), 0.0);
  coef = 1.0;
  next_backward = spec.layers - 1;
  for (const StageId id : issue_order(g, kernels)) run_stage(id, kernels[static_cast<std::size_t>(id)]);
  StepStats stats;
  // Over ranks: the global mean loss, and the norm of every rank's sent slices and own experts.
  const auto over_ranks = [&](double v) {
    if (!dist()) return v;
    auto t = at::full({1}, v, at::TensorOptions().dtype(at::kDouble).device(dev));  // the group's device
    group->all_reduce_sum(t);
    return t.item<double>();
  };
  stats.loss = over_ranks(loss.item<double>() / P);
  if (cfg.max_grad_norm > 0) {
    double total = 0;
    for (double v : sq_norm) total += v;
    stats.grad_norm = std::sqrt(over_ranks(total));
    coef = clip_coefficient(stats.grad_norm, cfg.max_grad_norm);
    for (auto& update : deferred_device) update();
    for (auto& job : deferred) worker.submit(std::move(job));
  }
  worker.wait_all();
  OOM_ASSERT(passes.empty() && ready.empty() && host_grad.empty(), "every pass ended and every gradient was updated");
  if (dist() && ep()) {
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

void GraphRunner::Impl::clear_step() {
  deferred.clear();
  deferred_device.clear();
  retained_moe.clear();
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
  tok = tgt = outer_flat = head_grad = embed_grad = hL = loss = at::Tensor();
  outer = BlockWeights();
  graph = nullptr;
}

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
