// collective_perf --pattern pairs (pair_sweep.h): the node-pair schedule, the exchange of
// each pair, each node's own all-reduce, and the HDF5 of every iteration with the node-by-
// node figures.
#include "shardbench/bench/pair_sweep.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>

#include "shardbench/backend/backend.h"
#include "shardbench/core/check.h"
#include "shardbench/core/format.h"
#include "shardbench/core/nodes.h"
#include "shardbench/run/environment.h"
#include "shardbench/run/provenance.h"
#include "shardbench/trace/h5.h"
#include "shardbench/trace/trace.h"

namespace sb {

std::vector<PairRound> round_robin(int nodes) {
  // The circle method: seat m (even) players, hold the last fixed and turn the others;
  // with odd `nodes` the extra seat is the bye.
  const int m = nodes + nodes % 2;
  std::vector<PairRound> rounds;
  for (int r = 0; r + 1 < m; ++r) {
    PairRound round;
    for (int k = 0; k < m / 2; ++k) {
      const int a = k == 0 ? m - 1 : (r + k) % (m - 1);
      const int b = (r - k + (m - 1)) % (m - 1);
      if (a < nodes && b < nodes) round.push_back({std::min(a, b), std::max(a, b)});
    }
    rounds.push_back(round);
  }
  return rounds;
}

std::vector<PairRound> pack_rounds(const std::vector<NodePair>& pairs) {
  std::vector<PairRound> rounds;
  for (const NodePair& p : pairs) {
    auto fits = [&](const PairRound& r) {
      return std::none_of(r.begin(), r.end(), [&](const NodePair& q) {
        return q.a == p.a || q.a == p.b || q.b == p.a || q.b == p.b;
      });
    };
    auto it = std::find_if(rounds.begin(), rounds.end(), fits);
    if (it == rounds.end()) rounds.push_back({p});
    else it->push_back(p);
  }
  return rounds;
}

std::vector<std::vector<PairRound>> repeat_schedule(const std::vector<PairRound>& base, int nodes, int repeat,
                                                    bool full, uint64_t seed) {
  std::vector<std::vector<PairRound>> out{base};
  std::vector<NodePair> flat;
  for (const PairRound& r : base) flat.insert(flat.end(), r.begin(), r.end());
  for (int rep = 1; rep < repeat; ++rep) {
    // Fisher-Yates on mt19937_64, not std::shuffle: every rank (and every library) draws the same.
    std::mt19937_64 rng(seed * 1000003u + uint64_t(rep));
    auto shuffle = [&](auto& v) {
      for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[size_t(rng() % i)]);
    };
    std::vector<PairRound> rounds;
    if (full) {
      std::vector<int> label(static_cast<size_t>(nodes));
      for (int k = 0; k < nodes; ++k) label[size_t(k)] = k;
      shuffle(label);
      for (const PairRound& r : base) {
        PairRound round;
        for (const NodePair& p : r) {
          const int a = label[size_t(p.a)], b = label[size_t(p.b)];
          round.push_back({std::min(a, b), std::max(a, b)});
        }
        std::sort(round.begin(), round.end(), [](const NodePair& x, const NodePair& y) {
          return x.a != y.a ? x.a < y.a : x.b < y.b;
        });
        rounds.push_back(round);
      }
      shuffle(rounds);
    } else {
      std::vector<NodePair> pairs = flat;
      shuffle(pairs);
      rounds = pack_rounds(pairs);
    }
    out.push_back(rounds);
  }
  return out;
}

std::vector<NodePair> parse_pairs(const std::string& list, const std::vector<std::string>& hosts) {
  std::string known;
  for (const std::string& h : hosts) known += (known.empty() ? "" : ", ") + h;
  auto node = [&](const std::string& item, const std::string& name) {
    auto it = std::find(hosts.begin(), hosts.end(), name);
    if (it == hosts.end())
      throw UsageError("--pairs '" + item + "': '" + name + "' is not a node of this run (its nodes: " + known + ")");
    return int(it - hosts.begin());
  };
  std::vector<NodePair> out;
  size_t at = 0;
  while (at <= list.size()) {
    const size_t end = std::min(list.find(',', at), list.size());
    const std::string item = list.substr(at, end - at);
    const size_t colon = item.find(':');
    if (colon == std::string::npos || item.find(':', colon + 1) != std::string::npos)
      throw UsageError("--pairs '" + item + "' is not allowed (pairs of host names, A:B, separated by commas)");
    const int a = node(item, item.substr(0, colon)), b = node(item, item.substr(colon + 1));
    if (a == b) throw UsageError("--pairs '" + item + "' pairs a node with itself");
    const NodePair p{std::min(a, b), std::max(a, b)};
    if (std::count(out.begin(), out.end(), p)) throw UsageError("--pairs '" + item + "' is given twice");
    out.push_back(p);
    at = end + 1;
  }
  return out;
}

