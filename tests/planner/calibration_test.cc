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

// A calibration written before the windowed kernel had a constant of its own priced windows as the
// flash kernel: read back, such a file keeps doing so (its own attention efficiency), while one
// that states the windowed efficiency keeps it. A probed device (the CPU backend, one attention
// kernel) starts from windowed = flash.
TEST(Calibration, AFileWithoutTheWindowedKernelPricesWindowsAsItsFlashKernel) {
  Calibration c = default_calibration(load_hardware_spec("h100-sxm-node"));
  EXPECT_LT(c.windowed_attention_efficiency, c.attention_efficiency);
  c.attention_efficiency = 0.7;
  c.windowed_attention_efficiency = 0.5;
  nlohmann::json j = calibration_to_json(c);
  EXPECT_DOUBLE_EQ(calibration_from_json(j, "x.json").windowed_attention_efficiency, 0.5);
  j.erase("windowed_attention_efficiency");
  EXPECT_DOUBLE_EQ(calibration_from_json(j, "x.json").windowed_attention_efficiency, 0.7);
  const Calibration cpu = default_calibration(load_hardware_spec("local-cpu"));
  EXPECT_DOUBLE_EQ(cpu.windowed_attention_efficiency, cpu.attention_efficiency);
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
  // A hardware without a calibration file, whose GPU architecture (Ada) nobody calibrated, gets
  // the estimate.
  const HardwareSpec other = load_hardware_spec("rtx4090-node");
  EXPECT_EQ(other.gpu.architecture, "ada");
  EXPECT_EQ(load_calibration_for(other), default_calibration(other));
  std::string source;
  load_calibration_for(other, "analytic", &source);
  EXPECT_NE(source.find("uncalibrated"), std::string::npos) << source;
  load_calibration_for(h, "analytic", &source);
  EXPECT_NE(source.find("h100-sxm-node.json"), std::string::npos) << source;
}

TEST(Calibration, TransfersTheH100CalibrationToTheH200) {
  const HardwareSpec h100 = load_hardware_spec("h100-sxm-node");
  const HardwareSpec h200 = load_hardware_spec("h200-sxm-node");
  ASSERT_EQ(h200.gpu.architecture, h100.gpu.architecture);
  for (const std::string engine : {"analytic", "simgrid"}) {
    SCOPED_TRACE(engine);
    const Calibration fitted = load_calibration_for(h100, engine);
    const Calibration c = load_calibration_for(h200, engine);
    EXPECT_EQ(c.hardware, "h200-sxm-node");
    EXPECT_NE(c.fitted_from.find("h100-sxm-node"), std::string::npos) << c.fitted_from;
    // The kernels' efficiencies and the fixed costs as fitted (each engine's own fit).
    EXPECT_EQ(c.gemm_efficiency, fitted.gemm_efficiency);
    EXPECT_EQ(c.expert_gemm_efficiency, fitted.expert_gemm_efficiency);
    EXPECT_EQ(c.attention_efficiency, fitted.attention_efficiency);
    EXPECT_EQ(c.gdn_efficiency, fitted.gdn_efficiency);
    EXPECT_EQ(c.compute_overhead_s, fitted.compute_overhead_s);
    EXPECT_EQ(c.expert_overhead_s, fitted.expert_overhead_s);
    EXPECT_EQ(c.fabric_efficiency, fitted.fabric_efficiency);  // NVLink both
    EXPECT_EQ(c.collective_overhead_s, fitted.collective_overhead_s);
    // Link and CPU rates as fractions of each spec's datasheet rates.
    EXPECT_DOUBLE_EQ(c.h2d_Bps, fitted.h2d_Bps * h200.pcie.h2d_Bps / h100.pcie.h2d_Bps);
    EXPECT_DOUBLE_EQ(c.cpu_adamw_params_per_s,
                     fitted.cpu_adamw_params_per_s * h200.numa[0].adamw_params_per_s / h100.numa[0].adamw_params_per_s);
    EXPECT_NE(c, default_calibration(h200));
  }
  EXPECT_NE(load_calibration_for(h200, "simgrid"), load_calibration_for(h200));
}

TEST(Calibration, TransferScalesRatesAndKeepsTheFabricOnlyOnItsKind) {
  const HardwareSpec from = load_hardware_spec("h100-sxm-node");
  Calibration fitted = load_calibration_for(from);
  HardwareSpec to = from;
  to.name = "faster-links";
  to.pcie.h2d_Bps *= 2;
  to.pcie.d2h_Bps *= 3;
  for (auto& n : to.numa) n.adamw_params_per_s /= 2;
  Calibration c = transfer_calibration(fitted, from, to);
  EXPECT_DOUBLE_EQ(c.h2d_Bps, 2 * fitted.h2d_Bps);
  EXPECT_DOUBLE_EQ(c.d2h_Bps, 3 * fitted.d2h_Bps);
  EXPECT_DOUBLE_EQ(c.cpu_adamw_params_per_s, fitted.cpu_adamw_params_per_s / 2);
  EXPECT_DOUBLE_EQ(c.host_prep_params_per_s, fitted.host_prep_params_per_s / 2);
  EXPECT_DOUBLE_EQ(c.host_accumulate_params_per_s, fitted.host_accumulate_params_per_s / 2);
  EXPECT_DOUBLE_EQ(c.torch_adamw_params_per_s, fitted.torch_adamw_params_per_s / 2);
  EXPECT_EQ(c.fabric_efficiency, fitted.fabric_efficiency);
  // Another fabric (PCIe peer): the NVLink fit says nothing of it.
  to.fabric.kind = FabricKind::kPciePeer;
  c = transfer_calibration(fitted, from, to);
  EXPECT_EQ(c.fabric_efficiency, default_calibration(to).fabric_efficiency);
  EXPECT_EQ(c.collective_overhead_s, default_calibration(to).collective_overhead_s);
  EXPECT_EQ(c.gemm_efficiency, fitted.gemm_efficiency);
  EXPECT_EQ(c.windowed_attention_efficiency, fitted.windowed_attention_efficiency);
  // A probed device: its measured GEMM ramp, and one attention kernel, windowed or not.
  ASSERT_NE(fitted.windowed_attention_efficiency, fitted.attention_efficiency);
  to.gpu.gemm_half_rows = 48;
  c = transfer_calibration(fitted, from, to);
  EXPECT_EQ(c.gemm_half_rows, 48);
  EXPECT_EQ(c.expert_half_rows, 48);
  EXPECT_EQ(c.windowed_attention_efficiency, fitted.attention_efficiency);
  // No stated architecture: nothing to transfer from.
  HardwareSpec unknown = load_hardware_spec("h200-sxm-node");
  unknown.gpu.architecture.clear();
  EXPECT_EQ(load_calibration_for(unknown), default_calibration(unknown));
}

}  // namespace
}  // namespace oom
