#include "costmodel/input_limits.h"

#include <cmath>

#include <fmt/format.h>

#include "costmodel/input_error.h"

namespace oom {
namespace {

std::string unit_name(Bytes unit) {
  switch (unit) {
    case 1: return "B";
    case kKiB: return "KiB";
    case kMiB: return "MiB";
    case kGiB: return "GiB";
    default: return fmt::format("units of {} B", unit);
  }
}

}  // namespace

std::optional<Bytes> checked_bytes(double amount, Bytes unit) {
  if (!std::isfinite(amount) || amount < 0 || unit <= 0) return std::nullopt;
  const double bytes = amount * static_cast<double>(unit);
  // 2^63 is exact in a double, and every double below it converts to int64 without overflow.
  if (!(bytes < 0x1p63)) return std::nullopt;
  return static_cast<Bytes>(bytes);
}

Bytes input_bytes(double amount, Bytes unit, const std::string& file, const std::string& field) {
  if (const auto b = checked_bytes(amount, unit)) return *b;
  const std::string value = fmt::format("{}", amount);
  if (!std::isfinite(amount)) throw InputError(file, field, value, "expected a finite number of " + unit_name(unit));
  if (amount < 0) throw InputError(file, field, value, "expected a number of " + unit_name(unit) + " ≥ 0");
  throw InputError(file, field, value, fmt::format("{} {} is more bytes than a 64-bit count holds (8 EiB)", value, unit_name(unit)));
}

int checked_node_count(std::int64_t nodes, const std::string& file, const std::string& field) {
  if (nodes < 1 || nodes > kMaxNodes) {
    throw InputError(file, field, std::to_string(nodes),
                     fmt::format("out of range 1..{} (nodes of a cluster, so that GPU counts and rank indices stay in range)", kMaxNodes));
  }
  return static_cast<int>(nodes);
}

}  // namespace oom
