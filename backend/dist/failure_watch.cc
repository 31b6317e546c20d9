#include "backend/dist/failure_watch.h"

#include <unistd.h>

#include <cstdio>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "backend/dist/process_group.h"

namespace oom::backend::dist {
namespace {

std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }

std::string to_json(const RankFailure& f) {
  return nlohmann::json{{"rank", f.rank}, {"node", f.node}, {"reason", f.reason}, {"by", f.by}}.dump();
}

// What another process wrote under `failure`; a value that is not ours is reported as it is.
RankFailure from_json(const std::string& text) {
  const auto j = nlohmann::json::parse(text, nullptr, false);
  RankFailure f;
  if (j.is_discarded() || !j.is_object()) {
    f.reason = first_line(text);
    return f;
  }
  f.rank = j.value("rank", -1);
  f.node = j.value("node", -1);
  f.reason = first_line(j.value("reason", std::string()));
  f.by = j.value("by", -1);
  return f;
}

}  // namespace

std::string failure_line(const RankFailure& f) {
  if (f.rank < 0) return "the job's store failed: " + f.reason;
  if (f.node < 0) return fmt::format("rank {} failed: {}", f.rank, f.reason);
  return fmt::format("rank {} (node {}) failed: {}", f.rank, f.node, f.reason);
}

FailureWatch::FailureWatch(const FailureWatchOptions& options)
    : o_(options),
      last_beat_(static_cast<std::size_t>(options.world_size), -1),
      last_change_(static_cast<std::size_t>(options.world_size)) {
  const auto timeout = std::chrono::milliseconds(static_cast<std::int64_t>(o_.timeout_s * 1000.0));
  try {
    c10d::TCPStoreOptions to;
    to.port = static_cast<std::uint16_t>(o_.master_port);
    to.isServer = false;
    to.waitWorkers = false;  // not one of the workers the serving rank counts
    to.timeout = timeout;
    store_ = c10::make_intrusive<c10d::TCPStore>(o_.master_addr, to);
    store_->setTimeout(timeout);
    store_->set(key("node/" + std::to_string(o_.rank)), std::to_string(o_.node));
    store_->add(key("beat/" + std::to_string(o_.rank)), 1);
  } catch (const std::exception& e) {
    throw PeerError(fmt::format("rank {}: the store at {}:{} does not answer: {}", o_.rank, o_.master_addr, o_.master_port,
                                first_line(e.what())));
  }
  thread_ = std::thread([this] { loop(); });
}

FailureWatch::~FailureWatch() { stop_watcher(); }

std::string FailureWatch::key(const std::string& name) const { return "oom/failure-watch/" + o_.run + "/" + name; }

void FailureWatch::loop() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (stop_) return;
    }
    RankFailure found;
    bool report = false;
    try {
      report = poll(found);
    } catch (const std::exception& e) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        if (stop_) return;
      }
      // The store is gone: the process that served it ended.
      found.rank = o_.store_rank;
      found.node = o_.store_rank == 0 ? 0 : -1;
      found.reason = fmt::format("the store it served at {}:{} stopped answering ({})", o_.master_addr, o_.master_port,
                                 first_line(e.what()));
      if (o_.store_rank < 0) found.reason = fmt::format("torchrun's agent at {}:{} stopped answering ({})", o_.master_addr,
                                                        o_.master_port, first_line(e.what()));
      report_and_exit(found);
    }
    if (report) report_and_exit(found);
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, kBeatPeriod, [this] { return stop_; });
  }
}

bool FailureWatch::poll(RankFailure& found) {
  store_->add(key("beat/" + std::to_string(o_.rank)), 1);
  if (store_->check({key("failure")})) {
    found = from_json(store_->get_to_str(key("failure")));
    if (found.rank != o_.rank) return true;
  }
  return find_silent(found, suspicious_.load());
}

