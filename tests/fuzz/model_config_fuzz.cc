// Hugging Face config.json → ModelSpec (model_spec_from_hf_config), its round trip through
// model_spec_to_hf_config, and what consumes an accepted spec: parameter counts and FLOPs.
#include <cmath>

#include "costmodel/flops.h"
#include "costmodel/json_input.h"
#include "costmodel/model_spec.h"
#include "costmodel/params.h"
#include "tests/fuzz/fuzz_support.h"

using namespace oom;

OOM_FUZZ_TARGET(model_config) {
  nlohmann::json config;
  if (!fuzz::accepts([&] { config = parse_json_text(std::string(input), "config.json"); })) return;
  ModelSpec m;
  if (!fuzz::accepts([&] { m = model_spec_from_hf_config(config, "config.json", "fuzz"); })) return;

  OOM_FUZZ_CHECK(m.layers > 0 && static_cast<std::size_t>(m.layers) == m.layer_kinds.size());
  OOM_FUZZ_CHECK(m.moe.top_k >= 1 && m.moe.top_k <= m.moe.experts);
  // The writer's output reads back to the same spec.
  const ModelSpec back = model_spec_from_hf_config(model_spec_to_hf_config(m), "round-trip", "fuzz");
  OOM_FUZZ_CHECK(back == m);

  const ModelParams p = model_params(m);
  OOM_FUZZ_CHECK(p.active() > 0 && p.active() <= p.total());
  const Eq1Flops f = model_forward_flops(m, 1, 64);
  OOM_FUZZ_CHECK(std::isfinite(f.total()) && f.total() > 0);
}
