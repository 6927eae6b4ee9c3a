// The optimizers on host memory (backend/host_optimizer.h). Sources: torch.optim.AdamW and
// torch.optim.SGD (their documented update rules); bitsandbytes' blockwise 8-bit optimizers,
// https://github.com/bitsandbytes-foundation/bitsandbytes (bitsandbytes/functional.py
// create_dynamic_map; csrc/kernels.cu kOptimizerStatic8bit2StateBlockwise and quantize_2D;
// bitsandbytes/optim/optimizer.py Optimizer2State), read at commit 95f9af3 and written anew
// here (docs/references.md).
//
// Built with -ffp-contract=off (Makefile): every product and sum rounds on its own, so the
// auto-vectorised loops and their scalar remainders give the same bits.
#include "shardbench/backend/host_optimizer.h"

#ifdef __AVX2__
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

#include "shardbench/core/check.h"
#include "shardbench/core/half.h"

namespace sb {
namespace {

// torch.linspace(0.1, 1, steps) in float32 as PyTorch's CPU kernel computes it: step =
// (end - start) / (steps - 1); the first half counted from start, the second from end.
std::vector<float> linspace_f32(int steps) {
  const float start = 0.1f, end = 1.f, step = (end - start) / float(steps - 1);
  std::vector<float> out(static_cast<size_t>(steps));
  for (int i = 0; i < steps; ++i) out[size_t(i)] = i < steps / 2 ? start + step * float(i) : end - step * float(steps - i - 1);
  return out;
}

// create_dynamic_map(signed, max_exponent_bits = 7, total_bits = 8): for each exponent i of
// 0..6, the midpoints of a float32 linspace(0.1, 1) of 2^i + 1 points (signed; 2^(i+1) + 1
// unsigned) times 10^(i - 6), and their negatives when signed; then 0 and 1, sorted. (With
// these defaults there are no "additional items" and no padding zeros: 254 + 2 codes.)
std::array<float, 256> make_dynamic_map(bool is_signed) {
  static const double kPow10[7] = {1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0};
  std::vector<float> data;
  for (int i = 0; i < 7; ++i) {
    const int items = (is_signed ? (1 << i) : (1 << (i + 1))) + 1;
    const std::vector<float> b = linspace_f32(items);
    for (int j = 0; j + 1 < items; ++j) {
      const float mean = (b[size_t(j)] + b[size_t(j) + 1]) / 2.f;
      data.push_back(float(kPow10[i] * double(mean)));  // Python: a float64 product, stored as float32
      if (is_signed) data.push_back(float(-kPow10[i] * double(mean)));
    }
  }
  data.push_back(0.f);
  data.push_back(1.f);
  SB_ASSERT(data.size() == 256, "a dynamic map of 256 codes");
  std::sort(data.begin(), data.end());
  std::array<float, 256> map{};
  std::copy(data.begin(), data.end(), map.begin());
  return map;
}

float read_f32(CBuf g, int64_t i) {
  switch (g.dtype) {
    case DType::BF16: return bf16_bits_to_float(static_cast<const uint16_t*>(g.ptr)[i]);
    case DType::F16: return f16_bits_to_float(static_cast<const uint16_t*>(g.ptr)[i]);
    default: return static_cast<const float*>(g.ptr)[i];
  }
}
// g[0..len) as fp32: the tensor itself when fp32, else converted into `tmp`.
const float* f32_of(CBuf g, int64_t i0, int64_t len, std::vector<float>& tmp) {
  if (g.dtype == DType::F32) return static_cast<const float*>(g.ptr) + i0;
  tmp.resize(size_t(len));
  for (int64_t i = 0; i < len; ++i) tmp[size_t(i)] = read_f32(g, i0 + i);
  return tmp.data();
}
void store_copy(Buf copy, int64_t i0, const float* p, int64_t len) {
  if (!copy.ptr) return;
  switch (copy.dtype) {
    case DType::BF16: {
      auto* d = static_cast<uint16_t*>(copy.ptr) + i0;
      for (int64_t i = 0; i < len; ++i) d[i] = float_to_bf16_bits(p[i]);
      break;
    }
    case DType::F16: {
      auto* d = static_cast<uint16_t*>(copy.ptr) + i0;
      for (int64_t i = 0; i < len; ++i) d[i] = float_to_f16_bits(p[i]);
      break;
    }
    default: std::memcpy(static_cast<float*>(copy.ptr) + i0, p, size_t(len) * 4);
  }
}

// Separate buffers (restrict) and the bias corrections folded into multipliers let the
// compiler vectorise the loops.
void adamw_kernel(const OptimizerConfig& cfg, const OptimizerStepConstants& c, float* __restrict__ p,
                  const float* __restrict__ g, float* __restrict__ m, float* __restrict__ v, int64_t n) {
  const float b1 = cfg.beta1, b2 = cfg.beta2, eps = c.eps, step_size = c.step_size, inv_bc2 = c.inv_bc2,
              unscale = cfg.grad_unscale;
  if (c.decays) {
    const float decay = c.decay;
    for (int64_t i = 0; i < n; ++i) p[i] = p[i] * decay;
  }
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i] * unscale;
    m[i] = b1 * m[i] + (1.f - b1) * gi;
    v[i] = b2 * v[i] + (1.f - b2) * gi * gi;
    p[i] -= step_size * m[i] / (std::sqrt(v[i] * inv_bc2) + eps);
  }
}