namespace {

constexpr int kPairSchemaVersion = 2;  // of the pair sweep's file; 2 added the repetition column
constexpr uint64_t kScheduleSeed = 48;  // the relabelling of each repetition (attribute schedule_seed)
enum Kind : int32_t { kExchange = 0, kLatency = 1, kIntraNode = 2 };
const std::vector<std::string> kKindNames{"exchange", "latency", "intra-node all-reduce"};

// Every rank's every iteration.
struct SampleRow {
  int32_t repetition, round, kind, node, peer_node, rank, peer_rank, iteration;
  int64_t size;
  double time;
};
// Rank 0: one row per repetition, node pair (or node, for kIntraNode) and size: the pair's
// iteration takes as long as its slowest rank; figures are over that repetition's iterations.
struct PairRow {
  int32_t repetition, round, kind, node_a, node_b, rank_pairs;
  int64_t size;
  double time_p50, time_min, time_max, busbw;  // busbw in GB/s: per direction for a pair
  int64_t wrong;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// The bytes every rank sends: its world rank and the index, so a receiver knows whose they are.
uint32_t word(int rank, int64_t i) { return uint32_t(rank) * 2654435761u ^ uint32_t(i * 40503 + 1); }

// What runs: the rounds of every repetition and the ranks of a node that take part.
struct Plan {
  std::vector<std::vector<PairRound>> schedule;  // [repetition][round]
  int rounds = 0, npairs = 0;                    // of one repetition
  int per = 1;                                   // ranks of each node in a pair
};

Plan plan_schedule(const PairSweepOptions& o, const NodeMap& nm) {
  const int nodes = nm.nodes();
  if (nodes < 2)
    throw UsageError("--pattern pairs needs ranks on at least 2 nodes; this run has 1 (" + nm.hosts[0] +
                     "): start it across nodes (mpirun --host, srun -N)");
  Plan plan;
  if (o.matched) {
    if (!nm.uniform())
      throw UsageError("--pair-ranks matched needs the same number of ranks on every node (this run: " +
                       std::to_string(nm.ranks_on(0)) + " on " + nm.hosts[0] + ", other counts elsewhere)");
    plan.per = nm.ranks_on(0);
  }
  std::vector<PairRound> rounds = o.pairs.empty() ? round_robin(nodes) : pack_rounds(parse_pairs(o.pairs, nm.hosts));
  if (o.rounds > 0 && !o.pairs.empty()) throw UsageError("--rounds is not allowed with --pairs (they name the pairs)");
  if (o.rounds > int(rounds.size()))
    throw UsageError("--rounds " + std::to_string(o.rounds) + " is not allowed: " + std::to_string(nodes) +
                     " nodes have " + std::to_string(rounds.size()) + (rounds.size() == 1 ? " round" : " rounds") +
                     " of pairs");
  if (o.rounds > 0) rounds.resize(size_t(o.rounds));
  for (const PairRound& r : rounds) plan.npairs += int(r.size());
  plan.schedule = repeat_schedule(rounds, nodes, o.repeat, o.pairs.empty() && o.rounds == 0, kScheduleSeed);
  for (const auto& rep : plan.schedule) plan.rounds += int(rep.size());
  return plan;
}

struct Sweep {
  const PairSweepOptions& o;
  Backend& b;
  const NodeMap& nm;
  int rank, world, per;
  std::vector<int64_t> sizes;  // the latency's first, then -b..-e
  void* send = nullptr;
  void* recv = nullptr;
  std::vector<SampleRow> samples;
  std::vector<PairRow> rows;  // rank 0
  int64_t wrong_total = 0;

  int64_t max_bytes() const { return *std::max_element(sizes.begin(), sizes.end()); }

