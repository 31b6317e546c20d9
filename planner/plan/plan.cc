#include "planner/plan/plan.h"

#include <algorithm>
#include <set>

#include <fmt/format.h>

#include "costmodel/input_error.h"
#include "costmodel/json_input.h"

namespace oom {
namespace {

constexpr std::int64_t kMaxLayers = 1 << 16;
constexpr std::int64_t kMaxTokens = std::int64_t{1} << 40;

std::vector<int> to_int_vector(const std::vector<std::int64_t>& v) { return {v.begin(), v.end()}; }

bool contains(const std::vector<int>& v, int x) { return std::find(v.begin(), v.end(), x) != v.end(); }

// Layer lists: every index within the model, no duplicates.
void check_layers(const JsonReader& r, const std::string& key, const std::vector<int>& layers, int model_layers,
                  const std::string& model_name) {
  std::set<int> seen;
  for (std::size_t i = 0; i < layers.size(); ++i) {
    const std::string field = fmt::format("{}[{}]", r.field(key), i);
    if (layers[i] < 0 || layers[i] >= model_layers) {
      r.fail_value(field, layers[i], fmt::format("layer index out of range 0..{} of {}", model_layers - 1, model_name));
    }
    if (!seen.insert(layers[i]).second) r.fail_value(field, layers[i], "duplicate layer index");
  }
}

}  // namespace

BoundaryPolicy::Place BoundaryPolicy::place(int layer) const {
  if (contains(gpu_held, layer)) return Place::kGpu;
  if (host_kept_all || contains(host_kept, layer)) return Place::kHost;
  return Place::kRegenerated;
}

bool Plan::is_resident(int layer) const { return contains(resident_layers, layer); }
bool Plan::is_moe_retained(int layer) const { return contains(moe_retained_layers, layer); }

std::string_view path_name(ExpertPath p) { return p == ExpertPath::kEp ? "ep" : "local"; }

Plan plan_from_json(const nlohmann::json& j, const std::string& file, const std::string& path) {
  const JsonReader r(j, file, path);
  r.reject_unknown_keys({"version", "path", "resident_layers", "moe_retained_layers", "routing_chunk_tokens",
                         "ep_group_gpus", "context_parallel_gpus", "param_transfer", "transfer_chunk_mib", "cpu_grad_slots", "split",
                         "keep_attention_results", "boundaries", "flat", "notes"});
  Plan p;
  p.version = static_cast<int>(r.integer("version", 1, 1));
  p.path = r.one_of("path", {"ep", "local"}) == "ep" ? ExpertPath::kEp : ExpertPath::kLocal;
  p.resident_layers = to_int_vector(r.integer_list("resident_layers", 0, kMaxLayers));
  p.moe_retained_layers = to_int_vector(r.integer_list("moe_retained_layers", 0, kMaxLayers));
  p.routing_chunk_tokens = r.integer("routing_chunk_tokens", 1, kMaxTokens);
  p.ep_group_gpus = static_cast<int>(r.integer_or("ep_group_gpus", 0, 0, 1 << 20));
  p.context_parallel_gpus = static_cast<int>(r.integer_or("context_parallel_gpus", 0, 0, 1 << 20));
  p.param_transfer = r.one_of("param_transfer", {"full", "shard"}) == "full" ? ParamTransfer::kFull : ParamTransfer::kShard;
  p.transfer_chunk_mib = r.integer("transfer_chunk_mib", 1, 1 << 20);
  p.cpu_grad_slots = static_cast<int>(r.integer("cpu_grad_slots", 1, 64));

  const JsonReader s = r.object("split");
  s.reject_unknown_keys({"attention_head_group", "gdn_chunk_tokens", "moe_chunk_tokens", "sub_batch_seqs"});
  p.split.attention_head_group = static_cast<int>(s.integer("attention_head_group", 0, 1 << 16));
  p.split.gdn_chunk_tokens = s.integer("gdn_chunk_tokens", 0, kMaxTokens);
  p.split.moe_chunk_tokens = s.integer("moe_chunk_tokens", 0, kMaxTokens);
  p.split.sub_batch_seqs = s.integer("sub_batch_seqs", 0, kMaxTokens);

  p.keep_attention_results = r.boolean("keep_attention_results");

  const JsonReader b = r.object("boundaries");
  b.reject_unknown_keys({"host_kept", "gpu_held", "regenerate_cap"});
  const auto& kept = b.raw().contains("host_kept") ? b.raw()["host_kept"] : nlohmann::json();
  if (kept.is_string()) {
    if (kept.get<std::string>() != "all") b.fail("host_kept", "expected \"all\" or a list of decoder indices");
    p.boundaries.host_kept_all = true;
  } else if (kept.is_array()) {
    p.boundaries.host_kept_all = false;
    p.boundaries.host_kept = to_int_vector(b.integer_list("host_kept", 0, kMaxLayers));
  } else {
    b.fail("host_kept", "expected \"all\" or a list of decoder indices");
  }
  p.boundaries.gpu_held = to_int_vector(b.integer_list("gpu_held", 0, kMaxLayers));
  p.boundaries.regenerate_cap = static_cast<int>(b.integer("regenerate_cap", 0, kMaxLayers));
  if (r.has("flat")) {
    const JsonReader f = r.object("flat");
    f.reject_unknown_keys({"expert_dispatch", "vocab_projection", "vocab_chunk_tokens", "checkpoint_offload",
                           "optimizer_bucket_mib"});
    if (f.has("expert_dispatch")) {
      p.flat.expert_dispatch = f.one_of("expert_dispatch", {"standard", "pipelined_llep"}) == "standard"
                                   ? ExpertDispatch::kStandard
                                   : ExpertDispatch::kPipelinedLlep;
    }
    if (f.has("vocab_projection")) {
      p.flat.vocab_projection = f.one_of("vocab_projection", {"chunked", "ring_dtp"}) == "chunked"
                                    ? VocabProjection::kChunked
                                    : VocabProjection::kRingDtp;
    }
    p.flat.vocab_chunk_tokens = f.integer_or("vocab_chunk_tokens", p.flat.vocab_chunk_tokens, 0, kMaxTokens);
    if (f.has("checkpoint_offload")) p.flat.selective_checkpoint_offload = f.one_of("checkpoint_offload", {"none", "sco"}) == "sco";
    p.flat.optimizer_bucket_mib = f.integer_or("optimizer_bucket_mib", 0, 0, 1 << 20);
  }
  p.notes = r.string_or("notes", "");
  return p;
}

nlohmann::json plan_to_json(const Plan& p) {
  nlohmann::json j;
  j["version"] = p.version;
  j["path"] = std::string(path_name(p.path));
  j["resident_layers"] = p.resident_layers;
  j["moe_retained_layers"] = p.moe_retained_layers;
  j["routing_chunk_tokens"] = p.routing_chunk_tokens;
  if (p.ep_group_gpus != 0) j["ep_group_gpus"] = p.ep_group_gpus;
  if (p.context_parallel_gpus != 0) j["context_parallel_gpus"] = p.context_parallel_gpus;
  j["param_transfer"] = p.param_transfer == ParamTransfer::kFull ? "full" : "shard";
  j["transfer_chunk_mib"] = p.transfer_chunk_mib;
  j["cpu_grad_slots"] = p.cpu_grad_slots;
  j["split"] = {{"attention_head_group", p.split.attention_head_group},
                {"gdn_chunk_tokens", p.split.gdn_chunk_tokens},
                {"moe_chunk_tokens", p.split.moe_chunk_tokens},
                {"sub_batch_seqs", p.split.sub_batch_seqs}};
  j["keep_attention_results"] = p.keep_attention_results;
  j["boundaries"] = {{"host_kept", p.boundaries.host_kept_all ? nlohmann::json("all") : nlohmann::json(p.boundaries.host_kept)},
                     {"gpu_held", p.boundaries.gpu_held},
                     {"regenerate_cap", p.boundaries.regenerate_cap}};
  if (!p.flat.is_default()) {
    const FlatSchedules& f = p.flat;
    j["flat"] = {{"expert_dispatch", f.expert_dispatch == ExpertDispatch::kStandard ? "standard" : "pipelined_llep"},
                 {"vocab_projection", f.vocab_projection == VocabProjection::kChunked ? "chunked" : "ring_dtp"},
                 {"vocab_chunk_tokens", f.vocab_chunk_tokens},
                 {"checkpoint_offload", f.selective_checkpoint_offload ? "sco" : "none"},
                 {"optimizer_bucket_mib", f.optimizer_bucket_mib}};
  }
  j["notes"] = p.notes;
  return j;
}

FlatSchedules applicable_flat(const FlatSchedules& f, const Plan& p, const ModelSpec& m, const Workload& w) {
  FlatSchedules out = f;
  if (p.path != ExpertPath::kEp || w.gpus < 2) out.expert_dispatch = ExpertDispatch::kStandard;
  if (w.gpus < 2 || m.vocab % w.gpus != 0) out.vocab_projection = VocabProjection::kChunked;
  if (!p.boundaries.host_kept_all || !p.boundaries.gpu_held.empty()) out.selective_checkpoint_offload = false;
  return out;
}

Plan load_plan(const std::string& path) { return plan_from_json(read_json_file(path), path); }

void validate_plan(const Plan& p, const ModelSpec& m, const Workload& w, const std::string& file,
                   const std::string& path) {
  const nlohmann::json j = plan_to_json(p);
  const JsonReader r(j, file, path);
  const JsonReader s(j["split"], file, r.field("split"));
  const JsonReader b(j["boundaries"], file, r.field("boundaries"));
  check_layers(r, "resident_layers", p.resident_layers, m.layers, m.name);
  check_layers(r, "moe_retained_layers", p.moe_retained_layers, m.layers, m.name);
  if (!p.boundaries.host_kept_all) check_layers(b, "host_kept", p.boundaries.host_kept, m.layers, m.name);
  check_layers(b, "gpu_held", p.boundaries.gpu_held, m.layers, m.name);

  // Every field is honoured by the path it names or refused here: a field the path would ignore is
  // an error, not a silent no-op.
  if (p.path == ExpertPath::kLocal) {
    if (!p.resident_layers.empty()) r.fail("resident_layers", "the local path has no resident expert shards");
    if (!p.moe_retained_layers.empty()) r.fail("moe_retained_layers", "the local path has no MoE-retained layers");
    if (p.routing_chunk_tokens != Plan{}.routing_chunk_tokens) {
      r.fail("routing_chunk_tokens", "the local path routes no tokens between GPUs; it chunks MoE work by split.moe_chunk_tokens");
    }
    if (p.ep_group_gpus != 0) r.fail("ep_group_gpus", "the local path has no expert-parallel groups");
    if (p.context_parallel_gpus != 0) r.fail("context_parallel_gpus", "the local path runs whole sequences per GPU");
    if (w.gpus_per_seq() > 1) {
      r.fail("path", fmt::format("the workload splits each sequence over {} GPUs (global_batch {} < gpus {}); the local "
                                 "path runs whole sequences per GPU: plan the ep path",
                                 w.gpus_per_seq(), w.global_batch, w.gpus));
    }
  } else {
    if (p.split.moe_chunk_tokens != 0) {
      s.fail("moe_chunk_tokens", "the ep path chunks MoE work by its dispatch rounds (routing_chunk_tokens)");
    }
    if (p.split.sub_batch_seqs != 0) s.fail("sub_batch_seqs", "sub-batches are a local-path partition");
    if (p.ep_group_gpus > w.gpus || (p.ep_group_gpus > 0 && w.gpus % p.ep_group_gpus != 0)) {
      r.fail("ep_group_gpus", fmt::format("an EP group divides the workload's {} GPUs into equal groups", w.gpus));
    }
    const int group = p.ep_group(w.gpus);
    if (m.moe.experts % group != 0) {
      r.fail(p.ep_group_gpus > 0 ? "ep_group_gpus" : "path",
             fmt::format("EP needs the {} experts of {} to split evenly over {} GPUs", m.moe.experts, m.name, group));
    }
    if (p.param_transfer == ParamTransfer::kShard) r.fail("param_transfer", "shard delivery is a local-path option");
    if (p.context_parallel() != w.gpus_per_seq()) {
      r.fail("context_parallel_gpus",
             w.gpus_per_seq() > 1
                 ? fmt::format("the workload's {} sequences over {} GPUs split each sequence over {} GPUs", w.global_batch,
                               w.gpus, w.gpus_per_seq())
                 : fmt::format("the workload has whole sequences per GPU ({} over {} GPUs): nothing to split",
                               w.global_batch, w.gpus));
    }
  }

  // A head group partitions the query heads of each KV group of every attention kind.
  const int g = p.split.attention_head_group;
  if (g > 0) {
    for (LayerKind kind : {LayerKind::kFullAttention, LayerKind::kSlidingAttention, LayerKind::kLatentAttention}) {
      if (m.count(kind) == 0) continue;
      const AttentionSpec& a = m.attention(kind);
      const int per_group = a.heads / a.kv_heads;
      if (per_group % g != 0) {
        s.fail("attention_head_group", fmt::format("must divide the {} query heads per KV group of {} {} layers",
                                                   per_group, m.name, layer_kind_name(kind)));
      }
    }
  }
  // A GDN chunk is a piece of one sequence (state hand-off) or a whole number of sequences.
  if (p.split.gdn_chunk_tokens > w.seq_len && p.split.gdn_chunk_tokens % w.seq_len != 0) {
    s.fail("gdn_chunk_tokens", fmt::format("above seq_len {} it must be a whole number of sequences", w.seq_len));
  }
  if (p.split.moe_chunk_tokens > w.tokens_per_gpu()) {
    s.fail("moe_chunk_tokens", fmt::format("exceeds the {} tokens per GPU", w.tokens_per_gpu()));
  }
  if (p.split.sub_batch_seqs > 0 && w.seqs_per_gpu() % p.split.sub_batch_seqs != 0) {
    s.fail("sub_batch_seqs", fmt::format("must divide the {} sequences per GPU", w.seqs_per_gpu()));
  }
  if (!p.flat.is_default()) {
    const JsonReader f(j["flat"], file, r.field("flat"));
    if (p.flat.expert_dispatch == ExpertDispatch::kPipelinedLlep && (p.path != ExpertPath::kEp || w.gpus < 2)) {
      f.fail("expert_dispatch", "PipelinedLLEP balances expert parallelism: it needs the ep path on 2 or more GPUs");
    }
    if (p.flat.vocab_projection == VocabProjection::kRingDtp && w.gpus < 2) {
      f.fail("vocab_projection", "Ring-DTP shards the vocabulary over a ring: it needs 2 or more GPUs");
    }
    if (p.flat.vocab_projection == VocabProjection::kRingDtp && m.vocab % w.gpus != 0) {
      f.fail("vocab_projection", fmt::format("Ring-DTP needs the vocabulary of {} ({}) to split evenly over {} GPUs",
                                             m.name, m.vocab, w.gpus));
    }
    if (p.flat.selective_checkpoint_offload && (!p.boundaries.host_kept_all || !p.boundaries.gpu_held.empty())) {
      f.fail("checkpoint_offload", "SCO offloads every boundary: it needs boundaries.host_kept \"all\" and no gpu_held");
    }
  }
}

void check_local_applies(const WorkloadContext& ctx) {
  const HardwareSpec& h = ctx.hardware;
  if (ctx.workload.gpus_per_seq() > 1) {
    throw InputError("", "global_batch", std::to_string(ctx.workload.global_batch),
                     fmt::format("the Local path runs whole sequences per GPU, not each sequence over {} of the {} GPUs; "
                                 "plan the ep path (oom plan --path ep)",
                                 ctx.workload.gpus_per_seq(), ctx.workload.gpus));
  }
  const int nodes = h.nodes_used(ctx.workload.gpus);
  if (nodes <= 1) return;
  throw InputError("", "gpus", std::to_string(ctx.workload.gpus),
                   fmt::format("the Local path sums every rank's gradients in one node's host memory: its ranks must fit on "
                               "one node of {} ({} GPUs), not {} nodes; plan the ep path (oom plan --path ep)",
                               h.name, h.gpus_per_node, nodes));
}

}  // namespace oom