void sgd_kernel(const OptimizerConfig& c, float* __restrict__ p, const float* __restrict__ g,
                float* __restrict__ buf, int64_t n) {
  const float lr = c.lr, wd = c.weight_decay, mu = c.momentum, unscale = c.grad_unscale;
  if (buf) {
    for (int64_t i = 0; i < n; ++i) {
      float d = g[i] * unscale;
      if (wd != 0.f) d = d + wd * p[i];
      buf[i] = mu * buf[i] + d;
      p[i] = p[i] - lr * buf[i];
    }
  } else {
    for (int64_t i = 0; i < n; ++i) {
      float d = g[i] * unscale;
      if (wd != 0.f) d = d + wd * p[i];
      p[i] = p[i] - lr * d;
    }
  }
}

// The code nearest to x without a search: a table over the top 16 bits of x's order key
// (its bits made monotonic in x) gives how many midpoints (neighbouring codes' (a + b) / 2,
// in fp32 as quantize_to_map computes them) lie below every x of that bucket; the at most
// two midpoints inside the bucket are then compared with x. No branches and no gathers: on
// this machine's AMD EPYC, a branchy binary search cost 59 ms of CPU time per update of a
// t5-small block (787,456 elements), one with AVX2 gathers 17 ms, the table (with the
// branchless lookups and sign fix below) 4.6 ms (docs/performance.md §4).
struct QuantTable {
  float mid[258];             // 255 midpoints, then +inf
  uint8_t below[1 << 16];     // per bucket: midpoints below all of it
};
inline uint32_t order_key(float x) {
  const uint32_t u = float_bits(x);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
QuantTable make_table(const std::array<float, 256>& map) {
  QuantTable t;
  for (int i = 0; i < 255; ++i) t.mid[i] = (map[size_t(i)] + map[size_t(i) + 1]) * 0.5f;
  t.mid[255] = t.mid[256] = t.mid[257] = INFINITY;
  int k = 0;  // midpoints whose key is below the bucket's first key
  for (uint32_t b = 0; b < (1u << 16); ++b) {
    while (k < 255 && order_key(t.mid[k]) < (b << 16)) ++k;
    int inside = 0;  // midpoints in the bucket
    while (k + inside < 255 && uint64_t(order_key(t.mid[k + inside])) < (uint64_t(b) + 1) << 16) ++inside;
    SB_ASSERT(inside <= 2, "at most two midpoints of a quantisation map in a bucket");
    // Positive NaNs (and +inf) sort above every midpoint; they count none, as a comparison does.
    t.below[b] = uint8_t(b >= (order_key(INFINITY) >> 16) ? 0 : k);
  }
  return t;
}
const QuantTable& quant_table(bool is_signed) {
  static const QuantTable s = make_table(dynamic_map(true)), u = make_table(dynamic_map(false));
  return is_signed ? s : u;
}
inline uint8_t quantize_fast(const QuantTable& t, float x) {
  const int k = t.below[order_key(x) >> 16];
  return uint8_t(k + (t.mid[k] < x) + (t.mid[k + 1] < x));
}
void quantize_block(const QuantTable& t, const float* x, uint8_t* out, int64_t len) {
  for (int64_t i = 0; i < len; ++i) {
    float xi = x[i];
    asm("" : "+x"(xi));  // keeps the loop scalar: vectorised, its lookups become gathers
    out[i] = quantize_fast(t, xi);
  }
}

// One block of len <= 256 elements: dequantise with the old absmaxes, update the moments and
// the parameters, take the new absmaxes, requantise (bitsandbytes' order).
void adam8_block(const OptimizerConfig& cfg, const OptimizerStepConstants& c, const std::array<float, 256>& map1, const std::array<float, 256>& map2,
                 float* __restrict__ p, const float* __restrict__ g, uint8_t* __restrict__ q1, uint8_t* __restrict__ q2,
                 float* absmax1, float* absmax2, int64_t len) {
  float s1[kOptimizerBlock], s2[kOptimizerBlock];
  const float a1 = *absmax1, a2 = *absmax2, b1 = cfg.beta1, b2 = cfg.beta2, unscale = cfg.grad_unscale;
  float max1 = 0.f, max2 = 0.f;
  for (int64_t i = 0; i < len; ++i) {  // the codes' values (s1, s2 as scratch)
    unsigned c1 = q1[i], c2 = q2[i];
    asm("" : "+r"(c1), "+r"(c2));  // keeps the lookups scalar: vectorised, they become gathers (slow)
    s1[i] = map1[c1], s2[i] = map2[c2];
  }
  for (int64_t i = 0; i < len; ++i) {
    const float gi = g[i] * unscale;
    const float v = s2[i] * a2;
    s2[i] = v * b2 + (1.f - b2) * gi * gi;
    const float m = s1[i] * a1;
    s1[i] = m * b1 + (1.f - b1) * gi;
    max1 = std::max(max1, std::fabs(s1[i]));
    max2 = std::max(max2, std::fabs(s2[i]));
  }
  const float eps2 = c.eps, step_size = c.step_size;
  for (int64_t i = 0; i < len; ++i) p[i] = p[i] + step_size * (s1[i] / (std::sqrt(s2[i]) + eps2));
  if (c.decays) {
    const float decay = c.decay;
    for (int64_t i = 0; i < len; ++i) p[i] = p[i] * decay;
  }
  *absmax1 = max1, *absmax2 = max2;
  const float inv1 = max1 > 0.f ? max1 : 1.f, inv2 = max2 > 0.f ? max2 : 1.f;  // an all-zero block: x = 0
  float x1[kOptimizerBlock], x2[kOptimizerBlock];
  for (int64_t i = 0; i < len; ++i) x1[i] = s1[i] / inv1, x2[i] = s2[i] / inv2;
  quantize_block(quant_table(true), x1, q1, len);
  quantize_block(quant_table(false), x2, q2, len);
  // Keep the first moment's sign (bitsandbytes: one code towards it where the nearest has
  // the other sign).
  // The map is sorted: a code is negative exactly when it is below the code of 0. Without
  // branches (a moment's sign is a coin toss to a branch predictor).
  static const int zero = zero_code(true);
  for (int64_t i = 0; i < len; ++i) {
    const int q = q1[i];
    q1[i] = uint8_t(q + (int(s1[i] > 0.f) & int(q < zero)) - (int(s1[i] < 0.f) & int(q >= zero)));
  }
}

// Runs body(first, last) over [0, n) split at block boundaries among up to `threads` threads.
template <class Body>
void parallel_blocks(int64_t n, int threads, Body body) {
  constexpr int64_t kMinPerThread = 32768;  // below this a thread costs more than it saves
  const int64_t blocks = (n + kOptimizerBlock - 1) / kOptimizerBlock;
  const int64_t t = std::max<int64_t>(1, std::min<int64_t>(threads, n / kMinPerThread));
  if (t <= 1) return body(int64_t(0), n);
  std::vector<std::thread> pool;
  for (int64_t k = 1; k < t; ++k) {
    const int64_t first = std::min(n, blocks * k / t * kOptimizerBlock), last = std::min(n, blocks * (k + 1) / t * kOptimizerBlock);
    pool.emplace_back([=] { body(first, last); });
  }
  body(int64_t(0), std::min(n, blocks / t * kOptimizerBlock));
  for (std::thread& th : pool) th.join();
}

}  // namespace

