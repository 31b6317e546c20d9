// What outside input may hold, and the one checked conversion of its amounts to bytes.
//
// Every amount a user gives in a unit (a budget in GiB, a size in MiB; a JSON field or a command
// option) becomes bytes through input_bytes(), never a bare cast: an amount that is not a finite
// number ≥ 0, or whose bytes do not fit a Bytes, is an InputError naming the field and the value.
// Cluster sizes are bounded so that every GPU count and global index derived from them stays far
// inside an int; budgets are bounded by the hardware they divide. Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "costmodel/units.h"

namespace oom {

struct WorkloadContext;

// At most kMaxNodes nodes of at most kMaxGpusPerNode GPUs and kMaxNumaPerNode NUMA nodes each:
// nodes × GPUs (or NUMA nodes) per node ≤ 2^26 (the largest GPU clusters built hold ~10^5 GPUs).
// A workload trains on at most kMaxWorkloadGpus of them. Hardware files, workloads, studies and
// `--nodes` refuse larger counts, naming the field.
inline constexpr int kMaxNodes = 1 << 16;
inline constexpr int kMaxGpusPerNode = 1 << 10;
inline constexpr int kMaxNumaPerNode = 1 << 10;
inline constexpr int kMaxWorkloadGpus = 1 << 16;

// The largest time a trace holds, in seconds from the start of its step (~31,700 years): trace
// readers refuse a time or duration beyond it, or one that is not a finite number.
inline constexpr Seconds kMaxTraceSeconds = 1e12;

// Bytes of `amount` units (kGiB, kMiB, ...): nullopt unless `amount` is a finite number ≥ 0 whose
// bytes fit a Bytes (below 2^63 B, 8 EiB). Rounds toward zero like from_gib().
std::optional<Bytes> checked_bytes(double amount, Bytes unit);

// checked_bytes() for outside input: else an InputError naming `file` ("" for a command option),
// `field` ("gpu_budget_gib", "--gpu-budget-gib") and the value.
Bytes input_bytes(double amount, Bytes unit, const std::string& file, const std::string& field);

// A node count from input (a workload's or study's "nodes", `--nodes`): `nodes` when it is in
// 1..kMaxNodes, else an InputError naming `file` and `field`.
int checked_node_count(std::int64_t nodes, const std::string& file, const std::string& field);

// The budgets of `c.workload` against its hardware: each a positive number of GiB (input_bytes) no
// larger than the capacity it divides, the GPU's HBM per GPU and the node's host memory per node
// (no machine honours a budget beyond it). Errors name `file` and `gpu_field` or `host_field`: a
// workload file's fields (resolve_workload), or a command's options with file "" (oom plan).
// Defined beside resolve_workload (costmodel/workload.cc).
void check_budgets(const WorkloadContext& c, const std::string& file, const std::string& gpu_field,
                   const std::string& host_field);

}  // namespace oom
