#include "backend/runtime.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include "backend/host_copies.h"
#include "backend/job_queue.h"
#include "costmodel/input_error.h"

namespace oom::backend {

double clip_coefficient(double total_norm, double max_norm) {
  return std::min(1.0, max_norm / (total_norm + 1e-6));
}

StreamedTrainer::StreamedTrainer(HostState& state, TrainerConfig config, at::Device device)
    : state_(state), config_(config), device_(device), window_(state, device),
      worker_(std::make_unique<JobQueue>()) {}

StreamedTrainer::~StreamedTrainer() = default;

void StreamedTrainer::update_block(int block, double grad_scale) {
  cpu_adamw_step(state_.master(block), state_.grad_slot(block), state_.exp_avg(block), state_.exp_avg_sq(block),
                 config_.adam, state_.step + 1, grad_scale, config_.adam_threads);
  state_.publish(block);
}

StepStats StreamedTrainer::step(const at::Tensor& tokens, const at::Tensor& targets) {
  const int K = config_.accumulate;
  if (K < 1 || tokens.size(0) % K != 0) {
    throw InputError("", "--accumulate", std::to_string(K),
                     "must divide the step's " + std::to_string(tokens.size(0)) + " sequences");
  }
  const bool clip = config_.max_grad_norm > 0;
  std::vector<double> sq_norm(static_cast<std::size_t>(state_.blocks()), 0.0);
  std::vector<std::function<void()>> grad_ready(static_cast<std::size_t>(state_.blocks()));
  const auto tok_parts = tokens.chunk(K, 0), tgt_parts = targets.chunk(K, 0);
  double loss = 0.0;
  for (int k = 0; k < K; ++k) {
    loss += micro_batch(tok_parts[static_cast<std::size_t>(k)], tgt_parts[static_cast<std::size_t>(k)], k, sq_norm,
                        grad_ready);
  }

  StepStats stats;
  stats.loss = K == 1 ? loss : loss / K;
  if (clip) {
    double total = 0;
    for (double s : sq_norm) total += s;
    stats.grad_norm = std::sqrt(total);
    const double coef = clip_coefficient(stats.grad_norm, config_.max_grad_norm);
    for (int b = state_.blocks() - 1; b >= 0; --b) {
      worker_->submit([this, b, coef, ready = grad_ready[static_cast<std::size_t>(b)]] {
        ready();
        update_block(b, coef);
      });
    }
  }
  worker_->wait_all();
  ++state_.step;
  return stats;
}

// One micro-batch's forward and backward. With one micro-batch per step (K = 1) each block's
// gradient goes to its host slot and, without clipping, its update is handed to the worker at once.
// With K > 1 the micro-batch's loss is scaled by 1/K and each block's gradient is summed into an
// FP32 host buffer; the last micro-batch moves the sums into the gradient slots and hands on the
// updates as above. With clipping the squared norms are recorded on the last micro-batch and the
// caller submits the updates.
double StreamedTrainer::micro_batch(const at::Tensor& tokens, const at::Tensor& targets, int k,
                                    std::vector<double>& sq_norm, std::vector<std::function<void()>>& grad_ready) {
  const ModelSpec& spec = state_.spec();
  const ModelLayout& layout = state_.layout();
  const int L = spec.layers;
  const int K = config_.accumulate;
  const bool last_micro = k + 1 == K;
  const bool clip = config_.max_grad_norm > 0;
  const auto tok = tokens.to(device_), tgt = targets.to(device_);

  // Outer block: resident on the compute device for the whole step.
  auto outer_flat = state_.working(0).to(device_).detach().requires_grad_(true);
  const auto outer = block_views(layout.blocks[0], outer_flat);
  const auto x0 = embed(tok, outer, spec);

  // Forward without autograd, keeping each layer's input on the host; the last decoder (with
  // retain_last_decoder) runs with autograd and keeps its graph and its window slot until its backward.
  // The load-balancing loss couples the layers only through the routers' slot counts, which carry
  // no gradient: the forward sums them over every layer, then each layer's recompute adds its own
  // term coef·E/R² · Σ_e counts_e · probs_l,e, whose values sum to the loss and whose gradients are
  // exactly its gradients.
  const bool aux = spec.router_aux_loss_coef > 0;
  RouterStats routed, last_stats;
  std::vector<at::Tensor> checkpoints(static_cast<std::size_t>(L));
  at::Tensor h = x0.detach();
  at::Tensor last_w, last_x, last_y;
  if (L > 0) window_.prefetch(1);
  for (int l = 0; l < L; ++l) {
    if (l + 1 < L) window_.prefetch(l + 2);
    const auto views = [&](const at::Tensor& w) { return block_views(layout.blocks[static_cast<std::size_t>(1 + l)], w); };
    if (l + 1 == L && config_.retain_last_decoder) {
      last_w = window_.acquire(1 + l).detach().requires_grad_(true);
      last_x = h.detach().requires_grad_(true);
      last_y = decoder_layer(last_x, views(last_w), spec, l, config_.model, aux ? &last_stats : nullptr);
      if (aux) routed.add_detached(last_stats);
      h = last_y.detach();
      continue;
    }
    at::NoGradGuard no_grad;
    checkpoints[static_cast<std::size_t>(l)] = to_host(h, state_.pinned());
    h = decoder_layer(h, views(window_.acquire(1 + l)), spec, l, config_.model, aux ? &routed : nullptr);
    window_.release(1 + l);
  }
  const double aux_scale = aux ? spec.router_aux_loss_coef * spec.moe.experts /
                                     (static_cast<double>(routed.rows) * static_cast<double>(routed.rows)) / K
                               : 0.0;
  // The term of one layer from its recomputed router probabilities (autograd on).
  const auto aux_term = [&](const RouterStats& layer) { return (routed.slot_counts * layer.prob_sums).sum() * aux_scale; };
  auto hL = h.detach().requires_grad_(true);
  const auto loss = head_loss(hL, tgt, outer, spec, config_.model.loss_chunk_tokens);
  const double aux_value =
      aux ? spec.router_aux_loss_coef * router_aux_loss(routed, spec.moe.experts).item<double>() : 0.0;
  if (K == 1) {
    loss.backward();
  } else {
    (loss / K).backward();
  }
  at::Tensor g = hL.grad();

  // Where block b's gradient goes: K = 1 as before; K > 1 summed in FP32 on the host, and on the
  // last micro-batch moved into the slot (its ready function then has nothing to wait for).
  const auto deliver = [&](int b, const at::Tensor& grad) -> std::function<void()> {
    if (K == 1) return gradient_to_host(state_.grad_slot(b), grad);
    auto& sum = accumulated_[static_cast<std::size_t>(b)];
    const auto host = grad.to(at::kCPU, at::kFloat);
    if (k == 0) {
      sum = host;  // a CPU FP32 gradient is adopted: it is fresh and nothing else reads it
    } else {
      sum.add_(host);
    }
    if (last_micro) {
      state_.grad_slot(b) = sum;
      sum = at::Tensor();
    }
    return [] {};
  };
  const auto block_sq_norm = [&](int b, const at::Tensor& grad) {
    return (K == 1 ? grad : state_.grad_slot(b)).to(at::kFloat).pow(2).sum().item<double>();
  };
  if (K > 1 && accumulated_.size() != static_cast<std::size_t>(state_.blocks())) {
    accumulated_.resize(static_cast<std::size_t>(state_.blocks()));
  }

  // Backward: recompute each layer from its checkpoint, bring its gradient home, update it.
  if (L > 0) window_.prefetch(L);
  for (int l = L - 1; l >= 0; --l) {
    if (l > 0) window_.prefetch(l);
    at::Tensor w, x;
    if (last_y.defined() && l + 1 == L) {
      w = last_w;
      x = last_x;
      if (aux) {
        torch::autograd::backward({last_y, aux_term(last_stats)}, {g, at::ones({}, g.options().dtype(at::kFloat))});
      } else {
        last_y.backward(g);
      }
      last_y = at::Tensor();
    } else {
      w = window_.acquire(1 + l).detach().requires_grad_(true);
      x = checkpoints[static_cast<std::size_t>(l)].to(device_).detach().requires_grad_(true);
      checkpoints[static_cast<std::size_t>(l)] = at::Tensor();
      RouterStats layer;
      const auto y = decoder_layer(x, block_views(layout.blocks[static_cast<std::size_t>(1 + l)], w), spec, l,
                                   config_.model, aux ? &layer : nullptr);
      if (aux) {
        torch::autograd::backward({y, aux_term(layer)}, {g, at::ones({}, g.options().dtype(at::kFloat))});
      } else {
        y.backward(g);
      }
    }
    g = x.grad();
    window_.release(1 + l);
    const int b = 1 + l;
    auto ready = deliver(b, w.grad());
    if (!last_micro) continue;
    if (clip) {
      sq_norm[static_cast<std::size_t>(b)] = block_sq_norm(b, w.grad());
      grad_ready[static_cast<std::size_t>(b)] = std::move(ready);
    } else {
      worker_->submit([this, b, ready] {
        ready();
        update_block(b, 1.0);
      });
    }
  }
  x0.backward(g);
  auto ready0 = deliver(0, outer_flat.grad());
  if (last_micro) {
    if (clip) {
      sq_norm[0] = block_sq_norm(0, outer_flat.grad());
      grad_ready[0] = ready0;
    } else {
      worker_->submit([this, ready0] {
        ready0();
        update_block(0, 1.0);
      });
    }
  }
  return loss.item<double>() + aux_value;
}

}  // namespace oom::backend
