#include "backend/train/eval.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include "backend/io/hf_checkpoint.h"
#include "backend/io/token_file.h"
#include "backend/model/model.h"
#include "backend/runtime/state.h"
#include "backend/runtime/threads.h"
#include "backend/train/train.h"
#include "costmodel/input_error.h"

namespace oom::backend {

EvalResult evaluate(const EvalOptions& o) {
  if (o.seq < 2) throw InputError("", "--seq", std::to_string(o.seq), "must be at least 2 (one prediction)");
  if (o.batch < 1) throw InputError("", "--batch", std::to_string(o.batch), "must be at least 1");
  if (o.max_sequences < 0) throw InputError("", "--max-sequences", std::to_string(o.max_sequences), "must be ≥ 0");
  const ModelSpec spec = hf_checkpoint_spec(o.weights);
  const io::TokenFile tokens(o.data);
  std::int64_t n = tokens.size() / o.seq;
  if (n == 0) {
    throw InputError(o.data, "token count", std::to_string(tokens.size()),
                     fmt::format("is less than one sequence of --seq {} tokens", o.seq));
  }
  if (o.max_sequences > 0) n = std::min(n, o.max_sequences);
  if (tokens.max_token() >= static_cast<std::uint32_t>(spec.vocab)) {
    throw InputError(o.data, fmt::format("token {}", tokens.max_token_position()), std::to_string(tokens.max_token()),
                     fmt::format("is outside the vocabulary of {} ({} entries)", spec.name, spec.vocab));
  }
  set_compute_threads(o.threads);
  const at::Device device(resolve_device(o.device));
  HostState state(spec);
  load_hf_checkpoint(o.weights, state);
  ParamWindow window(state, device);
  at::NoGradGuard no_grad;
  const ModelOptions opt;
  const auto views = [&](int b, const at::Tensor& flat) {
    return block_views(state.layout().blocks[static_cast<std::size_t>(b)], flat);
  };
  // The outer block (embeddings, final norm, head) stays on the device; decoders stream through.
  const auto outer_flat = state.working(0).to(device);
  const auto outer = views(0, outer_flat);

  EvalResult r;
  r.seq = o.seq;
  r.model = spec.name;
  std::vector<std::int64_t> buf;
  for (std::int64_t s0 = 0; s0 < n; s0 += o.batch) {
    const std::int64_t b = std::min(o.batch, n - s0);
    buf.resize(static_cast<std::size_t>(b * o.seq));
    tokens.copy(s0 * o.seq, b * o.seq, buf.data());
    const auto ids = at::from_blob(buf.data(), {b, o.seq}, at::kLong).to(device);
    const auto input = ids.narrow(1, 0, o.seq - 1), target = ids.narrow(1, 1, o.seq - 1);
    auto x = embed(input, outer, spec);
    window.prefetch(1);
    for (int l = 0; l < spec.layers; ++l) {
      if (l + 1 < spec.layers) window.prefetch(2 + l);
      x = decoder_layer(x, views(1 + l, window.acquire(1 + l)), spec, l, opt);
      window.release(1 + l);
    }
    // Per-sequence mean cross-entropy, the vocabulary projection in chunks of tokens.
    for (std::int64_t i = 0; i < b; ++i) {
      const auto loss = head_loss(x.narrow(0, i, 1), target.narrow(0, i, 1), outer, spec, opt.loss_chunk_tokens);
      r.per_sequence.push_back(loss.item<double>());
    }
  }
  double sum = 0;
  for (double l : r.per_sequence) sum += l;
  r.loss = sum / static_cast<double>(r.per_sequence.size());
  r.tokens_scored = n * (o.seq - 1);
  return r;
}

}  // namespace oom::backend
