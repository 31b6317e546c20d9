// Tests of planner/calibration/calibration.h: JSON round trip, errors naming the field, defaults from the
// hardware, and the project's calibration files.
#include "planner/calibration/calibration.h"

#include <gtest/gtest.h>

#include "costmodel/input_error.h"

namespace oom {
namespace {

TEST(Calibration, JsonRoundTrip) {
  Calibration c = default_calibration(load_hardware_spec("h100-sxm-node"));
  c.gemm_efficiency = 0.61;
  c.attention_backward_efficiency = 0.42;
  c.expert_overhead_s = 7e-6;
  c.operator_overhead_s = 6e-7;
  c.fitted_from = "test";
  EXPECT_EQ(calibration_from_json(calibration_to_json(c), "x.json"), c);
}

TEST(Calibration, RejectsEfficienciesAboveOneNamingTheField) {
  nlohmann::json j = calibration_to_json(default_calibration(load_hardware_spec("h100-sxm-node")));
  j["gemm_efficiency"] = 1.5;
  try {
    calibration_from_json(j, "cal.json");
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("cal.json"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("gemm_efficiency"), std::string::npos);
  }
  j["gemm_efficiency"] = 0.5;
  j["gem_efficiency"] = 0.5;  // misspelled
  EXPECT_THROW(calibration_from_json(j, "cal.json"), InputError);
}

TEST(Calibration, DefaultsTakeTheHardwareRates) {
  const HardwareSpec h = load_hardware_spec("rtx4090-node");
  const Calibration c = default_calibration(h);
  EXPECT_EQ(c.hardware, "rtx4090-node");
  EXPECT_DOUBLE_EQ(c.h2d_Bps, h.pcie.h2d_Bps);
  EXPECT_DOUBLE_EQ(c.cpu_adamw_params_per_s, h.numa[0].adamw_params_per_s);
}

TEST(Calibration, LoadsTheProjectCalibrationOfTheH100Node) {
  const HardwareSpec h = load_hardware_spec("h100-sxm-node");
  const Calibration c = load_calibration_for(h);
  EXPECT_EQ(c.hardware, "h100-sxm-node");
  EXPECT_NE(c, default_calibration(h));  // fitted, not the estimate
  EXPECT_GT(c.gemm_efficiency, 0.0);
  EXPECT_LE(c.gemm_efficiency, 1.0);
  // A hardware without a calibration file gets the estimate.
  const HardwareSpec other = load_hardware_spec("rtx4090-node");
  EXPECT_EQ(load_calibration_for(other), default_calibration(other));
}

}  // namespace
}  // namespace oom