  // One exchange of `bytes` with the other rank of `comm` (2 ranks), timed.
  double exchange(Comm& comm, int64_t bytes) {
    const double t0 = b.now();
    b.wait(b.collective({Collective::SendRecv, send, recv, bytes / 4, DType::F32, ReduceOp::Sum, 0}, comm));
    b.synchronize();
    return b.now() - t0;
  }

  // The received words against the peer's: wrong elements (the data check, -c).
  int64_t check(Comm& comm, int64_t bytes, int peer) {
    const int64_t n = bytes / 4;
    std::vector<uint32_t> mine(static_cast<size_t>(n)), got(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) mine[size_t(i)] = word(rank, i);
    b.upload(send, mine.data(), size_t(bytes));
    exchange(comm, bytes);
    b.download(got.data(), recv, size_t(bytes));
    if (o.inject_error == rank && n) got[size_t(n / 2)] ^= 1u;
    int64_t wrong = 0;
    for (int64_t i = 0; i < n; ++i) wrong += got[size_t(i)] != word(peer, i);
    return wrong;
  }

  // Every rank's `iters` times to rank 0 (idle ranks send -1).
  std::vector<double> gather(const std::vector<double>& t) {
    std::vector<double> all(rank == 0 ? size_t(world) * t.size() : 0);
    MPI_CHECK(MPI_Gather(t.data(), int(t.size()), MPI_DOUBLE, all.data(), int(t.size()), MPI_DOUBLE, 0, MPI_COMM_WORLD));
    return all;
  }

  // Rank 0: the row of a group of ranks (a pair's rank pairs, or a node's ranks).
  PairRow summarize(const std::vector<double>& all, const std::vector<int>& ranks, int32_t rep, int32_t round,
                    Kind kind, int a, int bnode, int64_t bytes, int64_t wrong) {
    std::vector<double> per_iter(size_t(o.iters), 0.0);
    for (int r : ranks)
      for (int i = 0; i < o.iters; ++i) per_iter[size_t(i)] = std::max(per_iter[size_t(i)], all[size_t(r) * o.iters + i]);
    PairRow row{rep, round, kind, a, bnode, kind == kIntraNode ? 0 : int32_t(ranks.size() / 2), bytes,
                median(per_iter), *std::min_element(per_iter.begin(), per_iter.end()),
                *std::max_element(per_iter.begin(), per_iter.end()), 0, wrong};
    const double algbw = double(bytes) / row.time_p50 / 1e9;
    const int n = int(ranks.size());
    // A pair: every rank pair's bytes cross the link in each direction at once. A node's
    // all-reduce: nccl-tests' bus bandwidth, 2(n−1)/n.
    row.busbw = kind == kIntraNode ? algbw * 2.0 * (n - 1) / n : algbw * row.rank_pairs;
    return row;
  }

  // The ranks of a node that take part: one, or with --pair-ranks matched the first `per`.
  std::vector<int> ranks_of(int node, int count) const {
    std::vector<int> out;
    for (int r = 0; r < world && int(out.size()) < count; ++r)
      if (nm.node_of[size_t(r)] == node) out.push_back(r);
    return out;
  }

