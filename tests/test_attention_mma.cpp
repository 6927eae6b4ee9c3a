// The tensor-core attention kernels (src/backend/cuda/attention_mma.h) on the CPU: the same
// source the GPU build compiles, run in the SIMT emulation (src/backend/cuda/simt_host.h:
// threads as fibers, shuffles and mma.sync.m16n8k16 from the PTX ISA's definitions).
//   - the emulated mma against a plain matrix product, with the kernels' own fragment
//     loaders (shared-memory tiles, global rows, accumulators reused as A operands);
//   - the emulator itself: shuffles, barriers, and a divergent barrier reported;
//   - the whole op (forward and backward, bias table and its gradient, causal mask) in bf16
//     and fp16 against the double-precision reference, on the shapes of the CPU and GPU
//     tests: tile boundaries, one key, one query, one head, head widths 8 to 128.
// What this proves and what it cannot: see simt_host.h and docs/gpu.md ("Tensor cores").
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "attention_emulation.h"
#include "attention_expect.h"
#include "shardbench/core/half.h"
#include "shardbench/core/rng.h"

namespace sb {
namespace {

namespace ma = cuda::mma_attention;
using simt::Dim;

uint16_t to_bits(DType t, float x) { return t == DType::BF16 ? float_to_bf16_bits(x) : float_to_f16_bits(x); }
float from_bits(DType t, uint16_t h) { return t == DType::BF16 ? bf16_bits_to_float(h) : f16_bits_to_float(h); }
AttnResult run_emulated(const AttnProblem& p, DType t) { return emulated_attention(p, t); }

// ---- the emulated mma and the kernels' fragment loaders

// One warp: D (16×16) = A (16×16) · B (16×16) as two n-tiles of 8, A from a shared tile
// ([row][k]), B from a tile stored [n][k]; then E = round(D) · B2 with D reused in registers
// as the A operand (a_from_accumulators). Both against products on the host.
TEST(AttentionMma, FragmentsMultiplyAsMatrices) {
  for (DType t : {DType::BF16, DType::F16}) {
    const int ld = 16 + ma::kPad;
    std::vector<float> A(256), Bt(256), B2t(256);  // Bt[n][k] = B[k][n]
    for (int i = 0; i < 256; ++i) {
      A[size_t(i)] = from_bits(t, to_bits(t, uniform_pm1(1, uint64_t(i))));
      Bt[size_t(i)] = from_bits(t, to_bits(t, uniform_pm1(2, uint64_t(i))));
      B2t[size_t(i)] = from_bits(t, to_bits(t, uniform_pm1(3, uint64_t(i))));
    }
    std::vector<uint16_t> sa(16 * ld), sb(16 * ld), sb2(16 * ld);
    for (int r = 0; r < 16; ++r)
      for (int c = 0; c < 16; ++c) {
        sa[size_t(r * ld + c)] = to_bits(t, A[size_t(r * 16 + c)]);
        sb[size_t(r * ld + c)] = to_bits(t, Bt[size_t(r * 16 + c)]);
        sb2[size_t(r * ld + c)] = to_bits(t, B2t[size_t(r * 16 + c)]);
      }
    std::vector<float> D(256, NAN), E(256, NAN);
    auto body = [&](auto kind) {
      const int lane = simt::tid();
      uint32_t a[4], b[2];
      float d[2][4] = {}, e[2][4] = {};
      ma::a_fragment(a, sa.data(), ld, 0, 0, lane);
      for (int nt = 0; nt < 2; ++nt) {
        ma::b_fragment(b, sb.data(), ld, nt * 8, 0, lane);
        simt::mma(kind, d[nt], a, b);
      }
      uint32_t da[4];
      ma::a_from_accumulators<decltype(kind)>(da, d, 0);
      for (int nt = 0; nt < 2; ++nt) {
        ma::b_fragment(b, sb2.data(), ld, nt * 8, 0, lane);
        simt::mma(kind, e[nt], da, b);
      }
      for (int nt = 0; nt < 2; ++nt)
        for (int i = 0; i < 4; ++i) {  // the C layout: rows g, g + 8; columns 2t, 2t + 1
          const int r = lane / 4 + (i >= 2 ? 8 : 0), c = nt * 8 + 2 * (lane % 4) + (i & 1);
          D[size_t(r * 16 + c)] = d[nt][i];
          E[size_t(r * 16 + c)] = e[nt][i];
        }
    };
    simt::host::launch(Dim{}, Dim{32, 1, 1}, 0, [&] {
      if (t == DType::BF16)
        body(simt::Bf16{});
      else
        body(simt::F16{});
    });
    for (int r = 0; r < 16; ++r)
      for (int c = 0; c < 16; ++c) {
        double d = 0;
        for (int k = 0; k < 16; ++k) d += double(A[size_t(r * 16 + k)]) * Bt[size_t(c * 16 + k)];
        EXPECT_EQ(D[size_t(r * 16 + c)], float(d)) << dtype_name(t) << " D " << r << " " << c;
      }
    for (int r = 0; r < 16; ++r)
      for (int c = 0; c < 16; ++c) {
        double e = 0;
        for (int k = 0; k < 16; ++k)
          e += double(from_bits(t, to_bits(t, D[size_t(r * 16 + k)]))) * B2t[size_t(c * 16 + k)];
        EXPECT_EQ(E[size_t(r * 16 + c)], float(e)) << dtype_name(t) << " E " << r << " " << c;
      }
  }
}

// Rows of a [batch*tq, heads*d_kv] tensor as the A operand, straight from global memory.
TEST(AttentionMma, GlobalFragmentsReadTheHeadsColumns) {
  const AttentionShape s{1, 3, 20, 20, 24, 8, false};  // d_kv 24: the second k-step is partial
  std::vector<uint16_t> x(size_t(s.tq * s.ld()));
  for (size_t i = 0; i < x.size(); ++i) x[i] = uint16_t(i + 1);  // each element its own bits
  const int h = 1, row0 = 16, k0 = 16;
  std::vector<uint32_t> got(32 * 4);
  simt::host::launch(Dim{}, Dim{32, 1, 1}, 0,
                     [&] { ma::global_a_fragment(&got[size_t(simt::tid()) * 4], x.data(), s, 0, row0, h, k0, simt::tid()); });
  for (int lane = 0; lane < 32; ++lane)
    for (int i = 0; i < 8; ++i) {
      const int r = row0 + lane / 4 + ((i == 2 || i == 3 || i == 6 || i == 7) ? 8 : 0);
      const int c = k0 + 2 * (lane % 4) + (i & 1) + (i >= 4 ? 8 : 0);
      const uint16_t want = r < s.tq && c < s.d_kv ? x[size_t(r * s.ld() + h * s.d_kv + c)] : 0;
      const uint32_t reg = got[size_t(lane * 4 + i / 2)];
      EXPECT_EQ(uint16_t(i & 1 ? reg >> 16 : reg & 0xffff), want) << "lane " << lane << " element " << i;
    }
}

// ---- the emulator

TEST(AttentionMma, EmulatorShufflesAndBarriers) {
  std::vector<float> shuffled(64), after_barrier(64);
  std::vector<int> written(64, 0);
  simt::host::launch(Dim{}, Dim{64, 1, 1}, 64 * sizeof(int), [&] {
    const int t = simt::tid();
    shuffled[size_t(t)] = simt::shfl_xor(float(t), 5);
    int* sm = reinterpret_cast<int*>(simt::smem());
    sm[t] = t * 10;
    simt::sync();
    after_barrier[size_t(t)] = float(sm[63 - t]);  // another warp's value: needs the barrier
    written[size_t(t)] = 1;
  });
  for (int t = 0; t < 64; ++t) {
    EXPECT_EQ(shuffled[size_t(t)], float((t & ~31) | ((t % 32) ^ 5))) << t;
    EXPECT_EQ(after_barrier[size_t(t)], float((63 - t) * 10)) << t;
    EXPECT_EQ(written[size_t(t)], 1);
  }
}

TEST(AttentionMma, EmulatorReportsADivergentBarrier) {
  EXPECT_THROW(simt::host::launch(Dim{}, Dim{64, 1, 1}, 0,
                                  [&] {
                                    if (simt::tid() < 40) simt::sync();
                                  }),
               std::runtime_error);
  try {
    simt::host::launch(Dim{}, Dim{32, 1, 1}, 0, [&] {
      if (simt::tid() == 3) throw std::logic_error("thread 3 failed");
      simt::sync();
    });
    FAIL() << "no exception";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("thread 3 failed"), std::string::npos) << e.what();
  }
}

// ---- the op against the reference
// Each output within its rounding bound with tensor cores (AttnTolerance::of(t, true): the
// one rounding of the output, and P or dS rounded to the operand type before the products
// that take them), and able to fail (expect_attention_within).
struct MmaCase {
  const char* what;
  int batch, heads, tq, tk, d_kv;
  bool causal, bias;
};
const MmaCase kMmaCases[] = {
    {"encoder self", 2, 2, 5, 5, 8, false, true},
    {"encoder self, tiles", 1, 2, 130, 130, 64, false, true},
    {"decoder self, tiles", 2, 1, 129, 129, 64, true, true},
    {"cross", 1, 2, 70, 130, 64, false, false},
    {"decoder self d128", 1, 2, 97, 97, 128, true, true},
    {"causal, tq < tk", 1, 2, 20, 90, 8, true, true},
    {"one key", 1, 2, 70, 1, 64, false, true},
    {"one key, causal d128", 2, 3, 1, 1, 128, true, true},
    {"one query", 1, 2, 1, 70, 64, false, true},
    {"one query, causal", 1, 2, 1, 70, 128, true, true},
    {"one head", 2, 1, 70, 70, 32, true, true},
    {"d_kv 40 (padded to 64)", 1, 2, 33, 47, 40, false, true},
};

TEST(AttentionMma, EmulatedKernelsMatchTheReference) {
  for (DType t : {DType::BF16, DType::F16})
    for (const MmaCase& c : kMmaCases) {
      const AttentionShape s{c.batch, c.heads, c.tq, c.tk, c.d_kv, 32, c.causal};
      AttnProblem p(s, c.bias, 500 + c.tq + c.tk);
      p.round_to(t);
      AttnResult scale;
      const AttnResult ref = p.reference(&scale), got = run_emulated(p, t);
      const std::string what = std::string(c.what) + " b" + std::to_string(c.batch) + " h" + std::to_string(c.heads) +
                               " tq " + std::to_string(c.tq) + " tk " + std::to_string(c.tk) + " d_kv " +
                               std::to_string(c.d_kv) + " " + dtype_name(t);
      const double worst =
          expect_attention_within(got, ref, scale, AttnTolerance::of(t, true), one_visible_key(s), what);
      std::printf("tensor-core attention (emulated) %-46s worst error / bound %.3f\n", what.c_str(), worst);
    }
}

// The rounding the tensor-core path adds must show (P and dS are rounded to the operand
// type), yet stay within the bound: against the CPU backend's fp32-math op on the same
// inputs the outputs differ, and the emulated kernels are deterministic.
TEST(AttentionMma, RoundsOperandsAndIsDeterministic) {
  const AttentionShape s{1, 2, 70, 70, 64, 32, true};
  AttnProblem p(s, true, 77);
  p.round_to(DType::BF16);
  const AttnResult a = run_emulated(p, DType::BF16), b = run_emulated(p, DType::BF16);
  EXPECT_EQ(a.o, b.o);
  EXPECT_EQ(a.dq, b.dq);
  EXPECT_EQ(a.dtable, b.dtable);
  auto cpu = make_backend("cpu");
  const AttnResult fma = p.run(*cpu, DType::BF16);
  EXPECT_NE(a.dq, fma.dq);
}

}  // namespace
}  // namespace sb
