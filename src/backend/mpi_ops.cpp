#include "shardbench/backend/mpi_ops.h"

#include <algorithm>
#include <climits>

#include "shardbench/core/check.h"
#include "shardbench/core/half.h"

namespace sb {
namespace {

template <class T, ReduceOp R>
void half_reduce(void* in, void* inout, int* len, MPI_Datatype*) {
  const T* a = static_cast<const T*>(in);
  T* b = static_cast<T*>(inout);
  for (int i = 0; i < *len; ++i) {
    const float x = a[i], y = b[i];
    switch (R) {
      case ReduceOp::Prod: b[i] = T(x * y); break;
      case ReduceOp::Min: b[i] = T(std::min(x, y)); break;
      case ReduceOp::Max: b[i] = T(std::max(x, y)); break;
      default: b[i] = T(x + y);
    }
  }
}

template <class T>
MPI_User_function* half_function(ReduceOp o) {
  switch (o) {
    case ReduceOp::Prod: return &half_reduce<T, ReduceOp::Prod>;
    case ReduceOp::Min: return &half_reduce<T, ReduceOp::Min>;
    case ReduceOp::Max: return &half_reduce<T, ReduceOp::Max>;
    default: return &half_reduce<T, ReduceOp::Sum>;
  }
}

template <class T>
void divide(void* buf, int64_t n, int by) {
  T* p = static_cast<T*>(buf);
  for (int64_t i = 0; i < n; ++i) p[i] = T(p[i] / by);
}

}  // namespace

MPI_Datatype mpi_datatype(DType t) {
  switch (t) {
    case DType::F32: return MPI_FLOAT;
    case DType::F64: return MPI_DOUBLE;
    case DType::I32: return MPI_INT32_T;
    case DType::I64: return MPI_INT64_T;
    case DType::U8: return MPI_UINT8_T;
    default: return MPI_UINT16_T;  // bfloat16, half: moved as 16-bit words
  }
}

MpiReductions::~MpiReductions() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  for (auto& [key, op] : half_ops_)
    if (!finalized) MPI_Op_free(&op);
}

MPI_Op MpiReductions::op(ReduceOp o, DType t) {
  if (t == DType::BF16 || t == DType::F16) {
    const int key = int(t) * int(ReduceOp::kCount) + int(o == ReduceOp::Avg ? ReduceOp::Sum : o);
    auto it = half_ops_.find(key);
    if (it != half_ops_.end()) return it->second;
    MPI_Op op;
    MPI_CHECK(MPI_Op_create(t == DType::BF16 ? half_function<bf16>(o) : half_function<f16>(o), 1, &op));
    return half_ops_[key] = op;
  }
  switch (o) {
    case ReduceOp::Prod: return MPI_PROD;
    case ReduceOp::Min: return MPI_MIN;
    case ReduceOp::Max: return MPI_MAX;
    default: return MPI_SUM;  // avg = sum, divided on completion (MPI has no average)
  }
}

void divide_elements(void* buf, int64_t n, DType t, int by) {
  switch (t) {
    case DType::F32: return divide<float>(buf, n, by);
    case DType::F64: return divide<double>(buf, n, by);
    case DType::I32: return divide<int32_t>(buf, n, by);
    case DType::I64: return divide<int64_t>(buf, n, by);
    case DType::U8: return divide<uint8_t>(buf, n, by);
    case DType::BF16: return divide<bf16>(buf, n, by);
    case DType::F16: return divide<f16>(buf, n, by);
    default: SB_FATAL("unknown dtype " + std::to_string(int(t)));
  }
}

int mpi_count(int64_t n) {
  SB_ASSERT(n <= INT_MAX, "collective of more than 2^31 elements");
  return int(n);
}

}  // namespace sb
