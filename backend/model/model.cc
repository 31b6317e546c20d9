// The decoder's assembly (model.h): named views of a flat block, RMSNorm (plain, 1 + w, and the
// variant that keeps its output), one decoder layer, the embeddings, the LM head and the chunked
// cross-entropy, the whole model's logits and loss. The token mixing is mixing.cc, the
// feed-forward half ffn.cc.
#include "backend/model/model.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <torch/torch.h>

#include "backend/runtime/device_memory.h"
#include "costmodel/input_error.h"

namespace oom::backend {

const at::Tensor& BlockWeights::operator[](const std::string& name) const {
  for (std::size_t i = 0; i < layout->entries.size(); ++i) {
    if (layout->entries[i].name == name) return tensors[i];
  }
  OOM_ASSERT(false, ("no weight named " + name + " in " + layout->name).c_str());
}

at::Tensor BlockWeights::expert(const std::string& name, int e) const {
  const auto bank = experts.find(name);
  return bank != experts.end() ? bank->second.at(static_cast<std::size_t>(e)) : (*this)[name][e];
}

BlockWeights block_views(const BlockLayout& layout, const at::Tensor& flat) {
  OOM_ASSERT(flat.dim() == 1 && flat.numel() == layout.numel, "flat buffer does not match its layout");
  BlockWeights w{&layout, {}, {}};
  w.tensors.reserve(layout.entries.size());
  for (const auto& e : layout.entries) w.tensors.push_back(flat.narrow(0, e.offset, e.numel()).view(e.shape));
  return w;
}

namespace {

// The norm's output in x's dtype and its FP32 1/rms [.., 1].
struct NormParts {
  at::Tensor out, r;
};
NormParts rms_norm_parts(const at::Tensor& x, const at::Tensor& weight, double eps) {
  const auto xf = x.to(at::kFloat);
  const auto r = at::rsqrt(xf.pow(2).mean({-1}, /*keepdim=*/true) + eps);
  const auto y = xf * r;
  return {(weight.defined() ? y * weight.to(at::kFloat) : y).to(x.scalar_type()), r};
}

at::Tensor rms_norm_ops(const at::Tensor& x, const at::Tensor& weight, double eps) { return rms_norm_parts(x, weight, eps).out; }

// The scale model_norm applies: w, or 1 + w in FP32 where spec.zero_centered_norm().
at::Tensor model_norm_scale(const at::Tensor& weight, const ModelSpec& spec) {
  return spec.zero_centered_norm() ? weight.to(at::kFloat) + 1.0 : weight;
}

}  // namespace

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  const auto norm = [eps](const std::vector<at::Tensor>& in) {
    return std::vector<at::Tensor>{rms_norm_ops(in[0], in.size() > 1 ? in[1] : at::Tensor(), eps)};
  };
  return lean_kernel(norm, weight.defined() ? std::vector<at::Tensor>{x, weight} : std::vector<at::Tensor>{x})[0];
}

at::Tensor model_norm(const at::Tensor& x, const at::Tensor& weight, const ModelSpec& spec) {
  return rms_norm(x, model_norm_scale(weight, spec), spec.norm_eps);
}

