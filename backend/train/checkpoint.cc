#include "backend/train/checkpoint.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "costmodel/atomic_file.h"
#include "costmodel/input_error.h"
#include "costmodel/json_input.h"

namespace oom::backend {
namespace {

constexpr char kMagic[9] = "OOMCKPT1";

std::uint64_t fnv1a64(const char* data, std::size_t n) {
  std::uint64_t h = 1469598103934665603ull;
  for (std::size_t i = 0; i < n; ++i) {
    h ^= static_cast<unsigned char>(data[i]);
    h *= 1099511628211ull;
  }
  return h;
}

void put_u64(std::string& s, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
std::uint64_t get_u64(const std::string& s, std::size_t at) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(s[at + static_cast<std::size_t>(i)]);
  return v;
}

// The saved run must have the same shape of training; otherwise the resumed losses would differ.
void check_resume(const nlohmann::json& run, const TrainOptions& o, const std::string& path) {
  auto same = [&](const char* key, const nlohmann::json& now) {
    if (!run.contains(key) || run[key] != now) {
      throw InputError(path, std::string("run.") + key, run.contains(key) ? run[key].dump() : "missing",
                       "differs from this run's " + now.dump());
    }
  };
  same("seq", o.seq);
  same("batch", o.batch);
  // Checkpoints written before gradient accumulation ran one micro-batch per step.
  if (o.accumulate != 1 || run.contains("accumulate")) same("accumulate", o.accumulate);
  same("lr", o.lr);
  same("weight_decay", o.weight_decay);
  same("max_grad_norm", o.max_grad_norm);
  same("bf16", o.bf16);
  same("gdn_chunk_tokens", o.gdn_chunk_tokens);
}

const at::Tensor* buffers_of(const HostState& st, int b, int which) {
  return which == 0 ? &st.master(b) : which == 1 ? &st.exp_avg(b) : &st.exp_avg_sq(b);
}

}  // namespace

std::string checkpoint_file(const std::string& dir) { return (std::filesystem::path(dir) / "checkpoint.oom").string(); }

void save_checkpoint(const std::string& dir, const HostState& state, const nlohmann::json& run) {
  std::string payload;
  std::vector<std::int64_t> numels;
  for (int b = 0; b < state.blocks(); ++b) {
    numels.push_back(state.master(b).numel());
    for (int which = 0; which < 3; ++which) {
      const auto t = buffers_of(state, b, which)->contiguous();
      payload.append(static_cast<const char*>(t.data_ptr()), static_cast<std::size_t>(t.nbytes()));
    }
  }
  nlohmann::json header;
  header["format"] = 1;
  header["model"] = model_spec_to_hf_config(state.spec());
  header["blocks"] = numels;
  header["step"] = state.step;
  header["payload_bytes"] = payload.size();
  header["payload_fnv1a64"] = fmt::format("{:016x}", fnv1a64(payload.data(), payload.size()));
  header["run"] = run;
  const std::string h = header.dump();
  std::string file(kMagic, 8);
  put_u64(file, h.size());
  file += h;
  file += payload;
  std::filesystem::create_directories(dir);
  write_file_atomically(checkpoint_file(dir), file);
}

CheckpointStamp checkpoint_stamp(const std::string& dir) {
  const std::string path = checkpoint_file(dir);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path, "cannot open the checkpoint");
  std::string head(16, '\0');
  if (!in.read(head.data(), 16) || head.compare(0, 8, kMagic, 8) != 0) throw InputError(path, "not an OOM checkpoint (bad magic)");
  const std::uint64_t hlen = get_u64(head, 8);
  std::string text(static_cast<std::size_t>(std::min<std::uint64_t>(hlen, std::uint64_t{1} << 30)), '\0');
  if (hlen > text.size() || !in.read(text.data(), static_cast<std::streamsize>(hlen))) {
    throw InputError(path, "header_length", std::to_string(hlen), "runs past the end of the file");
  }
  const auto header = parse_json_text(text, path);
  const JsonReader r(header, path);
  CheckpointStamp stamp;
  stamp.step = r.integer("step", 0, std::int64_t{1} << 50);
  const std::string sum = r.string("payload_fnv1a64");
  try {
    std::size_t used = 0;
    stamp.payload_fnv1a64 = std::stoull(sum, &used, 16);
    if (used != sum.size()) throw std::invalid_argument(sum);
  } catch (const std::exception&) {
    r.fail("payload_fnv1a64", "not a hexadecimal checksum");
  }
  return stamp;
}

