// Routing model: expert shares of each kind, EP rank loads, LLEP's rebalancing, the JSON form.
#include "costmodel/routing.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <numeric>

#include <gtest/gtest.h>

#include "costmodel/input_error.h"
#include "costmodel/workload.h"

namespace oom {
namespace {

double sum(const std::vector<double>& v) { return std::accumulate(v.begin(), v.end(), 0.0); }

RoutingSpec parse(const nlohmann::json& j, const std::string& file = "w.json") { return routing_from_json(j, file, "routing"); }

std::string error_of(const nlohmann::json& j) {
  try {
    parse(j);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(Routing, UniformGivesEveryExpertItsMeanShare) {
  const auto s = expert_shares(RoutingSpec{}, 8, 3);
  for (double x : s) EXPECT_DOUBLE_EQ(x, 0.125);
  const auto loads = ep_rank_loads(s, 4);
  for (double l : loads) EXPECT_DOUBLE_EQ(l, 1.0);
}

TEST(Routing, ZipfSharesFollowRankToThePowerMinusSkew) {
  const RoutingSpec z = parse({{"kind", "zipf"}, {"skew", 1.2}});
  std::vector<double> s = expert_shares(z, 64, 0);
  EXPECT_NEAR(sum(s), 1.0, 1e-12);
  std::sort(s.rbegin(), s.rend());
  for (int i = 1; i < 64; ++i) EXPECT_NEAR(s[static_cast<std::size_t>(i)] / s[0], std::pow(i + 1.0, -1.2), 1e-12);
  // Skew 0 is uniform; each layer has its own hot experts; the same spec gives the same shares.
  for (double x : expert_shares(parse({{"kind", "zipf"}, {"skew", 0.0}}), 16, 2)) EXPECT_NEAR(x, 1.0 / 16, 1e-15);
  EXPECT_NE(expert_shares(z, 64, 0), expert_shares(z, 64, 1));
  EXPECT_EQ(expert_shares(z, 64, 5), expert_shares(z, 64, 5));
  EXPECT_NE(expert_shares(z, 64, 0), expert_shares(parse({{"kind", "zipf"}, {"skew", 1.2}, {"seed", 7}}), 64, 0));
}

TEST(Routing, DirichletConcentrationSetsTheSkew) {
  const auto flat = expert_shares(parse({{"kind", "dirichlet"}, {"skew", 1e4}}), 32, 0);
  const auto skewed = expert_shares(parse({{"kind", "dirichlet"}, {"skew", 0.1}}), 32, 0);
  EXPECT_NEAR(sum(flat), 1.0, 1e-12);
  EXPECT_NEAR(sum(skewed), 1.0, 1e-12);
  EXPECT_LT(*std::max_element(flat.begin(), flat.end()) / *std::min_element(flat.begin(), flat.end()), 1.2);
  EXPECT_GT(max_load(ep_rank_loads(skewed, 4)), max_load(ep_rank_loads(flat, 4)));
  for (double x : skewed) EXPECT_GE(x, 0.0);
}

TEST(Routing, HistogramCountsPerLayerOrForAll) {
  const RoutingSpec one = parse({{"kind", "histogram"}, {"counts", {3, 1, 0, 4}}});
  EXPECT_EQ(expert_shares(one, 4, 9), (std::vector<double>{0.375, 0.125, 0.0, 0.5}));
  const RoutingSpec per = parse({{"kind", "histogram"}, {"counts", {{1, 1}, {3, 1}}}});
  EXPECT_EQ(expert_shares(per, 2, 1), (std::vector<double>{0.75, 0.25}));
  EXPECT_NO_THROW(check_routing(per, 2, 2, "w.json", "routing"));
  EXPECT_THROW(check_routing(per, 2, 3, "w.json", "routing"), InputError);
  EXPECT_THROW(check_routing(one, 8, 3, "w.json", "routing"), InputError);
  EXPECT_EQ(parse(routing_to_json(per)), per);
  EXPECT_EQ(parse(routing_to_json(one)), one);
}

TEST(Routing, HistogramFileIsReadBesideTheWorkload) {
  const auto dir = std::filesystem::temp_directory_path() / "oom_routing_test";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "hist.json") << R"({"counts": [2, 2, 4, 0]})";
  const RoutingSpec r = parse({{"kind", "histogram"}, {"file", "hist.json"}}, (dir / "w.json").string());
  EXPECT_EQ(expert_shares(r, 4, 0), (std::vector<double>{0.25, 0.25, 0.5, 0.0}));
  std::filesystem::remove_all(dir);
}

TEST(Routing, LoadsOfContiguousPlacement) {
  // Experts 0,1 on rank 0 and 2,3 on rank 1: rank 0 receives 0.7 of the assignments.
  const auto loads = ep_rank_loads({0.5, 0.2, 0.2, 0.1}, 2);
  EXPECT_NEAR(loads[0], 1.4, 1e-12);
  EXPECT_NEAR(loads[1], 0.6, 1e-12);
}

TEST(Routing, LeastLoadedSpillsTheExcessToTheLeastLoaded) {
  const RoutingSpec z = parse({{"kind", "zipf"}, {"skew", 1.5}});
  for (int layer = 0; layer < 4; ++layer) {
    const auto shares = expert_shares(z, 64, layer);
    const double before = max_load(ep_rank_loads(shares, 8));
    const LlepBalance b = least_loaded_ep(shares, 8, 0.05);
    EXPECT_GT(before, 1.05);
    EXPECT_LE(max_load(b.loads), 1.05 + 1e-9);
    EXPECT_NEAR(sum(b.loads), 8.0, 1e-9);  // nothing lost, nothing invented
    const int fetched = std::accumulate(b.fetched.begin(), b.fetched.end(), 0);
    const int lent = std::accumulate(b.lent.begin(), b.lent.end(), 0);
    EXPECT_EQ(fetched, b.spilled_experts);
    EXPECT_EQ(lent, b.spilled_experts);
    EXPECT_GT(b.spilled_experts, 0);
  }
  // Balanced routing spills nothing.
  const LlepBalance even = least_loaded_ep(std::vector<double>(16, 1.0 / 16), 4, 0.05);
  EXPECT_EQ(even.spilled_experts, 0);
}

TEST(Routing, BadInputNamesTheField) {
  EXPECT_NE(error_of({{"kind", "pareto"}}).find("routing.kind"), std::string::npos);
  EXPECT_NE(error_of({{"kind", "uniform"}, {"skew", 1.0}}).find("routing.skew"), std::string::npos);
  EXPECT_NE(error_of({{"kind", "zipf"}}).find("routing.skew"), std::string::npos);
  EXPECT_NE(error_of({{"kind", "zipf"}, {"skew", -1.0}}).find("routing.skew"), std::string::npos);
  EXPECT_NE(error_of({{"kind", "histogram"}}).find("routing.kind"), std::string::npos);
  EXPECT_NE(error_of({{"kind", "histogram"}, {"counts", {1, -2}}}).find("routing.counts[1]"), std::string::npos);
  EXPECT_NE(error_of({{"kind", "histogram"}, {"counts", {0, 0}}}).find("positive sum"), std::string::npos);
  EXPECT_NE(error_of({{"kind", "zipf"}, {"skew", 1.0}, {"counts", {1}}}).find("routing.counts"), std::string::npos);
  EXPECT_NE(error_of({{"kind", "zipf"}, {"skew", 1.0}, {"bias", 1}}).find("bias"), std::string::npos);
  EXPECT_NE(error_of({{"kind", "histogram"}, {"file", "/nonexistent/h.json"}}).find("/nonexistent/h.json"), std::string::npos);
}

TEST(Routing, WorkloadCarriesItAndChecksItAgainstTheModel) {
  nlohmann::json j = {{"model", "qwen3.6-35b-a3b"}, {"hardware", "h100-sxm-node"}, {"gpus", 4}, {"global_batch", 32},
                      {"seq_len", 4096}, {"routing", {{"kind", "zipf"}, {"skew", 1.1}}}};
  const Workload w = workload_from_json(j, "w.json");
  EXPECT_EQ(w.routing.kind, RoutingKind::kZipf);
  EXPECT_EQ(workload_from_json(workload_to_json(w), "rt"), w);
  // Uniform routing is not written: workloads written before it read back unchanged.
  j.erase("routing");
  EXPECT_FALSE(workload_to_json(workload_from_json(j, "w.json")).contains("routing"));
  j["routing"] = {{"kind", "histogram"}, {"counts", {1, 2, 3}}};
  try {
    resolve_workload(workload_from_json(j, "w.json"), "w.json");
    FAIL() << "a histogram of 3 experts for a 256-expert model";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("routing.counts"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace oom
