// A DurationModel of round numbers with no fixed part, for golden timelines a reader can check by
// hand: 100 TFLOP/s compute, 10 GB/s host–device copies, 100 GB/s collectives, CPU updates at
// 0.25 G params/s, free synchronization.
#pragma once

#include "planner/engine/duration_model.h"
#include "planner/lowering/step_graph.h"

namespace oom::test_support {

class RoundNumbers : public DurationModel {
 public:
  StageCost cost(const Stage& s, const StepGraph&) const override {
    switch (s.op) {
      case OpKind::kH2d:
      case OpKind::kD2h:
        return {0, static_cast<double>(s.bytes), 10e9, 10e9};
      case OpKind::kAllToAll:
      case OpKind::kAllGather:
      case OpKind::kReduceScatter:
        return {0, static_cast<double>(s.bytes), 100e9, 100e9};
      case OpKind::kCpuAdamW:
      case OpKind::kTorchCpuAdamW:
        return {0, static_cast<double>(s.params), 0.25e9, 0.25e9};
      case OpKind::kSync:
        return {};
      default:
        return {0, s.flops, 100e12, 100e12};
    }
  }
};

}  // namespace oom::test_support
