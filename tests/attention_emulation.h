// The tensor-core attention kernels (src/backend/cuda/attention_mma.h) run in the SIMT
// emulation (simt_host.h) on host tensors: the op as AttnProblem::run runs it on a backend.
// For host compilers only: tests/test_attention_mma.cpp, and tests/gpu/attention_emulation.cpp,
// which links it into the GPU tests so a GPU run compares the hardware with the emulation.
#pragma once
#ifdef __CUDACC__
#error "the SIMT emulation is host code: include this from a file the host compiler builds"
#endif
#include <cmath>
#include <cstdint>
#include <vector>

#include "../src/backend/cuda/attention_mma.h"
#include "attention_problem.h"
#include "shardbench/core/half.h"

namespace sb {
namespace emulation {

namespace ma = cuda::mma_attention;

// Runs a kernel over grid × 128 emulated threads: the stand-in for cudaLaunchKernel.
struct HostLaunch {
  template <class Kernel, class... Args>
  void operator()(simt::Dim grid, int smem, Kernel kernel, Args... args) const {
    simt::host::launch(grid, simt::Dim{ma::kThreads, 1, 1}, size_t(smem), [&] { kernel(args...); });
  }
};

inline std::vector<uint16_t> bits_of(DType t, const std::vector<float>& x) {
  std::vector<uint16_t> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = t == DType::BF16 ? float_to_bf16_bits(x[i]) : float_to_f16_bits(x[i]);
  return out;
}
inline std::vector<float> floats_of(DType t, const std::vector<uint16_t>& x) {
  std::vector<float> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = t == DType::BF16 ? bf16_bits_to_float(x[i]) : f16_bits_to_float(x[i]);
  return out;
}

template <class K>
AttnResult run(const AttnProblem& p, DType t) {
  const AttentionShape& s = p.s;
  const int64_t nq = int64_t(s.batch) * s.tq * s.ld(), nk = int64_t(s.batch) * s.tk * s.ld();
  const std::vector<uint16_t> q = bits_of(t, p.q), k = bits_of(t, p.k), v = bits_of(t, p.v),
                              dout = bits_of(t, p.dout), table = bits_of(t, p.table);
  // Outputs start as NaN (0x7fff in both types) and the workspace too: unwritten shows.
  std::vector<uint16_t> o(size_t(nq), 0x7fff), dq(size_t(nq), 0x7fff), dk(size_t(nk), 0x7fff), dv(size_t(nk), 0x7fff);
  std::vector<uint16_t> dtable = bits_of(t, std::vector<float>(p.table.size(), AttnProblem::kTableStart));
  std::vector<float> lse(size_t(s.batch) * s.heads * s.tq, NAN);
  std::vector<float> ws(size_t(attention_workspace_floats(s, p.bias)), NAN);
  const uint16_t* tab = p.bias ? table.data() : nullptr;
  const int* rel = p.bias ? p.rel.data() : nullptr;
  ma::forward<K>(HostLaunch{}, o.data(), lse.data(), q.data(), k.data(), v.data(), tab, rel, s);
  ma::backward<K>(HostLaunch{}, dq.data(), dk.data(), dv.data(), p.bias ? dtable.data() : nullptr, dout.data(),
                  q.data(), k.data(), v.data(), o.data(), lse.data(), tab, rel, ws.data(), s);
  AttnResult r{floats_of(t, o), lse, floats_of(t, dq), floats_of(t, dk), floats_of(t, dv), {}};
  if (p.bias) r.dtable = floats_of(t, dtable);
  return r;
}

}  // namespace emulation

// The op on emulated tensor cores with tensors of type t (bf16 or fp16; inputs as p holds
// them, already rounded to t).
inline AttnResult emulated_attention(const AttnProblem& p, DType t) {
  return t == DType::BF16 ? emulation::run<simt::Bf16>(p, t) : emulation::run<simt::F16>(p, t);
}

}  // namespace sb
