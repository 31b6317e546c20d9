// DurationModel: the engine-neutral price of one StepGraph stage.
//
// Both the analytic evaluator and the SimGrid simulator ask the same model what a stage costs, so
// they disagree only where contention changes the answer. A stage's cost is a fixed part
// (launch, DMA set-up, collective synchronization) plus `work / rate`: FLOPs at the achieved
// FLOP/s for compute, bytes at the achieved bandwidth for transfers, parameters at the achieved
// parameters/s for CPU and GPU updates. `rate` is the stage's fair share when the ranks that
// share its hardware element run alike (e.g. two ranks' CPU updates on one socket each get half of
// it) — what an engine without contention uses; `exclusive_rate` is the whole element's rate for
// engines that model sharing themselves (SimGrid: a socket's CPU, a NUMA node's DRAM).
// Thread-safety: cost() is const and may be called from several threads.
#pragma once

#include <algorithm>
#include <memory>
#include <vector>

#include "costmodel/hardware_spec.h"
#include "costmodel/units.h"
#include "planner/calibration/calibration.h"
#include "planner/lowering/step_graph.h"

namespace oom {

struct StageCost {
  Seconds fixed_s = 0;        // overhead paid once per stage
  double work = 0;            // FLOPs, bytes or parameters
  double rate = 0;            // work per second, fair share (0 when work is 0)
  double exclusive_rate = 0;  // work per second with the shared element to itself
  Seconds duration_s() const { return fixed_s + (rate > 0 ? work / rate : 0.0); }
  // The work part alone on its hardware: work / exclusive_rate.
  Seconds alone_s() const { return work > 0 && exclusive_rate > 0 ? work / exclusive_rate : 0.0; }
};

// DRAM bytes a CPU task moves per parameter (kAdamWDramBytesPerParam and the others): calibration.h.

// DRAM bytes of CPU stage `s`: its bytes when the lowering set them, else its parameters at the
// per-kind rates above; 0 for stages that are not CPU tasks.
Bytes cpu_stage_dram_bytes(const Stage& s);
// Host DRAM bytes stage `s` moves: a CPU task's (above), a host–device copy's bytes; 0 for GPU work.
// A property of the stage, not of a calibration: both engines' host sharing read it.
Bytes host_dram_bytes(const Stage& s);

// A socket's host state past its DRAM spills into the node's other sockets (costmodel/
// host_placement.h, Linux's default NUMA policy); that share of its CPU tasks' parameters is
// reached across the socket links. A CPU task streams its DRAM bytes half each way (AdamW: master,
// moments and the gradient read, 14 B; the same written back), so a remote parameter costs its
// half of the stage's DRAM bytes on the links' one-direction rate (HardwareSpec::socket_link_Bps)
// when that is slower than the socket's cores. The share is NUMA node `numa`'s base footprint
// (StepGraph::numa_base_bytes) beyond its DRAM; 0 when it fits or the links are not stated.
double spilled_state_fraction(const HardwareSpec& h, const StepGraph& g, int numa);
// The rate of a CPU task of `dram_bytes_per_param` on a socket of `socket_rate` parameters/s of
// which `remote` share of the parameters sit on another socket behind `link_Bps`.
double cpu_rate_with_remote_state(double socket_rate, double remote, double dram_bytes_per_param, BytesPerS link_Bps);

// PyTorch's memory-efficient attention (ATen's CUTLASS mem_eff_attention, the kernel SDPA picks
// for head dims past 256, which FlashAttention does not take) works in tiles of 32 queries × 128
// keys once the head dim exceeds 64 (kernel_forward.h: 64 × 64 only up to 64). Each query tile
// streams every key and value it attends to.
inline constexpr std::int64_t kMemoryEfficientAttentionQueriesPerTile = 32;

// HBM bytes the memory-efficient forward re-reads for K and V: each query tile streams its keys
// and values (BF16); the tiles in flight at once are neighbouring query tiles of one head (the
// kernel's grid runs query tiles fastest), so they share that head's K and V through L2 as long as
// the head's K and V over the keys its tiles reach fit in `l2_bytes`. The share that does not fit,
// 1 − L2 / working set, comes from HBM. 0 when `l2_bytes` is 0 (not stated) or the working set
// fits. Not applied to the backward kernel, whose tiling (key blocks streaming the queries) is not
// modelled.
Bytes memory_efficient_attention_hbm_rereads(const OpShape& shape, Bytes l2_bytes);

class DurationModel {
 public:
  virtual ~DurationModel() = default;
  // Achievable DRAM bandwidth of NUMA node `numa` that CPU tasks and DMA copies share; 0 when the
  // model does not know it (then only the socket's cores are shared).
  virtual double host_dram_Bps(int numa) const {
    (void)numa;
    return 0;
  }
  // The PCIe channel (a GPU's link, or a switch uplink several GPUs share) that rank `rank` of
  // `ranks` copies over; ranks with equal values share it. Default: a link per rank.
  virtual int pcie_link_of_rank(int rank, int ranks) const {
    (void)ranks;
    return rank;
  }
  // The cost of stage `s` of graph `g`. Never negative; a kSync stage costs nothing. Depends only
  // on the stage's op, phase, resource (and that resource's fields), rank, demand (flops, bytes,
  // params), shape and peers — never on its name, layer, dependencies or memory events — so stages
  // alike in those are priced once (planner/calibration/calibrate.cc).
  virtual StageCost cost(const Stage& s, const StepGraph& g) const = 0;
  Seconds duration_s(const Stage& s, const StepGraph& g) const { return cost(s, g).duration_s(); }
};

// Prices stages from the HardwareSpec's peaks and a Calibration's constants:
//   GEMM: flops / (peak · gemm_efficiency · m/(m + half_rows)); expert GEMM likewise with the
//   tokens per expert, plus expert_overhead_s per local expert; attention and GDN:
//   flops / (peak · efficiency), attention backward with its own efficiency, a windowed core (a
//   window shorter than the sequence) at the windowed kernel's, the memory-efficient
//   (head dim > 256) forward adding its K/V re-reads past L2 at the HBM rate; every compute stage
//   adds its memory-bound kernels' HBM bytes (costmodel/traffic.h) / (HBM · hbm_efficiency);
//   element-wise and GPU AdamW: bytes / (HBM · hbm_efficiency); H2D/D2H: a transfer's fixed cost
//   plus bytes / achieved link rate; collectives: collective_overhead_s + (members − 1) · fabric
//   latency + bytes / (fabric rate · fabric_efficiency), members on other nodes through the NICs
//   (their latency per such peer; all-to-all sends the off-node share there, shared by the node's
//   members; all-gather and reduce-scatter rings at the slower of fabric and the node's NICs);
//   CPU work: params / (socket rate / ranks on the socket).
// How member `rank` of a collective over `peers` reaches the other members on `h` (rank r on node
// r / gpus_per_node, HardwareSpec::global_gpu_of_rank): `on_node(q)` is called for every other
// member q on its node; the result counts the members on other nodes and names the farthest of
// their nodes (the most switches away, −1 when none), whose latency and sustained rate pace the
// member's off-node shares. Members of consecutive ranks (every lowering's collective over all
// ranks) are counted per node, in O(gpus_per_node): leaves and pods are runs of consecutive nodes,
// so the farthest node is the run's first or last. Both engines price a collective through it.
struct CollectiveReach {
  bool member = false;   // `rank` is among `peers`
  int off_node = 0;      // members on other nodes
  int farthest_node = -1;
};
template <class OnNode>
CollectiveReach collective_reach(const HardwareSpec& h, const std::vector<int>& peers, int rank, OnNode on_node) {
  CollectiveReach out;
  if (peers.empty()) return out;
  const int per_node = std::max(1, h.gpus_per_node), node = std::max(0, rank) / per_node;
  auto reach = [&](int other) {
    if (other != node && (out.farthest_node < 0 || h.network.switches_between(node, other) >
                                                       h.network.switches_between(node, out.farthest_node))) {
      out.farthest_node = other;
    }
  };
  const int first = peers.front(), last = peers.back();
  if (last - first + 1 == static_cast<int>(peers.size()) && first <= rank && rank <= last) {
    out.member = true;
    const int lo = std::max(first, node * per_node), hi = std::min(last, node * per_node + per_node - 1);
    for (int q = lo; q <= hi; ++q) {
      if (q != rank) on_node(q);
    }
    out.off_node = static_cast<int>(peers.size()) - (hi - lo + 1);
    reach(first / per_node);
    reach(last / per_node);
    return out;
  }
  for (const int q : peers) {
    if (q == rank) {
      out.member = true;
    } else if (q / per_node == node) {
      on_node(q);
    } else {
      ++out.off_node;
      reach(q / per_node);
    }
  }
  return out;
}

class CalibratedDurationModel : public DurationModel {
 public:
  // `ranks` is the number of training ranks (to share sockets fairly).
  CalibratedDurationModel(HardwareSpec hardware, Calibration calibration, int ranks);
  // The same over a shared HardwareSpec (no copy: callers that price one hardware under many
  // calibrations, such as the fit, build a model per calibration).
  CalibratedDurationModel(std::shared_ptr<const HardwareSpec> hardware, Calibration calibration, int ranks);
  StageCost cost(const Stage& s, const StepGraph& g) const override;
  double host_dram_Bps(int numa) const override;
  int pcie_link_of_rank(int rank, int ranks) const override { return hardware_->pcie_switch_of_rank(rank, ranks); }
  const Calibration& calibration() const { return calibration_; }
  const HardwareSpec& hardware() const { return *hardware_; }

 private:
  std::shared_ptr<const HardwareSpec> hardware_;
  Calibration calibration_;
  int ranks_ = 1;
  std::vector<int> ranks_per_numa_;

  // All-to-all, all-gather, reduce-scatter: fixed cost and rate, through the NICs for members on
  // other nodes.
  void collective_cost(const Stage& s, StageCost& out) const;
};

}  // namespace oom
