// Work counts: how much a plan search or a study did, for the benchmarks that watch their time
// (tests/bench/study_bench.cc) and for anyone asking why a case is slow.
//
// Counted where the work happens, on the thread that does it:
//   lowerings   - step graphs built for the plan search and the short executions
//                 (PlanPricer::lower_plan, GraphExecutor::run);
//   simulations - step graphs executed by an engine or evaluated analytically for the same;
//   priced      - candidate plans priced at their depth (PlanPricer::price, memo hits included);
//   price_hits  - of those, the ones answered from the pricer's memo without lowering.
// The baselines' own lowerings (planner/lowering/baselines.h) are not counted here.
// Thread-safety: each thread has its own counts (thread_work_counts()); a caller that runs work on
// several threads sums what each reports. Reading or resetting them costs nothing.
#pragma once

#include <cstdint>

namespace oom {

struct WorkCounts {
  std::int64_t lowerings = 0;
  std::int64_t simulations = 0;
  std::int64_t priced = 0;
  std::int64_t price_hits = 0;
  WorkCounts& operator+=(const WorkCounts& o) {
    lowerings += o.lowerings;
    simulations += o.simulations;
    priced += o.priced;
    price_hits += o.price_hits;
    return *this;
  }
  friend WorkCounts operator-(WorkCounts a, const WorkCounts& b) {
    a.lowerings -= b.lowerings;
    a.simulations -= b.simulations;
    a.priced -= b.priced;
    a.price_hits -= b.price_hits;
    return a;
  }
};

// The calling thread's counts since it started.
inline WorkCounts& thread_work_counts() {
  static thread_local WorkCounts counts;
  return counts;
}

}  // namespace oom
