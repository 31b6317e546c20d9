// Tests of traces/trace.h: JSON round trip, errors naming the field, Chrome trace export, finalize;
// and traces/merge.h: one step's rank traces merged.
#include "traces/trace.h"

#include "traces/merge.h"

#include <set>
#include <vector>

#include <gtest/gtest.h>

#include "costmodel/input_error.h"

namespace oom {
namespace {

TraceStage stage(std::int64_t id, const std::string& name, const std::string& kind, const std::string& resource,
                 Seconds start_s, Seconds end_s, Bytes bytes, Flops flops) {
  return {id, name, *parse_stage_key(name), kind, resource, start_s, end_s, 0, bytes, flops};
}

Trace sample() {
  Trace t;
  t.engine = "analytic";
  t.stages = {stage(1, "g0.fwd.L0.weights.h2d", "h2d", "gpu0.h2d", 0.0, 0.1, 1000, 0),
              stage(2, "g0.fwd.L0.attn.proj", "gemm", "gpu0.compute", 0.1, 0.3, 0, 1e12),
              stage(3, "g0.opt.L0.layer.cpu_adamw", "cpu_adamw", "numa0.cpu_update.r0", 0.3, 0.5, 12, 0)};
  t.stages[1].ops = 213;  // operators the stage dispatched (kept through JSON and the Chrome export)
  t.stages[1].syncs = 1;  // and the host synchronisations it made
  t.host_syncs = 3;       // the step's: its stages' and the loss and norm read between them
  t.memory = {{"gpu0", {{0.0, 10}, {0.1, 1010}, {0.3, 10}}, 1010}, {"numa0", {{0.0, 5}}, 5}};
  t.gpu_peak_bytes = {1010};
  t.numa_peak_bytes = {5};
  t.step_s = 0.5;
  return t;
}

TEST(Trace, AllocatedGpuPeakIsTheLargestGpuSampleWithoutHeadroom) {
  Trace t = sample();
  t.gpu_peak_bytes = {1030};  // an executor's peak with 2 % fragmentation headroom
  t.memory[0].peak_bytes = 1030;
  t.memory[1].samples = {{0.0, 5000}};  // a NUMA node's bytes are not a GPU's
  EXPECT_EQ(allocated_gpu_peak_bytes(t), 1010);
  t.memory.clear();  // no samples (e.g. a measured step): the largest GPU peak as given
  t.gpu_peak_bytes = {700, 1030};
  EXPECT_EQ(allocated_gpu_peak_bytes(t), 1030);
}

TEST(Trace, JsonRoundTrip) {
  const Trace t = sample();
  EXPECT_EQ(trace_from_json(trace_to_json(t), "t.json"), t);
  EXPECT_EQ(trace_from_json(nlohmann::json::parse(trace_to_json(t).dump()), "t.json"), t);
}

TEST(Trace, BadInputNamesTheField) {
  nlohmann::json j = trace_to_json(sample());
  j["stages"][1]["end_s"] = 0.05;  // before its start
  try {
    trace_from_json(j, "t.json");
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("stages[1].end_s"), std::string::npos);
  }
  j = trace_to_json(sample());
  j["memory"][0]["samples"][1] = "x";
  EXPECT_THROW(trace_from_json(j, "t.json"), InputError);
  j = trace_to_json(sample());
  j["stages"][2]["name"] = "g0.opt.L0.adamw";  // no part: not a stage key
  try {
    trace_from_json(j, "t.json");
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("stages[2].name"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("g0.opt.L0.adamw"), std::string::npos) << e.what();
  }
  j = trace_to_json(sample());
  j["stages"][1]["ops"] = -3;  // an operator count below 0
  try {
    trace_from_json(j, "t.json");
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("stages[1].ops"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("-3"), std::string::npos) << e.what();
  }
}

TEST(Trace, ChromeExportHasOneCompleteEventPerStageAndMemoryCounters) {
  const nlohmann::json c = trace_to_chrome_json(sample());
  int complete = 0, counters = 0, names = 0;
  for (const auto& e : c["traceEvents"]) {
    if (e["ph"] == "X") {
      ++complete;
      if (e["name"] == "g0.fwd.L0.attn.proj") {
        EXPECT_DOUBLE_EQ(e["ts"].get<double>(), 0.1e6);
        EXPECT_NEAR(e["dur"].get<double>(), 0.2e6, 1e-6);
        EXPECT_EQ(e["cat"], "gemm");
        EXPECT_DOUBLE_EQ(e["args"]["flops"].get<double>(), 1e12);
      }
    }
    counters += e["ph"] == "C" ? 1 : 0;
    names += (e["ph"] == "M" && e["name"] == "thread_name") ? 1 : 0;
  }
  EXPECT_EQ(complete, 3);
  EXPECT_EQ(counters, 4);  // three GPU samples, one NUMA sample
  EXPECT_EQ(names, 3);     // three resources
}

// The keys oom diff knows (and refuses others of) are the keys the export writes.
TEST(Trace, ChromeExportWritesTheKeysItsReaderKnows) {
  const auto keys = [](const nlohmann::json& object) {
    std::set<std::string> out;
    for (const auto& [key, value] : object.items()) out.insert(key);
    return out;
  };
  const auto known = [](const auto& list) { return std::set<std::string>(list.begin(), list.end()); };
  const nlohmann::json c = trace_to_chrome_json(sample());
  EXPECT_EQ(keys(c), known(kChromeTraceKeys));
  std::set<std::string> event_keys, arg_keys;
  for (const auto& e : c["traceEvents"]) {
    if (e["ph"] != "X") continue;
    event_keys.merge(keys(e));
    arg_keys.merge(keys(e["args"]));
  }
  EXPECT_EQ(event_keys, known(kChromeStageEventKeys));
  EXPECT_EQ(arg_keys, known(kChromeStageArgKeys));  // the sample's stage 2 counts its operators and syncs
}

TEST(Trace, FinalizeSortsStagesAndSetsStepAndPeaks) {
  Trace t = sample();
  std::swap(t.stages[0], t.stages[2]);
  t.step_s = 0;
  t.memory[0].peak_bytes = 0;
  finalize_trace(t);
  EXPECT_EQ(t.stages[0].id, 1);
  EXPECT_EQ(t.stages[2].id, 3);
  EXPECT_DOUBLE_EQ(t.step_s, 0.5);
  EXPECT_EQ(t.memory[0].peak_bytes, 1010);
}

// Two ranks' traces of one step: every stage (ids renumbered), the GPUs' timelines by index and the
// NUMA node both ranks report with both sample series and the larger peak.
TEST(MergeRankTraces, KeepsEveryStageAndEachDevicesTimeline) {
  Trace r0 = sample();
  Trace r1;
  r1.engine = "analytic";
  r1.stages = {stage(1, "g1.fwd.L0.weights.h2d", "h2d", "gpu1.h2d", 0.0, 0.2, 1000, 0),
               stage(2, "g1.fwd.L0.attn.proj", "gemm", "gpu1.compute", 0.2, 0.6, 0, 1e12)};
  r1.memory = {{"gpu1", {{0.0, 20}, {0.2, 2020}}, 2020}, {"numa0", {{0.1, 7}}, 7}};
  finalize_trace(r1);
  const Trace m = merge_rank_traces({r0, r1});
  EXPECT_EQ(m.engine, "analytic");
  EXPECT_EQ(m.host_syncs, 3);  // the most any rank made (the second rank's trace counted none)
  ASSERT_EQ(m.stages.size(), 5u);
  std::set<std::int64_t> ids;
  for (const auto& s : m.stages) ids.insert(s.id);
  EXPECT_EQ(ids.size(), 5u);
  EXPECT_DOUBLE_EQ(m.step_s, 0.6);
  EXPECT_EQ(m.gpu_peak_bytes, (std::vector<Bytes>{1010, 2020}));
  EXPECT_EQ(m.numa_peak_bytes, (std::vector<Bytes>{7}));
  ASSERT_EQ(m.memory.size(), 3u);
  EXPECT_EQ(m.memory[0].device, "gpu0");
  EXPECT_EQ(m.memory[1].device, "gpu1");
  EXPECT_EQ(m.memory[2].device, "numa0");
  EXPECT_EQ(m.memory[2].samples.size(), 2u);
}

}  // namespace
}  // namespace oom
