// A block's weights as autograd leaves, and its gradient on the device as flat parts that the
// leaves' gradients are views of (autograd adds each weight's gradient into its slice in place).
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include "backend/model/layout.h"
#include "backend/model/model.h"
#include "costmodel/input_error.h"

namespace oom::backend::runner {

// A tensor detached as a leaf that requires its gradient (undefined stays undefined).
at::Tensor leaf(const at::Tensor& t);

// autograd backward over the (output, gradient) pairs whose gradient is defined.
void backward_defined(const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& grads);

// The routed-expert banks of a decoder block, each [experts, ...].
inline constexpr const char* kExpertBanks[] = {"experts.gate", "experts.up", "experts.down"};

// The tensors of a flat block as leaves. With their gradients attached to the slices of one flat
// gradient (attach_gradient), autograd adds each weight's gradient into its slice in place, where
// differentiating views of one flat leaf would materialize a block-size gradient per view.
BlockWeights leaf_views(const BlockLayout& layout, const at::Tensor& flat);

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
void attach_gradient(BlockWeights& leaves, const BlockGrad& grad);
// Takes the gradients off the leaves whose elements lie in [a0, a1) (their part is released).
void detach_gradient(BlockWeights& leaves, std::int64_t a0, std::int64_t a1);

}  // namespace oom::backend::runner
