// Training checkpoints: the whole training state in one file, DIR/checkpoint.oom.
//
// Layout: the 8 magic bytes "OOMCKPT1", an 8-byte little-endian header length N, N bytes of JSON
// ({"format": 1, "model": HF config of the spec, "blocks": [numel per block], "step",
// "payload_bytes", "payload_fnv1a64", "run": caller's object — data position, sampler RNG,
// hyper-parameters}), then per block the FP32 master, first and second Adam moments. Written with
// write_file_atomically (temp file + rename): a crash leaves the previous checkpoint intact.
// Loading validates the whole file (magic, header, model, sizes, checksum) before touching the
// state, so a corrupt or mismatched checkpoint raises one InputError and changes nothing.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "backend/data/data.h"
#include "backend/optim/lr_schedule.h"
#include "backend/runtime/state.h"
#include "backend/train/train.h"

namespace oom::backend {

std::string checkpoint_file(const std::string& dir);

// Writes the state of `state` and `run` into DIR/checkpoint.oom (creating DIR).
void save_checkpoint(const std::string& dir, const HostState& state, const nlohmann::json& run);

// What tells two copies of a checkpoint apart: the step and the payload checksum its header states.
struct CheckpointStamp {
  std::int64_t step = 0;
  std::uint64_t payload_fnv1a64 = 0;
};

// The stamp of DIR/checkpoint.oom, from its header only (the payload is checked by
// load_checkpoint). Throws InputError naming the file when it is missing or its header is bad.
CheckpointStamp checkpoint_stamp(const std::string& dir);

// Restores masters, moments and step into `state` (then republishes its working copies) and
// returns the saved `run` object. Throws InputError naming the file and the field when the file is
// missing, corrupt, or for a different model; `state` is unchanged then.
nlohmann::json load_checkpoint(const std::string& dir, HostState& state);

// The `run` object of a training checkpoint: the settings that shape the losses (sequence, batch,
// micro-batches per step, optimizer hyper-parameters, precision, GDN chunk, the data's size) and
// the data sampler's position (TrainingData::save_state). `options.bf16` is the run's resolved
// precision (bf16_working_weights).
nlohmann::json checkpoint_run(const TrainOptions& options, const TrainingData& data);

// The run's learning-rate schedule: resolve_lr_schedule() of the options, the decay ending by
// default at the run's last global step (`steps_done` + options.steps). A resumed run (`saved` its
// checkpoint's run object, else null) without --decay-steps keeps the checkpoint's decay end; a
// schedule that differs from the saved one (a checkpoint without one ran at a constant lr) is an
// InputError naming `path` and run.lr_schedule.
LrSchedule run_lr_schedule(const TrainOptions& options, std::int64_t steps_done, const nlohmann::json* saved,
                           const std::string& path);

// Whether a checkpoint is due after step `index` (0-based) of this run: after its last step, and
// after every `checkpoint_every` steps; never without a checkpoint folder.
bool checkpoint_due(const TrainOptions& options, int index);

// Restores `state` and the data sampler from options.resume_dir and returns the saved run object.
// Throws InputError naming the checkpoint and the field when the file is bad or its run differs
// from `options` or the data (run.FIELD).
nlohmann::json resume_training(const TrainOptions& options, HostState& state, TrainingData& data);

}  // namespace oom::backend