  // One round of one repetition: its pairs at once, every size; rank 0 keeps a row per pair.
  void run_round(int rep, int r, const PairRound& round) {
    const int my_local = nm.local_rank();
    int color = MPI_UNDEFINED, peer = -1, peer_node = -1;
    for (size_t k = 0; k < round.size() && my_local < per; ++k)
      if (round[k].a == nm.node() || round[k].b == nm.node()) {
        color = int(k) * per + my_local;
        peer_node = round[k].a == nm.node() ? round[k].b : round[k].a;
        peer = ranks_of(peer_node, per)[size_t(my_local)];
      }
    MPI_Comm pc = MPI_COMM_NULL;
    MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, color, rank, &pc));
    std::unique_ptr<Comm> comm = pc == MPI_COMM_NULL ? nullptr : b.make_comm(pc);
    for (size_t z = 0; z < sizes.size(); ++z) {
      const int64_t bytes = sizes[z];
      const Kind kind = z == 0 ? kLatency : kExchange;
      int64_t wrong = 0;
      for (int c = 0; c < o.check && comm; ++c) wrong += check(*comm, bytes, peer);
      std::vector<double> t(size_t(o.iters), -1.0);
      for (int i = 0; i < o.warmup && comm; ++i) exchange(*comm, bytes);
      MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));  // the round's pairs start each size together
      for (int i = 0; i < o.iters && comm; ++i) {
        // Both sides' clocks start together: back to back, the side done first (its send left
        // in the socket buffer) timed its peer's lag as well; healthy emulated pairs read 22 or
        // 31-48 ms for 1 MiB by which side was ahead, a pair's median +40 % for a whole job.
        MPI_CHECK(MPI_Barrier(pc));
        t[size_t(i)] = exchange(*comm, bytes);
      }
      for (int i = 0; i < o.iters && comm; ++i)
        samples.push_back({rep, r, kind, nm.node(), peer_node, rank, peer, i, bytes, t[size_t(i)]});
      const std::vector<double> all = gather(t);
      std::vector<int64_t> wrongs(rank == 0 ? size_t(world) : 0);
      MPI_CHECK(MPI_Gather(&wrong, 1, MPI_INT64_T, wrongs.data(), 1, MPI_INT64_T, 0, MPI_COMM_WORLD));
      if (rank != 0) continue;
      for (const NodePair& p : round) {
        std::vector<int> ranks = ranks_of(p.a, per), rb = ranks_of(p.b, per);
        ranks.insert(ranks.end(), rb.begin(), rb.end());
        int64_t w = 0;
        for (int q : ranks) w += wrongs[size_t(q)];
        wrong_total += w;
        rows.push_back(summarize(all, ranks, rep, r, kind, p.a, p.b, bytes, w));
      }
    }
    if (comm) comm.reset();
    if (pc != MPI_COMM_NULL) MPI_CHECK(MPI_Comm_free(&pc));
  }

  // Each node's own all-reduce, every node at once: the intra-node figure beside its links.
  void intra_node() {
    if (nm.max_ranks_per_node() <= 1) return;
    MPI_Comm nc = node_comm();
    std::unique_ptr<Comm> comm = b.make_comm(nc);
    const int local = nm.local_ranks();
    for (int64_t v : o.sizes) {
      const int64_t count = v / 4 / local * local;
      if (count == 0) continue;
      const int64_t bytes = count * 4;
      std::vector<double> t(size_t(o.iters), -1.0);
      const CollectiveArgs a{Collective::AllReduce, send, recv, count, DType::F32, ReduceOp::Sum, 0};
      if (local > 1) {
        for (int i = 0; i < o.warmup; ++i) b.wait(b.collective(a, *comm));
        b.synchronize();
      }
      MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
      for (int i = 0; i < o.iters && local > 1; ++i) {
        const double t0 = b.now();
        b.wait(b.collective(a, *comm));
        b.synchronize();
        t[size_t(i)] = b.now() - t0;
        samples.push_back({0, -1, kIntraNode, nm.node(), nm.node(), rank, -1, i, bytes, t[size_t(i)]});
      }
      const std::vector<double> all = gather(t);
      for (int node = 0; rank == 0 && node < nm.nodes(); ++node)
        if (nm.ranks_on(node) > 1)
          rows.push_back(summarize(all, ranks_of(node, world), 0, -1, kIntraNode, node, node, bytes, 0));
    }
    comm.reset();
    MPI_CHECK(MPI_Comm_free(&nc));
  }
};

// Rank 0, after each round: its pairs' bandwidth at the largest size.
void print_round(const Sweep& s, int rep, int repeat, int r, int rounds, double seconds) {
  if (repeat > 1) std::printf("# repetition %d/%d, round %d/%d (%.1f s):", rep + 1, repeat, r + 1, rounds, seconds);
  else std::printf("# round %d/%d (%.1f s):", r + 1, rounds, seconds);
  for (const PairRow& row : s.rows)
    if (row.repetition == rep && row.round == r && row.kind == kExchange && row.size == s.max_bytes())
      std::printf(" %s:%s %.4g GB/s", s.nm.hosts[size_t(row.node_a)].c_str(), s.nm.hosts[size_t(row.node_b)].c_str(),
                  row.busbw);
  std::printf("\n");
  std::fflush(stdout);
}

