// The one table from a stage's (part, operator) to its handler (handlers.h).
#include "backend/runner/handlers.h"

#include <stdexcept>

#include <fmt/format.h>

#include "backend/runner/runner.h"

namespace oom::backend::runner {

namespace {

using P = StagePart;
using O = StageOp;
using U = MemoryUse;
using V = Variant;
// The pass a decoder stage belongs to (started at its first kernel).
#define OOM_IN_PASS(method) [](Runner& r, const Stage& s) { r.method(s, r.pass_of(s)); }

// The memory use (MemoryUse) is what the stage's kernels allocate on the device; tensors whose role
// differs from their stage's are tagged where they are made or retagged when their role is known
// (the decoder outputs and hidden-state gradients: activations; gradients: optimizer; held and
// regenerated decoder inputs: boundaries). The loss stages run the final norm (activations) around
// the cross-entropy, which counts its logits blocks as the vocabulary's (model.h).
const Handler kHandlers[] = {
    // Embedding and LM head: weights delivery, gather, loss, backward, scatter.
    {part_set({P::kEmbedding, P::kLmHead}), O::kH2d, V::kAny, U::kOther, 0, [](Runner& r, const Stage& s) { r.outer_h2d(s); }},
    {part_set({P::kEmbedding}), O::kGather, V::kAny, U::kActivations, kBuildsGraph, [](Runner& r, const Stage&) { r.gather_embeddings(); }},
    {part_set({P::kEmbedding}), O::kRegather, V::kAny, U::kBoundaries, 0, [](Runner& r, const Stage&) { r.regather(); }},
    {part_set({P::kLmHead}), O::kLoss, V::kWhole, U::kActivations, kBuildsGraph, [](Runner& r, const Stage&) { r.head_loss_stage(); }},
    {part_set({P::kLmHead}), O::kBackward, V::kWhole, U::kActivations, kBuildsGraph, [](Runner& r, const Stage&) { r.head_backward(); }},
    {part_set({P::kEmbedding}), O::kScatter, V::kAny, U::kOptimizer, kBuildsGraph, [](Runner& r, const Stage&) { r.scatter_embedding_gradient(); }},
    // Ring-DTP.
    {part_set({P::kLmHead}), O::kLoss, V::kRing, U::kVocabulary, kBuildsGraph, [](Runner& r, const Stage& s) { r.ring_loss(s); }},
    {part_set({P::kLmHead}), O::kPass, V::kAny, U::kVocabulary, 0, [](Runner& r, const Stage&) { r.ring_pass(); }},
    {part_set({P::kLmHead}), O::kBackward, V::kRing, U::kVocabulary, 0, [](Runner& r, const Stage& s) { r.ring_backward(s); }},
    {part_set({P::kLmHead}), O::kGradPass, V::kAny, U::kVocabulary, 0, [](Runner& r, const Stage& s) { r.ring_grad_pass(s); }},
    // Decoder weights and checkpoint boundaries.
    {part_set({P::kWeights}), O::kH2d, V::kAny, U::kOther, kOpensPass, [](Runner& r, const Stage& s) { r.weights_h2d(s); }},
    {part_set({P::kBoundary}), O::kD2h, V::kAny, U::kOther, 0, [](Runner& r, const Stage& s) { r.boundary_d2h(s); }},
    {part_set({P::kBoundary}), O::kH2d, V::kAny, U::kBoundaries, kLoadsBoundary, [](Runner& r, const Stage& s) { r.boundary_h2d(s); }},
    // Mixing: attention (query-head groups, kept O/LSE) and GDN (sequence chunks).
    {part_set({P::kAttention, P::kGdn}), O::kProj, V::kAny, U::kActivations, 0, OOM_IN_PASS(mix_proj)},
    {part_set({P::kAttention}), O::kCore, V::kAny, U::kActivations, 0, OOM_IN_PASS(attn_core)},
    {part_set({P::kGdn}), O::kCore, V::kAny, U::kActivations, 0, OOM_IN_PASS(gdn_core)},
    {part_set({P::kAttention}), O::kOlseD2h, V::kAny, U::kOther, 0, OOM_IN_PASS(olse_d2h)},
    {part_set({P::kAttention}), O::kOlseH2d, V::kAny, U::kActivations, 0, OOM_IN_PASS(olse_h2d)},
    {part_set({P::kAttention, P::kGdn}), O::kOut, V::kAny, U::kActivations, 0, OOM_IN_PASS(mix_out)},
    {part_set({P::kAttention, P::kGdn}), O::kOutBwd, V::kAny, U::kActivations, 0, OOM_IN_PASS(mix_out_bwd)},
    {part_set({P::kAttention}), O::kCoreRefwd, V::kAny, U::kActivations, 0, OOM_IN_PASS(attn_core_refwd)},
    {part_set({P::kAttention, P::kGdn}), O::kCoreBwd, V::kAny, U::kActivations, 0, OOM_IN_PASS(mix_core_bwd)},
    {part_set({P::kAttention, P::kGdn}), O::kProjBwd, V::kAny, U::kActivations, 0, OOM_IN_PASS(mix_proj_bwd)},
    // Context parallelism (context.cc): the sequence's K/V. Work-free: the K/V gradients'
    // reduce-scatter, which runs in the projections' backward once the core's backward has made
    // them (the lowering emits its stage before the core's), and the GDN state's hops, which run
    // in the correction's stage (gdn.core / gdn.core_bwd) with the pieces they connect.
    {part_set({P::kAttention}), O::kAllGather, V::kAny, U::kActivations, 0, OOM_IN_PASS(attn_gather)},
    {part_set({P::kAttention}), O::kReduceScatter, V::kAny, U::kActivations, 0, [](Runner&, const Stage&) {}},
    {part_set({P::kGdn}), O::kPass, V::kAny, U::kActivations, 0, [](Runner&, const Stage&) {}},
    {part_set({P::kGdn}), O::kGradPass, V::kAny, U::kActivations, 0, [](Runner&, const Stage&) {}},
    // MoE per token chunk, and its all-to-alls over ranks (EP).
    {part_set({P::kMoe}), O::kRouterShared, V::kAny, U::kDispatch, 0, OOM_IN_PASS(router_shared)},
    {part_set({P::kMoe}), O::kExperts, V::kAny, U::kDispatch, 0, OOM_IN_PASS(experts)},
    {part_set({P::kMoe}), O::kExpertsBwd, V::kAny, U::kDispatch, 0, OOM_IN_PASS(experts_bwd)},
    {part_set({P::kMoe}), O::kRouterSharedBwd, V::kAny, U::kDispatch, 0, OOM_IN_PASS(router_shared_bwd)},
    {part_set({P::kMoe}), O::kA2aDispatch, V::kAny, U::kDispatch, 0, OOM_IN_PASS(a2a_dispatch)},
    {part_set({P::kMoe}), O::kA2aReturn, V::kAny, U::kDispatch, 0, OOM_IN_PASS(a2a_return)},
    {part_set({P::kMoe}), O::kCombine, V::kAny, U::kDispatch, 0, OOM_IN_PASS(combine)},
    {part_set({P::kMoe}), O::kA2aGradDispatch, V::kAny, U::kDispatch, 0, OOM_IN_PASS(a2a_grad_dispatch)},
    {part_set({P::kMoe}), O::kA2aGradReturn, V::kAny, U::kDispatch, 0, OOM_IN_PASS(a2a_grad_return)},
    // PipelinedLLEP.
    {part_set({P::kLlep}), O::kFetch, V::kAny, U::kDispatch, 0, [](Runner& r, const Stage& s) { r.llep_fetch(r.pass_of(s)); }},
    {part_set({P::kLlep}), O::kGradReturn, V::kAny, U::kDispatch, 0, [](Runner& r, const Stage& s) { r.llep_grad_return(r.pass_of(s)); }},
    // Gradients: reduction over ranks, D2H, the device update of resident expert banks.
    {part_set({P::kEmbedding, P::kLmHead, P::kCommon}), O::kReduceScatter, V::kAny, U::kOptimizer, kReadsLayerGrad | kReadsOuterGrad,
     [](Runner& r, const Stage& s) { r.reduce_scatter(s); }},
    // EP groups: an expert shard's gradient over its replicas; the bank all-gathers (before a pass,
    // after a resident bank's update) find it whole, as the window copies the node's host state.
    {part_set({P::kExperts}), O::kReduceScatter, V::kAny, U::kOptimizer, kReadsLayerGrad | kReadsExpertGrad,
     [](Runner& r, const Stage& s) { r.expert_reduce_scatter(s); }},
    {part_set({P::kWeights, P::kExperts}), O::kAllGather, V::kAny, U::kOther, 0, [](Runner&, const Stage&) {}},
    {part_set({P::kEmbedding, P::kLmHead}), O::kGradD2h, V::kAny, U::kOptimizer, kReadsOuterGrad, [](Runner& r, const Stage& s) { r.outer_grad_d2h(s); }},
    {part_set({P::kLayer, P::kCommon}), O::kGradD2h, V::kAny, U::kOptimizer, kReadsLayerGrad, [](Runner& r, const Stage& s) { r.layer_grad_d2h(s); }},
    {part_set({P::kExperts}), O::kGradD2h, V::kAny, U::kOptimizer, kReadsLayerGrad | kReadsExpertGrad,
     [](Runner& r, const Stage& s) { r.layer_grad_d2h(s); }},
    {part_set({P::kExperts}), O::kGpuAdamW, V::kAny, U::kOptimizer, kReadsLayerGrad | kReadsExpertGrad, [](Runner& r, const Stage& s) { r.gpu_adamw(s); }},
    // The worker thread: host accumulation, CPU AdamW and publication; a streamed update
    // (OffloadStreamAdamW) updates and publishes each bucket of a part on its own.
    {part_set({P::kLayer}), O::kHostAccumulate, V::kAny, U::kOther, kWaitsGradCopy, nullptr,
     [](Runner&, const Stage&) { return Runner::host_accumulate_job(); }},
    {part_set({P::kLayer, P::kEmbedding, P::kLmHead}), O::kCpuAdamW, V::kAny, U::kOther, kWaitsGradCopy, nullptr,
     [](Runner& r, const Stage& s) { return r.cpu_adamw_job(s); }},
    {part_set({P::kExperts, P::kCommon}), O::kCpuAdamW, V::kBucket, U::kOther, kWaitsGradCopy, nullptr,
     [](Runner& r, const Stage& s) { return r.cpu_adamw_job(s); }},
    {part_set({P::kLayer, P::kEmbedding, P::kLmHead}), O::kPublish, V::kAny, U::kOther, 0, nullptr,
     [](Runner& r, const Stage& s) { return r.publish_job(s); }},
    {part_set({P::kExperts, P::kCommon}), O::kPublish, V::kBucket, U::kOther, 0, nullptr, [](Runner& r, const Stage& s) { return r.publish_job(s); }},
};
#undef OOM_IN_PASS

// A sync stage: no work.
const Handler kJoin{};

bool takes(const Handler& h, const Stage& s) {
  if ((h.parts & (1u << static_cast<unsigned>(s.key.part))) == 0 || h.op != s.key.op) return false;
  switch (h.variant) {
    case Variant::kAny: return true;
    case Variant::kRing: return s.key.ring_step >= 0;
    case Variant::kWhole: return s.key.ring_step < 0;
    case Variant::kBucket: return s.key.bucket >= 0;
  }
  return false;
}

}  // namespace

const Handler& handler_of(const Stage& s) {
  if (s.op == OpKind::kSync) return kJoin;
  for (const Handler& h : kHandlers) {
    if (takes(h, s)) return h;
  }
  throw std::logic_error(fmt::format("the graph runner has no kernel for stage {} ({})", s.name, op_kind_name(s.op)));
}

}  // namespace oom::backend::runner
