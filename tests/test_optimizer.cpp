// The optimizers (--optimizer) on host memory (backend/host_optimizer.h): each against a
// plain scalar reference written from the update rules (torch.optim.AdamW, torch.optim.SGD,
// bitsandbytes' blockwise 8-bit AdamW), bitsandbytes' quantisation maps, a step computed by
// hand, independence of the region's length and the thread count, the state's bytes.
// Built with -ffp-contract=off, as the implementation, so the reference can match bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "shardbench/backend/backend.h"
#include "shardbench/backend/host_optimizer.h"
#include "shardbench/core/check.h"
#include "shardbench/core/half.h"
#include "shardbench/core/rng.h"

using namespace sb;

namespace {

std::vector<float> random(int64_t n, uint64_t key, float scale) {
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) x[static_cast<size_t>(i)] = scale * uniform_pm1(key, uint64_t(i));
  return x;
}

OptimizerConfig config(OptimizerKind k, float wd) {
  OptimizerConfig c;
  c.kind = k;
  c.lr = 1e-2f;
  c.weight_decay = wd;
  c.grad_unscale = 0.5f;
  return c;
}

// ---- the scalar references: one element (one block for 8-bit) at a time, straight from the rules ----
void ref_adamw(const OptimizerConfig& c, int step, float& p, float g, float& m, float& v) {
  const float bc1 = 1.f - std::pow(c.beta1, float(step)), bc2 = 1.f - std::pow(c.beta2, float(step));
  if (c.weight_decay > 0.f) p = p * (1.f - c.lr * c.weight_decay);  // torch.optim.AdamW: decay first
  g = g * c.grad_unscale;
  m = c.beta1 * m + (1.f - c.beta1) * g;
  v = c.beta2 * v + (1.f - c.beta2) * g * g;
  p -= (c.lr / bc1) * m / (std::sqrt(v * (1.f / bc2)) + c.eps);
}
void ref_sgd(const OptimizerConfig& c, float& p, float g, float* buf) {
  float d = g * c.grad_unscale;
  if (c.weight_decay != 0.f) d = d + c.weight_decay * p;  // torch.optim.SGD: L2 into the gradient
  if (buf) *buf = c.momentum * *buf + d, d = *buf;
  p = p - c.lr * d;
}
// Nearest code by a linear scan (the implementation halves): between neighbours a < b, b
// when x > (a + b) / 2.
int ref_quantize(const std::array<float, 256>& map, float x) {
  int c = 0;
  for (int i = 0; i < 256; ++i)
    if (map[static_cast<size_t>(i)] <= x) c = i;
  if (c < 255 && x > (map[static_cast<size_t>(c)] + map[static_cast<size_t>(c) + 1]) * 0.5f) ++c;
  return c;
}
// bitsandbytes' kOptimizerStatic8bit2StateBlockwise on one block.
void ref_adam8_block(const OptimizerConfig& c, int step, float* p, const float* g, uint8_t* q1, uint8_t* q2,
                     float& a1, float& a2, int len) {
  const auto &map1 = dynamic_map(true), &map2 = dynamic_map(false);
  const float c1 = 1.f - std::pow(c.beta1, float(step)), c2 = std::sqrt(1.f - std::pow(c.beta2, float(step)));
  const float step_size = -c.lr * c2 / c1;
  std::vector<float> s1(static_cast<size_t>(len)), s2(static_cast<size_t>(len));
  float m1 = 0, m2 = 0;
  for (int i = 0; i < len; ++i) {
    const float gi = g[i] * c.grad_unscale;
    s2[static_cast<size_t>(i)] = map2[q2[i]] * a2 * c.beta2 + (1.f - c.beta2) * gi * gi;
    s1[static_cast<size_t>(i)] = map1[q1[i]] * a1 * c.beta1 + (1.f - c.beta1) * gi;
    m1 = std::max(m1, std::fabs(s1[static_cast<size_t>(i)]));
    m2 = std::max(m2, std::fabs(s2[static_cast<size_t>(i)]));
  }
  for (int i = 0; i < len; ++i) {
    p[i] = p[i] + step_size * (s1[static_cast<size_t>(i)] / (std::sqrt(s2[static_cast<size_t>(i)]) + c2 * c.eps));
    if (c.weight_decay > 0.f) p[i] = p[i] * (1.f - c.lr * c.weight_decay);  // bitsandbytes: decay after
    int k = ref_quantize(map1, s1[static_cast<size_t>(i)] / (m1 > 0 ? m1 : 1.f));
    if (s1[static_cast<size_t>(i)] > 0 && map1[static_cast<size_t>(k)] < 0) ++k;
    if (s1[static_cast<size_t>(i)] < 0 && map1[static_cast<size_t>(k)] >= 0) --k;
    q1[i] = uint8_t(k);
    q2[i] = uint8_t(ref_quantize(map2, s2[static_cast<size_t>(i)] / (m2 > 0 ? m2 : 1.f)));
  }
  a1 = m1, a2 = m2;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

}  // namespace

