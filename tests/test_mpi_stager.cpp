// The CUDA backend's MPI path (mpi_stager.h) against host memory: a stand-in for the
// communication stream runs every copy at once but lets its marks pass only after a few
// queries (a different pattern on every rank), so the ring of slots fills, chunks wait for
// slots and for their copies, and ranks reach each step at different times. Every
// collective, staged in many chunks and with "device pointers" (host ones here), in and out
// of place, fp32 and bf16 (user-defined MPI reductions), sum and avg, several outstanding
// at once, and the two-level reduction of hybrid sharding on sub-communicators.
// Runs on any number of ranks: `make test` runs it alone, tests/mpi_tests.sh on 3 and 4.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstring>
#include <memory>
#include <vector>

#include "shardbench/core/half.h"
#include "shardbench/backend/mpi_stager.h"

using namespace sb;

namespace {

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

// The communication stream, run on the host.
struct HostStream : StagingDevice {
  struct MarkState {
    int queries_left;
  };
  uint64_t state;
  int live = 0;            // marks not yet released
  int64_t copies = 0;      // staging copies issued
  int host_buffers = 0;    // host_alloc calls not yet freed
  int host_allocs = 0;     // host_alloc calls
  std::vector<Request> done;
  std::vector<std::pair<OpKind, int64_t>> records;  // kind and bytes of each finished collective
  explicit HostStream(uint64_t seed) : state(seed * 0x9E3779B97F4A7C15ull + 1) {}
  int delay() {  // 0..3 queries before a mark passes
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return int(state >> 62);
  }
  static MarkState* ms(Mark m) { return static_cast<MarkState*>(m); }
  void stage_copy(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height, Phase,
                  int) override {
    for (size_t r = 0; r < height; ++r)
      std::memmove(static_cast<char*>(dst) + r * dpitch, static_cast<const char*>(src) + r * spitch, width);
    ++copies;
  }
  void comm_after(Mark m) override { release_mark(m); }
  Mark comm_mark() override {
    ++live;
    return new MarkState{delay()};
  }
  bool mark_passed(Mark m) override { return ms(m)->queries_left-- <= 0; }
  void release_mark(Mark m) override {
    EXPECT_GT(live, 0);
    --live;
    delete ms(m);
  }
  void comm_sync() override {}
  char* host_alloc(size_t bytes) override {
    ++host_buffers;
    ++host_allocs;
    return new char[bytes];
  }
  void host_free(char* p) override {
    --host_buffers;
    delete[] p;
  }
  double comm_clock() override { return MPI_Wtime(); }
  void collective_done(Request id, Mark m, OpKind kind, Phase, int, int64_t bytes, double start, double end) override {
    EXPECT_LE(start, end);
    done.push_back(id);
    records.push_back({kind, bytes});
    release_mark(m);
  }
};

// Small integers: every sum over a few ranks is exact in bf16 too (and every value is exact).
float input(int rank, int64_t i) { return float(((rank + 1) * 3 + i * 7) % 5 - 2); }

template <class T>
std::vector<T> values(int rank, int64_t first, int64_t n) {
  std::vector<T> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = T(input(rank, first + i));
  return v;
}

template <class T>
T reduce_all(int64_t i, int n, ReduceOp r) {
  T acc = T(input(0, i));
  for (int k = 1; k < n; ++k) acc = T(float(acc) + input(k, i));
  return r == ReduceOp::Avg ? T(float(acc) / n) : acc;
}

// One collective through a stager; returns this rank's result (the NCCL layout).
template <class T>
struct Run {
  MpiStager& st;
  HostStream& dev;
  MPI_Comm comm;
  int n, rank;
  Request next = 0;

  void go(CollectiveArgs a) {
    st.issue(next, a, comm, Phase::Backward, 3, dev.comm_mark());
    while (st.pending(next)) st.progress();
    ++next;
  }

