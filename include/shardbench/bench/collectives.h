// collective_perf's operations and sizes. The per-collective facts (names, nccl-tests
// programs, buffer conventions, bus-bandwidth factors) are the backend's collective table
// (backend.h, CollectiveInfo); this adds the hybrid operation and nccl-tests' "size":
// algbw = size / time; busbw = algbw × the bus factor. "size" is the bytes of the largest
// buffer: the gathered array of an all-gather, the scattered input of a reduce-scatter,
// the whole buffer otherwise.
// Hybrid is the two-level gradient reduction of hybrid sharding: reduce-scatter inside
// shard groups of G ranks, then all-reduce of the 1/G shard across the R = n/G groups.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "shardbench/backend/backend.h"

namespace sb {

// One operation collective_perf measures: a collective of the table, or the hybrid reduction.
struct BenchOp {
  Collective collective = Collective::AllReduce;  // unused when hybrid
  bool hybrid = false;
  bool is(Collective c) const { return !hybrid && collective == c; }
  bool operator==(const BenchOp& o) const { return hybrid == o.hybrid && (hybrid || collective == o.collective); }
};
// Every operation: the table's collectives that nccl-tests measures (not the point-to-point
// send and receive), in its order, then hybrid. An operation's index
// here is its code in the result files (op columns, op_names).
const std::vector<BenchOp>& bench_ops();
int bench_op_code(BenchOp op);
const char* bench_op_name(BenchOp op);                 // all-reduce, ..., send-recv, hybrid
BenchOp parse_bench_op(const std::string& name);       // throws UsageError
std::vector<BenchOp> parse_bench_ops(const std::string& list);  // "all-reduce,all-gather" or "all"
bool is_reduction(BenchOp op);
bool is_rooted(BenchOp op);     // broadcast and reduce
bool has_in_place(BenchOp op);  // all-to-all and send/recv run out of place only

DType parse_dtype(const std::string& name);     // nccl-tests names; throws UsageError
ReduceOp parse_reduce_op(const std::string& name);

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

}  // namespace sb