TEST(Optimizer, NamesParseAndRefuse) {
  for (OptimizerKind k : {OptimizerKind::AdamW, OptimizerKind::AdamW8bit, OptimizerKind::Sgd})
    EXPECT_EQ(parse_optimizer(optimizer_name(k), "--optimizer"), k);
  try {
    parse_optimizer("adam", "--optimizer");
    FAIL() << "no UsageError";
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(), "--optimizer 'adam' is not allowed (allowed: adamw, adamw-8bit, sgd)");
  }
}

TEST(Optimizer, StateBytesAndLayout) {
  OptimizerConfig a = config(OptimizerKind::AdamW, 0), s = config(OptimizerKind::Sgd, 0),
                  q = config(OptimizerKind::AdamW8bit, 0);
  EXPECT_EQ(optimizer_state_bytes(a, 1000), 8000);
  EXPECT_EQ(optimizer_state_bytes(s, 1000), 4000);
  s.momentum = 0;
  EXPECT_EQ(optimizer_state_bytes(s, 1000), 0);
  EXPECT_EQ(optimizer_state_bytes(q, 1), 2 + 8);
  EXPECT_EQ(optimizer_state_bytes(q, 256), 512 + 8);
  EXPECT_EQ(optimizer_state_bytes(q, 257), 514 + 16);
  EXPECT_EQ(optimizer_region_alignment(a), 1);
  EXPECT_EQ(optimizer_region_alignment(q), 256);
  const OptimizerStateLayout l = optimizer_state_layout(q, {1, 300, 256, 5});
  ASSERT_EQ(l.offset.size(), 4u);
  const std::vector<int64_t> expect = {0, 520, 520 + 1040, 520 + 1040 + 520};  // regions at 0, 256, 768, 1024
  EXPECT_EQ(l.offset, expect);
  EXPECT_EQ(l.bytes, optimizer_state_bytes(q, 1280));
  for (int64_t o : l.offset) EXPECT_EQ(o % 8, 0);
  const OptimizerStateLayout la = optimizer_state_layout(a, {3, 5});
  EXPECT_EQ(la.offset, (std::vector<int64_t>{0, 24}));
  EXPECT_EQ(la.bytes, 64);
}

// bitsandbytes' create_dynamic_map: 256 ascending codes, each its own nearest code.
TEST(Optimizer, DynamicMaps) {
  for (bool is_signed : {true, false}) {
    const std::array<float, 256>& m = dynamic_map(is_signed);
    for (int i = 1; i < 256; ++i) EXPECT_LT(m[static_cast<size_t>(i - 1)], m[static_cast<size_t>(i)]) << i;
    EXPECT_EQ(m[255], 1.f);
    EXPECT_EQ(m[zero_code(is_signed)], 0.f);
    for (int c = 0; c < 256; ++c) EXPECT_EQ(quantize_to_map(m, m[static_cast<size_t>(c)]), c) << c;
    EXPECT_EQ(quantize_to_map(m, 2.f), 255);
    EXPECT_EQ(quantize_to_map(m, -2.f), 0);
  }
  const auto &s = dynamic_map(true), &u = dynamic_map(false);
  // Signed: 127 negative codes, 0, 128 positive; the smallest magnitude 1e-6 · 0.55 (the one
  // midpoint of linspace(0.1, 1, 2)), the largest below 1 the last midpoint of linspace(0.1, 1, 65).
  EXPECT_EQ(zero_code(true), 127);
  EXPECT_NEAR(s[128], 5.5e-7f, 1e-12);
  EXPECT_NEAR(s[126], -5.5e-7f, 1e-12);
  EXPECT_NEAR(s[254], 1.f - 0.9f / 128, 1e-6);
  EXPECT_NEAR(s[0], -(1.f - 0.9f / 128), 1e-6);
  // Unsigned: 0 first, the smallest positive 1e-6 · 0.325 (linspace(0.1, 1, 3)'s first midpoint).
  EXPECT_EQ(zero_code(false), 0);
  EXPECT_NEAR(u[1], 3.25e-7f, 1e-12);
  EXPECT_NEAR(u[254], 1.f - 0.9f / 256, 1e-6);
}

