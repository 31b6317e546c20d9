// The decoder passes of the tensor store (tensor_store.h): a pass opened by its weights' H2D,
// started at its first kernel (weights acquired, leaves and gradient attached, input taken), its
// sub-batches and token chunks, and its end, which says what each table keeps.
#include "backend/runner/runner.h"

#include <algorithm>

#include <torch/torch.h>

#include "backend/runtime/device_memory.h"
#include "costmodel/input_error.h"

namespace oom::backend::runner {

std::pair<std::int64_t, std::int64_t> piece(std::int64_t total, std::int64_t size, int index) {
  if (size <= 0 || size >= total) return {0, total};
  const std::int64_t a = std::int64_t{index} * size;
  OOM_ASSERT(a < total, "piece index beyond the extent");
  return {a, std::min(size, total - a)};
}

Pass& Runner::pass_of(const Stage& s) {
  const auto it = open_pass.find(s.layer);
  OOM_ASSERT(it != open_pass.end(), "a decoder stage before its weights");
  Pass& p = passes.at(it->second);
  if (!p.started) start_pass(p);
  return p;
}

void Runner::start_pass(Pass& p) {
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
at::Tensor& Runner::output_of(Pass& p) {
  if (!p.y.defined()) {
    device_memory::Tagged hidden(MemoryUse::kActivations);
    p.y = at::empty_like(p.x);
  }
  return p.y;
}

// The retained graph's own copies of the feed-forward weights (leaves, gradients attached later).
void Runner::keep_feed_forward_weights(BlockWeights& w) const {
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

void Runner::end_pass(StageId id) {
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

Sub& Runner::sub_of(Pass& p, const StageKey& k) {
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
Chunk& Runner::chunk_of(const Pass& p, Sub& s, const StageKey& k) {
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
std::pair<std::int64_t, std::int64_t> Runner::chunk_tokens(const Sub& s, const StageKey& k) const {
  return piece(s.n * S, ep() ? plan.routing_chunk_tokens : plan.split.moe_chunk_tokens, k.chunk);
}

at::Tensor Runner::rows(const at::Tensor& t, const Sub& s, std::pair<std::int64_t, std::int64_t> tokens) {
  const auto r = t.narrow(0, s.b0, s.n);
  return r.reshape({-1, r.size(-1)}).narrow(0, tokens.first, tokens.second);
}

// A new pass of the decoder: the copy is issued now, the pass starts at its first kernel.
void Runner::weights_h2d(const Stage& s) {
  Pass p;
  p.l = s.layer;
  p.kind = s.phase == Phase::kForward ? PassKind::kForward : s.phase == Phase::kRecompute ? PassKind::kRegenerate : PassKind::kBackward;
  passes[s.id] = std::move(p);
  open_pass[s.layer] = s.id;
  window.prefetch(1 + s.layer);
}

}  // namespace oom::backend::runner
