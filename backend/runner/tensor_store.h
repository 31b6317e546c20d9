// The per-step tensor store of the graph runner: every tensor a stage leaves for a later one, keyed
// by what produced it. A decoder's input on the device (from the previous decoder, a host-kept
// boundary loaded back, a held one, a regeneration or the embedding's regather), the passes a
// decoder's `weights.h2d` stages open (forward, regeneration, backward) with their sub-batch and
// token-chunk intermediates, the kept O/LSE per sub-batch, the gradient flowing into each decoder's
// output, and the retained MoE graphs of the EP path. The runner's methods that open, look up and
// end passes are in tensor_store.cc.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/edge.h>

#include "backend/model/model.h"
#include "backend/model/plan_ops.h"
#include "backend/runner/block_grad.h"
#include "planner/lowering/step_graph.h"

namespace oom::backend::runner {

struct OLse {
  at::Tensor out, lse;  // [b, H, S, d] in the activations' dtype, [b, H, S] FP32, on the host
};

// What a decoder pass does: its forward, a regeneration (a recompute before another decoder's
// backward) or its backward; it says whether the pass's kernels build autograd graphs.
enum class PassKind { kForward, kRegenerate, kBackward };

// One token chunk of a sub-batch's MoE.
struct Chunk {
  at::Tensor hc, xn_l, routed, comb;
  FfnInputs in;
  Routing r;
  plan_ops::DenseTerms d;
  // Over ranks (EP): the chunk's (token, slot) pairs sorted by expert, the rows sent to and
  // received from each rank, the received rows (as received until the experts run), the outputs
  // to return, the returned rows (a leaf at the source in a graph), and in backward the gradients
  // coming back to the owner, going out from it, and coming back to the source. The owner runs its
  // experts without autograd (plan_ops::expert_forward) on the received rows in the experts' order
  // (`order`: each expert's rows of recv_x in turn); where a backward follows it keeps them (xs)
  // and their activations.
  at::Tensor tokens_sorted, weights_sorted, recv_x, y_recv, back, dy_recv, d_recv, dxn, order, xs;
  plan_ops::ExpertActivations acts;
  torch::autograd::edge_list dense_edges;  // the shared expert's and dense MLP's graphs (keep_dense_graphs)
  std::vector<std::int64_t> send, recv;
  std::vector<at::Tensor> expert_rows;  // per owned expert: its rows of recv_x (undefined: none)
  std::map<int, at::Tensor> fetched_rows;  // PipelinedLLEP: per fetched expert, its rows of recv_x
};

using plan_ops::ExpertWeights;

// One sub-batch of a decoder pass.
struct Sub {
  std::int64_t b0 = 0, n = 0;
  at::Tensor x, x_l;  // input rows; their leaf in a backward pass
  plan_ops::AttentionInputs in;
  at::Tensor q_l, k_l, v_l, gate_l;
  plan_ops::GdnInputs gin, glin;
  at::Tensor state, dstate;
  std::vector<at::Tensor> starts, outs, lses;  // GDN chunk start states / per group or chunk outputs
  at::Tensor kf, vf;                           // context parallelism: the sequence's K/V (a backward's: leaves)
  std::vector<at::Tensor> contexts;            // context parallelism: the GDN chunks' conv left contexts
  at::Tensor out_graph, group_graph, out, lse, out_l, mixed, h, dh, dout, dq, dk, dv;
  std::map<int, Chunk> chunks;
};

struct Pass {
  int l = -1;
  PassKind kind = PassKind::kForward;
  bool started = false;
  at::Tensor wflat, x, y, dy;  // weights; input; output (forward) or input gradient (backward); output gradient
  BlockGrad grad;              // a backward pass: the weights' gradient
  BlockWeights w;
  std::map<int, ExpertWeights> fetched;  // PipelinedLLEP: the other ranks' experts this rank computes
  std::map<int, at::Tensor> fetched_grad;  // a backward: their gradients (gate, up, down in one row)
  std::map<int, Sub> subs;
};

// Where a decoder's input on the device came from, which says how long it stays (as the lowering
// keeps it: a regathered embedding output, a host boundary loaded to start a regeneration and
// the regenerated inputs within regenerate_cap of the next backward stay).
enum class Origin { kForward, kLoaded, kRegather, kRegenerated };

// The step's tables, cleared at each step's start and end (Runner::clear_step).
struct TensorStore {
  std::map<int, at::Tensor> act;               // decoder → its input on the device (L: the head's)
  std::map<int, Origin> origin;                // decoder → where its input on the device came from
  std::map<int, at::Tensor> host;              // host-kept boundaries
  std::map<int, std::vector<OLse>> olse;       // kept O/LSE per sub-batch
  std::map<int, at::Tensor> dgrad;             // decoder → dL/d(its input) (L: the head's input)
  std::map<StageId, Pass> passes;              // by the weights stage that opened them
  std::map<int, StageId> open_pass;            // decoder → its latest pass
  std::map<int, StageId> backward_pass;        // decoder → its backward pass (until its gradient leaves)
  std::vector<StageId> last_use;               // weights stage → the pass's last stage
  std::vector<StageId> last_grad_use;          // backward weights stage → the last stage reading its gradient
  std::vector<StageId> last_expert_use;  // per backward pass (EP): the last stage reading its experts' gradient
  // EP: MoE chunks whose forward graph is retained for the backward (decoder, chunk), and the
  // forward weights those graphs differentiate into.
  std::map<std::pair<int, int>, Chunk> retained_moe;
  std::map<int, BlockWeights> retained_weights;  // decoder → the leaves its retained MoE graphs differentiate into
  int next_backward = 0;                         // the decoder whose backward comes next
};

// A stage key's sub-batch (0 when the batch runs whole).
inline std::size_t sub_index(const StageKey& k) { return static_cast<std::size_t>(std::max(k.sub_batch, 0)); }
// Whether a stage belongs to a decoder pass (the pass its decoder's latest `weights.h2d` opened).
inline bool in_pass(const Stage& s) {
  const StagePart p = s.key.part;
  return s.layer >= 0 && (p == StagePart::kAttention || p == StagePart::kGdn || p == StagePart::kMoe || p == StagePart::kLlep);
}
// Piece `index` of `total` cut in pieces of `size` (the last takes the remainder; size ≤ 0 or
// ≥ total: one piece). Returns {start, length}.
std::pair<std::int64_t, std::int64_t> piece(std::int64_t total, std::int64_t size, int index);

}  // namespace oom::backend::runner