// The table the host update quantises with gives quantize_to_map's code for every x in
// [-1, 1]: at each code, each midpoint and their neighbouring floats, and at random values
// of every magnitude.
TEST(Optimizer, TableQuantisationIsTheNearestCode) {
  for (bool is_signed : {true, false}) {
    const std::array<float, 256>& m = dynamic_map(is_signed);
    std::vector<float> xs = {0.f, -0.f, 1.f, -1.f, 1e-30f, -1e-30f};
    for (int i = 0; i < 256; ++i) {
      const float mid = i < 255 ? (m[static_cast<size_t>(i)] + m[static_cast<size_t>(i) + 1]) * 0.5f : 1.f;
      for (float v : {m[static_cast<size_t>(i)], mid})
        for (float x : {v, std::nextafter(v, -2.f), std::nextafter(v, 2.f)}) xs.push_back(x);
    }
    for (int k = 0; k < 200000; ++k) {
      const float u = uniform_pm1(7, uint64_t(k));
      xs.push_back(u * std::pow(10.f, -float(k % 9)));  // 1 down to 1e-8
    }
    int64_t wrong = 0;
    for (float x : xs)
      if (x >= -1.f && x <= 1.f) wrong += quantize_dynamic(is_signed, x) != quantize_to_map(m, x);
    EXPECT_EQ(wrong, 0) << (is_signed ? "signed" : "unsigned");
    EXPECT_EQ(quantize_dynamic(is_signed, std::nanf("")), 0);
  }
}

// One 8-bit step by hand: g = (0.5, -0.25), zero state, lr 0.1, step 1. Then m = 0.1 g =
// (0.05, -0.025), v = 0.001 g² = (2.5e-4, 6.25e-5); absmax 0.05 and 2.5e-4; each weight moves
// by lr · sign(g); m / absmax = (1, -0.5) → codes 1 and the nearest to -0.5, -0.50078125
// (a midpoint of linspace(0.1, 1, 65): 0.1 + 28.5 · 0.9/64); v / absmax = (1, 0.25) → 1 and
// 0.251171875 (0.1 + 21.5 · 0.9/128).
TEST(Optimizer, AdamW8bitStepByHand) {
  OptimizerConfig c;
  c.kind = OptimizerKind::AdamW8bit;
  c.lr = 0.1f;
  std::vector<float> p = {1.f, 1.f}, g = {0.5f, -0.25f};
  std::vector<char> state(static_cast<size_t>(optimizer_state_bytes(c, 2)));
  host_optimizer_init_state(c, state.data(), 2);
  host_optimizer_update(c, 1, p.data(), g.data(), state.data(), 2);
  EXPECT_NEAR(p[0], 0.9f, 1e-6);
  EXPECT_NEAR(p[1], 1.1f, 1e-6);
  float absmax[2];
  std::memcpy(absmax, state.data(), 8);
  const auto* q = reinterpret_cast<const uint8_t*>(state.data() + 8);
  EXPECT_FLOAT_EQ(absmax[0], 0.05f);
  EXPECT_NEAR(absmax[1], 2.5e-4f, 1e-8);  // (1 - 0.999f) is 0.000999987 in fp32
  EXPECT_EQ(q[0], 255);
  EXPECT_NEAR(dynamic_map(true)[q[1]], -0.50078125f, 1e-7);
  EXPECT_EQ(q[2], 255);
  EXPECT_NEAR(dynamic_map(false)[q[3]], 0.251171875f, 1e-7);
}

