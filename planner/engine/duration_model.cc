#include "planner/engine/duration_model.h"

#include <algorithm>
#include <cmath>

#include "costmodel/host_placement.h"
#include "costmodel/input_error.h"

namespace oom {

CalibratedDurationModel::CalibratedDurationModel(HardwareSpec hardware, Calibration calibration, int ranks)
    : CalibratedDurationModel(std::make_shared<const HardwareSpec>(std::move(hardware)), std::move(calibration), ranks) {}

CalibratedDurationModel::CalibratedDurationModel(std::shared_ptr<const HardwareSpec> hardware, Calibration calibration, int ranks)
    : hardware_(std::move(hardware)), calibration_(std::move(calibration)), ranks_(std::max(1, ranks)) {
  OOM_ASSERT(hardware_ != nullptr, "a duration model needs a HardwareSpec");
  ranks_per_numa_ = hardware_->ranks_per_numa(ranks_);
  if (calibration_.h2d_Bps <= 0 || calibration_.d2h_Bps <= 0 || calibration_.cpu_adamw_params_per_s <= 0) {
    const Calibration d = default_calibration(*hardware_);
    if (calibration_.h2d_Bps <= 0) calibration_.h2d_Bps = d.h2d_Bps;
    if (calibration_.d2h_Bps <= 0) calibration_.d2h_Bps = d.d2h_Bps;
    if (calibration_.cpu_adamw_params_per_s <= 0) calibration_.cpu_adamw_params_per_s = d.cpu_adamw_params_per_s;
  }
  if (calibration_.host_prep_params_per_s <= 0) calibration_.host_prep_params_per_s = 4 * calibration_.cpu_adamw_params_per_s;
  if (calibration_.host_accumulate_params_per_s <= 0) {
    calibration_.host_accumulate_params_per_s = accumulate_rate_of(calibration_.cpu_adamw_params_per_s);
  }
  if (calibration_.torch_adamw_params_per_s <= 0) calibration_.torch_adamw_params_per_s = calibration_.cpu_adamw_params_per_s;
}

Bytes cpu_stage_dram_bytes(const Stage& s) {
  if (s.bytes > 0) return s.bytes;
  switch (s.op) {
    case OpKind::kCpuAdamW:
      return s.params * kAdamWDramBytesPerParam;
    case OpKind::kTorchCpuAdamW:
      return s.params * kTorchAdamWDramBytesPerParam;
    case OpKind::kHostAccumulate:
      return s.params * kHostAccumulateDramBytesPerParam;
    case OpKind::kHostPrep:
      return s.params * kHostPrepDramBytesPerParam;
    default:
      return 0;
  }
}

Bytes host_dram_bytes(const Stage& s) {
  switch (s.op) {
    case OpKind::kH2d:
    case OpKind::kD2h:
      return s.bytes;
    case OpKind::kCpuAdamW:
    case OpKind::kTorchCpuAdamW:
    case OpKind::kHostAccumulate:
    case OpKind::kHostPrep:
      return cpu_stage_dram_bytes(s);
    default:
      return 0;
  }
}

double spilled_state_fraction(const HardwareSpec& h, const StepGraph& g, int numa) {
  if (numa < 0 || static_cast<std::size_t>(numa) >= g.numa_base_bytes.size() || h.numa.empty() || h.socket_link_Bps <= 0) return 0;
  return spilled_fraction(g.numa_base_bytes[static_cast<std::size_t>(numa)], h.numa_spec(numa).dram_bytes);
}

double cpu_rate_with_remote_state(double socket_rate, double remote, double dram_bytes_per_param, BytesPerS link_Bps) {
  if (remote <= 0 || link_Bps <= 0 || dram_bytes_per_param <= 0 || socket_rate <= 0) return socket_rate;
  const double remote_rate = std::min(socket_rate, link_Bps / (dram_bytes_per_param / 2));
  return 1 / ((1 - remote) / socket_rate + remote / remote_rate);
}

void CalibratedDurationModel::collective_cost(const Stage& s, StageCost& out) const {
  // Alpha–beta: a fixed cost per collective (launch, split exchange, synchronization) plus one
  // latency per peer a member exchanges with, then the bytes at the fabric's rate.
  const Calibration& c = calibration_;
  const HardwareSpec& h = *hardware_;
  const double fabric = h.fabric.per_gpu_Bps * c.fabric_efficiency;
  const std::size_t members = std::max<std::size_t>(2, s.peers.size());
  out.work = static_cast<double>(s.bytes);
  out.rate = out.exclusive_rate = fabric;
  // Members on other nodes are reached through the NICs (ranks fill nodes in order: rank r on
  // node r / gpus_per_node, HardwareSpec::global_gpu_of_rank).
  const int node = std::max(0, s.gpu) / h.gpus_per_node;
  int others_on_node = 0;
  const CollectiveReach reach = collective_reach(h, s.peers, s.gpu, [&](int) { ++others_on_node; });
  const int on_node = others_on_node + (reach.member ? 1 : 0), off_node = reach.off_node;  // on_node: this member too
  Seconds network_latency = 0;
  BytesPerS network = h.network.per_node_Bps();
  if (reach.farthest_node >= 0) {
    network_latency = h.network.latency_between(node, reach.farthest_node);
    network = std::min(network, h.network.sustained_Bps(node, reach.farthest_node));
  }
  if (off_node == 0) {
    out.fixed_s = c.collective_overhead_s + static_cast<double>(members - 1) * h.fabric.latency_s;
    return;
  }
  out.fixed_s = c.collective_overhead_s + static_cast<double>(std::max(0, on_node - 1)) * h.fabric.latency_s +
                static_cast<double>(off_node) * network_latency;
  // The fabric and the NICs carry their parts at once. All-to-all (NCCL: a send to every peer)
  // sends the off-node peers' shares through the NICs, which the node's members share.
  // All-gather and reduce-scatter run as rings (NCCL: a channel per NIC): every byte a member sends
  // travels its fabric port, and a node's inter-node hops carry, over all channels, what one
  // member sends; the slower of fabric and the collective's NICs paces it. Every rank runs the same
  // schedule, so a collective with fewer members on the node than its GPUs (the replicas of an EP
  // shard, a strided data-parallel group) runs beside the others' and has their share of the
  // node's NICs: on_node of gpus_per_node (with rail-optimized NICs, its members' own).
  const double off_share = static_cast<double>(off_node) / static_cast<double>(std::max(1, on_node - 1 + off_node));
  const double nic_share = std::min(1.0, static_cast<double>(std::max(1, on_node)) / std::max(1, h.gpus_per_node));
  const double seconds_per_byte = s.op == OpKind::kAllToAll
                                      ? std::max((1 - off_share) / fabric, off_share * std::max(1, on_node) / network)
                                      : std::max(1 / fabric, 1 / (network * nic_share));
  // The fair share (the analytic engine's); alone on its port (exclusive_rate) the member runs at
  // the fabric's rate, and the SimGrid engine routes its off-node shares through the NIC links.
  out.rate = 1 / seconds_per_byte;
}

double CalibratedDurationModel::host_dram_Bps(int numa) const {
  if (numa < 0 || hardware_->numa.empty()) return 0;
  return hardware_->numa[static_cast<std::size_t>(numa) % hardware_->numa.size()].dram_Bps;
}

namespace {

// Keys per query of an attention core, averaged over the sequence: half of it when causal;
// W·(1 − W/2L) with a window W shorter than the sequence L.
double keys_per_query(const OpShape& shape) {
  const double L = static_cast<double>(shape.seq_len), W = static_cast<double>(shape.window);
  return W > 0 && W < L ? W * (1 - W / (2 * L)) : L / 2;
}

}  // namespace

Bytes memory_efficient_attention_hbm_rereads(const OpShape& shape, Bytes l2_bytes) {
  if (l2_bytes <= 0 || shape.seq_len <= 0 || shape.head_dim <= 0) return 0;
  const double L = static_cast<double>(shape.seq_len), W = static_cast<double>(shape.window);
  const double span = W > 0 && W < L ? W : L;  // keys a head's tiles reach
  const double keys = keys_per_query(shape);
  const double kv_row = 2.0 * static_cast<double>(shape.head_dim) * static_cast<double>(kBf16Bytes);  // K and V
  const double working_set = span * kv_row;
  const double miss = std::max(0.0, 1.0 - static_cast<double>(l2_bytes) / working_set);
  if (miss <= 0) return 0;
  const double seqs = static_cast<double>(std::max<std::int64_t>(1, shape.seqs));
  // Query tiles over this GPU's queries of each sequence: all L of them, or its piece of them
  // under context parallelism (tokens per sequence below L).
  const double queries = shape.tokens > 0 ? std::min(L, static_cast<double>(shape.tokens) / seqs) : L;
  const double tiles = std::ceil(queries / static_cast<double>(kMemoryEfficientAttentionQueriesPerTile));
  const double heads = static_cast<double>(std::max(1, shape.heads));
  return static_cast<Bytes>(heads * seqs * tiles * keys * kv_row * miss);
}

StageCost CalibratedDurationModel::cost(const Stage& s, const StepGraph& g) const {
  const Calibration& c = calibration_;
  const double peak = hardware_->gpu.bf16_flops_per_s;
  StageCost out;
  const double hbm = hardware_->gpu.hbm_Bps * c.hbm_efficiency;
  // Arithmetic at the kernel kind's efficiency plus the stage's memory-bound kernels (norms,
  // activations, permutations: Stage::bytes) at the HBM rate, one after the other on the stream;
  // expressed as one effective rate over the FLOPs so both engines run it as one piece of work.
  // Per stage (its launches' synchronization) plus each operator the backend dispatches for it.
  const double dispatch_s = c.compute_overhead_s + c.operator_overhead_s * static_cast<double>(s.ops);
  auto compute = [&](double efficiency, double extra_hbm_bytes = 0) {
    out.fixed_s = dispatch_s;
    const double flops = static_cast<double>(s.flops), bytes = static_cast<double>(s.bytes) + extra_hbm_bytes;
    if (flops <= 0) {
      out.work = bytes;
      out.rate = out.exclusive_rate = hbm;
      return;
    }
    const double seconds = flops / (peak * efficiency) + bytes / hbm;
    out.work = flops;
    out.rate = out.exclusive_rate = flops / seconds;
  };
  auto fill_rows = [](double rows, double half_rows) { return rows <= 0 ? 1.0 : rows / (rows + half_rows); };
  auto cpu = [&](double socket_rate) {
    const Resource& r = g.resource(s.resource);
    const int numa = std::max(0, r.numa);
    const int sharing = numa < static_cast<int>(ranks_per_numa_.size())
                            ? std::max(1, ranks_per_numa_[static_cast<std::size_t>(numa)])
                            : 1;
    out.fixed_s = c.cpu_task_overhead_s;
    out.work = static_cast<double>(s.params);
    const double remote = spilled_state_fraction(*hardware_, g, r.numa);
    if (remote > 0 && s.params > 0) {
      const double per_param = static_cast<double>(cpu_stage_dram_bytes(s)) / static_cast<double>(s.params);
      socket_rate = cpu_rate_with_remote_state(socket_rate, remote, per_param, hardware_->socket_link_Bps);
    }
    out.exclusive_rate = socket_rate;
    out.rate = socket_rate / sharing;
  };
  switch (s.op) {
    case OpKind::kGemm:
      compute(c.gemm_efficiency * fill_rows(static_cast<double>(s.shape.tokens), c.gemm_half_rows));
      break;
    case OpKind::kExpertGemm: {
      const double rows_per_expert =
          s.shape.experts > 0 ? static_cast<double>(s.shape.tokens) / static_cast<double>(s.shape.experts)
                              : static_cast<double>(s.shape.tokens);
      compute(c.expert_gemm_efficiency * fill_rows(rows_per_expert, c.expert_half_rows));
      out.fixed_s += c.expert_overhead_s * static_cast<double>(std::max<std::int64_t>(1, s.shape.experts));
      break;
    }
    case OpKind::kAttention: {
      const double keys = keys_per_query(s.shape);
      // Head dims past 256 run PyTorch's memory-efficient kernel, forward and backward alike; its
      // forward also re-reads K and V from HBM once they no longer fit in L2. A window shorter than
      // the sequence runs a windowed kernel (scaled_dot_product_attention takes no window), its
      // backward slower than the flash backward by as much as its forward is than the flash forward.
      const bool wide = s.shape.head_dim > 256;
      const bool windowed = s.shape.window > 0 && s.shape.window < s.shape.seq_len;
      const bool backward = s.phase == Phase::kBackward;
      double efficiency = c.attention_efficiency;
      if (wide) efficiency = c.wide_attention_efficiency;
      else if (windowed && backward) efficiency = c.attention_backward_efficiency * (c.windowed_attention_efficiency / c.attention_efficiency);
      else if (windowed) efficiency = c.windowed_attention_efficiency;
      else if (backward) efficiency = c.attention_backward_efficiency;
      compute(efficiency *
                  fill_rows(keys, c.attention_half_keys),
              wide && !backward
                  ? static_cast<double>(memory_efficient_attention_hbm_rereads(s.shape, hardware_->gpu.l2_bytes))
                  : 0.0);
      break;
    }
    case OpKind::kGdn:
      compute(c.gdn_efficiency);
      break;
    case OpKind::kElementwise:
    case OpKind::kGpuAdamW:
      out.fixed_s = dispatch_s;
      out.work = static_cast<double>(s.bytes);
      out.rate = out.exclusive_rate = hbm;
      break;
    case OpKind::kH2d:
    case OpKind::kD2h:
      // Each separate copy (a weight group goes in transfer_chunk_mib pieces) pays the latency.
      out.fixed_s = static_cast<double>(std::max<std::int64_t>(1, s.transfers)) * (c.transfer_overhead_s + hardware_->pcie.latency_s);
      out.work = static_cast<double>(s.bytes);
      out.rate = out.exclusive_rate = s.op == OpKind::kH2d ? c.h2d_Bps : c.d2h_Bps;
      break;
    case OpKind::kAllToAll:
    case OpKind::kAllGather:
    case OpKind::kReduceScatter:
      collective_cost(s, out);
      break;
    case OpKind::kCpuAdamW:
      cpu(c.cpu_adamw_params_per_s);
      break;
    case OpKind::kTorchCpuAdamW:
      cpu(c.torch_adamw_params_per_s);
      break;
    case OpKind::kHostAccumulate:
      cpu(c.host_accumulate_params_per_s);
      break;
    case OpKind::kHostPrep:
      cpu(c.host_prep_params_per_s);
      break;
    case OpKind::kSync:
      break;
  }
  if (out.work <= 0) {
    out.work = 0;
    if (s.op == OpKind::kSync) out.fixed_s = 0;
  }
  OOM_ASSERT(out.work == 0 || out.rate > 0, "a stage with work needs a positive rate");
  return out;
}

}  // namespace oom
