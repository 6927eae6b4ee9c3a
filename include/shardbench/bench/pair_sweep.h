// collective_perf --pattern pairs: every pair of nodes, measured on its own link.
// A round-robin schedule (the circle method: N−1 rounds of N/2 concurrent pairs, a bye
// per round for odd N, as SuperBench's ib-traffic), each pair exchanging in both directions
// at once (nccl-tests' sendrecv convention: busbw = algbw = size / time per direction), at
// each size of -b..-e and at 8 bytes for latency; then each node's own all-reduce inside
// the node. One rank per node, or with --pair-ranks matched local rank i of one node with
// local rank i of the other (one NIC per GPU). The whole schedule runs --repeat times, the
// nodes relabelled each time (a seeded permutation), so that a slow moment of the machine
// falls on other pairs in each repetition: a pair's repetitions are its independent samples.
// analysis/diagnose.py reads the result.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace sb {

struct NodePair {
  int a = 0, b = 0;  // node indices (NodeMap), a != b
  bool operator==(const NodePair& o) const { return a == o.a && b == o.b; }
};
using PairRound = std::vector<NodePair>;

// Every unordered pair of `nodes` nodes exactly once, each node at most once per round:
// nodes − 1 rounds for even `nodes`, `nodes` rounds (one node idle in each) for odd.
std::vector<PairRound> round_robin(int nodes);
// Given pairs (a re-test), greedily into rounds of disjoint pairs, in the given order.
std::vector<PairRound> pack_rounds(const std::vector<NodePair>& pairs);
// The schedule of each of `repeat` repetitions. Repetition 0 is `base`; each later one
// relabels the nodes of a complete round robin (`full`) by a permutation drawn from `seed`
// and the repetition, and shuffles the order of the rounds, so other pairs share a round
// (with 4 nodes the 3 rounds are the only 3 perfect matchings: only their order changes);
// otherwise (--pairs, --rounds) it shuffles the pairs and packs them again (pack_rounds).
// Every repetition holds exactly the pairs of `base`.
std::vector<std::vector<PairRound>> repeat_schedule(const std::vector<PairRound>& base, int nodes, int repeat,
                                                    bool full, uint64_t seed);
// --pairs "node1:node3,node2:node4" (host names) into node indices; throws UsageError
// naming the first bad entry (unknown host, a node with itself, a pair given twice).
std::vector<NodePair> parse_pairs(const std::string& list, const std::vector<std::string>& hosts);

struct PairSweepOptions {
  std::vector<std::string> argv;  // for the provenance
  std::string backend = "cpu", out;
  bool overwrite = false;
  std::vector<int64_t> sizes;      // bytes, from -b -e -f -i
  int64_t latency_bytes = 8;
  int iters = 20, warmup = 5, check = 1;
  bool matched = false;            // --pair-ranks matched: every local rank pairs with its match
  std::string pairs;               // --pairs: only these (a re-test); empty: every pair
  int rounds = 0;                  // --rounds K: the first K rounds of the schedule (0: all); each
                                   // round pairs every node once, so K rounds give each node K pairs
  int repeat = 5;                  // --repeat R: the whole schedule R times (diagnose's samples)
  int inject_error = -1;           // self-test of the data check: this rank corrupts what it received
};

// The sweep, on every rank of MPI_COMM_WORLD; the exit code.
int run_pair_sweep(const PairSweepOptions& o, int rank, int world);

}  // namespace sb
