// collective_perf --pattern pairs (pair_sweep.h): the node-pair schedule, the exchange of
// each pair, each node's own all-reduce, and the HDF5 of every iteration with the node-by-
// node figures.
#include "shardbench/bench/pair_sweep.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>

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

constexpr int kPairSchemaVersion = 1;  // of the pair sweep's file
enum Kind : int32_t { kExchange = 0, kLatency = 1, kIntraNode = 2 };
const std::vector<std::string> kKindNames{"exchange", "latency", "intra-node all-reduce"};

// Every rank's every iteration.
struct SampleRow {
  int32_t round, kind, node, peer_node, rank, peer_rank, iteration;
  int64_t size;
  double time;
};
// Rank 0: one row per node pair (or node, for kIntraNode) and size: the pair's iteration
// takes as long as its slowest rank; figures are over iterations.
struct PairRow {
  int32_t round, kind, node_a, node_b, rank_pairs;
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

struct Sweep {
  const PairSweepOptions& o;
  Backend& b;
  const NodeMap& nm;
  int rank, world;
  void* send = nullptr;
  void* recv = nullptr;
  std::vector<SampleRow> samples;
  std::vector<PairRow> rows;  // rank 0
  int64_t wrong_total = 0;

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
  PairRow summarize(const std::vector<double>& all, const std::vector<int>& ranks, int32_t round, Kind kind, int a,
                    int bnode, int64_t bytes, int64_t wrong) {
    std::vector<double> per_iter(size_t(o.iters), 0.0);
    for (int r : ranks)
      for (int i = 0; i < o.iters; ++i) per_iter[size_t(i)] = std::max(per_iter[size_t(i)], all[size_t(r) * o.iters + i]);
    PairRow row{round, kind, a, bnode, kind == kIntraNode ? 0 : int32_t(ranks.size() / 2), bytes, median(per_iter),
                *std::min_element(per_iter.begin(), per_iter.end()),
                *std::max_element(per_iter.begin(), per_iter.end()), 0, wrong};
    const double algbw = double(bytes) / row.time_p50 / 1e9;
    const int n = int(ranks.size());
    // A pair: every rank pair's bytes cross the link in each direction at once. A node's
    // all-reduce: nccl-tests' bus bandwidth, 2(n−1)/n.
    row.busbw = kind == kIntraNode ? algbw * 2.0 * (n - 1) / n : algbw * row.rank_pairs;
    return row;
  }

  // The ranks of a node that take part: one, or with --pair-ranks matched the first `per`.
  std::vector<int> ranks_of(int node, int per) const {
    std::vector<int> out;
    for (int r = 0; r < world && int(out.size()) < per; ++r)
      if (nm.node_of[size_t(r)] == node) out.push_back(r);
    return out;
  }
};

void print_matrix(const std::vector<PairRow>& rows, const std::vector<std::string>& hosts, Kind kind, int64_t bytes) {
  const int n = int(hosts.size());
  std::vector<double> cell(size_t(n) * n, NAN);
  for (const PairRow& r : rows)
    if (r.kind == kind && r.size == bytes)
      cell[size_t(r.node_a) * n + r.node_b] = cell[size_t(r.node_b) * n + r.node_a] =
          kind == kLatency ? r.time_p50 * 1e6 : r.busbw;
  std::printf("# %s, %lld B: %s\n#%12s", kind == kLatency ? "latency" : "bus bandwidth per direction",
              (long long)bytes, kind == kLatency ? "median time of an exchange (us)" : "GB/s (median iteration)", "");
  for (const std::string& h : hosts) std::printf(" %10.10s", h.c_str());
  std::printf("\n");
  for (int i = 0; i < n; ++i) {
    std::printf("#%12.12s", hosts[size_t(i)].c_str());
    for (int j = 0; j < n; ++j) {
      const double v = cell[size_t(i) * n + j];
      if (std::isnan(v)) std::printf(" %10s", i == j ? "-" : "n/a");
      else std::printf(" %10.4g", v);
    }
    std::printf("\n");
  }
}

}  // namespace

