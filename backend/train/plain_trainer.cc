#include "backend/train/plain_trainer.h"

#include <torch/torch.h>

#include "costmodel/input_error.h"

namespace oom::backend {

struct PlainTrainer::Impl {
  const ModelSpec spec;
  const ModelLayout layout;
  TrainerConfig config;
  std::vector<BlockWeights> weights;
  std::vector<torch::Tensor> params;  // every leaf, layout order
  std::unique_ptr<torch::optim::AdamW> optimizer;

  Impl(const HostState& init, TrainerConfig c) : spec(init.spec()), layout(init.layout()), config(c) {
    for (int b = 0; b < init.blocks(); ++b) {
      const auto& block = layout.blocks[static_cast<std::size_t>(b)];
      BlockWeights w{&block, {}, {}};
      for (const auto& e : block.entries) {
        auto t = init.master(b).narrow(0, e.offset, e.numel()).view(e.shape).clone().set_requires_grad(true);
        w.tensors.push_back(t);
        params.push_back(t);
      }
      weights.push_back(std::move(w));
    }
    auto opts = torch::optim::AdamWOptions(c.adam.lr)
                    .betas({c.adam.beta1, c.adam.beta2})
                    .eps(c.adam.eps)
                    .weight_decay(c.adam.weight_decay);
    optimizer = std::make_unique<torch::optim::AdamW>(params, opts);
  }
};

PlainTrainer::PlainTrainer(const HostState& init, TrainerConfig config)
    : impl_(std::make_unique<Impl>(init, config)) {}

PlainTrainer::~PlainTrainer() = default;

StepStats PlainTrainer::step(const at::Tensor& tokens, const at::Tensor& targets) {
  Impl& s = *impl_;
  s.optimizer->zero_grad();
  const int K = s.config.accumulate;
  if (K < 1 || tokens.size(0) % K != 0) {
    throw InputError("", "--accumulate", std::to_string(K),
                     "must divide the step's " + std::to_string(tokens.size(0)) + " sequences");
  }
  StepStats stats;
  if (K == 1) {
    const auto loss = model_loss(tokens, targets, s.weights, s.spec, s.config.model);
    loss.backward();
    stats.loss = loss.item<double>();
  } else {
    // Autograd sums the micro-batches' gradients in the leaves' .grad.
    const auto tok = tokens.chunk(K, 0), tgt = targets.chunk(K, 0);
    for (int k = 0; k < K; ++k) {
      const auto loss = model_loss(tok[static_cast<std::size_t>(k)], tgt[static_cast<std::size_t>(k)], s.weights,
                                   s.spec, s.config.model);
      (loss / K).backward();
      stats.loss += loss.item<double>();
    }
    stats.loss /= K;
  }
  // A weight the loss does not depend on (Gemma 4's layer_scalar enters without gradient) gets a
  // zero gradient rather than none, so AdamW decays it as the flat-buffer trainers do instead of
  // skipping it.
  for (auto& p : s.params) {
    if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
  }
  if (s.config.max_grad_norm > 0) {
    stats.grad_norm = torch::nn::utils::clip_grad_norm_(s.params, s.config.max_grad_norm);
  }
  s.optimizer->step();
  return stats;
}

void PlainTrainer::set_lr(double lr) {
  impl_->config.adam.lr = lr;
  for (auto& group : impl_->optimizer->param_groups()) {
    static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
  }
}

std::vector<at::Tensor> PlainTrainer::flat_params() const {
  std::vector<at::Tensor> out;
  for (const auto& w : impl_->weights) {
    std::vector<at::Tensor> parts;
    for (const auto& t : w.tensors) parts.push_back(t.detach().reshape({-1}));
    out.push_back(at::cat(parts));
  }
  return out;
}

}  // namespace oom::backend
