// Routing model: how the token–expert assignments of a MoE layer spread over its experts, and
// what that does to expert parallelism (FLAT §"expert dispatch"; reference §6).
//
// A RoutingSpec is part of the Workload (its data, not its plan): "uniform" (every expert gets its
// mean share: the model every earlier equation assumed), "zipf" (share ∝ rank^−skew), "dirichlet"
// (shares drawn from a symmetric Dirichlet with concentration `skew`: small = skewed) or
// "histogram" (recorded per-expert counts, one list for every layer or one per layer). Zipf ranks
// and Dirichlet draws are placed on experts by a deterministic generator seeded with
// (seed, layer), so each layer has its own hot experts; the same spec gives the same shares on
// every machine (mt19937_64 and our own transforms; no implementation-defined distributions).
//
// Expert parallelism places experts contiguously, E/P per rank. ep_load() turns shares into each
// rank's received share of one dispatch; least_loaded_ep() is PipelinedLLEP's rebalancing: the
// excess assignments of ranks above the mean spill to the least-loaded ranks, which fetch the
// spilled experts' weights. Plain value types; pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace oom {

enum class RoutingKind { kUniform, kZipf, kDirichlet, kHistogram };

struct RoutingSpec {
  RoutingKind kind = RoutingKind::kUniform;
  double skew = 0;                         // zipf: exponent s ≥ 0; dirichlet: concentration α > 0
  std::uint64_t seed = 0;                  // placement of zipf ranks, dirichlet draws
  std::vector<std::vector<double>> counts; // histogram: one list (all layers) or one per layer
  bool operator==(const RoutingSpec&) const = default;
  bool uniform() const { return kind == RoutingKind::kUniform; }
};

std::string_view routing_kind_name(RoutingKind k);  // "uniform" | "zipf" | "dirichlet" | "histogram"

// Parses {"kind": "zipf", "skew": 1.2, "seed": 0} / {"kind": "histogram", "file": "h.json"} /
// {"kind": "histogram", "counts": [[...], ...]}. A histogram file holds {"counts": [...]} (one
// list) or {"counts": [[...], ...]} (one per layer); a relative `file` is read beside `file_of_spec`
// (the workload file), else from the working directory. Counts are non-negative with a positive
// sum. Throws InputError naming the file and field.
RoutingSpec routing_from_json(const nlohmann::json& j, const std::string& file_of_spec, const std::string& path);
// The histogram form carries its counts inline, so a written workload is self-contained.
nlohmann::json routing_to_json(const RoutingSpec& r);

// Checks the spec against a model: a histogram's lists have `experts` entries and there is one
// list or `layers` lists. Throws InputError naming `file` and `path` + ".counts".
void check_routing(const RoutingSpec& r, int experts, int layers, const std::string& file, const std::string& path);

// Share of the layer's token–expert assignments each expert receives (sums to 1).
std::vector<double> expert_shares(const RoutingSpec& r, int experts, int layer);

// The largest share any one expert of layer `layer` receives (1/experts when uniform).
double largest_expert_share(const RoutingSpec& r, int experts, int layer);

// Each rank's share of the assignments of one dispatch under expert parallelism with E/P experts
// per rank (contiguous placement), relative to the mean: load[r] = P · Σ shares of r's experts.
// max(load) is the straggler factor of the expert GEMMs and of the receive buffer.
std::vector<double> ep_rank_loads(const std::vector<double>& shares, int ranks);
double max_load(const std::vector<double>& loads);

// PipelinedLLEP's least-loaded rebalancing of one layer's assignments. Ranks whose load exceeds
// the mean by more than `tolerance` (relative) spill the excess of their hottest experts to the
// least-loaded ranks, an expert's whole share or part of it at a time, until every rank is within
// the tolerance. The helper ranks fetch each spilled expert's weights from its owner (forward)
// and send the expert's gradient back (backward).
struct LlepBalance {
  std::vector<double> loads;       // per rank after spilling, relative to the mean
  std::vector<int> fetched;        // per rank: spilled experts whose weights it fetches
  std::vector<int> lent;           // per rank: own experts other ranks fetch
  int spilled_experts = 0;         // (expert, helper) pairs
  std::vector<std::pair<int, int>> spills;  // the (expert, helper) pairs, in the order they spilled
};
LlepBalance least_loaded_ep(const std::vector<double>& shares, int ranks, double tolerance);

// PipelinedLLEP spills only from ranks more than 5% above the mean load: each spill costs a
// weight fetch, and a few percent of imbalance costs less than one (FLAT's least-loaded rule with
// a tolerance; not fitted).
inline constexpr double kLlepTolerance = 0.05;

// Per decoder (`layers` of them), each of `ranks` expert-parallel ranks' received load under `r`,
// after PipelinedLLEP's rebalancing (tolerance kLlepTolerance) when `llep`. Uniform routing
// without LLEP: every load 1 and nothing spilled, without drawing any shares.
std::vector<LlepBalance> ep_layer_balance(const RoutingSpec& r, int experts, int layers, int ranks, bool llep);

}  // namespace oom
