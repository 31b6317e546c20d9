#include "costmodel/routing.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <numeric>
#include <random>

#include <fmt/format.h>

#include "costmodel/input_error.h"
#include "costmodel/json_input.h"

namespace oom {
namespace {

// A generator per (seed, layer): splitmix64 of the pair seeds mt19937_64, whose output sequence
// the standard fixes, so shares are the same on every platform.
std::mt19937_64 generator(std::uint64_t seed, int layer) {
  std::uint64_t z = seed + 0x9E3779B97F4A7C15ULL * (static_cast<std::uint64_t>(layer) + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return std::mt19937_64(z ^ (z >> 31));
}

double uniform01(std::mt19937_64& g) {  // in (0, 1)
  return (static_cast<double>(g() >> 11) + 0.5) * 0x1.0p-53;
}

double standard_normal(std::mt19937_64& g) {  // Box–Muller
  const double u = uniform01(g), v = uniform01(g);
  return std::sqrt(-2.0 * std::log(u)) * std::cos(2.0 * M_PI * v);
}

// log of a Gamma(alpha, 1) draw (Marsaglia–Tsang; alpha < 1 through Gamma(alpha + 1)·U^(1/alpha)),
// in logs so that tiny concentrations do not underflow.
double log_gamma_draw(double alpha, std::mt19937_64& g) {
  double boost = 0;
  if (alpha < 1) {
    boost = std::log(uniform01(g)) / alpha;
    alpha += 1;
  }
  const double d = alpha - 1.0 / 3.0, c = 1.0 / std::sqrt(9.0 * d);
  for (;;) {
    const double x = standard_normal(g);
    const double v = std::pow(1.0 + c * x, 3);
    if (v <= 0) continue;
    const double u = uniform01(g);
    if (std::log(u) < 0.5 * x * x + d - d * v + d * std::log(v)) return std::log(d * v) + boost;
  }
}

std::vector<int> permutation(int n, std::mt19937_64& g) {  // Fisher–Yates
  std::vector<int> p(static_cast<std::size_t>(n));
  std::iota(p.begin(), p.end(), 0);
  for (int i = n - 1; i > 0; --i) std::swap(p[static_cast<std::size_t>(i)], p[g() % static_cast<std::uint64_t>(i + 1)]);
  return p;
}

std::vector<double> counts_list(const nlohmann::json& v, const JsonReader& r, const std::string& field) {
  if (!v.is_array() || v.empty()) r.fail_value(field, v, "must be a non-empty list of counts");
  std::vector<double> out;
  double sum = 0;
  for (std::size_t i = 0; i < v.size(); ++i) {
    const auto& x = v[i];
    if (!x.is_number() || !std::isfinite(x.get<double>()) || x.get<double>() < 0) {
      r.fail_value(fmt::format("{}[{}]", field, i), x, "must be a non-negative number");
    }
    out.push_back(x.get<double>());
    sum += out.back();
  }
  // The shares divide by the sum: it must be a positive finite number (counts near the largest
  // double can sum to infinity, which would turn every share into 0).
  if (!(sum > 0) || !std::isfinite(sum)) r.fail_value(field, v, "counts must have a positive sum, and a finite one");
  return out;
}

std::vector<std::vector<double>> read_counts(const nlohmann::json& v, const JsonReader& r, const std::string& field) {
  if (v.is_array() && !v.empty() && v.front().is_array()) {
    std::vector<std::vector<double>> out;
    for (std::size_t i = 0; i < v.size(); ++i) out.push_back(counts_list(v[i], r, fmt::format("{}[{}]", field, i)));
    return out;
  }
  return {counts_list(v, r, field)};
}

}  // namespace

std::string_view routing_kind_name(RoutingKind k) {
  switch (k) {
    case RoutingKind::kUniform: return "uniform";
    case RoutingKind::kZipf: return "zipf";
    case RoutingKind::kDirichlet: return "dirichlet";
    case RoutingKind::kHistogram: return "histogram";
  }
  return "?";
}

RoutingSpec routing_from_json(const nlohmann::json& j, const std::string& file_of_spec, const std::string& path) {
  const JsonReader r(j, file_of_spec, path);
  r.reject_unknown_keys({"kind", "skew", "seed", "file", "counts"});
  RoutingSpec s;
  const std::string kind = r.one_of("kind", {"uniform", "zipf", "dirichlet", "histogram"});
  if (kind == "zipf") {
    s.kind = RoutingKind::kZipf;
    s.skew = r.number("skew", 0.0, 8.0);
  } else if (kind == "dirichlet") {
    s.kind = RoutingKind::kDirichlet;
    s.skew = r.number("skew", 1e-3, 1e6);
  } else if (kind == "histogram") {
    s.kind = RoutingKind::kHistogram;
  }
  if (s.kind != RoutingKind::kZipf && s.kind != RoutingKind::kDirichlet && r.has("skew")) {
    r.fail("skew", fmt::format("applies to zipf and dirichlet routing, not {}", kind));
  }
  s.seed = static_cast<std::uint64_t>(r.integer_or("seed", 0, 0, std::int64_t{1} << 53));
  if (s.kind == RoutingKind::kHistogram) {
    if (r.has("file") == r.has("counts")) r.fail("kind", "histogram routing takes exactly one of file and counts");
    if (r.has("counts")) {
      s.counts = read_counts(j.at("counts"), r, r.field("counts"));
    } else {
      std::filesystem::path f = r.string("file");
      if (f.is_relative() && !file_of_spec.empty()) {
        const auto beside = std::filesystem::path(file_of_spec).parent_path() / f;
        if (std::filesystem::exists(beside)) f = beside;
      }
      std::error_code ec;
      if (std::filesystem::exists(f, ec) && !std::filesystem::is_regular_file(f, ec)) {
        r.fail("file", "a histogram file must be a regular JSON file");
      }
      const nlohmann::json h = read_json_file(f.string());
      const JsonReader hr(h, f.string());
      hr.reject_unknown_keys({"counts", "source"});
      if (!hr.has("counts")) hr.fail("counts", "a histogram file needs counts");
      s.counts = read_counts(h.at("counts"), hr, "counts");
    }
  } else if (r.has("file") || r.has("counts")) {
    r.fail(r.has("file") ? "file" : "counts", fmt::format("applies to histogram routing, not {}", kind));
  }
  return s;
}

nlohmann::json routing_to_json(const RoutingSpec& s) {
  nlohmann::json j = {{"kind", routing_kind_name(s.kind)}};
  if (s.kind == RoutingKind::kZipf || s.kind == RoutingKind::kDirichlet) j["skew"] = s.skew;
  if (s.seed != 0) j["seed"] = s.seed;
  if (s.kind == RoutingKind::kHistogram) {
    j["counts"] = s.counts.size() == 1 ? nlohmann::json(s.counts.front()) : nlohmann::json(s.counts);
  }
  return j;
}

void check_routing(const RoutingSpec& s, int experts, int layers, const std::string& file, const std::string& path) {
  if (s.kind != RoutingKind::kHistogram) return;
  const std::string field = path.empty() ? "counts" : path + ".counts";
  if (experts <= 0) throw InputError(file, field, "histogram", "the model has no routed experts");
  if (s.counts.size() != 1 && static_cast<int>(s.counts.size()) != layers) {
    throw InputError(file, field, fmt::format("{} lists", s.counts.size()),
                     fmt::format("need 1 list of counts or one per layer ({})", layers));
  }
  for (std::size_t i = 0; i < s.counts.size(); ++i) {
    if (static_cast<int>(s.counts[i].size()) != experts) {
      throw InputError(file, s.counts.size() == 1 ? field : fmt::format("{}[{}]", field, i),
                       fmt::format("{} counts", s.counts[i].size()),
                       fmt::format("the model has {} routed experts", experts));
    }
  }
}

std::vector<double> expert_shares(const RoutingSpec& s, int experts, int layer) {
  OOM_ASSERT(experts > 0, "routing needs experts");
  const auto E = static_cast<std::size_t>(experts);
  std::vector<double> w(E, 1.0);
  switch (s.kind) {
    case RoutingKind::kUniform:
      break;
    case RoutingKind::kZipf: {
      auto g = generator(s.seed, layer);
      const std::vector<int> place = permutation(experts, g);
      for (std::size_t i = 0; i < E; ++i) w[static_cast<std::size_t>(place[i])] = std::pow(static_cast<double>(i + 1), -s.skew);
      break;
    }
    case RoutingKind::kDirichlet: {
      auto g = generator(s.seed, layer);
      std::vector<double> logs(E);
      for (auto& l : logs) l = log_gamma_draw(s.skew, g);
      const double top = *std::max_element(logs.begin(), logs.end());
      for (std::size_t i = 0; i < E; ++i) w[i] = std::exp(logs[i] - top);
      break;
    }
    case RoutingKind::kHistogram: {
      OOM_ASSERT(!s.counts.empty(), "histogram routing without counts");
      const auto& c = s.counts.size() == 1 ? s.counts.front() : s.counts[static_cast<std::size_t>(layer) % s.counts.size()];
      OOM_ASSERT(c.size() == E, "histogram counts do not match the experts (check_routing)");
      w = c;
      break;
    }
  }
  const double sum = std::accumulate(w.begin(), w.end(), 0.0);
  for (auto& x : w) x /= sum;
  return w;
}

std::vector<double> ep_rank_loads(const std::vector<double>& shares, int ranks) {
  OOM_ASSERT(ranks >= 1, "at least one rank");
  std::vector<double> loads(static_cast<std::size_t>(ranks), 0.0);
  const auto E = static_cast<std::int64_t>(shares.size());
  for (std::int64_t e = 0; e < E; ++e) loads[static_cast<std::size_t>(e * ranks / E)] += shares[static_cast<std::size_t>(e)] * ranks;
  return loads;
}

double max_load(const std::vector<double>& loads) {
  return loads.empty() ? 1.0 : *std::max_element(loads.begin(), loads.end());
}

LlepBalance least_loaded_ep(const std::vector<double>& shares, int ranks, double tolerance) {
  LlepBalance b;
  b.loads = ep_rank_loads(shares, ranks);
  b.fetched.assign(static_cast<std::size_t>(ranks), 0);
  b.lent.assign(static_cast<std::size_t>(ranks), 0);
  const auto E = static_cast<std::int64_t>(shares.size());
  constexpr double kEps = 1e-12;
  const double cap = 1.0 + std::max(0.0, tolerance);
  for (int r = 0; r < ranks; ++r) {
    auto& load = b.loads[static_cast<std::size_t>(r)];
    if (load <= cap + kEps) continue;
    // r's experts, hottest first; each gives tokens until r is back at the mean.
    std::vector<std::pair<double, std::int64_t>> own;
    for (std::int64_t e = 0; e < E; ++e) {
      if (e * ranks / E == r) own.emplace_back(shares[static_cast<std::size_t>(e)] * ranks, e);
    }
    std::sort(own.begin(), own.end(), [](const auto& a, const auto& c) { return a.first > c.first || (a.first == c.first && a.second < c.second); });
    int pairs = 0;
    for (auto& [expert_load, e] : own) {
      while (load > 1.0 + kEps && expert_load > kEps) {
        const auto least = std::min_element(b.loads.begin(), b.loads.end()) - b.loads.begin();
        const double room = 1.0 - b.loads[static_cast<std::size_t>(least)];
        if (room <= kEps) break;
        const double moved = std::min({load - 1.0, expert_load, room});
        b.loads[static_cast<std::size_t>(least)] += moved;
        load -= moved;
        expert_load -= moved;
        ++b.fetched[static_cast<std::size_t>(least)];
        ++b.spilled_experts;
        b.spills.emplace_back(static_cast<int>(e), static_cast<int>(least));
        ++pairs;
      }
      if (load <= 1.0 + kEps) break;
    }
    b.lent[static_cast<std::size_t>(r)] = pairs;  // (expert, helper) pairs this owner serves
  }
  return b;
}

double largest_expert_share(const RoutingSpec& r, int experts, int layer) {
  if (experts <= 0) return 1.0;
  const std::vector<double> shares = expert_shares(r, experts, layer);
  return *std::max_element(shares.begin(), shares.end());
}

std::vector<LlepBalance> ep_layer_balance(const RoutingSpec& r, int experts, int layers, int ranks, bool llep) {
  const auto n = static_cast<std::size_t>(std::max(1, ranks));
  LlepBalance even{std::vector<double>(n, 1.0), std::vector<int>(n, 0), std::vector<int>(n, 0), 0, {}};
  std::vector<LlepBalance> out(static_cast<std::size_t>(std::max(0, layers)), even);
  if (ranks <= 1 || experts <= 0 || (r.uniform() && !llep)) return out;
  for (int l = 0; l < layers; ++l) {
    const std::vector<double> shares = expert_shares(r, experts, l);
    auto& b = out[static_cast<std::size_t>(l)];
    if (llep) {
      b = least_loaded_ep(shares, ranks, kLlepTolerance);
    } else {
      b.loads = ep_rank_loads(shares, ranks);
    }
  }
  return out;
}

}  // namespace oom