namespace {

// y = x̂ · w, x̂ = x · r, r = (mean(x²) + eps)^-1/2. Backward from y and r alone: x̂ = y / w,
// dx = r · (g − x̂ · mean(g · x̂)) with g = dy · w, dw = Σ dy · x̂ over the rows.
class NormKeepingOutput : public torch::autograd::Function<NormKeepingOutput> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight, double eps) {
    NormParts n = rms_norm_parts(x, weight, eps);
    ctx->save_for_backward({n.out, n.r, weight});
    return n.out;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx, torch::autograd::variable_list grad_out) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &out = saved[0], &r = saved[1], &weight = saved[2];
    const at::Tensor& dy = grad_out[0];
    if (!dy.defined()) return {at::Tensor(), at::Tensor(), at::Tensor()};
    const auto w = weight.defined() ? weight.to(at::kFloat) : at::Tensor();
    const auto xhat = w.defined() ? out.to(at::kFloat) / w : out.to(at::kFloat);
    const auto g = w.defined() ? dy.to(at::kFloat) * w : dy.to(at::kFloat);
    const auto dx = (r * (g - xhat * (g * xhat).mean({-1}, /*keepdim=*/true))).to(out.scalar_type());
    at::Tensor dw;
    if (weight.defined() && ctx->needs_input_grad(1)) {
      dw = (dy.to(at::kFloat) * xhat).reshape({-1, xhat.size(-1)}).sum(0).to(weight.scalar_type());
    }
    return {dx, dw, at::Tensor()};
  }
};

}  // namespace

at::Tensor model_norm_keeping_output(const at::Tensor& x, const at::Tensor& weight, const ModelSpec& spec) {
  return NormKeepingOutput::apply(x, model_norm_scale(weight, spec), spec.norm_eps);
}

at::Tensor decoder_layer(const at::Tensor& x, const BlockWeights& w, const ModelSpec& spec, int layer,
                         const ModelOptions& opt, RouterStats* stats) {
  const LayerKind kind = spec.layer_kinds[static_cast<std::size_t>(layer)];
  const auto xn = model_norm(x, w["input_norm"], spec);
  const auto mixed = kind == LayerKind::kLinearAttention ? gdn_mixing(xn, w, spec, opt)
                                                         : attention_mixing(xn, w, spec, kind, opt);
  return ffn_half(x + post_mixing(mixed, w, spec), w, spec, stats);
}

at::Tensor embed(const at::Tensor& tokens, const BlockWeights& outer, const ModelSpec& spec) {
  const auto& table = outer["embed"];
  const auto x = at::embedding(table, tokens);
  if (!spec.gemma4()) return x;
  // transformers' Gemma4TextScaledWordEmbedding: × √h cast to the table's dtype.
  return x * at::scalar_tensor(std::sqrt(static_cast<double>(spec.hidden)), table.options().dtype(table.scalar_type()));
}

