#include "traces/stage_key.h"

#include <array>
#include <charconv>
#include <vector>

#include <fmt/format.h>

namespace oom {
namespace {

constexpr std::array<std::string_view, 4> kPhaseNames = {"fwd", "recompute", "bwd", "opt"};
constexpr std::array<std::string_view, kStageParts> kPartNames = {
    "embedding", "lm_head", "attn", "gdn", "mixing", "moe", "llep", "experts", "common", "layer", "weights", "grads", "boundary", "model"};
constexpr std::array<std::string_view, kStageOps> kOpNames = {
    "proj",         "proj_bwd",     "core",          "core_refwd",     "core_bwd",  "out",
    "out_bwd",    "olse_h2d",     "olse_d2h",     "router_shared", "router_shared_bwd", "a2a_dispatch", "a2a_return",
    "a2a_grad_dispatch", "a2a_grad_return", "experts", "experts_bwd", "combine",  "dispatch",
    "return",       "fetch",        "grad_return",   "gather",         "scatter",   "regather",
    "loss",         "backward",     "pass",          "grad_pass",      "done",      "ready",
    "buffer",       "h2d",          "d2h",           "allgather",      "reduce_scatter", "grad_d2h",
    "grad_h2d",     "input_d2h",    "output_h2d",    "cpu",            "cpu_bwd",   "host_accumulate",
    "cpu_adamw",    "publish",      "gpu_adamw"};

template <std::size_t N>
int index_of(const std::array<std::string_view, N>& names, std::string_view s) {
  for (std::size_t i = 0; i < N; ++i) {
    if (names[i] == s) return static_cast<int>(i);
  }
  return -1;
}

// "<prefix><non-negative decimal>" without sign or leading zeros (so the text form is unique).
std::optional<int> indexed(std::string_view token, std::string_view prefix) {
  if (!token.starts_with(prefix)) return std::nullopt;
  const std::string_view digits = token.substr(prefix.size());
  if (digits.empty() || (digits.size() > 1 && digits.front() == '0')) return std::nullopt;
  int v = 0;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
  if (ec != std::errc() || end != digits.data() + digits.size() || v < 0) return std::nullopt;
  return v;
}

}  // namespace

std::string_view phase_name(Phase p) { return kPhaseNames.at(static_cast<std::size_t>(p)); }
std::string_view stage_part_name(StagePart p) { return kPartNames.at(static_cast<std::size_t>(p)); }
std::string_view stage_op_name(StageOp o) { return kOpNames.at(static_cast<std::size_t>(o)); }

StageOp backward_op(StageOp o) {
  switch (o) {
    case StageOp::kProj: return StageOp::kProjBwd;
    case StageOp::kCore: return StageOp::kCoreBwd;
    case StageOp::kRouterShared: return StageOp::kRouterSharedBwd;
    case StageOp::kExperts: return StageOp::kExpertsBwd;
    case StageOp::kOut: return StageOp::kOutBwd;
    default: return o;
  }
}

std::string format_stage_key(const StageKey& k) {
  std::string out = fmt::format("g{}.{}", k.rank, phase_name(k.phase));
  auto index = [&](std::string_view prefix, int v) {
    if (v >= 0) fmt::format_to(std::back_inserter(out), ".{}{}", prefix, v);
  };
  index("mb", k.micro_batch);
  index("L", k.decoder);
  fmt::format_to(std::back_inserter(out), ".{}", stage_part_name(k.part));
  index("sb", k.sub_batch);
  index("r", k.repeat);
  index("c", k.chunk);
  index("h", k.head_group);
  index("s", k.ring_step);
  index("b", k.bucket);
  fmt::format_to(std::back_inserter(out), ".{}", stage_op_name(k.op));
  if (k.join) out += ".join";
  return out;
}

std::optional<StageKey> parse_stage_key(std::string_view text) {
  std::vector<std::string_view> t;
  for (std::size_t from = 0;;) {
    const std::size_t dot = text.find('.', from);
    t.push_back(text.substr(from, dot == std::string_view::npos ? std::string_view::npos : dot - from));
    if (dot == std::string_view::npos) break;
    from = dot + 1;
  }
  StageKey k;
  if (t.size() > 4 && t.back() == "join") {
    k.join = true;
    t.pop_back();
  }
  if (t.size() < 4) return std::nullopt;
  const auto rank = indexed(t[0], "g");
  const int phase = index_of(kPhaseNames, t[1]);
  if (!rank || phase < 0) return std::nullopt;
  k.rank = *rank;
  k.phase = static_cast<Phase>(phase);
  std::size_t i = 2;
  // The optional indices, each at most once and in the canonical order.
  auto take = [&](std::string_view prefix, int& field) {
    if (i + 1 < t.size()) {
      if (const auto v = indexed(t[i], prefix)) field = *v, ++i;
    }
  };
  take("mb", k.micro_batch);
  take("L", k.decoder);
  if (i >= t.size()) return std::nullopt;
  const int part = index_of(kPartNames, t[i++]);
  if (part < 0) return std::nullopt;
  k.part = static_cast<StagePart>(part);
  take("sb", k.sub_batch);
  take("r", k.repeat);
  take("c", k.chunk);
  take("h", k.head_group);
  take("s", k.ring_step);
  take("b", k.bucket);
  if (i + 1 != t.size()) return std::nullopt;
  const int op = index_of(kOpNames, t[i]);
  if (op < 0) return std::nullopt;
  k.op = static_cast<StageOp>(op);
  return k;
}

}  // namespace oom