bool FailureWatch::find_silent(RankFailure& found, bool suspicious) {
  const auto now = std::chrono::steady_clock::now();
  const auto silence = suspicious ? kSilence : kUnpromptedSilence;
  const int next = (o_.rank + 1) % o_.world_size;
  for (int k = suspicious ? 0 : next; k < (suspicious ? o_.world_size : next + 1); ++k) {
    if (k == o_.rank) continue;
    const auto i = static_cast<std::size_t>(k);
    const std::int64_t beat = store_->add(key("beat/" + std::to_string(k)), 0);
    if (beat != last_beat_[i]) {
      last_beat_[i] = beat;
      last_change_[i] = now;
      continue;
    }
    if (now - last_change_[i] < silence || (!suspicious && beat == 0)) continue;
    if (store_->add(key("done/" + std::to_string(k)), 0) > 0) continue;  // it finished its run
    RankFailure silent;
    silent.rank = k;
    silent.by = o_.rank;
    const std::string node_key = key("node/" + std::to_string(k));
    if (store_->check({node_key})) silent.node = std::stoi(store_->get_to_str(node_key));
    const double s = std::chrono::duration<double>(silence).count();
    silent.reason = beat == 0 ? fmt::format("never joined the job (no heartbeat {:.1f} s after a rendezvous or collective failed)", s)
                    : suspicious ? fmt::format("stopped answering: no heartbeat for {:.1f} s after a collective failed "
                                               "(killed by a signal, or its node is down)", s)
                                 : fmt::format("stopped answering: no heartbeat for {:.1f} s (stopped, killed, or its node is cut off)", s);
    publish(silent);
    found = from_json(store_->get_to_str(key("failure")));
    if (found.by == o_.rank) count_stopped(1);  // this watcher's record won: count the silent rank
    return found.rank != o_.rank;
  }
  return false;
}

void FailureWatch::report_and_exit(const RankFailure& f) {
  const std::string line = "error: " + failure_line(f) + "\n";
  std::fputs(line.c_str(), stderr);
  std::fflush(stderr);
  try {
    count_stopped(1);
    linger();
  } catch (const std::exception&) {
  }
  ::_exit(1);
}

void FailureWatch::stop_watcher() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

void FailureWatch::publish(const RankFailure& f) { store_->compareSet(key("failure"), "", to_json(f)); }

void FailureWatch::count_stopped(int ranks) { store_->add(key("stopped"), ranks); }

void FailureWatch::linger() {
  // The store lives as long as the process serving it: this rank when it serves it; under
  // torchrun's agent store, node 0's agent, which stops it (and its other ranks) as soon as one of
  // its ranks exits, so node 0's ranks stay until every rank has read the failure.
  const bool keeps_store = o_.serves_store || (o_.store_rank < 0 && o_.node == 0);
  if (!keeps_store) return;
  const auto until = std::chrono::steady_clock::now() + kLinger;
  while (std::chrono::steady_clock::now() < until && store_->add(key("stopped"), 0) < o_.world_size) {
    std::this_thread::sleep_for(kBeatPeriod / 5);
  }
}

void FailureWatch::on_failure(const std::exception& error) {
  if (dynamic_cast<const PeerError*>(&error) != nullptr) {
    // A peer's failure, most likely: the watcher ends the process once it finds it.
    suspicious_ = true;
    std::this_thread::sleep_for(kCauseWait);
  }
  stop_watcher();
  try {
    RankFailure other;
    if (store_->check({key("failure")})) {
      other = from_json(store_->get_to_str(key("failure")));
      if (other.rank != o_.rank && dynamic_cast<const PeerError*>(&error) != nullptr) report_and_exit(other);
    }
    publish({o_.rank, o_.node, first_line(error.what()), o_.rank});
    count_stopped(1);
    linger();
  } catch (const std::exception&) {
    // The store is gone too: the caller's own error is all there is to say.
  }
}

void FailureWatch::finish() {
  stop_watcher();
  try {
    store_->add(key("done/" + std::to_string(o_.rank)), 1);
    store_->add(key("done"), 1);
    if (!o_.serves_store) return;
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(static_cast<std::int64_t>(o_.timeout_s * 1000.0));
    while (std::chrono::steady_clock::now() < until && store_->add(key("done"), 0) < o_.world_size &&
           !store_->check({key("failure")})) {
      std::this_thread::sleep_for(kBeatPeriod / 5);
    }
  } catch (const std::exception&) {
  }
}

}  // namespace oom::backend::dist
