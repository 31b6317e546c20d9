// FailureWatch: how the ranks of a torchrun job learn within seconds that one of them failed, and
// stop with one line naming it, instead of each waiting out the Communicator's timeout in its next
// collective and naming only the collective.
//
// Every rank runs one watcher thread with its own connection to the job's c10d TCPStore (rank 0's,
// or torchrun's agent's). Its keys, under "oom/failure-watch/RUN/" (RUN: the run id and torchrun's
// restart count, so a restarted attempt starts clean):
//   node/R    rank R's node (GROUP_RANK), set when its watch starts
//   beat/R    a counter rank R's watcher raises every kBeatPeriod: its heartbeat
//   failure   the job's first failure, {"rank", "node", "reason", "by"} as JSON (compareSet: the
//             first wins; "by": the rank that wrote it, which for a silent rank is not the rank)
//   stopped   how many ranks have stopped after the failure (a silent rank counted by its publisher)
//   done      how many ranks finished their run; done/R: rank R did
// A rank whose own work throws (anything but a PeerError: a bad --data path, a checkpoint its node
// lacks, a full disk) publishes the first line of its error, and its own stderr shows the error. A
// rank whose rendezvous or collective fails (PeerError) waits up to kCauseWait for the cause: its
// watcher then also reads every rank's heartbeat, and publishes a rank whose beat has not moved for
// kSilence (killed by a signal, or its node is down) as the failure; if no cause turns up, the rank
// publishes its PeerError. Without a failure, each watcher reads the heartbeat of the next rank
// (R + 1 mod P) and publishes it after kUnpromptedSilence: a rank stopped or cut off while its peers
// wait in a collective that does not notice (NCCL; a network partition keeps sockets open). Every
// watcher reads `failure` every kBeatPeriod; finding another rank's, it writes one line,
// "error: rank R (node N) failed: REASON", to stderr, counts itself in `stopped` and ends the
// process with _exit(1) (its main thread may be blocked in a collective for up to the timeout). The rank that serves the store (rank 0 without torchrun's agent store; under it, node 0's
// ranks, whose agent stops the store once one of them exits) stays up until every rank stopped
// (at most kLinger) so that the others can still read the failure, and at a
// normal end until every rank is done (at most the timeout). When the store stops answering, the
// rank that served it is named as the failed one.
//
// Costs: per rank and kBeatPeriod, three store requests (beat, failure check, the next rank's
// beat), and after a PeerError one per rank (the heartbeats). Only train_torchrun_rank
// (rank_train.cc) uses it: under `oom train --ranks P` the parent supervises its children
// (launcher.h).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <torch/csrc/distributed/c10d/Store.hpp>

namespace oom::backend::dist {

struct FailureWatchOptions {
  int rank = 0;
  int world_size = 1;
  int node = 0;                 // GROUP_RANK
  std::string master_addr;      // the store: TCPStore at master_addr:master_port
  int master_port = 0;
  bool serves_store = false;    // this process serves the store (lives until the others read it)
  int store_rank = 0;           // the rank whose process serves the store; -1: torchrun's agent
  std::string run;              // a name of this attempt of the job (key prefix)
  double timeout_s = 120.0;     // the Communicator's: the most a normal end waits for the others
};

// A failure as the store keeps it (one JSON object).
struct RankFailure {
  int rank = -1;  // -1: the store itself (torchrun's agent) stopped answering
  int node = -1;
  std::string reason;  // one line
  int by = -1;         // the rank that published it
};

// The line every other rank prints for `f`: "rank R (node N) failed: REASON".
std::string failure_line(const RankFailure& f);

class FailureWatch {
 public:
  static constexpr std::chrono::milliseconds kBeatPeriod{500};
  // A heartbeat that has not moved for 6 periods after a collective failed: the rank is gone (its
  // watcher thread does nothing else but beat, so a live rank misses at most a period or two).
  static constexpr std::chrono::milliseconds kSilence{3000};
  // With no failure seen: 20 periods of silence from the next rank. Longer than kSilence, since
  // nothing else says that a rank is gone; far below the collective timeout (120 s by default).
  static constexpr std::chrono::milliseconds kUnpromptedSilence{10000};
  // How long a rank whose collective failed waits for the watchers to find the cause: the silence,
  // and as long again for the slowest watcher to see it and for the failed rank's publisher.
  static constexpr std::chrono::milliseconds kCauseWait{2 * kSilence + 4 * kBeatPeriod};
  // How long the process serving the store waits, after a failure, for the others to have read it.
  static constexpr std::chrono::milliseconds kLinger{5000};

  // Connects to the store (a client of its own) and starts the watcher. Throws PeerError when the
  // store does not answer within options.timeout_s.
  explicit FailureWatch(const FailureWatchOptions& options);
  ~FailureWatch();  // stops the watcher
  FailureWatch(const FailureWatch&) = delete;
  FailureWatch& operator=(const FailureWatch&) = delete;

  // Called by the rank's main thread in the handler of `error`, before it rethrows it: publishes
  // the failure as the header says (waiting for the cause first when `error` is a PeerError; the
  // watcher may end the process meanwhile) and, serving the store, stays until the others read it.
  void on_failure(const std::exception& error);
  // The run ended normally: stops the watcher and counts this rank done; the process serving the
  // store waits until every rank is done or a failure is published.
  void finish();

 private:
  std::string key(const std::string& name) const;
  void loop();
  // Beats, and finds the failure to report (another rank's; after a PeerError also a silent rank,
  // which it publishes). Throws when the store does not answer.
  bool poll(RankFailure& found);
  bool find_silent(RankFailure& found, bool suspicious);
  [[noreturn]] void report_and_exit(const RankFailure& f);
  void stop_watcher();
  void publish(const RankFailure& f);  // compareSet: a failure already there stays
  void count_stopped(int ranks);
  void linger();

  FailureWatchOptions o_;
  c10::intrusive_ptr<c10d::Store> store_;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::atomic<bool> suspicious_{false};
  std::vector<std::int64_t> last_beat_;  // watcher thread only
  std::vector<std::chrono::steady_clock::time_point> last_change_;
};

}  // namespace oom::backend::dist