// The node-by-node matrix at one size: the median over repetitions of each pair's figure.
void print_matrix(const std::vector<PairRow>& rows, const std::vector<std::string>& hosts, Kind kind, int64_t bytes) {
  const int n = int(hosts.size());
  std::vector<std::vector<double>> cell(size_t(n) * n);
  for (const PairRow& r : rows)
    if (r.kind == kind && r.size == bytes) {
      const double v = kind == kLatency ? r.time_p50 * 1e6 : r.busbw;
      cell[size_t(r.node_a) * n + r.node_b].push_back(v);
      cell[size_t(r.node_b) * n + r.node_a].push_back(v);
    }
  std::printf("# %s, %lld B: %s\n#%12s", kind == kLatency ? "latency" : "bus bandwidth per direction",
              (long long)bytes, kind == kLatency ? "median time of an exchange (us)" : "GB/s (median iteration)", "");
  for (const std::string& h : hosts) std::printf(" %10.10s", h.c_str());
  std::printf("\n");
  for (int i = 0; i < n; ++i) {
    std::printf("#%12.12s", hosts[size_t(i)].c_str());
    for (int j = 0; j < n; ++j) {
      const std::vector<double>& v = cell[size_t(i) * n + j];
      if (v.empty()) std::printf(" %10s", i == j ? "-" : "n/a");
      else std::printf(" %10.4g", median(v));
    }
    std::printf("\n");
  }
}

void print_report(const Sweep& s, int64_t wrong_total, double seconds) {
  print_matrix(s.rows, s.nm.hosts, kExchange, s.max_bytes());
  print_matrix(s.rows, s.nm.hosts, kLatency, s.o.latency_bytes);
  for (const PairRow& row : s.rows)
    if (row.kind == kIntraNode && row.size == s.max_bytes())
      std::printf("# %s: all-reduce of its %d ranks, %lld B: busbw %.4g GB/s\n", s.nm.hosts[size_t(row.node_a)].c_str(),
                  s.nm.ranks_on(row.node_a), (long long)row.size, row.busbw);
  std::printf("# Out of bounds values : %lld %s\n# Sweep time           : %.1f s\n#\n", (long long)wrong_total,
              wrong_total ? "FAILED" : "OK", seconds);
}

void write_result(const std::string& path, const Sweep& s, const Plan& plan, int64_t wrong_total, double seconds,
                  double start, const std::string& device) {
  const PairSweepOptions& o = s.o;
  const NodeMap& nm = s.nm;
  std::string names;
  for (const std::string& h : nm.hosts) names += (names.empty() ? "" : ",") + h;
  std::string sizes_text;
  for (int64_t v : o.sizes) sizes_text += (sizes_text.empty() ? "" : ",") + std::to_string(v / 4 * 4);
  const std::string status = wrong_total ? "failed" : "ok";
  ResultFile f(path, MPI_COMM_WORLD, o.overwrite, int64_t(s.samples.size() * sizeof(SampleRow)));
  f.attributes("/", {
      Attr::integer("schema_version", kPairSchemaVersion), Attr::str("program", "collective_perf"),
      Attr::str("pattern", "pairs"), Attr::str("pairs", !o.pairs.empty() ? o.pairs : o.rounds ? "first rounds" : "all"),
      Attr::str("pair_ranks", o.matched ? "matched" : "one"), Attr::integer("ranks_per_pair", plan.per),
      Attr::str("node_names", names), Attr::integer("nodes", nm.nodes()), Attr::integer("world_size", s.world),
      Attr::integer("ranks_per_node", nm.max_ranks_per_node()),
      Attr::integer("rounds", int64_t(plan.schedule[0].size())), Attr::integer("repetitions", o.repeat),
      Attr::integer("schedule_seed", int64_t(kScheduleSeed)), Attr::integer("node_pairs", plan.npairs),
      Attr::str("sizes", sizes_text), Attr::integer("latency_bytes", o.latency_bytes),
      Attr::integer("iters", o.iters), Attr::integer("warmup", o.warmup), Attr::integer("check", o.check),
      Attr::str("backend", o.backend), Attr::str("status", status), Attr::integer("wrong_total", wrong_total),
      Attr::num("sweep_seconds", seconds), Attr::str("start_time", iso_time(start)),
      Attr::str("end_time", iso_time(wall_clock_rank0())),
  });
  write_provenance(f, collect_provenance(o.argv), hostname(), device, MPI_COMM_WORLD);
  f.table("samples", {SB_COLUMN(SampleRow, repetition, I32), SB_COLUMN(SampleRow, round, I32),
                      SB_COLUMN(SampleRow, kind, I32), SB_COLUMN(SampleRow, node, I32),
                      SB_COLUMN(SampleRow, peer_node, I32), SB_COLUMN(SampleRow, rank, I32),
                      SB_COLUMN(SampleRow, peer_rank, I32), SB_COLUMN(SampleRow, iteration, I32),
                      SB_COLUMN(SampleRow, size, I64), SB_COLUMN(SampleRow, time, F64)},
          s.samples);
  f.table("pairs", {SB_COLUMN(PairRow, repetition, I32), SB_COLUMN(PairRow, round, I32), SB_COLUMN(PairRow, kind, I32),
                    SB_COLUMN(PairRow, node_a, I32), SB_COLUMN(PairRow, node_b, I32),
                    SB_COLUMN(PairRow, rank_pairs, I32), SB_COLUMN(PairRow, size, I64),
                    SB_COLUMN(PairRow, time_p50, F64), SB_COLUMN(PairRow, time_min, F64),
                    SB_COLUMN(PairRow, time_max, F64), SB_COLUMN(PairRow, busbw, F64), SB_COLUMN(PairRow, wrong, I64)},
          s.rows);
  for (const char* table : {"samples", "pairs"}) {
    f.names_attribute(table, "kind_names", kKindNames);
    f.names_attribute(table, "node_names", nm.hosts);
  }
  f.commit();
}

}  // namespace

