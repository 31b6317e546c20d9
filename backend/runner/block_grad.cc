#include "backend/runner/block_grad.h"

#include <torch/torch.h>

namespace oom::backend::runner {

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

}  // namespace oom::backend::runner
