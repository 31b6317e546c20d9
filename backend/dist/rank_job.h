// What both ends of a multi-rank run share: the parent (rank_train.cc, train_ranks) and each rank
// (rank_run.cc, run_rank_worker and train_torchrun_rank) check the same options, read the same job
// and result files' fields, name the node's shared state file alike and take a checkpoint's
// PipelinedLLEP routing the same way. Private to backend/dist/; no LibTorch types.
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "backend/dist/rank_train.h"
#include "costmodel/input_error.h"
#include "costmodel/model_spec.h"
#include "costmodel/routing.h"

namespace oom::backend::dist::rank_job {

// Throws InputError for options the multi-rank trainer refuses, before any work.
void check(const TrainOptions& o, const RanksOptions& r, const ModelSpec& spec);

// The file a node's rank processes share their host state through: in /dev/shm where there is one.
std::string shared_state_path(const std::string& name, const std::string& fallback_dir);

// A job or result file's field `key`; InputError naming the file `path` where it is missing or mistyped.
template <typename T>
T field(const nlohmann::json& j, const char* key, const std::string& path) {
  if (!j.contains(key)) throw InputError(path, key, "missing", "the job file lacks it");
  try {
    return j.at(key).get<T>();
  } catch (const nlohmann::json::exception&) {
    throw InputError(path, key, j.at(key).dump(), "has the wrong type");
  }
}

// A checkpoint's run.llep_routing checked against the model; none when it has none.
std::optional<RoutingSpec> saved_llep_routing(const nlohmann::json& run, const ModelSpec& spec, const std::string& file);

}  // namespace oom::backend::dist::rank_job
