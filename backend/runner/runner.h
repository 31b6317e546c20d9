// Runner: one rank's execution of a lowered StepGraph (the graph runner behind backend/
// graph_runner.h, whose header says what it does). The runner is its context (host state, plan,
// device, parameter window, recorder, worker thread, ranks) and the state of each mechanism, each
// declared in its own header; its methods are grouped below by the file that defines them. A stage
// runs the handler its (part, operator) maps to in the one table of handlers.cc.
// Not thread-safe: one thread drives run(); the worker thread runs the jobs run_stage submits.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include "backend/dist/rank_group.h"
#include "backend/measure/stage_recorder.h"
#include "backend/model/plan_ops.h"
#include "backend/runner/block_grad.h"
#include "backend/runner/gradients.h"
#include "backend/runner/handlers.h"
#include "backend/runner/llep.h"
#include "backend/runner/moe.h"
#include "backend/runner/outer.h"
#include "backend/runner/ring_dtp.h"
#include "backend/runner/tensor_store.h"
#include "backend/runtime/job_queue.h"
#include "backend/runtime/runtime.h"
#include "backend/runtime/state.h"
#include "planner/lowering/step_graph.h"
#include "planner/plan/plan.h"
#include "traces/trace.h"

namespace oom::backend::runner {

struct Runner : TensorStore, OuterBlock, DispatchLog, LoadBalance, LlepPlacement, GradientPipeline {
  HostState& st;
  TrainerConfig cfg;
  Plan plan;
  at::Device dev;
  ParamWindow window;
  StageRecorder rec;
  JobQueue worker;
  Trace trace;
  bool tracing = false;
  const ModelSpec& spec;
  RankGroup* group = nullptr;  // null: one rank
  int R = 0, P = 1;            // this rank, the ranks
  // EP groups (Plan::ep_group_gpus): ep_size consecutive ranks a group, each group holding every
  // expert, so each expert shard has `replicas` copies (the rank at its place in every group).
  // The all-to-alls run over ep_group (`group` itself for one group); replica_group sums a shard's
  // gradient over its replicas (null without replicas).
  int ep_size = 1, ep_rank = 0, replicas = 1, replica = 0;
  std::unique_ptr<RankGroup> ep_sub, replica_sub;
  RankGroup* ep_group = nullptr;
  RankGroup* replica_group = nullptr;
  int experts_local = 0, expert0 = 0;  // EP over ranks: owned experts [expert0, expert0 + experts_local)

  // Per step.
  const StepGraph* graph = nullptr;
  std::int64_t B = 0, S = 0, sb = 0;  // this rank's sequences, their length, a sub-batch's sequences
  at::Tensor tok, tgt;                // this rank's tokens and targets on the device
  Ring ring;
  // Context parallelism (context.cc): the ranks of a sequence, this rank's piece of it.
  int cp_ranks = 1, cp_piece = 0;
  at::Tensor positions;                     // this rank's tokens' places in their sequence (C > 1)
  at::Tensor pieces_order, sequence_order;  // the gathered pieces' tokens; each token's row among them

  Runner(HostState& s, TrainerConfig c, Plan p, at::Device d, RankGroup* g);

  bool ep() const { return plan.path == ExpertPath::kEp; }
  bool llep() const { return ep() && P > 1 && plan.flat.expert_dispatch == ExpertDispatch::kPipelinedLlep; }
  int owner_of(int expert) const { return expert / experts_local; }
  bool ring_dtp() const { return plan.flat.ring_dtp(P); }
  std::int64_t shard_rows() const { return spec.vocab / P; }  // Ring-DTP: head rows per rank
  bool dist() const { return P > 1; }
  bool retained(int l) const { return ep() && plan.is_moe_retained(l); }
  bool attention(int l) const { return spec.layer_kinds[static_cast<std::size_t>(l)] != LayerKind::kLinearAttention; }
  const AttentionSpec& attn(int l) const { return spec.attention(spec.layer_kinds[static_cast<std::size_t>(l)]); }
  int groups(int l) const { return plan_ops::attention_groups(attn(l), plan.split.attention_head_group); }
  double scale(int l) const { return attention_scale(spec, attn(l)); }

  // ---- runner.cc: the step and the dispatch of its stages ----
  StepStats run(const StepGraph& g, const at::Tensor& tokens, const at::Tensor& targets);
  // Drops the step's tensors and bookkeeping (also what a step that threw left behind).
  void clear_step();
  void run_stage(StageId id, const Handler& h);
  std::string host_timeline_name(const StepGraph& g) const;

