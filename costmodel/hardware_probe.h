// A HardwareSpec of the machine this runs on (`oom hardware probe`), from what the OS reports:
// NUMA nodes with their CPUs and memory (/sys/devices/system/node, else /proc/meminfo and the
// online CPUs), sockets (each CPU's physical_package_id), the NVIDIA GPUs on the PCI bus with
// their NUMA node, link generation and upstream switch (/sys/bus/pci/devices), and the GPUs the
// LibTorch backend sees (name, memory), when it is there.
//
// Every field of the spec is marked in its "provenance" object as "measured" (read from the OS or
// the backend on this machine) or "assumed" (an estimate: rates no file reports, taken from the
// shipped spec of the same GPU or from the constants below), and named in "sources". With no GPU
// the spec is CPU-only like configs/hardware/local-cpu.json: the host CPU stands in for one GPU.
// Counts are logical CPUs this process may run on (its affinity mask), so a container's limit
// is respected. Reading is pure file I/O under a root folder, so tests can point it at a fake
// tree. Not thread-safe with concurrent changes to the files, like any reader of /sys.
#pragma once

#include <string>
#include <vector>

#include "costmodel/hardware_spec.h"
#include "costmodel/units.h"

namespace oom {

struct ProbedNumaNode {
  int id = 0;
  int cpus = 0;        // logical CPUs of the node this process may run on
  Bytes dram_bytes = 0;
};

// An NVIDIA display or 3D controller on the PCI bus.
struct ProbedPciGpu {
  std::string address;   // "0000:17:00.0"
  int numa_node = -1;    // -1: not reported
  int link_generation = 0;  // from current_link_speed; 0: not reported
  int link_width = 0;
  std::string upstream;  // the PCI device two levels up (the switch's upstream port), "" if none
};

// A GPU as the LibTorch backend reports it.
struct ProbedDevice {
  std::string name;
  Bytes memory_bytes = 0;
};

struct HostFacts {
  int sockets = 1;
  int usable_cpus = 0;  // over every NUMA node
  std::string cpu_model;
  std::vector<ProbedNumaNode> numa;
  std::vector<ProbedPciGpu> pci_gpus;
};

// Reads the facts under `root` ("/" for this machine). With `root` "/" the CPUs are those of this
// process's affinity mask; under another root every listed CPU counts. A machine that reports no
// NUMA nodes is one node with /proc/meminfo's MemTotal and every online CPU. Throws InputError
// naming the file when neither memory nor CPUs can be read.
HostFacts read_host_facts(const std::string& root = "/");

// Estimates of a CPU standing in for a GPU, per logical CPU, and of its copies: fitted on this
// project's 2-core machine by `oom calibrate --backend` (configs/hardware/local-cpu.json: 9.16e10
// FP32 FLOP/s, 3.66e10 B/s copies, 2.04e9 AdamW parameters/s over 2 cores).
inline constexpr double kAssumedCpuFlopsPerCore = 4.5e10;
inline constexpr double kAssumedCpuCopyBpsPerSocket = 3.6e10;
inline constexpr double kAssumedAdamwParamsPerCorePerS = 1.0e9;
// PCIe payload per lane and generation, after 128b/130b coding and packet overhead: about 80 % of
// the raw rate (Gen4 x16: 25.6 GB/s of 31.5 GB/s, the H100 node's measured copies).
inline constexpr double kPcieEfficiency = 0.8;

// The spec named `name` of the machine `host` describes, with `devices` the backend's GPUs (empty:
// a CPU-only spec). Its "provenance" and "sources" name every field. The result passes
// hardware_spec_from_json.
nlohmann::json probed_hardware_json(const HostFacts& host, const std::vector<ProbedDevice>& devices, const std::string& name);

}  // namespace oom
