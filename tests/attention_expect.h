// GoogleTest checks of a fused-attention result against the double-precision reference
// (attention_problem.h), shared by the CPU tests, the tensor-core emulation tests and the
// GPU tests: each output within its rounding bound (AttnTolerance), and each output that is
// not a cancellation checked to be able to fail (a zero output would exceed the bound).
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "attention_problem.h"

namespace sb {

// Every score row sees one key (one key, or the causal first row of one query): P = 1 and
// dS = P(dP − D) = 0 up to rounding, so dq, dk and the table's gradient are cancellations.
inline bool one_visible_key(const AttentionShape& s) { return s.tk == 1 || (s.tq == 1 && s.causal); }

// Returns the worst error ratio (≤ 1 passes) over the six outputs.
inline double expect_attention_within(const AttnResult& got, const AttnResult& ref, const AttnResult& scale,
                                      const AttnTolerance& tol, bool cancels, const std::string& what) {
  double worst = 0;
  const auto g = attention_outputs(got), r = attention_outputs(ref), m = attention_outputs(scale);
  for (int x = 0; x < int(g.size()); ++x) {
    if (r[x].second->empty()) {  // no table: no table gradient
      EXPECT_TRUE(g[x].second->empty()) << what << " " << g[x].first;
      continue;
    }
    const double e = attention_error_ratio(*g[x].second, *r[x].second, *m[x].second, tol, x);
    worst = std::max(worst, e);
    EXPECT_LE(e, 1.0) << what << " " << g[x].first << ": error / bound";
    const bool cancellation = cancels && (x == 2 || x == 3 || x == 5);  // dq, dk, dtable
    if (!cancellation) {
      const std::vector<float> zero(r[x].second->size(), x == 5 ? AttnProblem::kTableStart : 0.f);
      EXPECT_GT(attention_error_ratio(zero, *r[x].second, *m[x].second, tol, x), 2.0)
          << what << " " << g[x].first << ": the bound cannot tell a zero output from the right one";
    }
  }
  return worst;
}

}  // namespace sb