int run_pair_sweep(const PairSweepOptions& o, int rank, int world) {
  const NodeMap& nm = node_map();
  const Plan plan = plan_schedule(o, nm);
  const int nodes = nm.nodes();
  const std::string path = resolve_output(o.out, o.overwrite, "pair_sweep-n" + std::to_string(nodes), rank);
  const double start = wall_clock_rank0();  // the calendar time (whole seconds); durations: MPI_Wtime
  MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
  const double t_start = MPI_Wtime();

  std::unique_ptr<Backend> backend = make_backend(o.backend);
  backend->set_blocking_when_waited(true);
  Sweep s{o, *backend, nm, rank, world, plan.per, {o.latency_bytes}, nullptr, nullptr, {}, {}, 0};
  for (int64_t v : o.sizes) s.sizes.push_back(v / 4 * 4);  // whole 4-byte words
  s.send = backend->alloc(size_t(s.max_bytes()), MemCategory::CommBuffers);
  s.recv = backend->alloc(size_t(s.max_bytes()), MemCategory::CommBuffers);
  const int rounds1 = int(plan.schedule[0].size());
  if (rank == 0) {
    std::printf("#\n# collective_perf --pattern pairs: %d nodes, %d pair%s in %d round%s, %d repetition%s, %d rank "
                "pair%s per node pair, backend %s (%s)\n", nodes, plan.npairs, plan.npairs == 1 ? "" : "s", rounds1,
                rounds1 == 1 ? "" : "s", o.repeat, o.repeat == 1 ? "" : "s", plan.per, plan.per == 1 ? "" : "s",
                o.backend.c_str(), backend->device_name().c_str());
    std::printf("# each pair exchanges in both directions at once (busbw = size / time per direction); latency: "
                "%lld B; iterations %d, warm-up %d, check %d\n#\n", (long long)o.latency_bytes, o.iters, o.warmup, o.check);
    std::fflush(stdout);
  }
  for (int rep = 0; rep < o.repeat; ++rep)
    for (size_t r = 0; r < plan.schedule[size_t(rep)].size(); ++r) {
      const double t_round = MPI_Wtime();
      s.run_round(rep, int(r), plan.schedule[size_t(rep)][r]);
      if (rank == 0) print_round(s, rep, o.repeat, int(r), int(plan.schedule[size_t(rep)].size()), MPI_Wtime() - t_round);
    }
  s.intra_node();
  backend->release(s.send);
  backend->release(s.recv);
  int64_t wrong_total = s.wrong_total;
  MPI_CHECK(MPI_Bcast(&wrong_total, 1, MPI_INT64_T, 0, MPI_COMM_WORLD));
  double seconds = MPI_Wtime() - t_start;
  MPI_CHECK(MPI_Bcast(&seconds, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD));
  if (rank == 0) print_report(s, wrong_total, seconds);
  write_result(path, s, plan, wrong_total, seconds, start, backend->device_name());
  if (rank == 0) {
    std::printf("wrote %s (status %s)\n", path.c_str(), wrong_total ? "failed" : "ok");
    std::printf("next: /usr/bin/python3 analysis/diagnose.py %s\n", path.c_str());
  }
  return wrong_total ? kExitCheckFailed : kExitOk;
}

}  // namespace sb
