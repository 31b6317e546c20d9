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

  // Every rank lands on a GPU of the node and a NUMA node of the spec.
  const int ranks = std::min(h.total_gpus(), 64);
  const std::vector<int> gpus = h.rank_gpus(ranks);
  OOM_FUZZ_CHECK(gpus.size() == static_cast<std::size_t>(ranks));
  for (int r = 0; r < ranks; ++r) {
    OOM_FUZZ_CHECK(gpus[r] >= 0 && gpus[r] < h.gpus_per_node);
    const int numa = h.numa_of_rank(r, ranks);
    OOM_FUZZ_CHECK(numa >= 0 && static_cast<std::size_t>(numa) < h.numa.size());
  }
  int placed = 0;
  for (int n : h.ranks_per_numa(ranks)) placed += n;
  OOM_FUZZ_CHECK(placed == std::min(ranks, h.gpus_per_node));
}
