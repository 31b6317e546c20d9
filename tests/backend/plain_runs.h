// What the multi-rank tests hold their runs against: the plain trainer over the same seeded
// weights and global batches, autograd on the first global batch, and weights saved by a run
// compared block by block with the plain trainer's; and the EP plan file they vary.
#pragma once

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "backend/train/train.h"
#include "tests/backend/reference_ops.h"

namespace oom::backend::testing {

// The plain trainer on `o`'s seeded weights and its data's first o.steps global batches: its
// losses and its final masters (one flat tensor a block).
std::pair<std::vector<double>, std::vector<at::Tensor>> plain_run(const TrainOptions& o);

// Autograd over the whole model on `o`'s seeded weights and its data's first global batch.
ReferenceGradients first_step_gradients(const TrainOptions& o);

// The weights `file` (saved by a run of o.model) against the plain trainer's `params`, block by
// block: largest difference relative to the block's largest value ≤ max_tol, relative L2 ≤ l2_tol.
// Prints the worst block's figures under `tag`.
void expect_weights_match(const std::string& model, const std::string& file, const std::vector<at::Tensor>& params,
                          const std::string& tag, double max_tol, double l2_tol);

// An EP plan file dir/name: no resident or retained decoder, routing rounds of 65,536 tokens, full
// parameter delivery in 64 MiB chunks, 2 CPU gradient slots, no split, host-kept boundaries; then
// `fields` over it.
std::string write_ep_plan(const std::filesystem::path& dir, const std::string& name, const nlohmann::json& fields);

}  // namespace oom::backend::testing