  // Checks one collective of `count` elements (NCCL's count convention) against its definition.
  void check(Collective op, int64_t count, bool in_place, ReduceOp r, DType t) {
    SCOPED_TRACE(std::string(collective_name(op)) + (in_place ? " in place" : "") + " " + dtype_name(t) + " " +
                 reduce_op_name(r) + " count " + std::to_string(count));
    const int root = n - 1;
    std::vector<T> send, recv;
    CollectiveArgs a{op, nullptr, nullptr, count, t, r, root};
    switch (op) {
      case Collective::AllGather:
        recv.assign(size_t(n * count), T(-99.f));
        send = values<T>(rank, 0, count);
        if (in_place) std::copy(send.begin(), send.end(), recv.begin() + rank * count);
        a.send = in_place ? recv.data() + rank * count : send.data();
        a.recv = recv.data();
        break;
      case Collective::ReduceScatter:
        send = values<T>(rank, 0, n * count);
        recv.assign(size_t(count), T(-99.f));
        a.send = send.data();
        a.recv = in_place ? send.data() + rank * count : recv.data();
        break;
      default:
        send = values<T>(rank, 0, count);
        recv.assign(size_t(count), T(-99.f));
        a.send = send.data();
        a.recv = in_place ? send.data() : recv.data();
    }
    go(a);
    const T* got = static_cast<const T*>(a.recv);
    const int64_t out = op == Collective::AllGather ? n * count : count;
    int64_t wrong = 0;
    for (int64_t j = 0; j < out; ++j) {
      T want;
      switch (op) {
        case Collective::AllReduce: want = reduce_all<T>(j, n, r); break;
        case Collective::AllGather: want = T(input(int(j / count), j % count)); break;
        case Collective::ReduceScatter: want = reduce_all<T>(rank * count + j, n, r); break;
        case Collective::Broadcast: want = T(input(root, j)); break;
        case Collective::Reduce:
          if (rank != root) continue;  // nothing defined off the root
          want = reduce_all<T>(j, n, r);
          break;
        case Collective::AllToAll: {
          const int64_t per = count / n;
          want = T(input(int(j / per), rank * per + j % per));
          break;
        }
        case Collective::SendRecv: want = T(input((rank - 1 + n) % n, j)); break;
        default: want = T(0.f);
      }
      if (float(got[j]) != float(want) && wrong++ < 3)
        ADD_FAILURE() << "element " << j << ": " << float(got[j]) << " != " << float(want);
    }
    EXPECT_EQ(wrong, 0);
  }
};

const Collective kAll[] = {Collective::AllReduce, Collective::AllGather, Collective::ReduceScatter, Collective::Broadcast,
                           Collective::Reduce,    Collective::AllToAll,  Collective::SendRecv};
bool is_reduction(Collective op) {
  return op == Collective::AllReduce || op == Collective::ReduceScatter || op == Collective::Reduce;
}

// Every collective through `lib` with the smallest slots (64 KiB, 2 of them): counts of
// several slots' worth, so that messages go in many chunks.
template <class T>
void every_collective(CommLibrary lib, CudaAwareness aware, DType t) {
  const int n = world_size(), rank = world_rank();
  HostStream dev(uint64_t(rank) + 1);
  const StagingConfig cfg = parse_staging_config("64K", "2");
  std::vector<char> host(size_t(cfg.total_bytes()));
  {
    MpiStager st(dev, lib, aware, cfg, host.data());
    Run<T> run{st, dev, MPI_COMM_WORLD, n, rank};
    for (Collective op : kAll)
      for (bool in_place : {false, true}) {
        if (in_place && (op == Collective::AllToAll || op == Collective::SendRecv)) continue;
        // Elements per slot for this collective, then 2.5 slots' worth (rounded to ranks).
        const int64_t per_slot = cfg.slot_bytes / (slot_elements_per_block_element(op, n) * int64_t(sizeof(T)));
        const int64_t count = (per_slot * 5 / 2 + 7) / n * n;
        for (ReduceOp r : {ReduceOp::Sum, ReduceOp::Avg}) {
          if (r == ReduceOp::Avg && !is_reduction(op)) continue;
          run.check(op, count, in_place, r, t);
          run.check(op, n, in_place, r, t);  // one chunk
        }
      }
    EXPECT_EQ(dev.done.size(), size_t(run.next));
    EXPECT_TRUE(st.idle());
  }
  EXPECT_EQ(dev.live, 0) << "every mark handed back";
}

}  // namespace

