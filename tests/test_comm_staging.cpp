// The CUDA backend's MPI decisions, which need no GPU: --comm names, the CUDA-awareness
// answer, device pointers vs staging per collective, the staging ring's configuration, and
// the chunking of large messages through it.
#include <gtest/gtest.h>

#include <climits>
#include <string>

#include "shardbench/core/check.h"
#include "shardbench/backend/comm_staging.h"

using namespace sb;

TEST(CommStaging, ParsesEveryLibraryAndRefusesOthers) {
  for (int c = 0; c < int(CommLibrary::kCount); ++c)
    EXPECT_EQ(parse_comm_library(comm_library_name(CommLibrary(c)), "--comm"), CommLibrary(c));
  EXPECT_FALSE(uses_mpi(CommLibrary::Nccl));
  EXPECT_TRUE(uses_mpi(CommLibrary::Mpi));
  try {
    parse_comm_library("gloo", "--comm");
    FAIL() << "gloo accepted";
  } catch (const UsageError& e) {
    EXPECT_EQ(std::string(e.what()), "--comm 'gloo' is not allowed (allowed: nccl, mpi, mpi-staged, mpi-direct)");
  }
}

TEST(CommStaging, AwarenessNeedsTheMacroAndTheRuntimeAnswer) {
  EXPECT_EQ(cuda_awareness(-1, 1), CudaAwareness::Unknown);  // not Open MPI: cannot be asked
  EXPECT_EQ(cuda_awareness(0, 1), CudaAwareness::No);        // built without CUDA
  EXPECT_EQ(cuda_awareness(1, 0), CudaAwareness::No);        // built with it, not available now
  EXPECT_EQ(cuda_awareness(1, 1), CudaAwareness::Yes);
}

TEST(CommStaging, DirectIsRefusedOnlyWhereTheLibrarySaysNo) {
  EXPECT_NE(refuse_comm(CommLibrary::MpiDirect, CudaAwareness::No), "");
  EXPECT_EQ(refuse_comm(CommLibrary::MpiDirect, CudaAwareness::Unknown), "");  // the user knows better
  EXPECT_EQ(refuse_comm(CommLibrary::MpiDirect, CudaAwareness::Yes), "");
  for (CudaAwareness a : {CudaAwareness::Yes, CudaAwareness::No, CudaAwareness::Unknown}) {
    EXPECT_EQ(refuse_comm(CommLibrary::Mpi, a), "");
    EXPECT_EQ(refuse_comm(CommLibrary::MpiStaged, a), "");
  }
}

TEST(CommStaging, DevicePointersOnlyWhenTheLibraryTakesThemAndNoHostArithmetic) {
  const auto choose = [](CommLibrary c, CudaAwareness a, Collective op, DType t, ReduceOp r, int64_t block = 1000) {
    return choose_transfer(c, a, op, t, r, block);
  };
  const auto D = Transfer::DevicePointers, S = Transfer::Staged;
  const auto AR = Collective::AllReduce, AG = Collective::AllGather, RS = Collective::ReduceScatter;
  // What the library says decides under --comm mpi.
  EXPECT_EQ(choose(CommLibrary::Mpi, CudaAwareness::Yes, AR, DType::F32, ReduceOp::Sum), D);
  EXPECT_EQ(choose(CommLibrary::Mpi, CudaAwareness::No, AR, DType::F32, ReduceOp::Sum), S);
  EXPECT_EQ(choose(CommLibrary::Mpi, CudaAwareness::Unknown, AR, DType::F32, ReduceOp::Sum), S);
  // The user's flag overrides it.
  EXPECT_EQ(choose(CommLibrary::MpiStaged, CudaAwareness::Yes, AR, DType::F32, ReduceOp::Sum), S);
  EXPECT_EQ(choose(CommLibrary::MpiDirect, CudaAwareness::Unknown, AG, DType::F32, ReduceOp::Sum), D);
  // 16-bit reductions run user-defined MPI operations on the host; averages divide there.
  for (CommLibrary c : {CommLibrary::Mpi, CommLibrary::MpiDirect}) {
    EXPECT_EQ(choose(c, CudaAwareness::Yes, AR, DType::BF16, ReduceOp::Sum), S);
    EXPECT_EQ(choose(c, CudaAwareness::Yes, RS, DType::F16, ReduceOp::Max), S);
    EXPECT_EQ(choose(c, CudaAwareness::Yes, Collective::Reduce, DType::BF16, ReduceOp::Sum), S);
    EXPECT_EQ(choose(c, CudaAwareness::Yes, AR, DType::F32, ReduceOp::Avg), S);
    // Moving 16-bit words needs no arithmetic.
    EXPECT_EQ(choose(c, CudaAwareness::Yes, AG, DType::BF16, ReduceOp::Sum), D);
    EXPECT_EQ(choose(c, CudaAwareness::Yes, Collective::Broadcast, DType::F16, ReduceOp::Avg), D);
    EXPECT_EQ(choose(c, CudaAwareness::Yes, RS, DType::F32, ReduceOp::Sum), D);
  }
  // Beyond MPI's int count only the chunked (staged) path fits.
  EXPECT_EQ(choose(CommLibrary::Mpi, CudaAwareness::Yes, AG, DType::U8, ReduceOp::Sum, int64_t(INT_MAX) + 1), S);
  EXPECT_EQ(choose(CommLibrary::Mpi, CudaAwareness::Yes, AG, DType::U8, ReduceOp::Sum, INT_MAX), D);
}