// Each optimizer against its scalar reference, bit for bit, over three steps, with a
// region that ends inside a block, fp32 and bf16 gradients, a bf16 copy.
TEST(Optimizer, MatchesScalarReference) {
  const int64_t n = 1000;
  for (OptimizerKind k : {OptimizerKind::AdamW, OptimizerKind::AdamW8bit, OptimizerKind::Sgd})
    for (float wd : {0.f, 0.1f})
      for (DType gt : {DType::F32, DType::BF16}) {
        SCOPED_TRACE(std::string(optimizer_name(k)) + " wd " + std::to_string(wd) + " " + precision_name(gt));
        const OptimizerConfig c = config(k, wd);
        std::vector<float> p = random(n, 1, 1.f), rp = p;
        std::vector<char> state(static_cast<size_t>(optimizer_state_bytes(c, n)));
        host_optimizer_init_state(c, state.data(), n);
        std::vector<float> m(static_cast<size_t>(n), 0.f), v(static_cast<size_t>(n), 0.f), a1((n + 255) / 256, 0.f), a2 = a1;
        std::vector<uint8_t> q1(static_cast<size_t>(n), zero_code(true)), q2(static_cast<size_t>(n), zero_code(false));
        std::vector<uint16_t> copy(static_cast<size_t>(n));
        for (int step = 1; step <= 3; ++step) {
          std::vector<float> g = random(n, 10 + step, 0.1f);
          std::vector<uint16_t> gb(static_cast<size_t>(n));
          if (gt == DType::BF16)
            for (int64_t i = 0; i < n; ++i) gb[static_cast<size_t>(i)] = float_to_bf16_bits(g[static_cast<size_t>(i)]), g[static_cast<size_t>(i)] = bf16_bits_to_float(gb[static_cast<size_t>(i)]);
          const CBuf grad = gt == DType::F32 ? CBuf(g.data()) : CBuf(gb.data(), DType::BF16);
          host_optimizer_update(c, step, p.data(), grad, state.data(), n, Buf(copy.data(), DType::BF16));
          if (k == OptimizerKind::AdamW)
            for (int64_t i = 0; i < n; ++i) ref_adamw(c, step, rp[static_cast<size_t>(i)], g[static_cast<size_t>(i)], m[static_cast<size_t>(i)], v[static_cast<size_t>(i)]);
          else if (k == OptimizerKind::Sgd)
            for (int64_t i = 0; i < n; ++i) ref_sgd(c, rp[static_cast<size_t>(i)], g[static_cast<size_t>(i)], &m[static_cast<size_t>(i)]);
          else
            for (int64_t b = 0; b * 256 < n; ++b)
              ref_adam8_block(c, step, rp.data() + b * 256, g.data() + b * 256, q1.data() + b * 256, q2.data() + b * 256,
                              a1[static_cast<size_t>(b)], a2[static_cast<size_t>(b)], int(std::min<int64_t>(256, n - b * 256)));
          ASSERT_TRUE(same_bits(p, rp)) << "step " << step;
          for (int64_t i = 0; i < n; ++i) ASSERT_EQ(copy[static_cast<size_t>(i)], float_to_bf16_bits(p[static_cast<size_t>(i)]));
        }
        if (k == OptimizerKind::AdamW8bit) {
          const int64_t B = (n + 255) / 256;
          EXPECT_EQ(std::memcmp(state.data(), a1.data(), static_cast<size_t>(B) * 4), 0);
          EXPECT_EQ(std::memcmp(state.data() + 4 * B, a2.data(), static_cast<size_t>(B) * 4), 0);
          EXPECT_EQ(std::memcmp(state.data() + 8 * B, q1.data(), static_cast<size_t>(n)), 0);
          EXPECT_EQ(std::memcmp(state.data() + 8 * B + n, q2.data(), static_cast<size_t>(n)), 0);
        }
      }
}

