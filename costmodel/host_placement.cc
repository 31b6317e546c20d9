#include "costmodel/host_placement.h"

#include <algorithm>

#include "costmodel/input_error.h"

namespace oom {

double HostPlacement::remote_fraction(int n) const {
  const auto i = static_cast<std::size_t>(n);
  if (i >= demand.size() || demand[i] <= 0) return 0;
  return static_cast<double>(spilled[i]) / static_cast<double>(demand[i]);
}

double spilled_fraction(Bytes demand, Bytes capacity) {
  if (demand <= 0 || demand <= capacity) return 0;
  return static_cast<double>(demand - std::max<Bytes>(0, capacity)) / static_cast<double>(demand);
}

HostPlacement place_host_memory(const std::vector<Bytes>& demand, const std::vector<Bytes>& capacity, int numa_per_node) {
  OOM_ASSERT(demand.size() == capacity.size(), "one capacity per NUMA node");
  OOM_ASSERT(numa_per_node > 0, "a node has at least one socket");
  const std::size_t count = demand.size(), k = static_cast<std::size_t>(numa_per_node);
  HostPlacement p;
  p.demand = demand;
  p.local.assign(count, 0);
  p.spilled.assign(count, 0);
  p.resident.assign(count, 0);
  for (std::size_t n = 0; n < count; ++n) {
    p.local[n] = std::clamp<Bytes>(demand[n], 0, std::max<Bytes>(0, capacity[n]));
    p.resident[n] = p.local[n];
  }
  for (std::size_t first = 0; first < count; first += k) {
    const std::size_t last = std::min(count, first + k);
    for (std::size_t n = first; n < last; ++n) {
      Bytes over = std::max<Bytes>(0, demand[n]) - p.local[n];
      while (over > 0) {
        std::size_t roomiest = n;
        Bytes room = 0;
        for (std::size_t o = first; o < last; ++o) {
          const Bytes free = std::max<Bytes>(0, capacity[o]) - p.resident[o];
          if (o != n && free > room) roomiest = o, room = free;
        }
        if (room <= 0) break;
        const Bytes moved = std::min(over, room);
        p.resident[roomiest] += moved;
        p.spilled[n] += moved;
        over -= moved;
      }
      p.unplaced += over;
    }
  }
  return p;
}

std::vector<Bytes> per_node_sums(const std::vector<Bytes>& bytes, int numa_per_node) {
  OOM_ASSERT(numa_per_node > 0, "a node has at least one socket");
  const std::size_t k = static_cast<std::size_t>(numa_per_node);
  std::vector<Bytes> out((bytes.size() + k - 1) / k, 0);
  for (std::size_t n = 0; n < bytes.size(); ++n) out[n / k] += bytes[n];
  return out;
}

std::optional<HostOverflow> host_overflow(const std::vector<Bytes>& demand, const std::vector<Bytes>& capacity, int numa_per_node) {
  const std::size_t count = std::min(demand.size(), capacity.size());
  const auto needed = per_node_sums({demand.begin(), demand.begin() + static_cast<std::ptrdiff_t>(count)}, numa_per_node);
  const auto have = per_node_sums({capacity.begin(), capacity.begin() + static_cast<std::ptrdiff_t>(count)}, numa_per_node);
  for (std::size_t node = 0; node < needed.size(); ++node) {
    if (needed[node] > have[node]) return HostOverflow{static_cast<int>(node), needed[node], have[node]};
  }
  return std::nullopt;
}

}  // namespace oom
