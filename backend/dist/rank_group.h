// RankGroup: the collectives a rank's share of a multi-rank StepGraph needs (backend/runner/graph_runner.h),
// without naming the process group that provides them. backend/dist/process_group.h's
// Communicator (Gloo or NCCL over c10d) is the implementation; the interface keeps c10d out of the
// single-rank backend. Counts and splits are in rows (dimension 0); every collective is blocking
// and must be called by every rank in the same order. Not thread-safe: one thread issues the calls.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/ATen.h>

namespace oom::backend {

class RankGroup {
 public:
  virtual ~RankGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // In place: t ← Σ over ranks of t (contiguous).
  virtual void all_reduce_sum(at::Tensor& t) = 0;
  // Every rank's int64 count vector (equal lengths) as a [size, n] int64 CPU tensor.
  virtual at::Tensor all_gather_counts(const std::vector<std::int64_t>& counts) = 0;
  // Uneven all-to-all over rows: the first send_rows[0] rows go to rank 0, and so on; returns
  // [Σ recv_rows, ...] ordered by source rank.
  virtual at::Tensor all_to_all(const at::Tensor& input, const std::vector<std::int64_t>& send_rows,
                                const std::vector<std::int64_t>& recv_rows) = 0;
  virtual void barrier() = 0;
  // The group of `members` (ranks of this group, ascending, this rank among them), ranked by their
  // order there; `tag` tells it from the other sub-groups (its members pass the same one). Every
  // member calls it, in the same order as its other sub-groups.
  virtual std::unique_ptr<RankGroup> sub_group(const std::vector<int>& members, const std::string& tag) = 0;
};

}  // namespace oom::backend