nlohmann::json load_checkpoint(const std::string& dir, HostState& state) {
  const std::string path = checkpoint_file(dir);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path, "cannot open the checkpoint");
  std::ostringstream buf;
  buf << in.rdbuf();
  const std::string bytes = buf.str();
  if (bytes.size() < 16 || bytes.compare(0, 8, kMagic, 8) != 0) throw InputError(path, "not an OOM checkpoint (bad magic)");
  const std::uint64_t hlen = get_u64(bytes, 8);
  if (hlen > bytes.size() - 16) throw InputError(path, "header_length", std::to_string(hlen), "runs past the end of the file");
  const auto header = parse_json_text(bytes.substr(16, hlen), path);
  const JsonReader r(header, path);
  if (r.integer("format", 0, 1000) != 1) r.fail("format", "unsupported checkpoint format");
  const auto expected_model = model_spec_to_hf_config(state.spec());
  if (!r.has("model") || header["model"] != expected_model) {
    throw InputError(path, "model", json_value_text(header.value("model", nlohmann::json())),
                     "checkpoint is for a different model than " + state.spec().name);
  }
  const auto numels = r.integer_list("blocks", 0, std::int64_t{1} << 40);
  if (static_cast<int>(numels.size()) != state.blocks()) r.fail("blocks", "block count differs from the model");
  std::uint64_t expected_bytes = 0;
  for (int b = 0; b < state.blocks(); ++b) {
    if (numels[static_cast<std::size_t>(b)] != state.master(b).numel()) {
      r.fail_value(fmt::format("blocks[{}]", b), numels[static_cast<std::size_t>(b)], "block size differs from the model");
    }
    expected_bytes += 3 * static_cast<std::uint64_t>(numels[static_cast<std::size_t>(b)]) * 4;
  }
  const std::size_t data_at = 16 + hlen;
  if (static_cast<std::uint64_t>(r.integer("payload_bytes", 0, std::int64_t{1} << 50)) != expected_bytes ||
      bytes.size() - data_at != expected_bytes) {
    throw InputError(path, "payload_bytes", std::to_string(bytes.size() - data_at),
                     fmt::format("file holds a truncated or oversized payload (expected {} bytes)", expected_bytes));
  }
  const auto sum = fmt::format("{:016x}", fnv1a64(bytes.data() + data_at, expected_bytes));
  if (r.string("payload_fnv1a64") != sum) {
    throw InputError(path, "payload_fnv1a64", r.string("payload_fnv1a64"), "checksum mismatch: the payload is corrupt (computed " + sum + ")");
  }
  const auto step = r.integer("step", 0, std::int64_t{1} << 50);
  if (!r.has("run") || !header["run"].is_object()) r.fail("run", "missing run object");
  // Everything is valid: restore.
  std::size_t at = data_at;
  for (int b = 0; b < state.blocks(); ++b) {
    for (int which = 0; which < 3; ++which) {
      auto& t = which == 0 ? state.master(b) : which == 1 ? state.exp_avg(b) : state.exp_avg_sq(b);
      std::memcpy(t.data_ptr(), bytes.data() + at, static_cast<std::size_t>(t.nbytes()));
      at += static_cast<std::size_t>(t.nbytes());
    }
    state.publish(b);
  }
  state.step = step;
  return header["run"];
}

nlohmann::json checkpoint_run(const TrainOptions& o, const TrainingData& data) {
  nlohmann::json run = {{"seq", o.seq}, {"batch", o.batch}, {"accumulate", o.accumulate}, {"lr", o.lr},
                        {"weight_decay", o.weight_decay}, {"max_grad_norm", o.max_grad_norm}, {"seed", o.seed},
                        {"bf16", o.bf16}, {"gdn_chunk_tokens", o.gdn_chunk_tokens}, {"data_kind", data.kind()}};
  run.update(data.save_state());
  return run;
}

LrSchedule run_lr_schedule(const TrainOptions& o, std::int64_t steps_done, const nlohmann::json* saved,
                           const std::string& path) {
  std::int64_t decay_steps = o.decay_steps;
  const bool saved_cosine = saved != nullptr && saved->contains("lr_schedule") && (*saved)["lr_schedule"].is_object() &&
                            (*saved)["lr_schedule"].value("kind", "") == "cosine";
  if (decay_steps == 0 && saved_cosine && o.lr_schedule != "constant") {
    const auto& d = (*saved)["lr_schedule"]["decay_steps"];
    if (d.is_number_integer()) decay_steps = d.get<std::int64_t>();
  }
  const LrSchedule schedule =
      resolve_lr_schedule(o.lr_schedule, o.lr, o.min_lr, o.warmup_steps, decay_steps, steps_done + o.steps);
  if (saved != nullptr) {
    const nlohmann::json now = lr_schedule_to_json(schedule);
    const nlohmann::json before =
        saved->value("lr_schedule", lr_schedule_to_json(resolve_lr_schedule("constant", o.lr, -1, 0, 0, 0)));
    if (before != now) throw InputError(path, "run.lr_schedule", before.dump(), "differs from this run's " + now.dump());
  }
  return schedule;
}

bool checkpoint_due(const TrainOptions& o, int index) {
  if (o.checkpoint_dir.empty()) return false;
  return index + 1 == o.steps || (o.checkpoint_every > 0 && (index + 1) % o.checkpoint_every == 0);
}

nlohmann::json resume_training(const TrainOptions& o, HostState& state, TrainingData& data) {
  const std::string path = checkpoint_file(o.resume_dir);
  const auto run = load_checkpoint(o.resume_dir, state);
  check_resume(run, o, path);
  // Checkpoints written before token files held bytes.
  const nlohmann::json kind = run.value("data_kind", nlohmann::json("bytes"));
  if (kind != data.kind()) {
    throw InputError(path, "run.data_kind", kind.dump(), "differs from this run's \"" + data.kind() + "\"");
  }
  data.restore_state(run, path);
  return run;
}

}  // namespace oom::backend
