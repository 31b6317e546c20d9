// StepGraph: one training step of a Plan lowered to work (DESIGN.md "The central idea").
//
// A StepGraph is a DAG of stages. Each stage runs on one resource (a GPU's compute stream, its H2D
// or D2H copy engine, the dedicated expert-gradient D2H stream, its fabric port, a rank's CPU
// update executor, a rank's host preparation worker), carries its demand (FLOPs with the operator
// kind and shape that calibration prices, bytes with the link they cross, parameters for
// optimizer updates), its memory events (bytes allocated or freed on GPU i or NUMA node n, at the
// stage's start or end) and its dependencies (data readiness, buffer reuse; reference §3). Each
// resource runs its stages one at a time in its issue order (`Resource::order`), which is the
// stream order of the runtime: executors add the edge "previous stage on the same resource" to
// the data edges. Stage ids are indices into `stages`; every dependency points to a smaller id
// and every resource's issue order is increasing in id, so `stages` in index order is a
// topological order of data and resource edges together.
//
// Units: seconds, bytes, FLOPs, parameters. The graph is plain data: lowering builds it, executors
// (planner/engine/analytic_evaluator.h, sim/, backend/) read it; reading from several threads is safe.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "costmodel/memory.h"
#include "costmodel/units.h"
#include "costmodel/workload.h"
#include "planner/plan/plan.h"
#include "traces/stage_key.h"