TEST(MpiStager, EveryCollectiveStagedInChunksFp32) {
  every_collective<float>(CommLibrary::Mpi, CudaAwareness::No, DType::F32);
}
TEST(MpiStager, EveryCollectiveStagedInChunksBf16) {
  every_collective<bf16>(CommLibrary::MpiStaged, CudaAwareness::Yes, DType::BF16);
}
// Device pointers (host ones here): blocking collectives on the buffers themselves; bf16
// reductions and averages still go through the slots.
TEST(MpiStager, EveryCollectiveWithDevicePointers) {
  every_collective<float>(CommLibrary::Mpi, CudaAwareness::Yes, DType::F32);
  every_collective<bf16>(CommLibrary::MpiDirect, CudaAwareness::Unknown, DType::BF16);
}

// A staged all-reduce moves each chunk twice (D2H, H2D) and records one operation with the
// collective's bytes; device pointers move nothing.
TEST(MpiStager, CopiesPerChunkAndTheRecord) {
  const int n = world_size(), rank = world_rank();
  const StagingConfig cfg = parse_staging_config("64K", "3");
  std::vector<char> host(size_t(cfg.total_bytes()));
  const int64_t count = 10 * (cfg.slot_bytes / 4) + 1;  // 11 chunks
  std::vector<float> buf(size_t(count), 1.f);
  for (CudaAwareness aware : {CudaAwareness::No, CudaAwareness::Yes}) {
    HostStream dev(uint64_t(rank) + 7);
    MpiStager st(dev, CommLibrary::Mpi, aware, cfg, host.data());
    st.issue(0, {Collective::AllReduce, buf.data(), buf.data(), count, DType::F32, ReduceOp::Sum, 0}, MPI_COMM_WORLD,
             Phase::Backward, 0, dev.comm_mark());
    st.drain();
    EXPECT_EQ(dev.copies, aware == CudaAwareness::No ? 2 * 11 : 0);
    ASSERT_EQ(dev.records.size(), 1u);
    EXPECT_EQ(dev.records[0].first, OpKind::AllReduce);
    EXPECT_EQ(dev.records[0].second, count * 4);
  }
  EXPECT_EQ(buf[0], float(n * n));  // 1 → n → n·n
}

// Several collectives outstanding at once, on the world and on the two sub-communicators
// of hybrid sharding (reduce-scatter in shard groups, then all-reduce across them), issued
// before any is waited for: the stager starts them in issue order on every rank.
TEST(MpiStager, OutstandingCollectivesOnSubCommunicators) {
  const int n = world_size(), rank = world_rank();
  const int G = n % 2 == 0 ? 2 : 1;  // shard group size
  MPI_Comm shard, replicate;
  MPI_Comm_split(MPI_COMM_WORLD, rank / G, rank, &shard);
  MPI_Comm_split(MPI_COMM_WORLD, rank % G, rank, &replicate);
  const StagingConfig cfg = parse_staging_config("64K", "2");
  std::vector<char> host(size_t(cfg.total_bytes()));
  HostStream dev(uint64_t(rank) * 3 + 5);
  {
    MpiStager st(dev, CommLibrary::Mpi, CudaAwareness::No, cfg, host.data());
    const int64_t m = 3 * cfg.slot_bytes / (4 * G) + 5;  // each rank's shard: several chunks
    std::vector<float> grad = values<float>(rank, 0, G * m), world_sum = values<float>(rank, 0, m);
    std::vector<float> part(static_cast<size_t>(m));
    st.issue(0, {Collective::ReduceScatter, grad.data(), part.data(), m, DType::F32, ReduceOp::Sum, 0}, shard,
             Phase::Backward, 0, dev.comm_mark());
    st.issue(1, {Collective::AllReduce, world_sum.data(), world_sum.data(), m, DType::F32, ReduceOp::Sum, 0},
             MPI_COMM_WORLD, Phase::Backward, 1, dev.comm_mark());
    while (st.pending(0)) st.progress();
    st.issue(2, {Collective::AllReduce, part.data(), part.data(), m, DType::F32, ReduceOp::Avg, 0}, replicate,
             Phase::Backward, 0, dev.comm_mark());
    st.drain();
    const int g = rank % G;
    int64_t wrong = 0;
    for (int64_t j = 0; j < m; ++j) {
      float all = 0;
      for (int k = 0; k < n; ++k) all += input(k, g * m + j);
      wrong += part[j] != all / (n / G);
      wrong += world_sum[j] != reduce_all<float>(j, n, ReduceOp::Sum);
    }
    EXPECT_EQ(wrong, 0);
    EXPECT_EQ(dev.done, (std::vector<Request>{0, 1, 2}));
  }
  EXPECT_EQ(dev.live, 0);
  MPI_Comm_free(&shard);
  MPI_Comm_free(&replicate);
}

