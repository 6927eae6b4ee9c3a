// The collective table: every per-collective fact the code relies on, in one place.
// Bus-bandwidth factors as nccl-tests defines them (docs/references.md, "nccl-tests"):
//   all-reduce 2(n−1)/n; all-gather, reduce-scatter, all-to-all (n−1)/n;
//   broadcast, reduce, send/recv 1; a point-to-point send 1, its receive 0 (it sends nothing).
#include <cmath>

#include "shardbench/backend/backend.h"
#include "shardbench/core/check.h"

namespace sb {
namespace {

double twice_all_but_one(int n) { return 2.0 * (n - 1) / n; }  // each element out and back in a ring
double all_but_one(int n) { return double(n - 1) / n; }         // every rank's part to every other
double one(int) { return 1.0; }                                 // the whole buffer once
double none(int) { return 0.0; }                                // a receive sends nothing

constexpr int kRows = int(Collective::kCount);
const CollectiveInfo kTable[kRows] = {
    // op                     name              nccl-tests          recorded as            count                  reduces rooted in_place p2p    bus factor
    {Collective::AllReduce,     "all-reduce",     "all_reduce_perf",     OpKind::AllReduce,     CountIs::Whole,        true,   false, true, false,  twice_all_but_one},
    {Collective::AllGather,     "all-gather",     "all_gather_perf",     OpKind::AllGather,     CountIs::RankSend,     false,  false, true, false,  all_but_one},
    {Collective::ReduceScatter, "reduce-scatter", "reduce_scatter_perf", OpKind::ReduceScatter, CountIs::RankRecv,     true,   false, true, false,  all_but_one},
    {Collective::Broadcast,     "broadcast",      "broadcast_perf",      OpKind::Broadcast,     CountIs::Whole,        false,  true,  true, false,  one},
    {Collective::Reduce,        "reduce",         "reduce_perf",         OpKind::Reduce,        CountIs::Whole,        true,   true,  true, false,  one},
    {Collective::AllToAll,      "all-to-all",     "alltoall_perf",       OpKind::AllToAll,      CountIs::WholeDivided, false,  false, false, false, all_but_one},
    {Collective::SendRecv,      "send-recv",      "sendrecv_perf",       OpKind::SendRecv,      CountIs::Whole,        false,  false, false, false, one},
    {Collective::Send,          "send",           nullptr,               OpKind::Send,          CountIs::Whole,        false,  false, false, true,  one},
    {Collective::Recv,          "recv",           nullptr,               OpKind::Recv,          CountIs::Whole,        false,  false, false, true,  none},
};

// The table is indexed by the enum: a row out of place would name the wrong collective.
bool rows_in_order() {
  for (int i = 0; i < kRows; ++i)
    if (int(kTable[i].op) != i) return false;
  return true;
}

}  // namespace

const CollectiveInfo& collective_info(Collective c) {
  static const bool ordered = rows_in_order();
  SB_ASSERT(ordered, "the collective table's rows are out of order");
  SB_ASSERT(int(c) >= 0 && c < Collective::kCount, "unknown collective " + std::to_string(int(c)));
  return kTable[int(c)];
}

const CollectiveInfo* collective_info(OpKind k) {
  for (const CollectiveInfo& row : kTable)
    if (row.kind == k) return &row;
  return nullptr;
}

int64_t collective_bytes(const CollectiveArgs& a, int comm_size) {
  const CountIs count = collective_info(a.op).count;
  const bool per_rank = count == CountIs::RankSend || count == CountIs::RankRecv;
  return a.count * dtype_size(a.dtype) * (per_rank ? comm_size : 1);
}

int64_t bytes_sent(const OpEvent& e) {
  const CollectiveInfo* c = collective_info(e.kind);
  if (!c || e.ranks <= 1) return 0;
  return std::llround(double(e.bytes) * c->bus_factor(e.ranks));
}

}  // namespace sb
