// Checked conversion of input amounts to bytes and bounds of input (costmodel/input_limits.h).
#include "costmodel/input_limits.h"

#include <cmath>
#include <limits>

#include <gtest/gtest.h>

#include "costmodel/input_error.h"

namespace oom {
namespace {

std::string error_of(double amount, Bytes unit) {
  try {
    input_bytes(amount, unit, "w.json", "gpu_budget_gib");
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(InputLimits, CheckedBytesIsExactWhereTheBytesFit) {
  EXPECT_EQ(checked_bytes(80, kGiB), 80 * kGiB);
  EXPECT_EQ(checked_bytes(0.5, kMiB), kMiB / 2);
  EXPECT_EQ(checked_bytes(0, kGiB), 0);
  EXPECT_EQ(checked_bytes(131.3, kGiB), from_gib(131.3));
  // The largest GiB amount below 2^63 bytes (8 EiB = 2^33 GiB) converts; 2^33 GiB does not.
  const double below = std::nextafter(0x1p33, 0.0);
  ASSERT_TRUE(checked_bytes(below, kGiB).has_value());
  EXPECT_GT(*checked_bytes(below, kGiB), 0);
  EXPECT_FALSE(checked_bytes(0x1p33, kGiB).has_value());
}

TEST(InputLimits, CheckedBytesRefusesNonFiniteNegativeAndOverflowingAmounts) {
  EXPECT_FALSE(checked_bytes(std::numeric_limits<double>::infinity(), kGiB).has_value());
  EXPECT_FALSE(checked_bytes(std::numeric_limits<double>::quiet_NaN(), kGiB).has_value());
  EXPECT_FALSE(checked_bytes(-1, kGiB).has_value());
  EXPECT_FALSE(checked_bytes(1e10, kGiB).has_value());  // 1.07e19 bytes, past int64
  EXPECT_FALSE(checked_bytes(1e308, kMiB).has_value());
}

TEST(InputLimits, InputBytesNamesTheFieldAndValue) {
  EXPECT_EQ(input_bytes(2, kGiB, "w.json", "gpu_budget_gib"), 2 * kGiB);
  EXPECT_EQ(error_of(std::numeric_limits<double>::infinity(), kGiB),
            "w.json: field 'gpu_budget_gib': value inf: expected a finite number of GiB");
  EXPECT_EQ(error_of(-3, kMiB), "w.json: field 'gpu_budget_gib': value -3: expected a number of MiB ≥ 0");
  EXPECT_EQ(error_of(1e10, kGiB),
            "w.json: field 'gpu_budget_gib': value 10000000000: 10000000000 GiB is more bytes than a 64-bit count holds (8 EiB)");
}

TEST(InputLimits, NodeCountsStayWhereGpuCountsFitAnInt) {
  EXPECT_EQ(checked_node_count(1, "w.json", "nodes"), 1);
  EXPECT_EQ(checked_node_count(kMaxNodes, "w.json", "nodes"), kMaxNodes);
  // The bound keeps every product of counts the cluster derives inside an int.
  static_assert(static_cast<std::int64_t>(kMaxNodes) * kMaxGpusPerNode <= (std::int64_t{1} << 26));
  static_assert(static_cast<std::int64_t>(kMaxNodes) * kMaxNumaPerNode <= (std::int64_t{1} << 26));
  for (const std::int64_t bad : {std::int64_t{0}, std::int64_t{-1}, std::int64_t{kMaxNodes} + 1, std::int64_t{2147483647}}) {
    try {
      checked_node_count(bad, "", "--nodes");
      ADD_FAILURE() << bad << " accepted";
    } catch (const InputError& e) {
      EXPECT_EQ(std::string(e.what()).rfind("field '--nodes': value " + std::to_string(bad) + ": out of range 1..65536", 0), 0u)
          << e.what();
    }
  }
}

}  // namespace
}  // namespace oom