const std::array<float, 256>& dynamic_map(bool is_signed) {
  static const std::array<float, 256> s = make_dynamic_map(true), u = make_dynamic_map(false);
  return is_signed ? s : u;
}

uint8_t quantize_to_map(const std::array<float, 256>& map, float x) {
  // The last code <= x (0 when x is below every code), by halving; then the nearer neighbour.
  int lo = 0;
  for (int step = 128; step > 0; step >>= 1)
    if (map[size_t(lo + step)] <= x) lo += step;
  if (lo == 0 && !(map[0] <= x)) return 0;
  if (lo < 255 && x > (map[size_t(lo)] + map[size_t(lo) + 1]) * 0.5f) ++lo;
  return uint8_t(lo);
}

OptimizerStepConstants optimizer_step_constants(const OptimizerConfig& cfg, int step) {
  const float bc1 = 1.f - std::pow(cfg.beta1, float(step)), bc2 = 1.f - std::pow(cfg.beta2, float(step));
  OptimizerStepConstants c;
  c.decay = 1.f - cfg.lr * cfg.weight_decay;
  c.decays = cfg.weight_decay > 0.f;
  switch (cfg.kind) {
    case OptimizerKind::AdamW: c.step_size = cfg.lr / bc1, c.inv_bc2 = 1.f / bc2, c.eps = cfg.eps; break;
    case OptimizerKind::AdamW8bit: {
      const float c2 = std::sqrt(bc2);
      c.step_size = -cfg.lr * c2 / bc1, c.eps = c2 * cfg.eps;
      break;
    }
    case OptimizerKind::Sgd: c.step_size = cfg.lr, c.decays = false; break;
  }
  return c;
}

