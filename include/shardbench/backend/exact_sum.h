// Sums rounded once: the exact value of a sum of products of floats, rounded to the nearest
// float (ties to even). The CPU backend computes with them under ComputeOptions::exact_sums,
// which --check's tensor-parallel lockstep sets (docs/reliability.md): an element then depends
// on its own row and column only, never on the GEMM's shape or its blocking, and carries
// exactly one rounding. Slower than BLAS (about one double multiply-add per term).
#pragma once
#include <cstdint>

namespace sb {

// C[m, n] (ldc) = alpha op(A) op(B) + beta C, row-major, each element computed exactly and
// rounded once (C is not read when beta is 0). op(A) is [m, k], op(B) is [k, n].
void exact_sgemm(bool ta, bool tb, int m, int n, int k, float alpha, const float* a, int lda, const float* b,
                 int ldb, float beta, float* c, int ldc);

// Σ x[i], computed exactly and rounded once.
float exact_sum(const float* x, int64_t n);

}  // namespace sb
