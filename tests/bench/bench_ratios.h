// A console reporter that also keeps each benchmark's counters, so a benchmark program can end
// with the ratios it exists to measure (e.g. CPU AdamW params/s ÷ torch::optim::AdamW params/s).
#pragma once

#include <map>
#include <string>

#include <benchmark/benchmark.h>

namespace oom::bench {

class RecordingReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const auto& r : runs) {
      if (r.error_occurred || r.run_type != Run::RT_Iteration) continue;
      Record& rec = records[r.benchmark_name()];
      rec.real_time_s = r.GetAdjustedRealTime() * benchmark::GetTimeUnitMultiplier(r.time_unit);
      rec.cpu_time_s = r.GetAdjustedCPUTime() * benchmark::GetTimeUnitMultiplier(r.time_unit);
      for (const auto& [name, counter] : r.counters) rec.counters[name] = counter.value;
    }
    ConsoleReporter::ReportRuns(runs);
  }
  struct Record {
    double real_time_s = 0;  // per iteration
    double cpu_time_s = 0;   // per iteration (process CPU time when the benchmark measures it)
    std::map<std::string, double> counters;
  };
  std::map<std::string, Record> records;

  // The record whose name starts with `prefix` (names carry arguments and options), or nullptr.
  const Record* find(const std::string& prefix) const {
    for (const auto& [name, rec] : records) {
      if (name.rfind(prefix, 0) == 0) return &rec;
    }
    return nullptr;
  }
};

}  // namespace oom::bench