uint8_t quantize_dynamic(bool is_signed, float x) { return quantize_fast(quant_table(is_signed), x); }

uint8_t zero_code(bool is_signed) {
  const std::array<float, 256>& m = dynamic_map(is_signed);
  return uint8_t(std::find(m.begin(), m.end(), 0.f) - m.begin());
}

void host_optimizer_init_state(const OptimizerConfig& cfg, void* state, int64_t n) {
  const int64_t bytes = optimizer_state_bytes(cfg, n);
  if (cfg.kind != OptimizerKind::AdamW8bit) {
    std::memset(state, 0, size_t(bytes));
    return;
  }
  const int64_t blocks = (n + kOptimizerBlock - 1) / kOptimizerBlock;
  auto* base = static_cast<char*>(state);
  std::memset(base, 0, size_t(8 * blocks));
  std::memset(base + 8 * blocks, zero_code(true), size_t(n));
  std::memset(base + 8 * blocks + n, zero_code(false), size_t(n));
}

void host_optimizer_update(const OptimizerConfig& cfg, int step, float* param, CBuf grad, void* state, int64_t n,
                           Buf copy, int threads) {
  if (n <= 0) return;
  constexpr int64_t kChunk = 16 * kOptimizerBlock;  // cache-sized: the copy reads what was just written
  const OptimizerStepConstants c = optimizer_step_constants(cfg, step);
  switch (cfg.kind) {
    case OptimizerKind::AdamW: {
      float* m = static_cast<float*>(state);
      float* v = m + n;
      parallel_blocks(n, threads, [&](int64_t first, int64_t last) {
        std::vector<float> tmp;
        for (int64_t i0 = first; i0 < last; i0 += kChunk) {
          const int64_t len = std::min(kChunk, last - i0);
          adamw_kernel(cfg, c, param + i0, f32_of(grad, i0, len, tmp), m + i0, v + i0, len);
          store_copy(copy, i0, param + i0, len);
        }
      });
      break;
    }
    case OptimizerKind::Sgd: {
      float* buf = cfg.momentum != 0.f ? static_cast<float*>(state) : nullptr;
      parallel_blocks(n, threads, [&](int64_t first, int64_t last) {
        std::vector<float> tmp;
        for (int64_t i0 = first; i0 < last; i0 += kChunk) {
          const int64_t len = std::min(kChunk, last - i0);
          sgd_kernel(cfg, param + i0, f32_of(grad, i0, len, tmp), buf ? buf + i0 : nullptr, len);
          store_copy(copy, i0, param + i0, len);
        }
      });
      break;
    }
    case OptimizerKind::AdamW8bit: {
      const int64_t blocks = (n + kOptimizerBlock - 1) / kOptimizerBlock;
      float* absmax1 = static_cast<float*>(state);
      float* absmax2 = absmax1 + blocks;
      uint8_t* q1 = reinterpret_cast<uint8_t*>(absmax2 + blocks);
      uint8_t* q2 = q1 + n;
      const std::array<float, 256>&map1 = dynamic_map(true), &map2 = dynamic_map(false);
      parallel_blocks(n, threads, [&](int64_t first, int64_t last) {
        std::vector<float> tmp;
        for (int64_t i0 = first; i0 < last; i0 += kChunk) {
          const int64_t len = std::min(kChunk, last - i0);
          const float* g = f32_of(grad, i0, len, tmp);
          for (int64_t b0 = 0; b0 < len; b0 += kOptimizerBlock) {
            const int64_t blk = (i0 + b0) / kOptimizerBlock;
            adam8_block(cfg, c, map1, map2, param + i0 + b0, g + b0, q1 + i0 + b0, q2 + i0 + b0, absmax1 + blk,
                        absmax2 + blk, std::min(kOptimizerBlock, len - b0));
          }
          store_copy(copy, i0, param + i0, len);
        }
      });
      break;
    }
  }
}

}  // namespace sb
