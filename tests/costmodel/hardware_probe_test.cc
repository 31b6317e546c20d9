// hardware_probe: the facts read from a fake /sys and /proc tree, the spec built from them (GPU
// NUMA nodes, PCIe generation, GPUs per switch, provenance), and this machine's spec against
// what the OS says of it (CPUs this process may use, NUMA nodes, MemTotal).
#include "costmodel/hardware_probe.h"

#include <sched.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "costmodel/hardware_spec.h"
#include "costmodel/input_error.h"

namespace oom {
namespace {

namespace fs = std::filesystem;

class FakeRoot {
 public:
  FakeRoot() : root_(fs::temp_directory_path() / ("oom_probe_test_" + std::to_string(::getpid()))) { fs::create_directories(root_); }
  ~FakeRoot() { fs::remove_all(root_); }
  void file(const std::string& rel, const std::string& text) const {
    fs::create_directories((root_ / rel).parent_path());
    std::ofstream(root_ / rel) << text << "\n";
  }
  // A PCI device at `chain` (bridges, then the device) with its attributes, linked from /sys/bus/pci/devices.
  void gpu(const std::string& chain, const std::string& numa, const std::string& speed) const {
    const fs::path dev = root_ / "sys/devices" / chain;
    const std::string rel = fs::relative(dev, root_).string();
    file(rel + "/vendor", "0x10de");
    file(rel + "/class", "0x030200");
    file(rel + "/numa_node", numa);
    file(rel + "/current_link_speed", speed);
    file(rel + "/current_link_width", "16");
    fs::create_directories(root_ / "sys/bus/pci/devices");
    fs::create_directory_symlink(dev, root_ / "sys/bus/pci/devices" / dev.filename());
  }
  std::string path() const { return root_.string(); }