namespace oom {

using StageId = std::int32_t;
using ResourceId = std::int32_t;

enum class ResourceKind {
  kGpuCompute,      // GPU i's compute stream
  kH2d,             // GPU i's host-to-device copy engine (its PCIe link, H2D direction)
  kD2h,             // GPU i's device-to-host copy engine (its PCIe link, D2H direction)
  kExpertGradD2h,   // GPU i's dedicated stream for expert-gradient D2H (same PCIe link, D2H)
  kFabric,          // GPU i's port on the GPU–GPU fabric (NVLink or PCIe peer path)
  kCpuUpdate,       // rank r's CPU update executor (AdamW, host accumulation) on NUMA node n
  kHostPrep,        // rank r's host preparation worker (BF16 weight staging) on NUMA node n
};
std::string_view resource_kind_name(ResourceKind k);  // "compute", "h2d", "d2h", "expert_grad_d2h", ...
// The name every lowering gives a rank's compute stream ("gpu0.compute"): the resource of its
// compute stages in a Trace.
std::string gpu_compute_resource_name(int rank);

struct Resource {
  ResourceId id = 0;
  ResourceKind kind = ResourceKind::kGpuCompute;
  std::string name;  // "gpu0.compute", "gpu2.h2d", "numa1.cpu_update.r3", ...
  int gpu = -1;      // the GPU (rank) it belongs to: its stream, its PCIe link, its fabric port
  int numa = -1;     // the NUMA node (socket, DRAM) its host side uses; −1 for pure GPU resources
  std::vector<StageId> order;  // issue order: the stages this resource runs, one at a time
};

// The operator kinds calibration prices. Names (op_kind_name) are the Trace stage kinds.
enum class OpKind {
  kGemm,             // dense projections: attention/GDN in/out projections, router, shared expert, dense MLP, LM head
  kExpertGemm,       // routed-expert grouped GEMMs
  kAttention,        // softmax attention core (flash kernel): scores and values
  kGdn,              // Gated DeltaNet chunked recurrence
  kElementwise,      // norms, activations, loss: bandwidth-bound work on HBM
  kH2d,              // host-to-device copy over PCIe
  kD2h,              // device-to-host copy over PCIe
  kAllToAll,         // EP token dispatch or return
  kAllGather,        // Local shard delivery
  kReduceScatter,    // gradient reduction over the fabric
  kCpuAdamW,         // CPU AdamW of host-resident state
  kTorchCpuAdamW,    // torch.optim.AdamW over CPU tensors after the backward (FSDP2's optimizer.step())
  kHostAccumulate,   // FP32 accumulation of BF16 gradient partials in host memory
  kHostPrep,         // BF16 staging of FP32 masters into the pinned pool
  kGpuAdamW,         // GPU AdamW of a resident shard + BF16 refresh
  kSync,             // zero-work join (an event): completes when its dependencies do
};
std::string_view op_kind_name(OpKind k);  // "gemm", "expert_gemm", "attention", "gdn", ...

// The shape of a compute stage, as calibration needs it. Unused fields stay 0.
struct OpShape {
  std::int64_t tokens = 0;     // rows of the GEMM / tokens processed
  std::int64_t seqs = 0;       // sequences (attention, GDN)
  std::int64_t seq_len = 0;    // tokens per sequence (attention, GDN)
  std::int64_t k = 0;          // GEMM reduction dimension
  std::int64_t n = 0;          // GEMM output dimension (summed over the fused GEMMs)
  int heads = 0;               // query heads processed (attention) or value heads (GDN)
  int head_dim = 0;
  std::int64_t window = 0;     // attention window, 0 = full causal
  std::int64_t experts = 0;    // experts in an expert GEMM group
  bool operator==(const OpShape&) const = default;
};

enum class MemorySpace { kGpu, kHost };

// What an allocation holds, so that a peak can be read as its parts (FLAT's four peaks among
// them: expert dispatch, vocabulary projection, checkpoint boundaries, optimizer state).
enum class MemoryUse {
  kOther,        // weights in the window, staging, anything not below
  kActivations,  // mixing (attention, GDN) activations and the running hidden-state gradient
  kDispatch,     // MoE: all-to-all buffers, routed activations, LLEP's fetched expert weights
  kVocabulary,   // the vocabulary projection's logits and their gradient
  kBoundaries,   // checkpoint boundaries (decoder inputs) and regenerated ones
  kOptimizer,    // gradients awaiting their optimizer (GPU buffers) and resident optimizer state
};
std::string_view memory_use_name(MemoryUse u);  // "other", "activations", "dispatch", "vocabulary", ...
inline constexpr int kMemoryUses = 6;

// `bytes` > 0 allocates, < 0 frees, on GPU `device` or NUMA node `device`, at the stage's start or end.
struct MemoryEvent {
  MemorySpace space = MemorySpace::kGpu;
  int device = 0;
  Bytes bytes = 0;
  bool at_end = false;  // false: when the stage starts; true: when it ends
  MemoryUse use = MemoryUse::kOther;
  bool operator==(const MemoryEvent&) const = default;
};

// The GPUs taking part in a collective, read like a std::vector<int>. Its members' stages share one
// list (copying a PeerList copies a pointer), so a collective of P members holds one list of P
// ranks, not P copies of it: a step's graph grows linearly with its GPUs.
class PeerList {
 public:
  using value_type = int;
  using const_iterator = std::vector<int>::const_iterator;
  using iterator = const_iterator;
  PeerList() = default;
  PeerList(std::vector<int> ranks)  // NOLINT(google-explicit-constructor): a list of ranks is a PeerList
      : list_(ranks.empty() ? nullptr : std::make_shared<const std::vector<int>>(std::move(ranks))) {}
  PeerList(std::initializer_list<int> ranks) : PeerList(std::vector<int>(ranks)) {}
  const std::vector<int>& ranks() const {
    static const std::vector<int> kNone;
    return list_ ? *list_ : kNone;
  }
  operator const std::vector<int>&() const { return ranks(); }  // NOLINT(google-explicit-constructor)
  bool empty() const { return ranks().empty(); }
  std::size_t size() const { return ranks().size(); }
  int front() const { return ranks().front(); }
  int back() const { return ranks().back(); }
  int operator[](std::size_t i) const { return ranks()[i]; }
  const_iterator begin() const { return ranks().begin(); }
  const_iterator end() const { return ranks().end(); }
  void clear() { list_.reset(); }
  // Whether `other` shares this list (the same collective's members), not merely equal ranks.
  bool shares(const PeerList& other) const { return list_ == other.list_; }
  const void* identity() const { return list_.get(); }  // the shared list's address (nullptr: empty)
  friend bool operator==(const PeerList& a, const PeerList& b) { return a.ranks() == b.ranks(); }
  friend bool operator<(const PeerList& a, const PeerList& b) { return a.ranks() < b.ranks(); }