int run_pair_sweep(const PairSweepOptions& o, int rank, int world) {
  const NodeMap& nm = node_map();
  const int nodes = nm.nodes();
  if (nodes < 2)
    throw UsageError("--pattern pairs needs ranks on at least 2 nodes; this run has 1 (" + nm.hosts[0] +
                     "): start it across nodes (mpirun --host, srun -N)");
  int per = 1;  // ranks of each node in a pair
  if (o.matched) {
    if (!nm.uniform())
      throw UsageError("--pair-ranks matched needs the same number of ranks on every node (this run: " +
                       std::to_string(nm.ranks_on(0)) + " on " + nm.hosts[0] + ", other counts elsewhere)");
    per = nm.ranks_on(0);
  }
  std::vector<PairRound> rounds = o.pairs.empty() ? round_robin(nodes) : pack_rounds(parse_pairs(o.pairs, nm.hosts));
  if (o.rounds > 0 && !o.pairs.empty()) throw UsageError("--rounds is not allowed with --pairs (they name the pairs)");
  if (o.rounds > int(rounds.size()))
    throw UsageError("--rounds " + std::to_string(o.rounds) + " is not allowed: " + std::to_string(nodes) +
                     " nodes have " + std::to_string(rounds.size()) + (rounds.size() == 1 ? " round" : " rounds") +
                     " of pairs");
  if (o.rounds > 0) rounds.resize(size_t(o.rounds));
  int npairs = 0;
  for (const PairRound& r : rounds) npairs += int(r.size());
  const std::string path = resolve_output(o.out, o.overwrite, "pair_sweep-n" + std::to_string(nodes), rank);
  const double start = wall_clock_rank0();  // the calendar time (whole seconds); durations: MPI_Wtime
  MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
  const double t_start = MPI_Wtime();

  std::unique_ptr<Backend> backend = make_backend(o.backend);
  backend->set_blocking_when_waited(true);
  Sweep s{o, *backend, nm, rank, world, nullptr, nullptr, {}, {}, 0};
  std::vector<int64_t> sizes{o.latency_bytes};
  for (int64_t v : o.sizes) sizes.push_back(v / 4 * 4);  // whole 4-byte words
  const int64_t max_bytes = *std::max_element(sizes.begin(), sizes.end());
  s.send = backend->alloc(size_t(max_bytes), MemCategory::CommBuffers);
  s.recv = backend->alloc(size_t(max_bytes), MemCategory::CommBuffers);
  if (rank == 0) {
    std::printf("#\n# collective_perf --pattern pairs: %d nodes, %d pair%s in %d round%s, %d rank pair%s per node pair, "
                "backend %s (%s)\n", nodes, npairs, npairs == 1 ? "" : "s", int(rounds.size()),
                rounds.size() == 1 ? "" : "s", per, per == 1 ? "" : "s", o.backend.c_str(), backend->device_name().c_str());
    std::printf("# each pair exchanges in both directions at once (busbw = size / time per direction); latency: "
                "%lld B; iterations %d, warm-up %d, check %d\n#\n", (long long)o.latency_bytes, o.iters, o.warmup, o.check);
    std::fflush(stdout);
  }
  const int my_local = nm.local_rank();
  const bool takes_part = my_local < per;
  for (size_t r = 0; r < rounds.size(); ++r) {
    const PairRound& round = rounds[r];
    int color = MPI_UNDEFINED, peer = -1, peer_node = -1;
    for (size_t k = 0; k < round.size() && takes_part; ++k)
      if (round[k].a == nm.node() || round[k].b == nm.node()) {
        color = int(k) * per + my_local;
        peer_node = round[k].a == nm.node() ? round[k].b : round[k].a;
        peer = s.ranks_of(peer_node, per)[size_t(my_local)];
      }
    MPI_Comm pc = MPI_COMM_NULL;
    MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, color, rank, &pc));
    std::unique_ptr<Comm> comm = pc == MPI_COMM_NULL ? nullptr : backend->make_comm(pc);
    const double t_round = MPI_Wtime();
    for (size_t z = 0; z < sizes.size(); ++z) {
      const int64_t bytes = sizes[z];
      const Kind kind = z == 0 ? kLatency : kExchange;
      int64_t wrong = 0;
      for (int c = 0; c < o.check && comm; ++c) wrong += s.check(*comm, bytes, peer);
      std::vector<double> t(size_t(o.iters), -1.0);
      for (int i = 0; i < o.warmup && comm; ++i) s.exchange(*comm, bytes);
      MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));  // the round's pairs start each size together
      for (int i = 0; i < o.iters && comm; ++i) t[size_t(i)] = s.exchange(*comm, bytes);
      for (int i = 0; i < o.iters && comm; ++i)
        s.samples.push_back({int32_t(r), kind, nm.node(), peer_node, rank, peer, i, bytes, t[size_t(i)]});
      const std::vector<double> all = s.gather(t);
      std::vector<int64_t> wrongs(rank == 0 ? size_t(world) : 0);
      MPI_CHECK(MPI_Gather(&wrong, 1, MPI_INT64_T, wrongs.data(), 1, MPI_INT64_T, 0, MPI_COMM_WORLD));
      if (rank != 0) continue;
      for (const NodePair& p : round) {
        std::vector<int> ranks = s.ranks_of(p.a, per), rb = s.ranks_of(p.b, per);
        ranks.insert(ranks.end(), rb.begin(), rb.end());
        int64_t w = 0;
        for (int q : ranks) w += wrongs[size_t(q)];
        s.wrong_total += w;
        s.rows.push_back(s.summarize(all, ranks, int32_t(r), kind, p.a, p.b, bytes, w));
      }
    }
    if (comm) comm.reset();
    if (pc != MPI_COMM_NULL) MPI_CHECK(MPI_Comm_free(&pc));
    if (rank == 0) {  // progress: one line per round
      std::printf("# round %zu/%zu (%.1f s):", r + 1, rounds.size(), MPI_Wtime() - t_round);
      for (const PairRow& row : s.rows)
        if (row.round == int32_t(r) && row.kind == kExchange && row.size == max_bytes)
          std::printf(" %s:%s %.4g GB/s", nm.hosts[size_t(row.node_a)].c_str(), nm.hosts[size_t(row.node_b)].c_str(),
                      row.busbw);
      std::printf("\n");
      std::fflush(stdout);
    }
  }

  // Each node's own all-reduce, every node at once: the intra-node figure beside its links.
  const int intra_ranks = nm.max_ranks_per_node();
  if (intra_ranks > 1) {
    MPI_Comm nc = node_comm();
    std::unique_ptr<Comm> comm = backend->make_comm(nc);
    const int local = nm.local_ranks();
    for (int64_t v : o.sizes) {
      const int64_t count = v / 4 / local * local;
      if (count == 0) continue;
      const int64_t bytes = count * 4;
      std::vector<double> t(size_t(o.iters), -1.0);
      const CollectiveArgs a{Collective::AllReduce, s.send, s.recv, count, DType::F32, ReduceOp::Sum, 0};
      if (local > 1) {
        for (int i = 0; i < o.warmup; ++i) backend->wait(backend->collective(a, *comm));
        backend->synchronize();
      }
      MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
      for (int i = 0; i < o.iters && local > 1; ++i) {
        const double t0 = backend->now();
        backend->wait(backend->collective(a, *comm));
        backend->synchronize();
        t[size_t(i)] = backend->now() - t0;
        s.samples.push_back({-1, kIntraNode, nm.node(), nm.node(), rank, -1, i, bytes, t[size_t(i)]});
      }
      const std::vector<double> all = s.gather(t);
      for (int node = 0; rank == 0 && node < nodes; ++node)
        if (nm.ranks_on(node) > 1) s.rows.push_back(s.summarize(all, s.ranks_of(node, world), -1, kIntraNode, node, node, bytes, 0));
    }
    comm.reset();
    MPI_CHECK(MPI_Comm_free(&nc));
  }
  backend->release(s.send);
  backend->release(s.recv);
  int64_t wrong_total = s.wrong_total;
  MPI_CHECK(MPI_Bcast(&wrong_total, 1, MPI_INT64_T, 0, MPI_COMM_WORLD));
  double seconds = MPI_Wtime() - t_start;
  MPI_CHECK(MPI_Bcast(&seconds, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD));
  const std::string status = wrong_total ? "failed" : "ok";
  if (rank == 0) {
    print_matrix(s.rows, nm.hosts, kExchange, max_bytes);
    print_matrix(s.rows, nm.hosts, kLatency, o.latency_bytes);
    for (const PairRow& row : s.rows)
      if (row.kind == kIntraNode && row.size == max_bytes)
        std::printf("# %s: all-reduce of its %d ranks, %lld B: busbw %.4g GB/s\n", nm.hosts[size_t(row.node_a)].c_str(),
                    nm.ranks_on(row.node_a), (long long)row.size, row.busbw);
    std::printf("# Out of bounds values : %lld %s\n# Sweep time           : %.1f s\n#\n", (long long)wrong_total,
                wrong_total ? "FAILED" : "OK", seconds);
  }

  std::string names;
  for (const std::string& h : nm.hosts) names += (names.empty() ? "" : ",") + h;
  std::string sizes_text;
  for (int64_t v : o.sizes) sizes_text += (sizes_text.empty() ? "" : ",") + std::to_string(v / 4 * 4);
  ResultFile f(path, MPI_COMM_WORLD, o.overwrite, int64_t(s.samples.size() * sizeof(SampleRow)));
  f.attributes("/", {
      Attr::integer("schema_version", kPairSchemaVersion), Attr::str("program", "collective_perf"),
      Attr::str("pattern", "pairs"), Attr::str("pairs", !o.pairs.empty() ? o.pairs : o.rounds ? "first rounds" : "all"),
      Attr::str("pair_ranks", o.matched ? "matched" : "one"), Attr::integer("ranks_per_pair", per),
      Attr::str("node_names", names), Attr::integer("nodes", nodes), Attr::integer("world_size", world),
      Attr::integer("ranks_per_node", nm.max_ranks_per_node()), Attr::integer("rounds", int64_t(rounds.size())),
      Attr::integer("node_pairs", npairs), Attr::str("sizes", sizes_text), Attr::integer("latency_bytes", o.latency_bytes),
      Attr::integer("iters", o.iters), Attr::integer("warmup", o.warmup), Attr::integer("check", o.check),
      Attr::str("backend", o.backend), Attr::str("status", status), Attr::integer("wrong_total", wrong_total),
      Attr::num("sweep_seconds", seconds), Attr::str("start_time", iso_time(start)),
      Attr::str("end_time", iso_time(wall_clock_rank0())),
  });
  write_provenance(f, collect_provenance(o.argv), hostname(), backend->device_name(), MPI_COMM_WORLD);
  f.table("samples", {SB_COLUMN(SampleRow, round, I32), SB_COLUMN(SampleRow, kind, I32), SB_COLUMN(SampleRow, node, I32),
                      SB_COLUMN(SampleRow, peer_node, I32), SB_COLUMN(SampleRow, rank, I32),
                      SB_COLUMN(SampleRow, peer_rank, I32), SB_COLUMN(SampleRow, iteration, I32),
                      SB_COLUMN(SampleRow, size, I64), SB_COLUMN(SampleRow, time, F64)},
          s.samples);
  f.table("pairs", {SB_COLUMN(PairRow, round, I32), SB_COLUMN(PairRow, kind, I32), SB_COLUMN(PairRow, node_a, I32),
                    SB_COLUMN(PairRow, node_b, I32), SB_COLUMN(PairRow, rank_pairs, I32), SB_COLUMN(PairRow, size, I64),
                    SB_COLUMN(PairRow, time_p50, F64), SB_COLUMN(PairRow, time_min, F64),
                    SB_COLUMN(PairRow, time_max, F64), SB_COLUMN(PairRow, busbw, F64), SB_COLUMN(PairRow, wrong, I64)},
          s.rows);
  for (const char* table : {"samples", "pairs"}) {
    f.names_attribute(table, "kind_names", kKindNames);
    f.names_attribute(table, "node_names", nm.hosts);
  }
  f.commit();
  if (rank == 0) {
    std::printf("wrote %s (status %s)\n", path.c_str(), status.c_str());
    std::printf("next: /usr/bin/python3 analysis/diagnose.py %s\n", path.c_str());
  }
  return wrong_total ? kExitCheckFailed : kExitOk;
}

}  // namespace sb
