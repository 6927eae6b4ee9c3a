#include <algorithm>

#include "shardbench/core/check.h"
#include "shardbench/core/rng.h"
#include "shardbench/model/t5.h"

namespace sb {

Tokens make_tokens(uint64_t seed, int step, int64_t first_sequence, const StepShape& shape,
                   int64_t vocab) {
  Tokens t;
  const int64_t B = shape.batch, Te = shape.enc_len, Td = shape.dec_len;
  t.enc_ids.resize(B * Te);
  t.dec_ids.resize(B * Td);
  t.labels.resize(B * Td);
  for (int64_t b = 0; b < B; ++b) {
    const uint64_t key = combine_key(combine_key(seed, uint64_t(step)), uint64_t(first_sequence + b));
    for (int64_t i = 0; i < Te; ++i) t.enc_ids[b * Te + i] = int(hash_index(key, i) % vocab);
    for (int64_t i = 0; i < Td; ++i) t.labels[b * Td + i] = int(hash_index(key, Te + i) % vocab);
    t.dec_ids[b * Td] = 0;
    for (int64_t i = 1; i < Td; ++i) t.dec_ids[b * Td + i] = t.labels[b * Td + i - 1];
  }
  return t;
}

void init_unit_params(Backend& b, const UnitSpec& u, uint64_t seed, float* dst, int64_t first, int64_t count) {
  const int64_t last = first + count;
  for (const TensorSpec& t : u.tensors) {
    const int64_t lo = std::max(first, t.offset), hi = std::min(last, t.offset + t.numel());
    if (lo >= hi) continue;
    float* out = dst + (lo - first);
    if (t.init == InitKind::Ones) {
      b.fill(out, 1.0f, hi - lo);
    } else if (b.holds_data()) {  // the plan's backend holds no values: no loop over a partitioned tensor's rows
      // Element e of the full tensor gets u(key, e), so a tensor-parallel rank's block (its
      // rows, or in each row its columns) initialises to the full tensor's values there.
      const uint64_t key = combine_key(combine_key(seed, uint64_t(t.stream_block)), uint64_t(t.stream_index));
      for (int64_t e = lo - t.offset; e < hi - t.offset;) {
        const int64_t r = e / t.cols, c = e % t.cols;
        const int64_t run = t.cols == t.full_cols ? hi - t.offset - e : std::min(t.cols - c, hi - t.offset - e);
        b.init_uniform(out, run, key, t.full_index(r, c), t.init_scale);
        out += run;
        e += run;
      }
    }
  }
  if (last > u.numel) {  // padding of the last shard
    const int64_t lo = std::max(first, u.numel);
    b.fill(dst + (lo - first), 0.0f, last - lo);
  }
}

}  // namespace sb
