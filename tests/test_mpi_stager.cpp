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
  double comm_clock() override { return MPI_Wtime(); }
  void collective_done(Request id, Mark m, OpKind kind, Phase, int, int64_t bytes, double start, double end) override {
    EXPECT_LE(start, end);
    done.push_back(id);
    records.push_back({kind, bytes});
    release_mark(m);
  }
};

// Small integers: every sum over a few ranks is exact in bf16 too.
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
