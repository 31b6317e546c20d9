#include "backend/measure/stage_recorder.h"

#include <algorithm>
#include <fstream>

#include <unistd.h>

#include <ATen/record_function.h>

#include "backend/measure/host_syncs.h"

namespace oom::backend {

namespace {

thread_local std::int64_t operators_dispatched = 0;  // ATen calls this thread made while counting

std::unique_ptr<at::ObserverContext> count_operator(const at::RecordFunction&) {
  ++operators_dispatched;
  return nullptr;
}

}  // namespace

Bytes process_rss_bytes() {
  std::ifstream f("/proc/self/statm");
  long long pages_total = 0, pages_resident = 0;
  if (!(f >> pages_total >> pages_resident)) return 0;
  return static_cast<Bytes>(pages_resident) * static_cast<Bytes>(sysconf(_SC_PAGESIZE));
}

StageRecorder::~StageRecorder() { count_operators(false); }

void StageRecorder::count_operators(bool on) {
  if (on && operator_callback_ == 0) {
    operator_callback_ = at::addGlobalCallback(
        at::RecordFunctionCallback(count_operator).scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION}));
    host_syncs::count(true);
  } else if (!on && operator_callback_ != 0) {
    at::removeCallback(operator_callback_);
    operator_callback_ = 0;
    host_syncs::count(false);
  }
}

void StageRecorder::start_step(bool enabled) {
  count_operators(enabled);
  std::lock_guard<std::mutex> lock(mu_);
  enabled_ = enabled;
  stages_.clear();
  host_samples_.clear();
  device_samples_.clear();
  if (enabled_ && cb_.sync) cb_.sync();
  t0_ = Clock::now();
  syncs_at_start_ = host_syncs::on_this_thread();
  if (enabled_) {
    host_samples_.push_back({0.0, process_rss_bytes()});
    if (cb_.device_bytes) device_samples_.push_back({0.0, cb_.device_bytes()});
  }
}

double StageRecorder::now_s() { return std::chrono::duration<double>(Clock::now() - t0_).count(); }

StageRecorder::Scope::Scope(StageRecorder* r, TraceStage s)
    : r_(r), s_(std::move(s)), ops_at_start_(operators_dispatched), syncs_at_start_(host_syncs::on_this_thread()) {}

StageRecorder::Scope::Scope(Scope&& o) noexcept
    : r_(o.r_), s_(std::move(o.s_)), ops_at_start_(o.ops_at_start_), syncs_at_start_(o.syncs_at_start_) {
  o.r_ = nullptr;
}

void StageRecorder::Scope::end() {
  if (r_ == nullptr) return;
  if (r_->cb_.sync && s_.resource.rfind("gpu", 0) == 0) r_->cb_.sync();
  s_.end_s = r_->now_s();
  s_.ops = operators_dispatched - ops_at_start_;
  s_.syncs = host_syncs::on_this_thread() - syncs_at_start_;
  r_->record(std::move(s_));
  r_ = nullptr;
}

StageRecorder::Scope StageRecorder::stage(const StageKey& key, const std::string& kind, const std::string& resource,
                                          Flops flops, Bytes bytes) {
  if (!enabled_) return {};
  const bool on_gpu = resource.rfind("gpu", 0) == 0;
  if (cb_.sync && on_gpu) cb_.sync();
  if (cb_.device_mark && on_gpu) cb_.device_mark();
  TraceStage s;
  s.name = format_stage_key(key);
  s.key = key;
  s.kind = kind;
  s.resource = resource;
  s.layer = key.decoder;
  s.flops = flops;
  s.bytes = bytes;
  s.start_s = now_s();
  return Scope(this, std::move(s));
}

void StageRecorder::record(TraceStage s) {
  const Bytes rss = process_rss_bytes();
  const Bytes dev = cb_.device_bytes ? cb_.device_bytes() : 0;
  const bool marked = cb_.device_mark && cb_.device_peak && s.resource.rfind("gpu", 0) == 0;
  const Bytes stage_peak = marked ? cb_.device_peak() : 0;
  std::lock_guard<std::mutex> lock(mu_);
  s.id = static_cast<std::int64_t>(stages_.size());
  host_samples_.push_back({s.end_s, rss});
  if (marked) device_samples_.push_back({s.end_s, std::max(stage_peak, dev)});
  if (cb_.device_bytes) device_samples_.push_back({s.end_s, dev});
  stages_.push_back(std::move(s));
}

Trace StageRecorder::finish() {
  const std::int64_t syncs = host_syncs::on_this_thread() - syncs_at_start_;
  count_operators(false);
  std::lock_guard<std::mutex> lock(mu_);
  Trace t;
  t.engine = "torch";
  t.host_syncs = syncs;
  t.stages = stages_;
  auto timeline = [](const std::string& device, std::vector<MemorySample> samples) {
    std::stable_sort(samples.begin(), samples.end(), [](const auto& a, const auto& b) { return a.time_s < b.time_s; });
    MemoryTimeline m{device, std::move(samples), 0};
    for (const auto& s : m.samples) m.peak_bytes = std::max(m.peak_bytes, s.bytes);
    return m;
  };
  if (cb_.device_bytes) {
    auto device = timeline(cb_.device_name, device_samples_);
    // Samples are taken at stage ends; a stage's own transient peak is the allocator's to say.
    if (cb_.device_peak) device.peak_bytes = std::max(device.peak_bytes, cb_.device_peak());
    t.memory.push_back(std::move(device));
    t.gpu_peak_bytes.push_back(t.memory.back().peak_bytes);
  }
  t.memory.push_back(timeline(cb_.host_name, host_samples_));
  t.numa_peak_bytes.push_back(t.memory.back().peak_bytes);
  finalize_trace(t);
  return t;
}

}  // namespace oom::backend
