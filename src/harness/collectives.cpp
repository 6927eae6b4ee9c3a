#include "shardbench/collectives.h"

#include <algorithm>
#include <cctype>
#include <cmath>

#include "shardbench/check.h"

namespace sb {

const char* bench_op_name(BenchOp op) {
  return op == BenchOp::Hybrid ? "hybrid" : collective_name(as_collective(op));
}

Collective as_collective(BenchOp op) {
  SB_ASSERT(op != BenchOp::Hybrid && int(op) >= 0 && op < BenchOp::kCount, "not a single collective");
  return Collective(int(op));
}

BenchOp parse_bench_op(const std::string& name) {
  for (int i = 0; i < int(BenchOp::kCount); ++i)
    if (name == bench_op_name(BenchOp(i))) return BenchOp(i);
  std::string allowed;
  for (int i = 0; i < int(BenchOp::kCount); ++i) allowed += std::string(i ? ", " : "") + bench_op_name(BenchOp(i));
  throw UsageError("unknown operation '" + name + "' (allowed: " + allowed + ", all)");
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
      for (int i = 0; i < int(BenchOp::kCount); ++i)
        if (BenchOp(i) != BenchOp::Hybrid) add(BenchOp(i));
    } else {
      add(parse_bench_op(name));
    }
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return ops;
}

bool is_reduction(BenchOp op) {
  return op == BenchOp::AllReduce || op == BenchOp::ReduceScatter || op == BenchOp::Reduce || op == BenchOp::Hybrid;
}

bool has_in_place(BenchOp op) { return op != BenchOp::AllToAll && op != BenchOp::SendRecv; }

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

int64_t parse_size(const std::string& flag, const std::string& text) {
  const std::string bad = flag + " '" + text + "' is not allowed (a positive size such as 64, 1K, 16M, 1G)";
  size_t pos = 0;
  long double v = 0;
  try {
    v = std::stold(text, &pos);
  } catch (...) {
    throw UsageError(bad);
  }
  std::string unit = text.substr(pos);
  for (char& c : unit) c = char(std::toupper(c));
  if (unit == "B") unit = "";
  const long double mult = unit.empty() ? 1 : unit == "K" || unit == "KB" || unit == "KIB" ? 1024.0L
                           : unit == "M" || unit == "MB" || unit == "MIB"                 ? 1048576.0L
                           : unit == "G" || unit == "GB" || unit == "GIB"                 ? 1073741824.0L
                                                                                          : -1;
  if (mult < 0 || !(v > 0)) throw UsageError(bad);
  const long double bytes = v * mult;
  if (bytes < 1 || bytes > 1e15L) throw UsageError(bad);
  return int64_t(bytes);
}

BenchSizes bench_sizes(BenchOp op, int64_t size_bytes, DType dtype, int n, int shard) {
  const int64_t es = dtype_size(dtype);
  BenchSizes s;
  int64_t count = size_bytes / es;
  switch (op) {
    case BenchOp::AllReduce:
    case BenchOp::Broadcast:
    case BenchOp::Reduce:
    case BenchOp::SendRecv:
      s.send = s.recv = s.arg = count;
      break;
    case BenchOp::AllGather:  // count per rank; the size is the gathered array
      count = count / n * n;
      s.send = s.arg = count / n;
      s.recv = count;
      break;
    case BenchOp::ReduceScatter:  // the size is the scattered input
      count = count / n * n;
      s.send = count;
      s.recv = s.arg = count / n;
      break;
    case BenchOp::AllToAll:
      count = count / n * n;
      s.send = s.recv = s.arg = count;
      break;
    case BenchOp::Hybrid:
      count = count / shard * shard;
      s.send = count;
      s.recv = s.arg = count / shard;
      break;
    default: SB_FATAL("unknown operation");
  }
  s.count = count;
  s.size_bytes = count * es;
  return s;
}

int64_t bytes_sent(const OpEvent& e) {
  if (!is_communication(e.kind) || e.ranks <= 1) return 0;
  for (int i = 0; i < int(BenchOp::Hybrid); ++i)
    if (collective_kind(as_collective(BenchOp(i))) == e.kind)
      return std::llround(double(e.bytes) * bus_factor(BenchOp(i), e.ranks));
  SB_FATAL(std::string("no bus factor for ") + op_kind_name(e.kind));
}

double bus_factor(BenchOp op, int n, int shard) {
  switch (op) {
    case BenchOp::AllReduce: return 2.0 * (n - 1) / n;
    case BenchOp::AllGather:
    case BenchOp::ReduceScatter:
    case BenchOp::AllToAll: return double(n - 1) / n;
    case BenchOp::Broadcast:
    case BenchOp::Reduce:
    case BenchOp::SendRecv: return 1.0;
    case BenchOp::Hybrid: {
      // Bytes each rank moves, over the size: (G−1)/G for the reduce-scatter of S, plus
      // 2(R−1)/R of the S/G shard for the all-reduce across the R replicas.
      const int G = shard, R = n / shard;
      return double(G - 1) / G + 2.0 * (R - 1) / R / G;
    }
    default: return 0.0;
  }
}

}  // namespace sb