TEST(CommStaging, StagingConfigDefaultsAndEnvironmentValues) {
  const StagingConfig d = parse_staging_config(nullptr, nullptr);
  EXPECT_EQ(d.slot_bytes, 4 << 20);
  EXPECT_EQ(d.slots, 4);
  EXPECT_EQ(d.total_bytes(), 16 << 20);
  const StagingConfig c = parse_staging_config("512K", "2");
  EXPECT_EQ(c.slot_bytes, 512 << 10);
  EXPECT_EQ(c.slots, 2);
  EXPECT_EQ(c.total_bytes(), 1 << 20);
  EXPECT_EQ(parse_staging_config("64K", "1").slot_bytes, kMinSlotBytes);
  for (const char* bad : {"0", "63K", "-1M", "lots", ""}) EXPECT_THROW(parse_staging_config(bad, nullptr), UsageError) << bad;
  for (const char* bad : {"0", "-2", "two", "3x", "", "1025"}) EXPECT_THROW(parse_staging_config(nullptr, bad), UsageError) << bad;
  try {
    parse_staging_config(nullptr, "0");
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_EQ(std::string(e.what()), "SB_MPI_STAGING_SLOTS '0' is not allowed (an integer 1..1024)");
  }
}

TEST(CommStaging, BlocksAndSlotFootprints) {
  CollectiveArgs a;
  a.count = 96;
  for (Collective op : {Collective::AllReduce, Collective::AllGather, Collective::ReduceScatter, Collective::Broadcast,
                        Collective::Reduce, Collective::SendRecv}) {
    a.op = op;
    EXPECT_EQ(block_elements(a, 4), 96) << collective_name(op);
  }
  a.op = Collective::AllToAll;
  EXPECT_EQ(block_elements(a, 4), 24);
  EXPECT_EQ(slot_elements_per_block_element(Collective::AllReduce, 8), 1);
  EXPECT_EQ(slot_elements_per_block_element(Collective::Broadcast, 8), 1);
  EXPECT_EQ(slot_elements_per_block_element(Collective::AllGather, 8), 8);
  EXPECT_EQ(slot_elements_per_block_element(Collective::ReduceScatter, 8), 8);
  EXPECT_EQ(slot_elements_per_block_element(Collective::AllToAll, 8), 16);
  EXPECT_EQ(slot_elements_per_block_element(Collective::SendRecv, 8), 2);
}

// Chunks cover the block in order without gaps, each fits a slot and MPI's int.
void expect_tiling(const std::vector<Chunk>& chunks, Collective op, int64_t block, int ranks, int es, int64_t slot) {
  int64_t next = 0;
  for (const Chunk& c : chunks) {
    EXPECT_EQ(c.first, next);
    EXPECT_GT(c.count, 0);
    EXPECT_LE(c.count, INT_MAX);
    EXPECT_LE(c.count * slot_elements_per_block_element(op, ranks) * es, slot);
    next += c.count;
  }
  EXPECT_EQ(next, block);
}

TEST(CommStaging, LargeMessagesAreChunkedThroughTheSlots) {
  const int64_t slot = 4 << 20;
  // 1 GiB of fp32 all-reduce: 256 slots' worth, every chunk full.
  auto c = plan_chunks(Collective::AllReduce, (1 << 30) / 4, 4, 4, slot);
  ASSERT_EQ(c.size(), 256u);
  for (const Chunk& k : c) EXPECT_EQ(k.count, slot / 4);
  expect_tiling(c, Collective::AllReduce, (1 << 30) / 4, 4, 4, slot);
  // All-gather on 8 ranks: the slot holds every rank's part of a chunk.
  c = plan_chunks(Collective::AllGather, 1000003, 8, 2, slot);
  EXPECT_EQ(c.front().count, slot / (8 * 2));
  EXPECT_EQ(c.size(), size_t((1000003 + slot / 16 - 1) / (slot / 16)));
  EXPECT_EQ(c.back().count, 1000003 % (slot / 16));  // the remainder last
  expect_tiling(c, Collective::AllGather, 1000003, 8, 2, slot);
  c = plan_chunks(Collective::AllToAll, 777777, 4, 8, kMinSlotBytes);
  expect_tiling(c, Collective::AllToAll, 777777, 4, 8, kMinSlotBytes);
  // A small message is one chunk; an empty one none.
  c = plan_chunks(Collective::ReduceScatter, 10, 2, 4, slot);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].count, 10);
  EXPECT_TRUE(plan_chunks(Collective::AllReduce, 0, 2, 4, slot).empty());
  // Device pointers (an unbounded "slot"): chunks only where MPI's int ends.
  c = plan_chunks(Collective::AllGather, int64_t(INT_MAX) * 2 + 5, 2, 1, INT64_MAX);
  ASSERT_EQ(c.size(), 3u);
  EXPECT_EQ(c[0].count, INT_MAX);
  EXPECT_EQ(c[2].count, 5);
}
