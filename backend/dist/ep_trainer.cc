#include "backend/dist/ep_trainer.h"

#include <algorithm>
#include <cmath>

#include <torch/torch.h>

#include "backend/adamw.h"
#include "backend/job_queue.h"
#include "backend/model.h"
#include "backend/plan_ops.h"
#include "costmodel/input_error.h"

namespace oom::backend::dist {
namespace {

// All-to-all as an autograd function: the backward sends the gradients back along the same rows
// (send and receive counts swapped).
class AllToAllFn : public torch::autograd::Function<AllToAllFn> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, std::int64_t comm_address,
                            std::vector<std::int64_t> send_rows, std::vector<std::int64_t> recv_rows) {
    ctx->saved_data["comm"] = comm_address;
    ctx->saved_data["send"] = send_rows;
    ctx->saved_data["recv"] = recv_rows;
    return reinterpret_cast<Communicator*>(comm_address)->all_to_all(x, send_rows, recv_rows);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* comm = reinterpret_cast<Communicator*>(ctx->saved_data["comm"].toInt());
    const auto send = ctx->saved_data["send"].toIntVector();
    const auto recv = ctx->saved_data["recv"].toIntVector();
    return {comm->all_to_all(grads[0].contiguous(), recv, send), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

at::Tensor all_to_all_autograd(Communicator& comm, const at::Tensor& x, const std::vector<std::int64_t>& send,
                               const std::vector<std::int64_t>& recv) {
  return AllToAllFn::apply(x, reinterpret_cast<std::int64_t>(&comm), send, recv);
}

bool is_expert_entry(const ParamEntry& e) { return e.name.rfind("experts.", 0) == 0; }

}  // namespace

struct EpTrainer::Impl {
  Communicator& comm;
  EpConfig cfg;
  ModelSpec spec;
  ModelLayout layout;
  at::Device device;
  int P = 1, rank = 0;
  int experts_local = 0, expert0 = 0;  // owned experts [expert0, expert0 + experts_local)

  struct Block {
    at::Tensor rep;                    // replicated weights, flat leaf on the compute device
    at::Tensor rep_master;             // host FP32 master of [slice_lo, slice_lo + slice_n) (CPU device: a view of rep)
    at::Tensor rep_m, rep_v;           // host moments: whole buffer (kFull) or this rank's slice (kShard)
    std::int64_t slice_lo = 0, slice_n = 0, slice_cap = 0;
    at::Tensor exp;                    // owned expert shard, flat leaf (decoder blocks with EP); streamed: this step only
    at::Tensor exp_m, exp_v;           // resident: on the device; streamed: host
    at::Tensor exp_host_master;        // streamed shards only: the host master the step's copy comes from
    std::vector<std::int64_t> offset;  // per entry: offset in rep or exp
    std::vector<bool> expert;          // per entry: lives in exp
    bool resident = true;              // exp updated on the device (else through host state)
    BlockWeights weights;
  };
  std::vector<Block> blocks;
  std::vector<bool> retained;  // per decoder: MoE-retained (else replayed whole in backward)
  std::int64_t step = 0;
  std::vector<DispatchRecord> log;
  // Host gradient slots (cpu_grad_slots) and the worker that runs the CPU AdamW updates.
  std::vector<at::Tensor> slots;
  JobQueue updates;
  int submitted = 0;
  // The last step's gradients (replicated: summed over ranks; experts: this rank's shard).
  std::vector<at::Tensor> last_rep_grads, last_exp_grads;

  Impl(const HostState& init, EpConfig c, Communicator& cm, at::Device dev)
      : comm(cm), cfg(c), spec(init.spec()), layout(init.layout()), device(dev), P(cm.size()), rank(cm.rank()),
      step(init.step) {
    const int E = spec.moe.experts;
    if (cfg.expert_parallel && E % P != 0) {
      throw InputError("", "num_experts", std::to_string(E),
                       "expert parallelism needs a multiple of the rank count " + std::to_string(P));
    }
    if (cfg.cpu_grad_slots < 1) {
      throw InputError("", "cpu_grad_slots", std::to_string(cfg.cpu_grad_slots), "must be ≥ 1");
    }
    if (cfg.moe_chunk_tokens < 0) {
      throw InputError("", "moe_chunk_tokens", std::to_string(cfg.moe_chunk_tokens), "must be ≥ 0");
    }
    const int L = spec.layers;
    for (const auto* layers : {&cfg.resident_layers, &cfg.moe_retained_layers}) {
      if (!layers->has_value()) continue;
      for (const int l : **layers) {
        if (l < 0 || l >= L) {
          throw InputError("", layers == &cfg.resident_layers ? "resident_layers" : "moe_retained_layers",
                           std::to_string(l), "must be a decoder index 0.." + std::to_string(L - 1));
        }
      }
    }
    retained.assign(static_cast<std::size_t>(L), !cfg.moe_retained_layers.has_value());
    if (cfg.moe_retained_layers) {
      for (const int l : *cfg.moe_retained_layers) retained[static_cast<std::size_t>(l)] = true;
    }
    experts_local = cfg.expert_parallel ? E / P : E;
    expert0 = cfg.expert_parallel ? rank * experts_local : 0;
    const auto f32 = at::TensorOptions().dtype(at::kFloat);
    for (int b = 0; b < init.blocks(); ++b) {
      const auto& bl = layout.blocks[static_cast<std::size_t>(b)];
      Block blk;
      blk.resident = cfg.resident_experts;
      if (cfg.resident_layers && b >= 1 && b <= L) {
        const auto& rl = *cfg.resident_layers;
        blk.resident = std::find(rl.begin(), rl.end(), b - 1) != rl.end();
      }
      // Per buffer (master, first and second moment): the replicated part and the owned shard.
      std::vector<at::Tensor> rep_parts[3], exp_parts[3];
      std::int64_t rep_n = 0, exp_n = 0;
      for (const auto& e : bl.entries) {
        const bool ex = cfg.expert_parallel && is_expert_entry(e);
        blk.expert.push_back(ex);
        auto& n = ex ? exp_n : rep_n;
        blk.offset.push_back(n);
        n += local_numel(e, ex);
        for (int k = 0; k < 3; ++k) {
          const auto& buf = k == 0 ? init.master(b) : k == 1 ? init.exp_avg(b) : init.exp_avg_sq(b);
          const auto full = buf.narrow(0, e.offset, e.numel());
          if (ex) {
            exp_parts[k].push_back(full.view(e.shape).narrow(0, expert0, experts_local).reshape({-1}));
          } else {
            rep_parts[k].push_back(full);
          }
        }
      }
      const auto rep_host = at::cat(rep_parts[0]).contiguous();
      blk.rep = rep_host.to(device).clone().detach().requires_grad_(true);
      if (cfg.delivery == Delivery::kShard) {
        blk.slice_cap = (rep_n + P - 1) / P;
        blk.slice_lo = std::min<std::int64_t>(rep_n, rank * blk.slice_cap);
        blk.slice_n = std::min<std::int64_t>(rep_n - blk.slice_lo, blk.slice_cap);
      } else {
        blk.slice_lo = 0;
        blk.slice_n = rep_n;
      }
      // Host master and moments of this rank's part; on a CPU device the leaf itself is the master.
      blk.rep_master = device.is_cpu() ? blk.rep.detach().narrow(0, blk.slice_lo, blk.slice_n)
                                       : rep_host.narrow(0, blk.slice_lo, blk.slice_n).clone();
      blk.rep_m = at::cat(rep_parts[1]).narrow(0, blk.slice_lo, blk.slice_n).to(f32).clone();
      blk.rep_v = at::cat(rep_parts[2]).narrow(0, blk.slice_lo, blk.slice_n).to(f32).clone();
      if (!exp_parts[0].empty()) {
        const auto host = at::cat(exp_parts[0]).contiguous();
        const auto where = blk.resident ? device : at::Device(at::kCPU);
        blk.exp_m = at::cat(exp_parts[1]).to(f32.device(where)).clone();
        blk.exp_v = at::cat(exp_parts[2]).to(f32.device(where)).clone();
        if (blk.resident) {
          blk.exp = host.to(device).clone().detach().requires_grad_(true);
        } else {
          blk.exp_host_master = host.clone();  // streamed to the device at each step (stream_in)
        }
      }
      blocks.push_back(std::move(blk));
    }
    // Named views are made at each step (rebuild_views), after the streamed shards are in.
  }

  // Elements of entry `e` on this rank: all of it, or the owned experts' rows of an expert entry.
  std::int64_t local_numel(const ParamEntry& e, bool expert) const {
    return expert ? e.numel() / e.shape[0] * experts_local : e.numel();
  }

  // Streamed shards: this step's device copy of the host master (on a CPU device, the master itself).
  void stream_in() {
    for (auto& blk : blocks) {
      if (blk.exp_host_master.defined()) {
        blk.exp = (device.is_cpu() ? blk.exp_host_master : blk.exp_host_master.to(device)).detach().requires_grad_(true);
      }
    }
  }
  // Streamed shards leave the device after their update.
  void release_streamed() {
    for (auto& blk : blocks) {
      if (blk.exp_host_master.defined()) blk.exp = at::Tensor();
    }
  }
  // An expert shard's weights wherever they are kept between steps.
  const at::Tensor& expert_weights(const Block& blk) const {
    return blk.exp_host_master.defined() ? blk.exp_host_master : blk.exp;
  }

  // Host update through a gradient slot: copies `grad` (any device) into the next free host slot,
  // then runs the CPU AdamW on the worker. A slot is reused once the update that held it finished.
  void host_update(at::Tensor master, const at::Tensor& grad, at::Tensor m, at::Tensor v, std::int64_t t, double coef) {
    const int S = cfg.cpu_grad_slots;
    const int k = submitted;  // this update's 0-based index
    if (k >= S) updates.wait_done(k - S + 1);
    const auto index = static_cast<std::size_t>(k % S);
    if (slots.size() <= index) slots.resize(index + 1);
    auto& slot = slots[index];
    if (!slot.defined() || slot.numel() < grad.numel()) {
      slot = at::empty({grad.numel()}, at::TensorOptions().dtype(at::kFloat));
    }
    auto g = slot.narrow(0, 0, grad.numel());
    g.copy_(grad);
    const AdamWConfig adam = cfg.trainer.adam;
    const int threads = cfg.trainer.adam_threads;
    submitted = updates.submit([master, g, m, v, adam, t, coef, threads]() mutable {
      cpu_adamw_step(master, g, m, v, adam, t, coef, threads);
    });
  }

  // Named views of the flat leaves, made afresh every step: the updates modify the leaves in place,
  // and views taken before an in-place update would backpropagate through a generic strided path.
  void rebuild_views() {
    for (std::size_t b = 0; b < blocks.size(); ++b) {
      auto& blk = blocks[b];
      const auto& bl = layout.blocks[b];
      blk.weights.layout = &bl;
      blk.weights.tensors.clear();
      for (std::size_t i = 0; i < bl.entries.size(); ++i) {
        const auto& e = bl.entries[i];
        if (blk.expert[i]) {
          auto shape = e.shape;
          shape[0] = experts_local;
          blk.weights.tensors.push_back(blk.exp.narrow(0, blk.offset[i], local_numel(e, true)).view(shape));
        } else {
          blk.weights.tensors.push_back(blk.rep.narrow(0, blk.offset[i], e.numel()).view(e.shape));
        }
      }
    }
  }

  // x + token mixing of norm(x): the first half of a decoder layer.
  at::Tensor mixing(const at::Tensor& x, const BlockWeights& w, int layer) const {
    const LayerKind kind = spec.layer_kinds[static_cast<std::size_t>(layer)];
    const auto xn = model_norm(x, w["input_norm"], spec);
    return x + post_mixing(kind == LayerKind::kLinearAttention ? gdn_mixing(xn, w, spec, cfg.trainer.model)
                                                               : attention_mixing(xn, w, spec, kind, cfg.trainer.model),
                           w, spec);
  }

  // The feed-forward half of a decoder layer on the residual a: routed experts with the owned
  // shard (dispatch to owners, compute, return), shared expert and dense MLP, combined as the
  // model does (ffn_output). `record`: add the dispatches to the step's log (not when a backward
  // replay repeats them).
  at::Tensor ffn(const at::Tensor& a, const BlockWeights& w, int layer, bool record = true) {
    if (!cfg.expert_parallel || P == 1) return ffn_half(a, w, spec);
    const MoeSpec& m = spec.moe;
    const auto a2 = a.reshape({-1, a.size(-1)});
    const FfnInputs in = ffn_inputs(a2, w, spec);
    const auto& x2 = in.experts;
    const std::int64_t T = x2.size(0);
    const std::int64_t chunk = cfg.moe_chunk_tokens > 0 ? std::min(cfg.moe_chunk_tokens, T) : T;
    const auto& eg = w["experts.gate"];
    const auto& eu = w["experts.up"];
    const auto& ed = w["experts.down"];
    std::vector<at::Tensor> outs;
    int chunk_index = 0;
    for (std::int64_t c0 = 0; c0 < T; c0 += chunk, ++chunk_index) {
      const auto C = std::min(chunk, T - c0);
      const auto xc = x2.narrow(0, c0, C);
      const auto r = route_layer(in.router.narrow(0, c0, C), w, spec);
      const plan_ops::SortedSlots slots = plan_ops::sort_slots_by_expert(r, m);
      // Received rows: by source rank, then by owned expert. One gather per owned expert.
      const plan_ops::DispatchSplits d = plan_ops::dispatch_splits(comm.all_gather_counts(slots.counts), rank, experts_local);
      if (record) log.push_back({layer, chunk_index, d.send});
      const auto recv_x = all_to_all_autograd(comm, xc.index_select(0, slots.tokens), d.send, d.recv);
      auto y_recv = at::zeros_like(recv_x);
      for (int j = 0; j < experts_local; ++j) {
        const auto& rj = d.owned_rows[static_cast<std::size_t>(j)];
        if (rj.empty()) continue;
        const auto idx = at::tensor(rj, at::TensorOptions().dtype(at::kLong)).to(a.device());
        const auto ye = gated_mlp(recv_x.index_select(0, idx), eg[j], eu[j], ed[j], spec.activation);
        y_recv = y_recv.index_add(0, idx, ye);
      }
      const auto back = all_to_all_autograd(comm, y_recv, d.recv, d.send);
      outs.push_back(at::zeros_like(xc).index_add(
          0, slots.tokens, back * slots.weights.unsqueeze(1).to(back.scalar_type())));
    }
    const auto routed = outs.size() == 1 ? outs[0] : at::cat(outs, 0);
    at::Tensor shared, dense;
    if (m.shared_expert_intermediate > 0) {
      const auto s = gated_mlp(in.dense, w["shared.gate"], w["shared.up"], w["shared.down"], spec.activation);
      shared = at::sigmoid(at::linear(in.dense, w["shared.expert_gate"])) * s;
    }
    if (m.dense_intermediate > 0) dense = gated_mlp(in.dense, w["dense.gate"], w["dense.up"], w["dense.down"], spec.activation);
    return ffn_output(a2, routed, shared, dense, w, spec).view(a.sizes());
  }

  static at::Tensor grad_or_zeros(const at::Tensor& leaf) {
    return leaf.grad().defined() ? leaf.grad() : at::zeros_like(leaf);
  }

  // Queues the host update of this rank's part of the replicated buffer.
  void update_replicated(Block& blk, const at::Tensor& grad, std::int64_t t, double coef) {
    if (blk.slice_n > 0) host_update(blk.rep_master, grad.narrow(0, blk.slice_lo, blk.slice_n), blk.rep_m, blk.rep_v, t, coef);
  }

  // After every host update finished: the new weights back into the device's working copy (and,
  // with shard delivery, every rank's slice to every rank).
  void publish_replicated(Block& blk) {
    auto p = blk.rep.detach();
    auto ps = p.narrow(0, blk.slice_lo, blk.slice_n);
    if (!p.is_cpu() && blk.slice_n > 0) ps.copy_(blk.rep_master);
    if (cfg.delivery == Delivery::kShard && P > 1) {
      auto mine = at::zeros({blk.slice_cap}, p.options());
      mine.narrow(0, 0, blk.slice_n).copy_(ps);
      const auto all = comm.all_gather(mine).reshape({-1});  // rank r's slice at r·cap
      p.copy_(all.narrow(0, 0, p.numel()));
    }
  }

  at::Tensor gather_block(std::size_t b, const at::Tensor& rep_part, bool rep_sliced, const at::Tensor& exp_part);

  void update_experts(Block& blk, const at::Tensor& grad, std::int64_t t, double coef) {
    auto p = blk.exp.detach();
    if (blk.resident) {
      if (p.is_cpu()) {
        // On a CPU compute device the resident shard is host memory: the vector kernel updates it in place.
        cpu_adamw_step(p, grad, blk.exp_m, blk.exp_v, cfg.trainer.adam, t, coef, cfg.trainer.adam_threads);
      } else {
        device_adamw_step(p, grad, blk.exp_m, blk.exp_v, cfg.trainer.adam, t, coef);
      }
      return;
    }
    host_update(blk.exp_host_master, grad, blk.exp_m, blk.exp_v, t, coef);
  }
};

EpTrainer::EpTrainer(const HostState& init, EpConfig config, Communicator& comm, at::Device device)
    : impl_(std::make_unique<Impl>(init, config, comm, device)) {}

EpTrainer::~EpTrainer() = default;

const std::vector<DispatchRecord>& EpTrainer::last_dispatch() const { return impl_->log; }
std::int64_t EpTrainer::steps() const { return impl_->step; }
void EpTrainer::set_lr(double lr) { impl_->cfg.trainer.adam.lr = lr; }

int EpTrainer::host_grad_slots_used() const { return static_cast<int>(impl_->slots.size()); }

std::int64_t EpTrainer::host_grad_slot_bytes() const {
  std::int64_t n = 0;
  for (const auto& t : impl_->slots) n += t.numel() * static_cast<std::int64_t>(t.element_size());
  return n;
}

std::int64_t EpTrainer::device_expert_bytes_between_steps() const {
  std::int64_t n = 0;
  for (const auto& blk : impl_->blocks) {
    if (blk.exp.defined()) n += blk.exp.numel() * static_cast<std::int64_t>(blk.exp.element_size());
  }
  return n;
}

StepStats EpTrainer::step(const at::Tensor& tokens, const at::Tensor& targets) {
  Impl& s = *impl_;
  const int L = s.spec.layers;
  const auto B = tokens.size(0);
  if (B % s.P != 0) {
    throw InputError("", "batch", std::to_string(B), "must be a multiple of the rank count " + std::to_string(s.P));
  }
  const auto local = B / s.P;
  const auto tok = tokens.narrow(0, s.rank * local, local).to(s.device);
  const auto tgt = targets.narrow(0, s.rank * local, local).to(s.device);
  s.log.clear();
  s.stream_in();
  s.rebuild_views();
  for (auto& blk : s.blocks) {
    blk.rep.mutable_grad() = at::Tensor();
    if (blk.exp.defined()) blk.exp.mutable_grad() = at::Tensor();
  }

  const auto& outer = s.blocks[0].weights;
  const auto x0 = embed(tok, outer, s.spec);
  std::vector<at::Tensor> inputs(static_cast<std::size_t>(L)), mids(static_cast<std::size_t>(L)),
      outs(static_cast<std::size_t>(L));
  at::Tensor h = x0.detach();
  for (int l = 0; l < L; ++l) {
    const auto& w = s.blocks[static_cast<std::size_t>(1 + l)].weights;
    inputs[static_cast<std::size_t>(l)] = h;
    if (!s.retained[static_cast<std::size_t>(l)]) {
      at::NoGradGuard no_grad;
      const auto a = s.mixing(h, w, l);
      h = s.ffn(a, w, l);
      continue;
    }
    at::Tensor a;
    {
      at::NoGradGuard no_grad;
      a = s.mixing(h, w, l);
    }
    auto a_leaf = a.detach().requires_grad_(true);
    const auto y = s.ffn(a_leaf, w, l);
    mids[static_cast<std::size_t>(l)] = a_leaf;
    outs[static_cast<std::size_t>(l)] = y;
    h = y.detach();
  }
  auto hL = h.requires_grad_(true);
  const auto local_loss = head_loss(hL, tgt, outer, s.spec);
  (local_loss / static_cast<double>(s.P)).backward();
  at::Tensor g = hL.grad();
  for (int l = L - 1; l >= 0; --l) {
    const auto i = static_cast<std::size_t>(l);
    const auto& w = s.blocks[1 + i].weights;
    if (!s.retained[i]) {
      auto x = inputs[i].detach().requires_grad_(true);
      inputs[i] = at::Tensor();
      const auto a = s.mixing(x, w, l);
      s.ffn(a, w, l, /*record=*/false).backward(g);
      g = x.grad();
      continue;
    }
    outs[i].backward(g);
    outs[i] = at::Tensor();
    const auto ga = mids[i].grad();
    mids[i] = at::Tensor();
    auto x = inputs[i].detach().requires_grad_(true);
    inputs[i] = at::Tensor();
    s.mixing(x, w, l).backward(ga);
    g = x.grad();
  }
  x0.backward(g);

  // Reduce replicated gradients; expert shards are complete on their owner.
  std::vector<at::Tensor> rep_grads, exp_grads;
  double rep_sq = 0.0;
  for (auto& blk : s.blocks) {
    auto gr = Impl::grad_or_zeros(blk.rep).contiguous();
    s.comm.all_reduce_sum(gr);
    rep_sq += gr.to(at::kDouble).pow(2).sum().item<double>();
    rep_grads.push_back(gr);
    exp_grads.push_back(blk.exp.defined() ? Impl::grad_or_zeros(blk.exp).contiguous() : at::Tensor());
  }
  StepStats stats;
  const auto on_comm = at::TensorOptions().dtype(at::kDouble).device(s.comm.device());
  auto loss_sum = local_loss.detach().to(on_comm).reshape({1}).contiguous();
  s.comm.all_reduce_sum(loss_sum);
  stats.loss = loss_sum.item<double>() / s.P;
  double coef = 1.0;
  if (s.cfg.trainer.max_grad_norm > 0) {
    double exp_sq = 0.0;
    for (const auto& ge : exp_grads) {
      if (ge.defined()) exp_sq += ge.to(at::kDouble).pow(2).sum().item<double>();
    }
    auto t = at::tensor({exp_sq}, at::TensorOptions().dtype(at::kDouble)).to(s.comm.device());
    s.comm.all_reduce_sum(t);
    stats.grad_norm = std::sqrt(rep_sq + t.item<double>());
    coef = clip_coefficient(stats.grad_norm, s.cfg.trainer.max_grad_norm);
  }
  const auto t = s.step + 1;
  for (std::size_t b = 0; b < s.blocks.size(); ++b) {
    s.update_replicated(s.blocks[b], rep_grads[b], t, coef);
    if (exp_grads[b].defined()) s.update_experts(s.blocks[b], exp_grads[b], t, coef);
  }
  s.updates.wait_all();
  s.last_rep_grads = std::move(rep_grads);
  s.last_exp_grads = std::move(exp_grads);
  for (auto& blk : s.blocks) s.publish_replicated(blk);
  s.release_streamed();
  ++s.step;
  return stats;
}

// One block's buffer in layout order from the replicated part (this rank's copy, or its slice
// [slice_lo, slice_lo + slice_n) when `rep_sliced`) and the owned expert shard. Collective.
at::Tensor EpTrainer::Impl::gather_block(std::size_t b, const at::Tensor& rep_part, bool rep_sliced,
                                         const at::Tensor& exp_part) {
  const auto& blk = blocks[b];
  const auto& bl = layout.blocks[b];
  at::Tensor rep_full = rep_part.detach().to(at::kCPU);
  if (rep_sliced && P > 1) {
    auto mine = at::zeros({blk.slice_cap}, rep_full.options().device(comm.device()));
    mine.narrow(0, 0, blk.slice_n).copy_(rep_full);
    rep_full = comm.all_gather(mine).reshape({-1}).narrow(0, 0, blk.rep.numel()).cpu();
  }
  auto flat = at::empty({bl.numel}, at::TensorOptions().dtype(at::kFloat));
  for (std::size_t i = 0; i < bl.entries.size(); ++i) {
    const auto& e = bl.entries[i];
    auto dst = flat.narrow(0, e.offset, e.numel());
    if (blk.expert[i]) {
      dst.copy_(comm.all_gather(exp_part.detach().narrow(0, blk.offset[i], local_numel(e, true)).to(comm.device()).contiguous())
                    .reshape({-1}).cpu());
    } else {
      dst.copy_(rep_full.narrow(0, blk.offset[i], e.numel()));
    }
  }
  return flat;
}

std::vector<at::Tensor> EpTrainer::gather_flat_params() {
  Impl& s = *impl_;
  std::vector<at::Tensor> out;
  for (std::size_t b = 0; b < s.blocks.size(); ++b) {
    out.push_back(s.gather_block(b, s.blocks[b].rep, false, s.expert_weights(s.blocks[b])));
  }
  return out;
}

std::vector<at::Tensor> EpTrainer::gather_flat_grads() {
  Impl& s = *impl_;
  if (s.last_rep_grads.empty()) throw std::logic_error("gather_flat_grads: no step has run");
  std::vector<at::Tensor> out;
  for (std::size_t b = 0; b < s.blocks.size(); ++b) {
    out.push_back(s.gather_block(b, s.last_rep_grads[b], false, s.last_exp_grads[b]));
  }
  return out;
}

void EpTrainer::export_state(HostState& out) {
  Impl& s = *impl_;
  const bool sliced = s.cfg.delivery == Delivery::kShard;
  for (std::size_t b = 0; b < s.blocks.size(); ++b) {
    const auto& blk = s.blocks[b];
    const int bi = static_cast<int>(b);
    out.master(bi).copy_(s.gather_block(b, blk.rep, false, s.expert_weights(blk)));
    out.exp_avg(bi).copy_(s.gather_block(b, blk.rep_m, sliced, blk.exp_m));
    out.exp_avg_sq(bi).copy_(s.gather_block(b, blk.rep_v, sliced, blk.exp_v));
    out.publish(bi);
  }
  out.step = s.step;
}

}  // namespace oom::backend::dist
