// Where a node's host memory lands: each NUMA node (socket) first holds what the ranks on it
// allocate, and what does not fit spills into the DRAM of the node's other sockets.
//
// This is Linux's default NUMA policy (MPOL_DEFAULT, Documentation/admin-guide/mm/
// numa_memory_policy.rst): a page is allocated on the node of the CPU that first touches it and,
// when that node has no free memory, on the next node of its zonelist. A process pinned to a socket
// (its ranks' CPU work runs there) therefore gets local memory until the socket's DRAM is full and
// remote memory after, and a node runs out of host memory only when its sockets' DRAM is full in
// all. The bytes a socket spills are reached by its cores across the socket links (UPI, xGMI).
//
// Pure functions over byte counts; NUMA nodes are numbered over the cluster, node-major
// (HardwareSpec::numa_of_rank): nodes n·k … n·k + k − 1 are node n's k sockets. Memory never
// spills across nodes.
#pragma once

#include <optional>
#include <vector>

#include "costmodel/units.h"

namespace oom {

struct HostPlacement {
  // Per NUMA node: what its ranks ask for, what of that it holds itself, and what of that lands on
  // the node's other sockets (demand = local + spilled, or less by `unplaced`).
  std::vector<Bytes> demand, local, spilled;
  // Per NUMA node: every byte resident in its DRAM, its own and the spill of its node's others.
  std::vector<Bytes> resident;
  // Bytes that fit nowhere on their node (0 when the node's demand fits its sockets in all).
  Bytes unplaced = 0;
  bool fits() const { return unplaced == 0; }
  // Share of NUMA node n's own demand held on another socket, 0..1.
  double remote_fraction(int n) const;
};

// Places `demand` (bytes per NUMA node) on DRAM of `capacity` (bytes per NUMA node, the same
// count) with `numa_per_node` sockets per node. A socket's overflow goes to its node's other sockets
// in order of their free room, the roomiest first.
HostPlacement place_host_memory(const std::vector<Bytes>& demand, const std::vector<Bytes>& capacity, int numa_per_node);

// The host footprint of one node against its sockets together: the first node whose demand exceeds
// its capacity in all, or nothing when every node's memory fits.
// `bytes` (per NUMA node) summed per node of `numa_per_node` sockets.
std::vector<Bytes> per_node_sums(const std::vector<Bytes>& bytes, int numa_per_node);

struct HostOverflow {
  int node = 0;
  Bytes needed = 0, capacity = 0;
};
std::optional<HostOverflow> host_overflow(const std::vector<Bytes>& demand, const std::vector<Bytes>& capacity, int numa_per_node);

// The share of a socket's own demand beyond its capacity: what place_host_memory spills from it
// when its node has the room (0..1). The cost model prices that share of the socket's CPU work as
// remote.
double spilled_fraction(Bytes demand, Bytes capacity);

}  // namespace oom
