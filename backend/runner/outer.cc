// The embedding and the LM head (outer.h): delivery, gather and regather, loss and its backward,
// the embedding's gradient scatter, their gradients.
#include "backend/runner/runner.h"

#include <cmath>

#include <torch/torch.h>

#include "backend/runtime/device_memory.h"

namespace oom::backend::runner {

// The gradient of the LM head group (`head`) or of the embeddings, allocated (zeroed) at the
// first backward that adds into it; a tied head adds into the embeddings' too.
at::Tensor& Runner::outer_grad(bool head) { return head ? head_grad : embed_grad; }

void Runner::outer_gradient(bool head) {
  device_memory::Tagged gradient(MemoryUse::kOptimizer);
  for (const bool part : {head, head && spec.tied_embeddings ? false : head}) {
    at::Tensor& g = outer_grad(part);
    if (!g.defined()) g = at::zeros({outer_range(part).second}, st.working(0).options().device(dev));
  }
  if (outer_flat.defined()) attach_outer_gradients();
}

// The outer leaves' gradients: views of the groups' gradients that exist.
void Runner::attach_outer_gradients() {
  const BlockLayout& layout = st.layout().blocks[0];
  for (std::size_t i = 0; i < layout.entries.size(); ++i) {
    const ParamEntry& e = layout.entries[i];
    const bool head = e.name != "embed";
    const at::Tensor& g = outer_grad(head);
    if (g.defined()) outer.tensors[i].mutable_grad() = g.narrow(0, e.offset - outer_range(head).first, e.numel()).view(e.shape);
  }
}

// Elements [a, a + n) of the outer block's gradient, in block coordinates.
at::Tensor Runner::outer_grad_range(std::int64_t a, std::int64_t n) {
  const bool head = a >= outer_range(true).first;
  return outer_grad(head).narrow(0, a - outer_range(head).first, n);
}

// The embedding and LM head's weights are on the device only while a stage uses them, as the
// lowering delivers them: the embedding for its gather (and a regather), the head from its H2D
// to the end of its backward. `head` copies the head's range, `table` the embedding's.
void Runner::bring_outer(bool head, bool table) {
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

void Runner::drop_outer() {
  outer_flat = at::Tensor();
  outer = BlockWeights();
}

// The embeddings of this rank's tokens, without a graph: the embedding's backward needs only the
// tokens (scatter_embedding_gradient), so the table leaves the device after the gather.
void Runner::gather_embeddings() {
  if (!outer_flat.defined()) bring_outer(false, true);  // a regather outside the embedding's delivery
  at::NoGradGuard no_grad;
  act[0] = embed(tok, outer, spec);
  drop_outer();
}

// The embedding table's gradient from dL/d(embeddings), as autograd computes it (through
// Gemma 4's √h scale, then embedding_backward), added into the outer gradient's table range.
void Runner::scatter_embedding_gradient() {
  outer_gradient(false);
  at::NoGradGuard no_grad;
  const auto& e = st.layout().blocks[0].at("embed");
  at::Tensor g = dgrad.at(0);
  if (spec.gemma4()) g = g * at::scalar_tensor(std::sqrt(static_cast<double>(spec.hidden)), g.options().dtype(embed_grad.scalar_type()));
  const auto table_grad = at::embedding_backward(g, tok, spec.vocab, /*padding_idx=*/-1, /*scale_grad_by_freq=*/false, /*sparse=*/false);
  outer_grad_range(e.offset, e.numel()).view(e.shape).add_(table_grad);
}

// The outer block's gradient of the LM head group (`head`) or of the embeddings as a BlockGrad.
BlockGrad Runner::outer_block_grad(bool head) {
  BlockGrad g;
  g.numel = st.layout().blocks[0].numel;
  g.parts.push_back({outer_range(head).first, outer_grad(head)});
  return g;
}

// The head's part; a tied head is the embedding table itself.
void Runner::outer_h2d(const Stage& s) {
  bring_outer(s.key.part == StagePart::kLmHead, s.key.part == StagePart::kEmbedding || spec.tied_embeddings);
}

void Runner::regather() {
  gather_embeddings();
  origin[0] = Origin::kRegather;
}

void Runner::head_loss_stage() {
  hL = leaf(act.at(spec.layers));
  act.erase(spec.layers);
  // The plan's logits blocks (FLAT's vocab_chunk_tokens; 0: all of this rank's tokens at once).
  loss = head_loss(hL, tgt, outer, spec, plan.flat.logits_block_tokens(hL.size(0) * hL.size(1)));
}

void Runner::head_backward() {
  outer_gradient(true);
  // Over ranks each rank's loss is its tokens' mean: 1/P of it sums to the global mean's gradient.
  (dist() ? loss / P : loss).backward();
  loss = loss.detach();  // its graph's leaves (the head's weights) and their gradients go
  dgrad[spec.layers] = hL.grad();
  hL = at::Tensor();
  drop_outer();
}

void Runner::outer_grad_d2h(const Stage& s) {
  const bool head = s.key.part == StagePart::kLmHead;
  send_gradient(s.key.part, -1, s.key.bucket, outer_block_grad(head));
}

}  // namespace oom::backend::runner
