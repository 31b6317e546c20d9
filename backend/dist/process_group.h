// Communicator: the collectives the multi-rank trainers need (backend/dist/rank_group.h), over a c10d
// process group.
//
// One Communicator per rank process. Ranks rendezvous through a c10d store: a FileStore (a file
// every rank can open; `oom train --ranks` puts it in the job folder) or a TCPStore served by rank 0
// at master_addr:master_port (torchrun's MASTER_ADDR/MASTER_PORT, across nodes). The group is a
// c10d::Backend of the communicator's device: Gloo for CPU tensors, NCCL for CUDA tensors (builds
// with OOM_BACKEND_NCCL; each rank then uses the GPU `cuda_device`). Every collective takes and
// returns tensors of that device; count exchanges are moved there and back.
//
// Every store access and every collective has a timeout (`timeout_s`): a peer that died or hangs
// makes the call throw PeerError naming the collective, instead of blocking forever (under
// torchrun, FailureWatch (failure_watch.h) names the rank that failed well before the timeout).
// Collectives are blocking and must be called by all ranks in the same order with matching shapes
// (all-to-all: the receive counts must equal the peers' send counts; exchange them first with
// all_gather_counts). Counts and splits are in rows (dimension 0). Not thread-safe: one thread per
// Communicator issues the calls.
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "backend/dist/rank_group.h"

namespace oom::backend::dist {

// A call that waits on the other ranks (the rendezvous, a collective) failed or timed out: a peer
// died, stalled or left, or the connection to it broke. What else a rank throws is its own failure.
class PeerError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct CommOptions {
  int rank = 0;
  int world_size = 1;
  std::string store_path;       // FileStore file shared by all ranks (created by the first to open it)
  std::string master_addr;      // with store_path empty: TCPStore at master_addr:master_port (rank 0 serves)
  int master_port = 0;
  // With a master address: whether rank 0 serves the store (false when torchrun's agent already
  // does: TORCHELASTIC_USE_AGENT_STORE=True).
  bool rank0_serves_store = true;
  double timeout_s = 120.0;     // store waits and every collective
  std::string host = "127.0.0.1";  // address Gloo binds to
  bool cuda = false;            // NCCL on CUDA tensors (only in builds with OOM_BACKEND_NCCL)
  int cuda_device = 0;          // with cuda: this rank's GPU (torchrun's LOCAL_RANK)
  // The store the caller already connected (connect_store); null: the Communicator connects one.
  c10::intrusive_ptr<c10d::Store> store;
};

// Connects this rank to the job's store as `options` say (FileStore at store_path, else the
// TCPStore at master_addr:master_port, served by rank 0 unless torchrun's agent serves it; a
// serving rank 0 waits until every rank connected). Throws PeerError when that fails within
// timeout_s, InputError for bad options.
c10::intrusive_ptr<c10d::Store> connect_store(const CommOptions& options);

class Communicator : public RankGroup {
 public:
  // Rendezvous with the other ranks (through options.store, else connect_store(options)). Throws
  // InputError for a bad rank/world size, and PeerError when the peers do not show up within timeout_s.
  explicit Communicator(const CommOptions& options);
  ~Communicator() override;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  // "gloo" or "nccl".
  const std::string& backend() const { return backend_; }
  // The device whose tensors the collectives take: CPU for Gloo, cuda:cuda_device for NCCL.
  at::Device device() const { return device_; }

  // In place: t ← Σ over ranks of t (contiguous).
  void all_reduce_sum(at::Tensor& t) override;
  // [size × t.numel()] with rank r's t in row r; every rank passes the same numel.
  at::Tensor all_gather(const at::Tensor& t);
  // Every rank's int64 count vector (equal lengths) as a [size, n] int64 CPU tensor.
  at::Tensor all_gather_counts(const std::vector<std::int64_t>& counts) override;
  // Uneven all-to-all over rows: input rows [Σ send_rows, ...] with the first send_rows[0] rows going
  // to rank 0, and so on; returns [Σ recv_rows, ...] ordered by source rank.
  at::Tensor all_to_all(const at::Tensor& input, const std::vector<std::int64_t>& send_rows,
                        const std::vector<std::int64_t>& recv_rows) override;
  void barrier() override;
  // A c10d group of the members on this group's store under the prefix `tag` (c10d keys each
  // group's rendezvous by its store: sub-groups need their own prefix).
  std::unique_ptr<RankGroup> sub_group(const std::vector<int>& members, const std::string& tag) override;

 private:
  struct Impl;
  Communicator(std::unique_ptr<Impl> impl, int rank, int size, std::string backend, at::Device device);
  std::unique_ptr<Impl> impl_;
  int rank_ = 0;
  int size_ = 1;
  std::string backend_;
  at::Device device_{at::kCPU};
};

}  // namespace oom::backend::dist