  // ---- tensor_store.cc: decoder passes, their sub-batches and chunks ----
  Pass& pass_of(const Stage& s);
  void start_pass(Pass& p);
  static at::Tensor& output_of(Pass& p);
  void keep_feed_forward_weights(BlockWeights& w) const;
  void end_pass(StageId id);
  Sub& sub_of(Pass& p, const StageKey& k);
  Chunk& chunk_of(const Pass& p, Sub& s, const StageKey& k);
  std::pair<std::int64_t, std::int64_t> chunk_tokens(const Sub& s, const StageKey& k) const;
  static at::Tensor rows(const at::Tensor& t, const Sub& s, std::pair<std::int64_t, std::int64_t> tokens);
  void weights_h2d(const Stage& s);

  // ---- boundaries.cc: checkpoint boundaries to and from the host, SCO's issue order ----
  void boundary_d2h(const Stage& s);
  void boundary_h2d(const Stage& s);
  std::vector<StageId> issue_order(const StepGraph& g, const std::vector<const Handler*>& handlers) const;

  // ---- param_ranges.cc: the elements of a block each group, slice and bucket covers ----
  std::pair<std::int64_t, std::int64_t> outer_range(bool head) const;
  Ranges whole_ranges(StagePart part, int layer) const;
  static Ranges cut(const Ranges& ranges, std::int64_t lo, std::int64_t hi);
  static std::int64_t count(const Ranges& ranges);
  Ranges slice(const Ranges& ranges) const;
  Ranges bucket_ranges(StagePart part, int layer, int bucket) const;
  Ranges owned_experts(int layer) const;
  Ranges replica_slice(const Ranges& ranges) const;
  Ranges ring_head_ranges() const;
  Ranges group_ranges(StagePart part, int layer) const;
  static int block_of(StagePart part, int layer);

  // ---- mixing.cc: attention (query-head groups, kept O/LSE) and GDN (sequence chunks) ----
  void mix_proj(const Stage& st_, Pass& p);
  AttentionOutput core(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int l);
  void attn_core(const Stage& st_, Pass& p);
  void olse_d2h(const Stage& st_, Pass& p);
  void olse_h2d(const Stage& st_, Pass& p);
  std::vector<std::pair<std::int64_t, std::int64_t>> gdn_call_rows(std::int64_t n) const;
  at::Tensor gdn_calls(const plan_ops::GdnInputs& in, std::int64_t s0, std::int64_t C, const Pass& p, at::Tensor& state);
  void gdn_core(const Stage& st_, Pass& p);
  void mix_out(const Stage& st_, Pass& p);
  void mix_out_bwd(const Stage& st_, Pass& p);
  void mix_core_bwd(const Stage& st_, Pass& p);
  void attn_core_refwd(const Stage& st_, Pass& p);
  void mix_proj_bwd(const Stage& st_, Pass& p);

