// Units used across the project.
//
// Quantities carry their unit in their type alias and in their name: `gpu_peak_bytes`,
// `step_s`, `h2d_Bps`, `forward_flops`. Byte counts are exact integers (int64: up to 8 EiB);
// FLOP counts, times and rates are doubles. GiB/GB conversions live here and nowhere else.
#pragma once

#include <cstdint>

namespace oom {

using Bytes = std::int64_t;   // a byte count
using Flops = double;         // a floating-point operation count
using Seconds = double;       // a duration
using FlopsPerS = double;     // a compute rate
using BytesPerS = double;     // a bandwidth

inline constexpr Bytes kKiB = 1024;
inline constexpr Bytes kMiB = 1024 * kKiB;
inline constexpr Bytes kGiB = 1024 * kMiB;
inline constexpr double kGB = 1e9;

inline constexpr double to_gib(Bytes b) { return static_cast<double>(b) / static_cast<double>(kGiB); }
inline constexpr Bytes from_gib(double gib) { return static_cast<Bytes>(gib * static_cast<double>(kGiB)); }

// Bytes per element of the number formats in use.
inline constexpr Bytes kBf16Bytes = 2;
inline constexpr Bytes kFp32Bytes = 4;

}  // namespace oom
