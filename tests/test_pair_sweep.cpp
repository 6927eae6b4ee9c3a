// The pair sweep's schedule: every pair once, each node once per round, and --pairs.
#include <gtest/gtest.h>

#include <set>
#include <utility>

#include "shardbench/bench/pair_sweep.h"
#include "shardbench/core/check.h"

namespace sb {
namespace {

// Every unordered pair exactly once; within a round no node twice.
void expect_complete(const std::vector<PairRound>& rounds, int nodes) {
  std::set<std::pair<int, int>> seen;
  for (const PairRound& r : rounds) {
    std::set<int> busy;
    for (const NodePair& p : r) {
      EXPECT_LT(p.a, p.b);
      EXPECT_GE(p.a, 0);
      EXPECT_LT(p.b, nodes);
      EXPECT_TRUE(busy.insert(p.a).second) << "node " << p.a << " twice in a round";
      EXPECT_TRUE(busy.insert(p.b).second) << "node " << p.b << " twice in a round";
      EXPECT_TRUE(seen.insert({p.a, p.b}).second) << p.a << "-" << p.b << " twice";
    }
  }
  EXPECT_EQ(int(seen.size()), nodes * (nodes - 1) / 2);
}

TEST(PairSweep, RoundRobinEvenIsNMinusOneFullRounds) {
  for (int n : {2, 4, 8, 16, 64}) {
    const auto rounds = round_robin(n);
    EXPECT_EQ(int(rounds.size()), n - 1) << n;
    for (const PairRound& r : rounds) EXPECT_EQ(int(r.size()), n / 2) << n;
    expect_complete(rounds, n);
  }
}

TEST(PairSweep, RoundRobinOddGivesEachNodeOneBye) {
  for (int n : {3, 5, 7, 33}) {
    const auto rounds = round_robin(n);
    EXPECT_EQ(int(rounds.size()), n) << n;
    std::vector<int> idle(size_t(n), 0);
    for (const PairRound& r : rounds) {
      EXPECT_EQ(int(r.size()), n / 2) << n;
      std::vector<bool> busy(size_t(n), false);
      for (const NodePair& p : r) busy[size_t(p.a)] = busy[size_t(p.b)] = true;
      for (int k = 0; k < n; ++k) idle[size_t(k)] += !busy[size_t(k)];
    }
    for (int k = 0; k < n; ++k) EXPECT_EQ(idle[size_t(k)], 1) << "node " << k << " of " << n;
    expect_complete(rounds, n);
  }
}

TEST(PairSweep, PackRoundsKeepsPairsDisjointAndInOrder) {
  const std::vector<NodePair> pairs{{0, 1}, {0, 2}, {2, 3}, {1, 3}, {0, 3}};
  const auto rounds = pack_rounds(pairs);
  ASSERT_EQ(rounds.size(), 3u);
  EXPECT_EQ(rounds[0], (PairRound{{0, 1}, {2, 3}}));
  EXPECT_EQ(rounds[1], (PairRound{{0, 2}, {1, 3}}));
  EXPECT_EQ(rounds[2], (PairRound{{0, 3}}));
}

// The rounds of a repetition as sets of pairs, ignoring their order.
std::set<std::set<std::pair<int, int>>> matchings(const std::vector<PairRound>& rounds) {
  std::set<std::set<std::pair<int, int>>> out;
  for (const PairRound& r : rounds) {
    std::set<std::pair<int, int>> m;
    for (const NodePair& p : r) m.insert({p.a, p.b});
    out.insert(m);
  }
  return out;
}

TEST(PairSweep, RepeatScheduleHasEveryPairOncePerRepetition) {
  for (int n : {2, 3, 4, 5, 8, 9, 16}) {
    const auto reps = repeat_schedule(round_robin(n), n, 6, true, 48);
    ASSERT_EQ(reps.size(), 6u) << n;
    EXPECT_EQ(reps[0], round_robin(n)) << "repetition 0 is the plain schedule";
    for (const auto& rounds : reps) {
      EXPECT_EQ(rounds.size(), round_robin(n).size()) << n;
      expect_complete(rounds, n);
    }
  }
}

TEST(PairSweep, RepeatScheduleChangesWhichPairsShareARound) {
  // From 6 nodes on there are more perfect matchings than rounds: each repetition's rounds
  // differ from the first's; with 4 the 3 rounds are the only 3 matchings (the order moves).
  for (int n : {6, 8, 16, 7}) {
    const auto reps = repeat_schedule(round_robin(n), n, 5, true, 48);
    for (size_t r = 1; r < reps.size(); ++r) EXPECT_NE(matchings(reps[r]), matchings(reps[0])) << n << " rep " << r;
  }
  const auto four = repeat_schedule(round_robin(4), 4, 5, true, 48);
  bool order_moved = false;
  for (size_t r = 1; r < four.size(); ++r) {
    EXPECT_EQ(matchings(four[r]), matchings(four[0]));
    order_moved = order_moved || four[r] != four[0];
  }
  EXPECT_TRUE(order_moved) << "with 4 nodes only the moment of each matching can change";
  // the same seed, the same schedule (every rank computes it alone); another seed, another
  EXPECT_EQ(repeat_schedule(round_robin(8), 8, 3, true, 48), repeat_schedule(round_robin(8), 8, 3, true, 48));
  EXPECT_NE(repeat_schedule(round_robin(8), 8, 3, true, 48), repeat_schedule(round_robin(8), 8, 3, true, 49));
}

TEST(PairSweep, RepeatScheduleOfGivenPairsKeepsThemAndPacksThemAgain) {
  const std::vector<NodePair> pairs{{0, 1}, {0, 2}, {2, 3}, {1, 3}, {0, 3}, {4, 5}};
  const auto reps = repeat_schedule(pack_rounds(pairs), 6, 8, false, 48);
  std::set<std::pair<int, int>> want;
  for (const NodePair& p : pairs) want.insert({p.a, p.b});
  bool moved = false;
  for (const auto& rounds : reps) {
    std::set<std::pair<int, int>> got;
    size_t count = 0;
    for (const PairRound& r : rounds) {
      std::set<int> busy;
      for (const NodePair& p : r) {
        EXPECT_TRUE(busy.insert(p.a).second && busy.insert(p.b).second) << "a node twice in a round";
        got.insert({p.a, p.b});
        ++count;
      }
    }
    EXPECT_EQ(got, want);
    EXPECT_EQ(count, pairs.size());
    moved = moved || matchings(rounds) != matchings(reps[0]);
  }
  EXPECT_TRUE(moved);
}

TEST(PairSweep, ParsePairsByHostName) {
  const std::vector<std::string> hosts{"node1", "node2", "gpu-a01", "node4"};
  const auto pairs = parse_pairs("node2:node4,gpu-a01:node1", hosts);
  ASSERT_EQ(pairs.size(), 2u);
  EXPECT_EQ(pairs[0], (NodePair{1, 3}));
  EXPECT_EQ(pairs[1], (NodePair{0, 2}));  // ordered: smaller index first
}

TEST(PairSweep, ParsePairsRefusesInOneLine) {
  const std::vector<std::string> hosts{"node1", "node2", "node3"};
  auto message = [&](const std::string& list) {
    try {
      parse_pairs(list, hosts);
    } catch (const UsageError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_EQ(message("node1:node9"), "--pairs 'node1:node9': 'node9' is not a node of this run (its nodes: node1, node2, node3)");
  EXPECT_EQ(message("node1:node1"), "--pairs 'node1:node1' pairs a node with itself");
  EXPECT_EQ(message("node1:node2,node2:node1"), "--pairs 'node2:node1' is given twice");
  EXPECT_EQ(message("node1-node2"), "--pairs 'node1-node2' is not allowed (pairs of host names, A:B, separated by commas)");
  EXPECT_EQ(message("node1:node2,"), "--pairs '' is not allowed (pairs of host names, A:B, separated by commas)");
  EXPECT_EQ(message(""), "--pairs '' is not allowed (pairs of host names, A:B, separated by commas)");
}

}  // namespace
}  // namespace sb