  // ---- context.cc: context parallelism (zig-zag pieces, the sequence's K/V, the GDN state chain) ----
  at::Tensor piece_positions(std::int64_t seq, int p) const;
  void take_piece(const at::Tensor& tokens, const at::Tensor& targets);
  at::Tensor sequence_exchange(const at::Tensor& rows, int from = -1, int to = -1);
  at::Tensor gather_sequence(const at::Tensor& t);
  at::Tensor scatter_sequence(const at::Tensor& t);
  void attn_gather(const Stage& st_, Pass& p);
  AttentionOutput piece_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int l);
  plan_ops::AttentionGrads piece_attention_backward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                    const at::Tensor& out, const at::Tensor& lse, const at::Tensor& dout, int l);
  std::pair<at::Tensor, at::Tensor> hand_state(const at::Tensor& state, const at::Tensor& context, int from, int to);
  void gdn_chain(const Stage& st_, Pass& p);
  void gdn_grad_chain(const Stage& st_, Pass& p);

  // ---- moe.cc: MoE per token chunk; over ranks its all-to-alls ----
  bool moe_graph(const Pass& p) const;
  void router_shared(const Stage& st_, Pass& p);
  void keep_dense_graphs(Chunk& c) const;
  static void dense_graphs_backward(Chunk& c, const at::Tensor& dyc);
  void experts(const Stage& st_, Pass& p);
  void chunk_output(Pass& p, Sub& s, const StageKey& k, Chunk& c);
  at::Tensor routed_gradient(Chunk& c, const Pass& p, const at::Tensor& dyc);
  void experts_bwd(const Stage& st_, Pass& p);
  void router_shared_bwd(const Stage& st_, Pass& p);
  static const at::Tensor& expert_input(const Chunk& c);
  void a2a_dispatch(const Stage& st_, Pass& p);
  std::vector<ExpertRows> experts_of(const Chunk& c, const Pass& p, bool grads) const;
  at::Tensor expert_grad(const Pass& p, const char* name, int e) const;
  void owned_experts_forward(Chunk& c, const Pass& p);
  void a2a_return(const Stage& st_, Pass& p);
  void combine(const Stage& st_, Pass& p);
  void a2a_grad_dispatch(const Stage& st_, Pass& p);
  void a2a_grad_return(const Stage& st_, Pass& p);

  // ---- load_balance.cc: the load-balancing loss (LoadBalance) ----
  bool balance_on() const { return spec.router_aux_loss_coef > 0; }
  void count_routing(const Chunk& c, const Pass& p);
  const at::Tensor& load_balance_grad();
  void routed_backward(Chunk& c, const Pass& p, const at::Tensor& grad);

  // ---- llep.cc: PipelinedLLEP's fetched experts ----
  const ExpertWeights& fetched_expert(const Pass& p, int e) const;
  std::int64_t expert_numel(int l) const;
  static at::Tensor pack(const ExpertWeights& w);
  static ExpertWeights unpack(const at::Tensor& row, const ExpertWeights& like);
  ExpertWeights own_expert(const Pass& p, int e) const;
  std::vector<std::pair<int, at::Tensor>> llep_exchange(int l, bool to_helpers, const std::function<at::Tensor(int)>& make, const at::TensorOptions& options);
  void llep_fetch(Pass& p);
  void llep_grad_return(Pass& p);
  void place_fetched_experts(const StepGraph& g);

  // ---- ring_dtp.cc: Ring-DTP ----
  at::Tensor ring_hop(const at::Tensor& t, int to_offset = 1);
  at::Tensor head_shard() const;
  std::int64_t logits_block() const;
  void ring_hop_all(std::initializer_list<at::Tensor*> ts);
  void ring_loss(const Stage& st_);
  void ring_pass();
  void ring_backward(const Stage& st_);
  void ring_grad_pass(const Stage& st_);

  // ---- outer.cc: the embedding and the LM head ----
  at::Tensor& outer_grad(bool head);
  void outer_gradient(bool head);
  void attach_outer_gradients();
  at::Tensor outer_grad_range(std::int64_t a, std::int64_t n);
  void bring_outer(bool head, bool table);
  void drop_outer();
  void gather_embeddings();
  void scatter_embedding_gradient();
  BlockGrad outer_block_grad(bool head);
  void outer_h2d(const Stage& s);
  void regather();
  void head_loss_stage();
  void head_backward();
  void outer_grad_d2h(const Stage& s);

  // ---- gradients.cc: gradients to the host, CPU and GPU AdamW, the worker's jobs ----
  static at::Tensor range_of(const BlockGrad& grad, std::int64_t a, std::int64_t n);
  static at::Tensor range_of(const at::Tensor& grad, std::int64_t a, std::int64_t n);
  template <typename Grad>
  void add_sq_norm(const Grad& grad, const Ranges& ranges);
  template <typename Grad>
  void capture(int b, const Ranges& ranges, const Grad& grad);
  at::Tensor grad_buffer(int kind, int index, std::int64_t numel, const at::TensorOptions& options);
  void send_gradient(StagePart part, int layer, int bucket, const BlockGrad& grad);
  const BlockGrad& layer_grad(int l);
  void release_expert_gradient(int l);
  std::vector<std::pair<Ranges, at::Tensor>> take_host_gradients(StagePart part, int layer, int bucket);
  void update_ranges(int b, const Ranges& ranges, const at::Tensor& grad);
  void publish_ranges(int b, const Ranges& ranges);
  std::function<void()> take_ready(StagePart part, int layer, int bucket);
  std::function<void()> worker_job(const Stage& s, const Handler& h);
  static std::function<void()> host_accumulate_job();
  std::function<void()> cpu_adamw_job(const Stage& s);
  std::function<void()> publish_job(const Stage& s);
  void layer_grad_d2h(const Stage& s);
  void reduce_scatter(const Stage& s);
  void expert_reduce_scatter(const Stage& s);
  void gpu_adamw(const Stage& s);
};

}  // namespace oom::backend::runner