namespace {

at::Tensor capped(const at::Tensor& logits, double softcap) {
  return softcap > 0 ? at::tanh(logits / softcap) * softcap : logits;
}

// Cross-entropy through the vocabulary projection, chunk by chunk in both directions: the forward
// keeps the per-token log-sum-exp, the backward recomputes each chunk's logits from xn and head.
// A chunk's working set is its logits in the head's dtype while they are cast and one FP32 [n, V]
// buffer (the log-sum-exp is taken in place), as the memory model's logits workspace has it; on a
// CPU standing in for a GPU it is counted as the vocabulary's (device_memory.h), the hidden-state
// gradient as activations and the head's gradient as the optimizer's.
//
// The head's gradient is each block's BF16 softmax gradient (the one dL/dx takes) against its
// hidden states, as the reference's linear backward has it. Where the head already has a gradient
// buffer of its own dtype (the graph runner allocates it before the loss's backward) the products
// are added into it and no gradient is returned, so nothing of [V, h] is allocated beside it; over
// more than one block of a BF16 head they are summed in an FP32 accumulator first (the memory
// model's 4 B per head element for the loss's backward), added in in sixteenths of its rows.
class ChunkedCrossEntropy : public torch::autograd::Function<ChunkedCrossEntropy> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& xn, const at::Tensor& head,
                            const at::Tensor& targets, double softcap, std::int64_t chunk) {
    const auto N = xn.size(0);
    device_memory::Tagged vocabulary(MemoryUse::kVocabulary);
    auto lse = at::empty({N}, xn.options().dtype(at::kFloat));
    auto total = at::zeros({}, xn.options().dtype(at::kFloat));
    for (std::int64_t t0 = 0; t0 < N; t0 += chunk) {
      const auto n = std::min(chunk, N - t0);
      auto logits = device_memory::gemm(xn.narrow(0, t0, n), head.t()).to(at::kFloat);  // [n, V]
      if (softcap > 0) logits.div_(softcap).tanh_().mul_(softcap);          // in place: one [n, V] buffer
      const auto target = logits.gather(1, targets.narrow(0, t0, n).unsqueeze(1)).squeeze(1);
      // log Σ exp(logits − max) + max, the exponentials in the logits' own buffer.
      const auto m = std::get<0>(logits.max(1, /*keepdim=*/true));
      const auto l = logits.sub_(m).exp_().sum(1).log_().add_(m.squeeze(1));
      lse.narrow(0, t0, n).copy_(l);
      total += (l - target).sum();
    }
    ctx->save_for_backward({xn, head, targets, lse});
    ctx->saved_data["softcap"] = softcap;
    ctx->saved_data["chunk"] = chunk;
    return total / static_cast<double>(N);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    const auto saved = ctx->get_saved_variables();
    const auto &xn = saved[0], &head = saved[1], &targets = saved[2], &lse = saved[3];
    const double softcap = ctx->saved_data["softcap"].toDouble();
    const std::int64_t chunk = ctx->saved_data["chunk"].toInt();
    const auto N = xn.size(0);
    const auto g = grad_out[0].to(at::kFloat) / static_cast<double>(N);
    at::Tensor dx, into = head.is_leaf() ? head.grad() : at::Tensor(), acc;
    const bool in_place = into.defined() && into.scalar_type() == head.scalar_type() && into.sizes() == head.sizes();
    const bool fp32_sum = N > chunk && head.scalar_type() != at::kFloat;
    {
      device_memory::Tagged hidden(MemoryUse::kActivations);
      dx = at::empty_like(xn);
    }
    {
      device_memory::Tagged gradient(MemoryUse::kOptimizer);
      if (fp32_sum) {
        acc = at::zeros(head.sizes(), head.options().dtype(at::kFloat));
      } else if (!in_place) {
        into = at::zeros(head.sizes(), head.options());
      }
    }
    device_memory::Tagged vocabulary(MemoryUse::kVocabulary);
    for (std::int64_t t0 = 0; t0 < N; t0 += chunk) {
      const auto n = std::min(chunk, N - t0);
      const auto xc = xn.narrow(0, t0, n);
      // In place on one [n, V] buffer: logits → softmax − one-hot → × dL/dloss.
      auto d = device_memory::gemm(xc, head.t()).to(at::kFloat);
      const auto target = targets.narrow(0, t0, n).unsqueeze(1);
      const auto lse_c = lse.narrow(0, t0, n).unsqueeze(1);
      if (softcap > 0) {
        // Capped logits cap·t with t = tanh(logits / cap), whose derivative 1 − t² scales the
        // gradient: softmax·g·(1 − t²) column block by column block (a [n, V/16] factor at a
        // time), then −g·(1 − t²) at each target.
        d.div_(softcap).tanh_();
        const auto t_target = d.gather(1, target);
        const std::int64_t V = d.size(1), cols = (V + 15) / 16;
        for (std::int64_t c0 = 0; c0 < V; c0 += cols) {
          auto block = d.narrow(1, c0, std::min(cols, V - c0));
          const auto slope = 1.0 - block * block;
          block.mul_(softcap).sub_(lse_c).exp_().mul_(g).mul_(slope);
        }
        d.scatter_add_(1, target, (t_target * t_target - 1.0) * g);
      } else {
        d.sub_(lse_c).exp_();
        d.scatter_add_(1, target, at::full({n, 1}, -1.0, d.options()));
        d.mul_(g);
      }
      if (fp32_sum) {
        {
          const auto dw = d.to(head.scalar_type());
          auto rows = dx.narrow(0, t0, n);
          device_memory::gemm_out(rows, dw, head);
          d.copy_(dw);  // the head's gradient takes the same BF16 softmax gradient
        }  // the BF16 copy released before the head's gradient product
        acc.addmm_(d.t(), xc.to(at::kFloat));
      } else {
        d = d.to(head.scalar_type());  // the FP32 buffer released (a no-op for an FP32 head)
        auto rows = dx.narrow(0, t0, n);
        device_memory::gemm_out(rows, d, head);
        device_memory::gemm_add(into, d.t(), xc);
      }
    }
    device_memory::Tagged gradient(MemoryUse::kOptimizer);
    if (fp32_sum) {
      if (!in_place) return {dx, acc.to(head.scalar_type()), at::Tensor(), at::Tensor(), at::Tensor()};
      const std::int64_t rows = head.size(0), piece = std::max<std::int64_t>(1, (rows + 15) / 16);
      for (std::int64_t r0 = 0; r0 < rows; r0 += piece) {
        const auto n = std::min(piece, rows - r0);
        into.narrow(0, r0, n).add_(acc.narrow(0, r0, n).to(head.scalar_type()));
      }
    }
    return {dx, in_place ? at::Tensor() : into, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

const at::Tensor& head_weight(const BlockWeights& outer, const ModelSpec& spec) {
  return spec.tied_embeddings ? outer["embed"] : outer["lm_head"];
}

}  // namespace

at::Tensor chunked_cross_entropy(const at::Tensor& xn, const at::Tensor& head, const at::Tensor& targets,
                                 double softcap, std::int64_t chunk_tokens) {
  return ChunkedCrossEntropy::apply(xn, head, targets, softcap, std::max<std::int64_t>(1, chunk_tokens));
}

at::Tensor head_logits(const at::Tensor& x, const BlockWeights& outer, const ModelSpec& spec) {
  const auto xn = model_norm(x, outer["final_norm"], spec);
  return capped(at::linear(xn, head_weight(outer, spec)).to(at::kFloat), spec.final_logit_softcap);
}

at::Tensor head_loss(const at::Tensor& x, const at::Tensor& targets, const BlockWeights& outer, const ModelSpec& spec,
                     std::int64_t chunk_tokens) {
  const auto xn = model_norm(x, outer["final_norm"], spec);
  return chunked_cross_entropy(xn.reshape({-1, xn.size(-1)}), head_weight(outer, spec), targets.reshape({-1}),
                               spec.final_logit_softcap, chunk_tokens);
}

at::Tensor model_logits(const at::Tensor& tokens, const std::vector<BlockWeights>& weights, const ModelSpec& spec,
                        const ModelOptions& opt) {
  OOM_ASSERT(static_cast<int>(weights.size()) == spec.layers + 1, "one weight block per layer plus the outer block");
  auto x = embed(tokens, weights[0], spec);
  for (int l = 0; l < spec.layers; ++l) x = decoder_layer(x, weights[1 + l], spec, l, opt);
  return head_logits(x, weights[0], spec);
}

at::Tensor model_loss(const at::Tensor& tokens, const at::Tensor& targets, const std::vector<BlockWeights>& weights,
                      const ModelSpec& spec, const ModelOptions& opt) {
  OOM_ASSERT(static_cast<int>(weights.size()) == spec.layers + 1, "one weight block per layer plus the outer block");
  auto x = embed(tokens, weights[0], spec);
  const bool aux = spec.router_aux_loss_coef > 0;
  RouterStats stats;
  for (int l = 0; l < spec.layers; ++l) x = decoder_layer(x, weights[1 + l], spec, l, opt, aux ? &stats : nullptr);
  const auto loss = head_loss(x, targets, weights[0], spec, opt.loss_chunk_tokens);
  return aux ? loss + spec.router_aux_loss_coef * router_aux_loss(stats, spec.moe.experts) : loss;
}

}  // namespace oom::backend