 private:
  std::shared_ptr<const std::vector<int>> list_;
};

struct Stage {
  StageId id = 0;
  StageKey key;          // unique within the graph (traces/stage_key.h): rank, phase, decoder, part, indices, operator
  // Copies of the key that StepGraphBuilder::add sets: the Trace name format_stage_key(key), the
  // rank (key.rank), the decoder (key.decoder) and the phase (key.phase).
  std::string name;
  Phase phase = Phase::kForward;
  int gpu = -1;          // the rank the work belongs to
  int layer = -1;        // decoder index, −1 for embedding/LM head/step-level work
  OpKind op = OpKind::kSync;
  ResourceId resource = 0;
  Flops flops = 0;       // compute demand
  Bytes bytes = 0;       // transfer demand (bytes this GPU sends/receives), or HBM bytes touched
  ParamCount params = 0; // optimizer demand (parameters updated / staged / accumulated)
  std::int64_t transfers = 1;  // H2D/D2H: the separate copies the stage issues (weights in plan.transfer_chunk_mib pieces)
  // Compute stages: the operators (ATen calls, each at least one kernel launch on a GPU) the
  // LibTorch backend dispatches to run the stage, as its kernels issue them (planner/lowering/
  // operator_counts.h); 0 where not counted. Each costs Calibration::operator_overhead_s.
  std::int64_t ops = 0;
  OpShape shape;
  // Collectives (kAllToAll, kAllGather, kReduceScatter): the GPUs taking part. Each member has its
  // own stage on its own fabric port with its own `bytes`; the members depend on each other's
  // inputs, so a collective starts when all members are ready.
  PeerList peers;
  std::vector<MemoryEvent> memory;
  std::vector<StageId> deps;  // data readiness and buffer reuse; all ids smaller than `id`
};

// A stage's key without its rank, phase, micro-batch and decoder: the part of the work a
// lowering names once and emits for every rank, e.g. what(StagePart::kMoe, StageOp::kExperts).at_chunk(1).
struct StageWhat {
  StagePart part = StagePart::kLayer;
  StageOp op = StageOp::kProj;
  int chunk = -1, head_group = -1, ring_step = -1, bucket = -1;
  StageWhat at_chunk(int c) const { StageWhat w = *this; w.chunk = c; return w; }
  StageWhat at_head_group(int g) const { StageWhat w = *this; w.head_group = g; return w; }
  StageWhat at_ring_step(int s) const { StageWhat w = *this; w.ring_step = s; return w; }
  StageWhat at_bucket(int b) const { StageWhat w = *this; w.bucket = b; return w; }
  StageWhat with(StageOp o) const { StageWhat w = *this; w.op = o; return w; }
  StageKey key(int rank, Phase phase, int decoder, int micro_batch = -1) const {
    StageKey k;
    k.rank = rank, k.phase = phase, k.micro_batch = micro_batch, k.decoder = decoder, k.part = part;
    k.chunk = chunk, k.head_group = head_group, k.ring_step = ring_step, k.bucket = bucket, k.op = op;
    return k;
  }
};
inline StageWhat what(StagePart part, StageOp op) {
  StageWhat w;
  w.part = part, w.op = op;
  return w;
}

struct StepGraph {
  int gpus = 0;        // ranks of the step
  int numa_nodes = 0;  // NUMA nodes of the (first) node
  std::vector<Resource> resources;
  std::vector<Stage> stages;
  // Bytes held for the whole step before any event: M_0 + M_state on each GPU; canonical state,
  // pinned pools and process memory on each NUMA node.
  std::vector<Bytes> gpu_base_bytes;
  std::vector<Bytes> numa_base_bytes;
  double gpu_headroom_fraction = 0;  // ε of Eq. 2, added to each GPU's peak by the executors
  // 0: every rank has its stages. R > 0: only ranks 0..R−1 (the first node) do; every other rank r
  // runs rank r mod R's schedule at the same times (LoweringOptions::symmetric_nodes), and the
  // stages of ranks 0..R−1 carry the memory events of every rank, so every GPU's and NUMA node's
  // peak is its own. Both engines run such a graph (the SimGrid engine simulates the one node, whose
  // traffic to the others crosses only its own NICs).
  int ranks_emitted = 0;

