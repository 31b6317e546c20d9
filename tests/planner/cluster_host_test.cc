// Host memory and CPU work per node on a cluster: the host NUMA nodes of every node a workload
// occupies are timelines, budgets and report lines of their own (HardwareSpec::numa_of_rank's
// node-major numbering), and a budget shortfall names the node.
#include <algorithm>

#include <gtest/gtest.h>

#include "costmodel/input_error.h"
#include "planner/engine/analytic_evaluator.h"
#include "planner/lowering/lowering.h"
#include "planner/lowering/memory_report.h"
#include "planner/search/local_planner.h"
#include "planner/search/plan_pricing.h"

namespace oom {
namespace {

// Qwen3.6-35B-A3B on `gpus` GPUs of `nodes` H200 SXM nodes, global batch 2 per GPU at 4K.
WorkloadContext qwen_on_h200(int gpus, int nodes, std::optional<double> host_budget_gib = std::nullopt) {
  Workload w;
  w.model = "qwen3.6-35b-a3b";
  w.hardware = "h200-sxm-node";
  w.nodes = nodes;
  w.gpus = gpus;
  w.global_batch = 2 * gpus;
  w.seq_len = 4096;
  w.host_budget_gib = host_budget_gib;
  return resolve_workload(w, "w.json");
}

TEST(ClusterHost, EveryOccupiedNodeHasItsOwnNumaNodes) {
  const WorkloadContext ctx = qwen_on_h200(12, 2);  // 8 ranks on node 0, 4 on node 1
  const MemoryReport m = static_memory(ctx, Plan{});
  ASSERT_EQ(m.host.size(), 4u);
  EXPECT_EQ(m.host[0].ranks, 4);
  EXPECT_EQ(m.host[1].ranks, 4);
  EXPECT_EQ(m.host[2].ranks, 2);
  EXPECT_EQ(m.host[3].ranks, 2);
  EXPECT_EQ(m.host[3].label, "node 1 NUMA node 1");
  // The per-rank items scale with the ranks of each socket: node 0's sockets hold more.
  EXPECT_GT(m.host[0].total(), m.host[2].total());
  EXPECT_GT(m.host[2].total(), 0);
  EXPECT_NE(memory_report_text(m).find("node 1 NUMA node 0 (2 ranks)"), std::string::npos) << memory_report_text(m);
}

TEST(ClusterHost, ASecondNodeAddsNumaTimelinesInsteadOfSharingTheFirstNodes) {
  const WorkloadContext one = qwen_on_h200(8, 1);
  const WorkloadContext two = qwen_on_h200(16, 2);
  const PlanPricer p1(one, load_calibration_for(one.hardware));
  const PlanPricer p2(two, load_calibration_for(two.hardware));
  const PricedPlan a = p1.price(Plan{}, 4);
  const PricedPlan b = p2.price(Plan{}, 4);
  ASSERT_EQ(a.numa_peak_bytes.size(), 2u);
  ASSERT_EQ(b.numa_peak_bytes.size(), 4u);
  // Each node's sockets carry what one node's carry alone, to within the shared layers' state,
  // which two nodes split over twice the sockets.
  for (int n = 0; n < 4; ++n) {
    EXPECT_GT(b.numa_peak_bytes[static_cast<std::size_t>(n)], 0) << n;
    EXPECT_LE(b.numa_peak_bytes[static_cast<std::size_t>(n)], a.numa_peak_bytes[static_cast<std::size_t>(n % 2)]) << n;
  }
  // The graph's CPU lanes of node 1's ranks sit on node 1's NUMA nodes.
  const StepGraph g = p2.lower_plan(Plan{}, 1);
  for (const Resource& r : g.resources) {
    if (r.kind != ResourceKind::kCpuUpdate) continue;
    EXPECT_EQ(two.hardware.node_of_numa(r.numa), r.gpu / 8) << r.name;
  }
}

TEST(ClusterHost, BudgetsAreCheckedPerNodeAndAShortfallNamesTheNode) {
  const WorkloadContext ctx = qwen_on_h200(12, 2, 64.0);  // 64 GiB per node
  const Budgets b = workload_budgets(ctx);
  ASSERT_EQ(b.numa_bytes.size(), 4u);
  for (const Bytes bytes : b.numa_bytes) EXPECT_EQ(bytes, 32 * kGiB);  // each node's budget over its two sockets
  EXPECT_EQ(b.numa_name(2), "host node 1 NUMA node 0");
  // A socket past its share spills into its node's other socket (costmodel/host_placement.h):
  // node 1's first socket at 40 GiB fits beside 10 GiB on its second.
  EXPECT_FALSE(check_budgets(b, 0, {10 * kGiB, 10 * kGiB, 40 * kGiB, 10 * kGiB}, "", "the step").has_value());
  // Node 0's sockets fit, node 1's do not together; nothing spills from one node to another.
  const std::vector<Bytes> peaks = {10 * kGiB, 10 * kGiB, 40 * kGiB, 30 * kGiB};
  const auto miss = check_budgets(b, 0, peaks, "", "the step");
  ASSERT_TRUE(miss.has_value());
  EXPECT_EQ(miss->message(), "host node 1 NUMA nodes 0-1 budget 64.0 GiB < 70.0 GiB needed by the step");
}

TEST(ClusterHost, OneNodeKeepsItsNumbering) {
  const WorkloadContext ctx = qwen_on_h200(4, 1);
  const Budgets b = workload_budgets(ctx);
  ASSERT_EQ(b.numa_bytes.size(), 2u);
  EXPECT_EQ(b.numa_name(1), "host NUMA node 1");
  EXPECT_EQ(static_memory(ctx, Plan{}).host[1].label, "NUMA node 1");
}

TEST(ClusterHost, TheLocalPathStaysOnOneNode) {
  const WorkloadContext ctx = qwen_on_h200(16, 2);
  const PlanPricer pricer(ctx, load_calibration_for(ctx.hardware));
  Plan local;
  local.path = ExpertPath::kLocal;
  try {
    pricer.lower_plan(local, 1);
    FAIL();
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()),
              "field 'gpus': value 16: the Local path sums every rank's gradients in one node's host memory: its ranks "
              "must fit on one node of h200-sxm-node (8 GPUs), not 2 nodes; plan the ep path (oom plan --path ep)");
  }
  EXPECT_THROW(plan_local(pricer), InputError);
  // On one node of the same cluster it lowers.
  const WorkloadContext one = qwen_on_h200(8, 2);
  EXPECT_GT(PlanPricer(one, load_calibration_for(one.hardware)).lower_plan(local, 1).stages.size(), 0u);
}

}  // namespace
}  // namespace oom
