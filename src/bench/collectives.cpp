#include "shardbench/bench/collectives.h"

#include <algorithm>

#include "shardbench/core/check.h"

namespace sb {

const std::vector<BenchOp>& bench_ops() {
  static const std::vector<BenchOp> ops = [] {
    std::vector<BenchOp> v;
    for (int i = 0; i < int(Collective::kCount); ++i)  // the collectives nccl-tests measures
      if (collective_info(Collective(i)).nccl_tests) v.push_back({Collective(i), false});
    v.push_back({Collective::AllReduce, true});
    return v;
  }();
  return ops;
}

int bench_op_code(BenchOp op) {
  const auto& ops = bench_ops();
  return int(std::find(ops.begin(), ops.end(), op) - ops.begin());
}

const char* bench_op_name(BenchOp op) { return op.hybrid ? "hybrid" : collective_name(op.collective); }

BenchOp parse_bench_op(const std::string& name) {
  for (BenchOp op : bench_ops())
    if (name == bench_op_name(op)) return op;
  std::string allowed;
  for (BenchOp op : bench_ops()) allowed += std::string(allowed.empty() ? "" : ", ") + bench_op_name(op);
  throw UsageError("--ops '" + name + "' is not allowed (allowed: " + allowed + ", all)");
}

std::vector<BenchOp> parse_bench_ops(const std::string& list) {
  std::vector<BenchOp> ops;
  auto add = [&](BenchOp op) {
    if (std::find(ops.begin(), ops.end(), op) == ops.end()) ops.push_back(op);
  };
  size_t start = 0;
  while (true) {
    const size_t comma = list.find(',', start);
    const std::string name = list.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (name == "all") {  // every single collective; hybrid needs a shard size, so it is named alone
      for (BenchOp op : bench_ops())
        if (!op.hybrid) add(op);
    } else {
      add(parse_bench_op(name));
    }
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return ops;
}

bool is_reduction(BenchOp op) { return op.hybrid || collective_info(op.collective).reduces; }
bool is_rooted(BenchOp op) { return !op.hybrid && collective_info(op.collective).rooted; }
bool has_in_place(BenchOp op) { return op.hybrid || collective_info(op.collective).in_place; }

DType parse_dtype(const std::string& name) {
  for (int i = 0; i < int(DType::kCount); ++i)
    if (name == dtype_name(DType(i))) return DType(i);
  if (name == "float32" || name == "fp32") return DType::F32;
  if (name == "bf16") return DType::BF16;
  if (name == "fp16" || name == "float16") return DType::F16;
  throw UsageError("-d '" + name + "' is not allowed (allowed: float, double, int32, int64, uint8, bfloat16, half)");
}

ReduceOp parse_reduce_op(const std::string& name) {
  for (int i = 0; i < int(ReduceOp::kCount); ++i)
    if (name == reduce_op_name(ReduceOp(i))) return ReduceOp(i);
  throw UsageError("-o '" + name + "' is not allowed (allowed: sum, prod, min, max, avg)");
}

BenchSizes bench_sizes(BenchOp op, int64_t size_bytes, DType dtype, int n, int shard) {
  const int64_t es = dtype_size(dtype);
  BenchSizes s;
  int64_t count = size_bytes / es;
  // Hybrid scatters the size over the shard group, as a reduce-scatter on G ranks.
  const CountIs convention = op.hybrid ? CountIs::RankRecv : collective_info(op.collective).count;
  const int parts = op.hybrid ? shard : n;
  switch (convention) {
    case CountIs::Whole:
      s.send = s.recv = s.arg = count;
      break;
    case CountIs::WholeDivided:
      count = count / parts * parts;
      s.send = s.recv = s.arg = count;
      break;
    case CountIs::RankSend:  // count per rank; the size is the gathered array
      count = count / parts * parts;
      s.send = s.arg = count / parts;
      s.recv = count;
      break;
    case CountIs::RankRecv:  // the size is the scattered input
      count = count / parts * parts;
      s.send = count;
      s.recv = s.arg = count / parts;
      break;
  }
  s.count = count;
  s.size_bytes = count * es;
  return s;
}

double bus_factor(BenchOp op, int n, int shard) {
  if (!op.hybrid) return bus_factor(op.collective, n);
  // Bytes each rank moves, over the size: (G−1)/G for the reduce-scatter of S, plus
  // 2(R−1)/R of the S/G shard for the all-reduce across the R replicas.
  const int G = shard, R = n / shard;
  return double(G - 1) / G + 2.0 * (R - 1) / R / G;
}

}  // namespace sb
