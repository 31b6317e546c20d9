// Hardware JSON → HardwareSpec (hardware_spec_from_json), its round trip, and the rank → GPU →
// NUMA placement an accepted spec answers.
#include "costmodel/hardware_spec.h"
#include "costmodel/json_input.h"
#include "tests/fuzz/fuzz_support.h"

using namespace oom;

OOM_FUZZ_TARGET(hardware_spec) {
  nlohmann::json j;
  if (!fuzz::accepts([&] { j = parse_json_text(std::string(input), "hardware.json"); })) return;
  HardwareSpec h;
  if (!fuzz::accepts([&] { h = hardware_spec_from_json(j, "hardware.json"); })) return;

  OOM_FUZZ_CHECK(h.gpus_per_node > 0 && static_cast<std::size_t>(h.gpus_per_node) == h.gpu_numa.size());
  const HardwareSpec back = hardware_spec_from_json(hardware_spec_to_json(h), "round-trip");
  OOM_FUZZ_CHECK(back == h);

  // Every rank lands on a GPU of its node and a host NUMA node of that node (numbered over the
  // cluster); each rank is counted once.
  const int ranks = std::min(h.total_gpus(), 64);
  const std::vector<int> gpus = h.rank_gpus(ranks);
  OOM_FUZZ_CHECK(gpus.size() == static_cast<std::size_t>(ranks));
  for (int r = 0; r < ranks; ++r) {
    OOM_FUZZ_CHECK(gpus[r] >= 0 && gpus[r] < h.gpus_per_node);
    const int numa = h.numa_of_rank(r, ranks);
    OOM_FUZZ_CHECK(numa >= 0 && numa < h.host_numa_count(ranks));
    OOM_FUZZ_CHECK(h.node_of_numa(numa) == r / h.gpus_per_node);
  }
  const std::vector<int> per_numa = h.ranks_per_numa(ranks);
  OOM_FUZZ_CHECK(static_cast<int>(per_numa.size()) == h.host_numa_count(ranks));
  int placed = 0;
  for (int n : per_numa) placed += n;
  OOM_FUZZ_CHECK(placed == ranks);

  // Paths between nodes: symmetric, more switches never faster or nearer.
  for (int a = 0; a < std::min(h.nodes, 8); ++a) {
    for (int b = 0; b < std::min(h.nodes, 8); ++b) {
      const NetworkSpec& n = h.network;
      OOM_FUZZ_CHECK(n.switches_between(a, b) == n.switches_between(b, a));
      OOM_FUZZ_CHECK(n.latency_between(a, b) >= 0 && n.sustained_Bps(a, b) <= n.per_node_Bps());
      if (a != b) OOM_FUZZ_CHECK(n.sustained_Bps(a, b) > 0);
    }
  }
}