// An element's result does not depend on the region it is updated in (its length, where a
// vector body ends: --check recomputes the update over a whole unit where the run updated a
// shard) nor on the thread count.
TEST(Optimizer, DeterministicAcrossRegionsAndThreads) {
  const int64_t n = 3 * 32768 + 77;  // long enough for 3 threads, ends inside a block
  for (OptimizerKind k : {OptimizerKind::AdamW, OptimizerKind::AdamW8bit, OptimizerKind::Sgd}) {
    SCOPED_TRACE(optimizer_name(k));
    const OptimizerConfig c = config(k, 0.01f);
    auto run = [&](const std::vector<int64_t>& cuts, int threads) {
      std::vector<float> p = random(n, 3, 1.f);
      std::vector<std::vector<char>> states;
      for (size_t r = 0; r + 1 < cuts.size(); ++r) {
        states.emplace_back(static_cast<size_t>(optimizer_state_bytes(c, cuts[r + 1] - cuts[r])));
        host_optimizer_init_state(c, states.back().data(), cuts[r + 1] - cuts[r]);
      }
      for (int step = 1; step <= 3; ++step) {
        const std::vector<float> g = random(n, 20 + step, 0.1f);
        for (size_t r = 0; r + 1 < cuts.size(); ++r)
          host_optimizer_update(c, step, p.data() + cuts[r], g.data() + cuts[r], states[r].data(),
                                cuts[r + 1] - cuts[r], {}, threads);
      }
      return p;
    };
    const std::vector<float> whole = run({0, n}, 1);
    EXPECT_TRUE(same_bits(whole, run({0, n}, 2)));
    EXPECT_TRUE(same_bits(whole, run({0, n}, 3)));
    // Regions at block boundaries (8-bit's blocks are the region's own); elementwise
    // optimizers also at any element.
    EXPECT_TRUE(same_bits(whole, run({0, 256, 40960, n}, 1)));
    if (k != OptimizerKind::AdamW8bit) {
      EXPECT_TRUE(same_bits(whole, run({0, 1, 1003, 40961, n}, 2)));
    } else {  // blocks that are not the region's own quantise otherwise: why FSDP pads shards
      EXPECT_FALSE(same_bits(whole, run({0, 1003, n}, 1)));
    }
  }
  // 8-bit: padding after a region's last element (an FSDP shard's, zero gradients) changes
  // nothing of the region's elements.
  const OptimizerConfig c = config(OptimizerKind::AdamW8bit, 0);
  const int64_t m = 1000, padded = 1024;
  std::vector<float> p = random(m, 4, 1.f), pp = p;
  pp.resize(padded, 0.f);
  std::vector<char> s(static_cast<size_t>(optimizer_state_bytes(c, m))), sp(static_cast<size_t>(optimizer_state_bytes(c, padded)));
  host_optimizer_init_state(c, s.data(), m);
  host_optimizer_init_state(c, sp.data(), padded);
  for (int step = 1; step <= 3; ++step) {
    std::vector<float> g = random(m, 30 + step, 0.1f), gp = g;
    gp.resize(padded, 0.f);
    host_optimizer_update(c, step, p.data(), g.data(), s.data(), m);
    host_optimizer_update(c, step, pp.data(), gp.data(), sp.data(), padded);
  }
  pp.resize(m);
  EXPECT_TRUE(same_bits(p, pp));
}

// The CPU backend's optimizer_update is the host implementation, and records its bytes.
TEST(Optimizer, CpuBackendRunsTheHostUpdate) {
  auto b = make_backend("cpu");
  for (OptimizerKind k : {OptimizerKind::AdamW, OptimizerKind::AdamW8bit, OptimizerKind::Sgd}) {
    const OptimizerConfig c = config(k, 0.01f);
    const int64_t n = 700;
    std::vector<float> p = random(n, 5, 1.f), hp = p, g = random(n, 6, 0.1f);
    std::vector<char> s(static_cast<size_t>(optimizer_state_bytes(c, n))), hs = s;
    b->optimizer_init_state(c, s.data(), n);
    host_optimizer_init_state(c, hs.data(), n);
    EXPECT_EQ(s, hs);
    for (int step = 1; step <= 2; ++step) {
      b->optimizer_update(c, step, p.data(), g.data(), s.data(), n);
      host_optimizer_update(c, step, hp.data(), g.data(), hs.data(), n);
    }
    EXPECT_TRUE(same_bits(p, hp)) << optimizer_name(k);
    EXPECT_EQ(s, hs);
  }
}
