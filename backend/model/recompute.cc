#include "backend/model/recompute.h"

#include <memory>
#include <utility>

#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/autograd.h>

#include "costmodel/input_error.h"

namespace oom::backend {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The function travels to the backward in the context's saved data.
struct FnHolder : torch::CustomClassHolder {
  explicit FnHolder(RecomputeFn f) : fn(std::move(f)) {}
  RecomputeFn fn;
};

struct Recompute : torch::autograd::Function<Recompute> {
  static variable_list forward(AutogradContext* ctx, const RecomputeFn& fn, at::TensorList inputs) {
    ctx->saved_data["fn"] = c10::IValue::make_capsule(c10::make_intrusive<FnHolder>(fn));
    ctx->save_for_backward(inputs.vec());
    ctx->set_materialize_grads(false);
    return fn(inputs.vec());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto holder = ctx->saved_data["fn"].toCapsule();
    const RecomputeFn& fn = static_cast<FnHolder*>(holder.get())->fn;
    const variable_list saved = ctx->get_saved_variables();
    variable_list inputs, wanted;
    std::vector<std::size_t> wanted_at;
    inputs.reserve(saved.size());
    for (std::size_t i = 0; i < saved.size(); ++i) {
      auto t = saved[i].detach();
      if (ctx->needs_input_grad(i) && at::isFloatingType(t.scalar_type())) {
        t.requires_grad_(true);
        wanted.push_back(t);
        wanted_at.push_back(i);
      }
      inputs.push_back(std::move(t));
    }
    variable_list outputs;
    {
      at::AutoGradMode record(true);
      outputs = fn(inputs);
    }
    variable_list roots, seeds;
    for (std::size_t i = 0; i < outputs.size() && i < grad_outputs.size(); ++i) {
      if (!grad_outputs[i].defined() || !outputs[i].requires_grad()) continue;
      roots.push_back(outputs[i]);
      seeds.push_back(grad_outputs[i]);
    }
    variable_list grads(saved.size() + 1);  // slot 0: the function, not a tensor
    if (roots.empty() || wanted.empty()) return grads;
    const auto got = torch::autograd::grad(roots, wanted, seeds, /*retain_graph=*/false, /*create_graph=*/false,
                                           /*allow_unused=*/true);
    for (std::size_t j = 0; j < wanted_at.size(); ++j) grads[wanted_at[j] + 1] = got[j];
    return grads;
  }
};

// index_add whose backward keeps the index only.
struct IndexAddRows : torch::autograd::Function<IndexAddRows> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& out, const at::Tensor& index, const at::Tensor& source) {
    ctx->save_for_backward({index});
    return out.index_add(0, index, source);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto& grad = grad_outputs[0];
    if (!grad.defined()) return {at::Tensor(), at::Tensor(), at::Tensor()};
    const at::Tensor index = ctx->get_saved_variables()[0];
    return {ctx->needs_input_grad(0) ? grad : at::Tensor(), at::Tensor(),
            ctx->needs_input_grad(2) ? grad.index_select(0, index) : at::Tensor()};
  }
};

}  // namespace

std::vector<at::Tensor> recomputed(RecomputeFn fn, const std::vector<at::Tensor>& inputs) {
  for (const auto& t : inputs) OOM_ASSERT(t.defined(), "recomputed(): every input must be defined");
  return Recompute::apply(fn, at::TensorList(inputs));
}

namespace {
thread_local bool lean_kernels = false;
}  // namespace

LeanKernels::LeanKernels(bool on) : previous_(lean_kernels) { lean_kernels = on; }
LeanKernels::~LeanKernels() { lean_kernels = previous_; }
bool LeanKernels::active() { return lean_kernels; }

std::vector<at::Tensor> lean_kernel(const RecomputeFn& fn, const std::vector<at::Tensor>& inputs) {
  return LeanKernels::active() ? recomputed(fn, inputs) : fn(inputs);
}

at::Tensor lean_index_add(const at::Tensor& out, const at::Tensor& index, const at::Tensor& source) {
  if (!LeanKernels::active() || !at::GradMode::is_enabled() || !(out.requires_grad() || source.requires_grad())) {
    return out.index_add(0, index, source);
  }
  return IndexAddRows::apply(out, index, source);
}

}  // namespace oom::backend