  const Stage& stage(StageId id) const { return stages.at(static_cast<std::size_t>(id)); }
  const Resource& resource(ResourceId id) const { return resources.at(static_cast<std::size_t>(id)); }
};

// Builds a StepGraph keeping its invariants (ids, issue order, dependency order). Lowerings and
// tests use it; stages are issued on their resource in the order they are added.
class StepGraphBuilder {
 public:
  StepGraphBuilder(int gpus, int numa_nodes);
  ResourceId add_resource(ResourceKind kind, std::string name, int gpu, int numa);
  // Appends the stage (its id, resource order, name, gpu, layer and phase are assigned here, the
  // last four from its key) and returns its id. A key that an earlier stage already has is the same
  // work done again (a regenerated decoder's forward): it gets the next repeat index
  // (StageKey::repeat). OOM_ASSERTs that the resource exists and every dependency precedes it.
  StageId add(Stage s);
  StepGraph& graph() { return g_; }
  StepGraph take() { return std::move(g_); }

 private:
  // A key's fields mixed (the name is a function of the key: hashing the key, not its text,
  // spares the lowering a string hash per stage).
  struct KeyHash {
    std::size_t operator()(const StageKey& k) const;
  };
  StepGraph g_;
  std::unordered_map<StageKey, int, KeyHash> repeats_;  // stage key → times it was added
};

// Checks the invariants above (ids, dependency order, each stage in exactly its resource's order
// and in increasing id, unique keys, names and copies that agree with the keys). Returns an empty string when the graph is well formed, else the first problem.
// `keys` false leaves out the names' agreement with the keys and their uniqueness, which
// StepGraphBuilder::add keeps by construction (it names each stage from its key and numbers
// repeats): the check the lowerings run on every graph they build, a plan search's included.
std::string check_step_graph(const StepGraph& g, bool keys = true);

// The stage limit every LoweringOptions starts from: graph_size_estimate.h's kDefaultMaxStages,
// or what the command's --max-stages set. Set once, before any lowering (not thread-safe against
// lowerings running).
double max_stages_default();
void set_max_stages_default(double max_stages);

struct LoweringOptions {
  MemoryConstants memory;  // M_0, ε, host process bytes, loss chunk
  // Lower only the first `decoder_layers` decoders (0 = all): the short executions of
  // Configure-then-Compare run one and two repeating units.
  int decoder_layers = 0;
  // Emit the stages of one node's ranks only when every node runs the same schedule (whole nodes,
  // more than one; every rank's routing load and LLEP exchange equal; every node the same distance
  // from the others; no Ring-DTP head): StepGraph::ranks_emitted. The plan search prices with it;
  // the step time and every peak equal the full graph's (tests/planner/symmetric_lowering_test.cc).
  bool symmetric_nodes = false;
  // The most stages the lowering builds: over it (its estimate, planner/lowering/graph_size_estimate.h)
  // lower() throws InputError naming the plan field that makes the graph so large.
  double max_stages = max_stages_default();
};

// Lowers one training step of `plan` on the workload (reference §2–§5, the runtime rules of §3)
// for every rank. EP and Local paths. Preconditions: validate_plan() accepted the plan for this
// workload. The result satisfies check_step_graph().
StepGraph lower(const Plan& plan, const WorkloadContext& ctx, const LoweringOptions& options = {});

}  // namespace oom