namespace {

// A pipeline's traffic between the two stages of a pair (ranks 2k and 2k+1; the last rank of
// an odd world, and a world of one, is both stages of its own pair): GPipe's forward issues
// every activation send at once, the second stage receives each and sends its gradient back,
// the first receives those; each message three times the whole ring, tags as the schedule's
// (one communicator per direction), collectives on the world in between, issued at different
// points of the two stages' schedules. Three steps: every message arrives intact, each is
// recorded as a send or a receive of its bytes, the host buffers are reused from step to step,
// and every mark and buffer is handed back.
template <class T>
void pipeline_traffic(CommLibrary lib, CudaAwareness aware, DType t) {
  const int n = world_size(), rank = world_rank();
  const int peer = (rank ^ 1) < n ? rank ^ 1 : rank;
  const bool first = rank % 2 == 0, second = rank % 2 == 1 || peer == rank;
  MPI_Comm grads;  // the gradients' own communicator, as TrainingSchedule's
  MPI_Comm_dup(MPI_COMM_WORLD, &grads);
  const StagingConfig cfg = parse_staging_config("64K", "2");
  std::vector<char> host(size_t(cfg.total_bytes()));
  HostStream dev(uint64_t(rank) * 11 + 3);
  const int M = 4, steps = 3;
  const int64_t count = 3 * cfg.total_bytes() / int64_t(sizeof(T)) + 5;
  const auto tag = [](int m) { return m * 8; };  // as Pipeline's: the direction is the communicator's
  const auto message = [&](int from, int m, bool gradient) {
    return values<T>(from + (gradient ? 5 : 0), int64_t(m) * 101, count);
  };
  int64_t wrong = 0, sends = 0, recvs = 0;
  {
    MpiStager st(dev, lib, aware, cfg, host.data());
    Request next = 0;
    const auto issue = [&](CollectiveArgs a, MPI_Comm c) {
      st.issue(next, a, c, Phase::Forward, 1, dev.comm_mark());
      return next++;
    };
    const auto wait = [&](Request r) {
      while (st.pending(r)) st.progress();
    };
    const auto expect = [&](const std::vector<T>& got, const std::vector<T>& want) {
      for (size_t i = 0; i < want.size(); ++i) wrong += float(got[i]) != float(want[i]);
    };
    for (int step = 0; step < steps; ++step) {
      std::vector<float> early(size_t(count), 1.f), mid(size_t(count), 1.f);
      const Request all = issue({Collective::AllReduce, early.data(), early.data(), count, DType::F32}, MPI_COMM_WORLD);
      std::vector<std::vector<T>> acts, act_in(M), grad_out, grad_in(M);
      std::vector<Request> pending;
      Request between = kNoRequest;
      if (first) {
        for (int m = 0; m < M; ++m) acts.push_back(message(rank, m, false));
        for (int m = 0; m < M; ++m) {
          CollectiveArgs a{Collective::Send, acts[size_t(m)].data(), nullptr, count, t};
          a.peer = peer;
          a.tag = tag(m);
          a.direction = P2PDirection::Activations;
          pending.push_back(issue(a, MPI_COMM_WORLD));
          ++sends;
        }
        between = issue({Collective::AllReduce, mid.data(), mid.data(), count, DType::F32}, MPI_COMM_WORLD);
      }
      if (second) {
        grad_out.resize(M);
        for (int m = 0; m < M; ++m) {
          act_in[size_t(m)].assign(size_t(count), T(-9.f));
          CollectiveArgs a{Collective::Recv, nullptr, act_in[size_t(m)].data(), count, t};
          a.peer = peer;
          a.tag = tag(m);
          a.direction = P2PDirection::Activations;
          wait(issue(a, MPI_COMM_WORLD));
          ++recvs;
          expect(act_in[size_t(m)], message(peer, m, false));
          if (m == 1 && !first)
            between = issue({Collective::AllReduce, mid.data(), mid.data(), count, DType::F32}, MPI_COMM_WORLD);
          grad_out[size_t(m)] = message(rank, m, true);
          CollectiveArgs g{Collective::Send, grad_out[size_t(m)].data(), nullptr, count, t};
          g.peer = peer;
          g.tag = tag(m);
          g.direction = P2PDirection::Gradients;
          pending.push_back(issue(g, grads));
          ++sends;
        }
      }
      if (first)
        for (int m = 0; m < M; ++m) {
          grad_in[size_t(m)].assign(size_t(count), T(-9.f));
          CollectiveArgs a{Collective::Recv, nullptr, grad_in[size_t(m)].data(), count, t};
          a.peer = peer;
          a.tag = tag(m);
          a.direction = P2PDirection::Gradients;
          wait(issue(a, grads));
          ++recvs;
          expect(grad_in[size_t(m)], message(peer, m, true));
        }
      for (Request r : pending) wait(r);
      wait(all);
      wait(between);
      for (int64_t i = 0; i < count; ++i) wrong += early[size_t(i)] != float(n) || mid[size_t(i)] != float(n);
    }
    st.drain();
    EXPECT_TRUE(st.idle());
    EXPECT_EQ(dev.done.size(), size_t(next));
  }
  EXPECT_EQ(wrong, 0);
  int64_t send_records = 0, recv_records = 0;
  for (const auto& [kind, bytes] : dev.records) {
    if (kind != OpKind::Send && kind != OpKind::Recv) continue;
    (kind == OpKind::Send ? send_records : recv_records) += 1;
    EXPECT_EQ(bytes, count * int64_t(sizeof(T)));
  }
  EXPECT_EQ(send_records, sends);
  EXPECT_EQ(recv_records, recvs);
  const bool staged = choose_transfer(lib, aware, Collective::Send, t, ReduceOp::Sum, count) == Transfer::Staged;
  if (staged) {
    // Without reuse every message would take a buffer of its own: steps * (sends + recvs) / steps.
    EXPECT_GT(dev.host_allocs, 0);
    EXPECT_LE(dev.host_allocs, (sends + recvs) / steps) << "the buffers of one step serve the next";
  } else {
    EXPECT_EQ(dev.host_allocs, 0) << "device pointers need no host buffer";
  }
  EXPECT_EQ(dev.host_buffers, 0) << "every host buffer freed";
  EXPECT_EQ(dev.live, 0) << "every mark handed back";
  MPI_Comm_free(&grads);
}

}  // namespace

TEST(MpiStager, PipelineSendsAndReceivesStagedFp32) {
  pipeline_traffic<float>(CommLibrary::Mpi, CudaAwareness::No, DType::F32);
}
TEST(MpiStager, PipelineSendsAndReceivesStagedBf16) {
  pipeline_traffic<bf16>(CommLibrary::MpiStaged, CudaAwareness::Yes, DType::BF16);
}
TEST(MpiStager, PipelineSendsAndReceivesWithDevicePointers) {
  pipeline_traffic<float>(CommLibrary::Mpi, CudaAwareness::Yes, DType::F32);
  pipeline_traffic<bf16>(CommLibrary::MpiDirect, CudaAwareness::Unknown, DType::BF16);
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  if (world_rank() != 0) ::testing::GTEST_FLAG(brief) = true;
  const int rc = RUN_ALL_TESTS();
  int worst = 0;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return worst;
}