 private:
  fs::path root_;
};

TEST(HardwareProbe, ReadsNumaNodesSocketsAndGpusFromAFakeTree) {
  const FakeRoot r;
  r.file("sys/devices/system/cpu/online", "0-7");
  for (int c = 0; c < 8; ++c) r.file("sys/devices/system/cpu/cpu" + std::to_string(c) + "/topology/physical_package_id", c < 4 ? "0" : "1");
  r.file("sys/devices/system/node/node0/cpulist", "0-3");
  r.file("sys/devices/system/node/node0/meminfo", "Node 0 MemTotal:       16777216 kB\nNode 0 MemFree: 1 kB");
  r.file("sys/devices/system/node/node1/cpulist", "4-7");
  r.file("sys/devices/system/node/node1/meminfo", "Node 1 MemTotal:       16777216 kB");
  r.file("sys/devices/system/node/node2/cpulist", "");  // a memory-only node is no socket
  r.file("sys/devices/system/node/node2/meminfo", "Node 2 MemTotal:       1048576 kB");
  r.file("proc/cpuinfo", "processor\t: 0\nmodel name\t: Test CPU 9000\n");
  // Four GPUs, two behind each switch, one switch per socket.
  r.gpu("pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0/0000:03:00.0", "0", "16.0 GT/s PCIe");
  r.gpu("pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:01.0/0000:04:00.0", "0", "16.0 GT/s PCIe");
  r.gpu("pci0000:80/0000:80:01.0/0000:81:00.0/0000:82:00.0/0000:83:00.0", "1", "16.0 GT/s PCIe");
  r.gpu("pci0000:80/0000:80:01.0/0000:81:00.0/0000:82:01.0/0000:84:00.0", "1", "16.0 GT/s PCIe");

  const HostFacts f = read_host_facts(r.path());
  EXPECT_EQ(f.sockets, 2);
  EXPECT_EQ(f.usable_cpus, 8);
  EXPECT_EQ(f.cpu_model, "Test CPU 9000");
  ASSERT_EQ(f.numa.size(), 2u);
  EXPECT_EQ(f.numa[1].id, 1);
  EXPECT_EQ(f.numa[1].dram_bytes, 16 * kGiB);
  ASSERT_EQ(f.pci_gpus.size(), 4u);
  EXPECT_EQ(f.pci_gpus[2].numa_node, 1);
  EXPECT_EQ(f.pci_gpus[0].link_generation, 4);
  EXPECT_EQ(f.pci_gpus[0].upstream, f.pci_gpus[1].upstream);
  EXPECT_NE(f.pci_gpus[0].upstream, f.pci_gpus[2].upstream);

  const std::vector<ProbedDevice> gpus(4, ProbedDevice{"NVIDIA H100 80GB HBM3", 80 * kGiB});
  const nlohmann::json j = probed_hardware_json(f, gpus, "fake");
  const HardwareSpec h = hardware_spec_from_json(j, "fake.json");
  EXPECT_EQ(h.gpus_per_node, 4);
  EXPECT_EQ(h.gpu_numa, (std::vector<int>{0, 0, 1, 1}));
  EXPECT_EQ(h.pcie.generation, 4);
  EXPECT_EQ(h.pcie.gpus_per_switch, 2);
  EXPECT_EQ(h.numa[0].cores, 4);
  EXPECT_EQ(j["provenance"]["gpu_numa"], "measured");
  EXPECT_EQ(j["provenance"]["pcie.gpus_per_switch"], "measured");
  EXPECT_EQ(j["provenance"]["gpu.bf16_flops"], "assumed");
  // The rates of the shipped spec of the same GPU (configs/hardware/h100-sxm-node.json).
  EXPECT_EQ(h.gpu.bf16_flops_per_s, load_hardware_spec("h100-sxm-node").gpu.bf16_flops_per_s);
  for (const auto& field : hardware_numeric_fields(h)) {
    EXPECT_TRUE(h.sources.contains(field)) << field;
    EXPECT_TRUE(j["provenance"].contains(field)) << field;
  }
}

TEST(HardwareProbe, NoNumaFilesIsOneNodeOfMemTotal) {
  const FakeRoot r;
  r.file("sys/devices/system/cpu/online", "0-2");
  r.file("proc/meminfo", "MemTotal:        8388608 kB\nMemFree: 1 kB");
  const HostFacts f = read_host_facts(r.path());
  ASSERT_EQ(f.numa.size(), 1u);
  EXPECT_EQ(f.numa[0].cpus, 3);
  EXPECT_EQ(f.numa[0].dram_bytes, 8 * kGiB);
  const nlohmann::json j = probed_hardware_json(f, {}, "cpu");
  const HardwareSpec h = hardware_spec_from_json(j, "cpu.json");
  EXPECT_EQ(h.gpu.name, "host CPU (FP32)");
  EXPECT_EQ(h.gpus_per_node, 1);
  EXPECT_EQ(j["provenance"]["numa.cores"], "measured");
  EXPECT_EQ(j["provenance"]["numa.dram_Bps"], "assumed");
}

TEST(HardwareProbe, NothingReadableIsAnInputError) {
  const FakeRoot r;
  EXPECT_THROW(read_host_facts(r.path()), InputError);
}

// This machine: the CPUs this process may use (nproc), the NUMA nodes /sys lists with CPUs and
// memory, and /proc/meminfo's MemTotal.
TEST(HardwareProbe, ThisMachineMatchesTheOs) {
  const HostFacts f = read_host_facts("/");
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  EXPECT_EQ(f.usable_cpus, CPU_COUNT(&set));
  int nodes = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/sys/devices/system/node", ec)) {
    const std::string n = e.path().filename().string();
    if (n.starts_with("node") && n.size() > 4 && std::isdigit(static_cast<unsigned char>(n[4]))) {
      std::ifstream list(e.path() / "cpulist");
      std::string cpus;
      std::getline(list, cpus);
      nodes += cpus.empty() ? 0 : 1;
    }
  }
  EXPECT_EQ(static_cast<int>(f.numa.size()), std::max(nodes, 1));
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  long long kb = 0;
  meminfo >> key >> kb;
  ASSERT_EQ(key, "MemTotal:");
  Bytes total = 0;
  for (const auto& n : f.numa) total += n.dram_bytes;
  EXPECT_NEAR(static_cast<double>(total), static_cast<double>(kb) * 1024, 0.02 * static_cast<double>(kb) * 1024);
  EXPECT_NO_THROW(hardware_spec_from_json(probed_hardware_json(f, {}, "this-machine"), "this-machine.json"));
}

}  // namespace
}  // namespace oom
