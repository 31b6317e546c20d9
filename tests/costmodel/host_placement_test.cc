// costmodel/host_placement.h: a socket keeps what fits in its DRAM and spills the rest to its
// node's other sockets; a node runs out of host memory only when its sockets are full in all.
#include "costmodel/host_placement.h"

#include <gtest/gtest.h>

#include <numeric>

namespace oom {
namespace {

Bytes sum(const std::vector<Bytes>& v) { return std::accumulate(v.begin(), v.end(), Bytes{0}); }

TEST(HostPlacement, AStateThatFitsItsSocketStaysLocal) {
  const HostPlacement p = place_host_memory({700 * kGiB, 300 * kGiB}, {1008 * kGiB, 1008 * kGiB}, 2);
  EXPECT_TRUE(p.fits());
  EXPECT_EQ(p.local, (std::vector<Bytes>{700 * kGiB, 300 * kGiB}));
  EXPECT_EQ(p.spilled, (std::vector<Bytes>{0, 0}));
  EXPECT_EQ(p.resident, p.local);
  EXPECT_EQ(p.remote_fraction(0), 0.0);
  EXPECT_EQ(spilled_fraction(700 * kGiB, 1008 * kGiB), 0.0);
}

TEST(HostPlacement, AStateBeyondItsSocketSpillsTheExcessToTheOtherSocket) {
  // Four ranks on socket 0 ask for 1,545 GiB; socket 1's ranks (none) ask for 0.
  const HostPlacement p = place_host_memory({1545 * kGiB, 0}, {1008 * kGiB, 1008 * kGiB}, 2);
  EXPECT_TRUE(p.fits());
  EXPECT_EQ(p.local[0], 1008 * kGiB);
  EXPECT_EQ(p.spilled[0], 537 * kGiB);
  EXPECT_EQ(p.resident, (std::vector<Bytes>{1008 * kGiB, 537 * kGiB}));
  EXPECT_DOUBLE_EQ(p.remote_fraction(0), 537.0 / 1545.0);
  EXPECT_DOUBLE_EQ(spilled_fraction(1545 * kGiB, 1008 * kGiB), p.remote_fraction(0));
  // Only as much as the other socket has free: its own ranks come first.
  const HostPlacement q = place_host_memory({1545 * kGiB, 900 * kGiB}, {1008 * kGiB, 1008 * kGiB}, 2);
  EXPECT_EQ(q.spilled[0], 108 * kGiB);
  EXPECT_EQ(q.unplaced, 429 * kGiB);
  EXPECT_FALSE(q.fits());
}

TEST(HostPlacement, WhatFitsIsTheNodesTotalWhereverTheRanksSit) {
  const std::vector<Bytes> dram{1008 * kGiB, 1008 * kGiB};
  // The same state on one socket or spread over both: the same verdict, the same bytes resident.
  for (const std::vector<Bytes>& demand : {std::vector<Bytes>{2000 * kGiB, 0}, std::vector<Bytes>{1000 * kGiB, 1000 * kGiB}}) {
    const HostPlacement p = place_host_memory(demand, dram, 2);
    EXPECT_TRUE(p.fits());
    EXPECT_EQ(sum(p.resident), 2000 * kGiB);
    EXPECT_FALSE(host_overflow(demand, dram, 2).has_value());
  }
  for (const std::vector<Bytes>& demand : {std::vector<Bytes>{2058 * kGiB, 0}, std::vector<Bytes>{1029 * kGiB, 1029 * kGiB}}) {
    EXPECT_FALSE(place_host_memory(demand, dram, 2).fits());
    const auto over = host_overflow(demand, dram, 2);
    ASSERT_TRUE(over.has_value());
    EXPECT_EQ(over->node, 0);
    EXPECT_EQ(over->needed, 2058 * kGiB);
    EXPECT_EQ(over->capacity, 2016 * kGiB);
  }
}

TEST(HostPlacement, MemoryNeverSpillsAcrossNodes) {
  // Two nodes of two sockets: node 0's socket 0 is over, node 1 has room it cannot lend.
  const std::vector<Bytes> dram(4, 100 * kGiB);
  const HostPlacement p = place_host_memory({250 * kGiB, 0, 0, 0}, dram, 2);
  EXPECT_EQ(p.spilled[0], 100 * kGiB);
  EXPECT_EQ(p.unplaced, 50 * kGiB);
  EXPECT_EQ(p.resident, (std::vector<Bytes>{100 * kGiB, 100 * kGiB, 0, 0}));
  const auto over = host_overflow({250 * kGiB, 0, 0, 0}, dram, 2);
  ASSERT_TRUE(over.has_value());
  EXPECT_EQ(over->node, 0);
  EXPECT_FALSE(host_overflow({0, 0, 150 * kGiB, 50 * kGiB}, dram, 2).has_value());
}

}  // namespace
}  // namespace oom
