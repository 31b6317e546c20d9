// backend/runtime/state.h: host buffers, the NUMA hook, publishing working copies, the CPU window.
#include "backend/runtime/state.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <set>

namespace oom::backend {
namespace {

// Master, two moments and working copy at construction; the gradient slot at its first use.
TEST(HostState, AllocatesFiveBuffersPerBlockAndCallsTheNumaHookForEach) {
  const ModelSpec spec = load_model_spec("tiny-moe");
  std::set<std::string> seen;
  std::size_t bytes = 0;
  StateOptions so;
  so.numa_hook = [&](int block, const std::string& what, void* ptr, std::size_t n) {
    EXPECT_NE(ptr, nullptr);
    seen.insert(std::to_string(block) + what);
    bytes += n;
  };
  HostState st(spec, so);
  EXPECT_EQ(seen.size(), 4u * static_cast<std::size_t>(st.blocks()));
  EXPECT_EQ(bytes, 4u * 4u * static_cast<std::size_t>(st.layout().total_numel()));
  for (int b = 0; b < st.blocks(); ++b) {
    EXPECT_EQ(st.grad_slot(b).sum().item<double>(), 0.0);  // zeroed
    EXPECT_EQ(st.grad_slot(b).data_ptr(), st.grad_slot(b).data_ptr());  // made once
  }
  EXPECT_EQ(seen.size(), 5u * static_cast<std::size_t>(st.blocks()));
  EXPECT_EQ(bytes, 5u * 4u * static_cast<std::size_t>(st.layout().total_numel()));
  EXPECT_EQ(st.pinned(), at::hasCUDA());
}

TEST(HostState, SeededInitIsDeterministicAndPublishRoundsToBf16) {
  const ModelSpec spec = load_model_spec("tiny-moe");
  StateOptions so;
  so.precision = WorkingPrecision::kBFloat16;
  HostState a(spec, so), b(spec, so), c(spec, so);
  a.init_from_seed(1);
  b.init_from_seed(1);
  c.init_from_seed(2);
  EXPECT_TRUE(at::equal(a.master(1), b.master(1)));
  EXPECT_FALSE(at::equal(a.master(1), c.master(1)));
  a.master(1).add_(1e-3);
  EXPECT_FALSE(at::equal(a.working(1), a.master(1).to(at::kBFloat16)));
  a.publish(1);
  EXPECT_TRUE(at::equal(a.working(1), a.master(1).to(at::kBFloat16)));
  // GDN decay parameters: A_log in [0, log 16], dt_bias the inverse softplus of a step in [1e-3, 0.1].
  const auto& e = a.layout().blocks[1].at("gdn.A_log");
  const auto alog = b.master(1).narrow(0, e.offset, e.numel());
  EXPECT_GE(alog.min().item<float>(), 0.0f);
  EXPECT_LE(alog.max().item<float>(), std::log(16.0f) + 1e-6f);
  const auto& d = a.layout().blocks[1].at("gdn.dt_bias");
  const auto dt = torch::softplus(b.master(1).narrow(0, d.offset, d.numel()));
  EXPECT_GE(dt.min().item<float>(), 0.999e-3f);
  EXPECT_LE(dt.max().item<float>(), 0.1001f);
}

TEST(ParamWindow, OnTheCpuHandsOutThePublishedWorkingCopyWithoutCopying) {
  const ModelSpec spec = load_model_spec("tiny-moe");
  HostState st(spec);
  st.init_from_seed(1);
  ParamWindow window(st, at::kCPU);
  window.prefetch(2);
  const auto w = window.acquire(2);
  EXPECT_EQ(w.data_ptr(), st.working(2).data_ptr());
  window.release(2);
}

}  // namespace
}  // namespace oom::backend
