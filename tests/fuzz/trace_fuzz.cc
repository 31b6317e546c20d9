// Trace JSON (the form trace_to_json writes, read back by trace_from_json for comparisons of
// predicted and measured steps) → Trace, its round trip, finalize_trace and the Chrome export;
// each stage name through the stage-key parser, which reads back only what its formatter writes.
#include <cmath>

#include "costmodel/json_input.h"
#include "tests/fuzz/fuzz_support.h"
#include "traces/trace.h"

using namespace oom;

OOM_FUZZ_TARGET(trace) {
  // The raw input as a stage name: accepted only in the one text form.
  if (const auto key = parse_stage_key(input)) OOM_FUZZ_CHECK(format_stage_key(*key) == input);
  nlohmann::json j;
  if (!fuzz::accepts([&] { j = parse_json_text(std::string(input), "trace.json"); })) return;
  Trace t;
  if (!fuzz::accepts([&] { t = trace_from_json(j, "trace.json"); })) return;
  OOM_FUZZ_CHECK(trace_from_json(trace_to_json(t), "round-trip") == t);
  for (const TraceStage& s : t.stages) OOM_FUZZ_CHECK(format_stage_key(s.key) == s.name);
  for (const TraceStage& s : t.stages) OOM_FUZZ_CHECK(std::isfinite(s.duration_s()) && s.duration_s() >= 0);

  finalize_trace(t);
  for (std::size_t i = 1; i < t.stages.size(); ++i) {
    const TraceStage& a = t.stages[i - 1];
    const TraceStage& b = t.stages[i];
    OOM_FUZZ_CHECK(a.start_s < b.start_s || (a.start_s == b.start_s && a.id <= b.id));
  }
  for (const TraceStage& s : t.stages) OOM_FUZZ_CHECK(s.end_s <= t.step_s);
  for (const MemoryTimeline& m : t.memory) {
    for (const MemorySample& x : m.samples) OOM_FUZZ_CHECK(x.bytes <= m.peak_bytes);
  }
  const nlohmann::json chrome = trace_to_chrome_json(t);
  OOM_FUZZ_CHECK(chrome.is_object() || chrome.is_array());
  (void)chrome.dump();
}
