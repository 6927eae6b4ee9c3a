// The interconnect benchmark's facts, in one place: which buffer sizes an operation uses
// for a given "size", and the bus-bandwidth factor, exactly as nccl-tests defines them
// (doc/PERFORMANCE.md): algbw = size / time; busbw = algbw × factor with
//   all-reduce 2(n−1)/n;  all-gather, reduce-scatter, all-to-all (n−1)/n;
//   broadcast, reduce, send/recv 1.
// "size" is the bytes of the largest buffer: the gathered array of an all-gather, the
// scattered input of a reduce-scatter, the whole buffer otherwise.
// Hybrid is the two-level gradient reduction of hybrid sharding: reduce-scatter inside
// shard groups of G ranks, then all-reduce of the 1/G shard across the R = n/G groups.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "shardbench/backend.h"

namespace sb {

enum class BenchOp : int { AllReduce, AllGather, ReduceScatter, Broadcast, Reduce, AllToAll, SendRecv, Hybrid, kCount };
const char* bench_op_name(BenchOp op);                 // all-reduce, ..., send-recv, hybrid
BenchOp parse_bench_op(const std::string& name);       // throws UsageError
std::vector<BenchOp> parse_bench_ops(const std::string& list);  // "all-reduce,all-gather" or "all"
bool is_reduction(BenchOp op);
bool has_in_place(BenchOp op);  // all-to-all and send/recv run out of place only
Collective as_collective(BenchOp op);  // not for Hybrid

DType parse_dtype(const std::string& name);     // nccl-tests names; throws UsageError
ReduceOp parse_reduce_op(const std::string& name);
// "64", "1K", "16M", "2G" (powers of 1024); throws UsageError naming the flag.
int64_t parse_size(const std::string& flag, const std::string& text);

struct BenchSizes {
  int64_t size_bytes = 0;  // the table's "size" column (after rounding)
  int64_t count = 0;       // the table's "count" column: size / type size
  int64_t send = 0, recv = 0;  // elements of this rank's send and receive buffers
  int64_t arg = 0;         // the count argument of the call (NCCL convention)
};
// Rounds `size_bytes` down to what the operation can use on `ranks` ranks (multiples of
// ranks × type size where a buffer is split); count 0 when nothing fits.
BenchSizes bench_sizes(BenchOp op, int64_t size_bytes, DType dtype, int ranks, int shard = 1);

double bus_factor(BenchOp op, int ranks, int shard = 1);

// Bytes this rank sent in a recorded collective: its `bytes` (the full buffer, nccl-tests'
// size) × bus_factor over its `ranks`, to the nearest byte; 0 for compute and on one rank.
int64_t bytes_sent(const OpEvent& e);

}  // namespace sb
