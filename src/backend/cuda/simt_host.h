// Host emulation of the CUDA execution model for kernels written against simt.h (included
// from there; CPU tests only). A launch runs its blocks one after another; every thread of
// a block is a fiber (ucontext) with its own stack, resumed round-robin on the calling
// thread. A fiber runs until it enters a collective operation — __syncthreads (the block),
// a shuffle or mma.sync (its warp) — and yields there until every participant has entered;
// the last one to enter computes the results for all. So kernel code between collectives
// runs as written, per thread, and the collectives follow their definitions:
//   __shfl_xor_sync(full mask, v, m): lane l receives lane (l ^ m)'s v;
//   mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32: the warp's fragments are
//     gathered into A (16×16), B (16×8) and C (16×8) by the PTX ISA's fragment tables
//     ("Matrix Fragments for mma.m16n8k16 with floating point type"), D = A·B + C with
//     products and sums in double, rounded once to fp32, and scattered back.
// What it cannot show: timing, bank conflicts, register spills, memory-model races between
// threads that a real GPU interleaves differently (fibers never run concurrently), and the
// tensor cores' own fp32 accumulation order (it rounds once; hardware may differ in the last
// bits). Shared memory starts as 0xff bytes (NaN in every float type), so a read of shared
// memory no thread wrote shows up in the results. A collective entered by part of a warp
// or block (a divergent __syncthreads) is reported as a deadlock, and an exception inside a
// fiber (SB_ASSERT) ends the launch with its message.
#pragma once
#include <ucontext.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "shardbench/core/half.h"

namespace sb {
namespace simt {
namespace host {

// What a fiber sees of itself (threadIdx.x, blockIdx, dynamic shared memory).
struct ThreadView {
  int thread = 0;
  Dim block;
  unsigned char* smem = nullptr;
};

struct WarpExchange {
  int kind = 0;  // of the collective in progress: 1 shuffle, 2 mma bf16, 3 mma f16
  int arrived = 0;
  unsigned generation = 0;
  float in[32] = {}, out[32] = {};
  int lane_mask[32] = {};
  uint32_t a[32][4] = {}, b[32][2] = {};
  float c[32][4] = {}, d[32][4] = {};
};

struct Fiber {
  ucontext_t context;
  std::vector<char> stack;
  ThreadView view;
  bool done = false;
};

struct Machine {
  static constexpr size_t kStack = 256 * 1024;
  ucontext_t scheduler;
  std::vector<Fiber> fibers;
  Fiber* current = nullptr;
  const std::function<void()>* body = nullptr;
  std::vector<unsigned char> smem;
  std::vector<WarpExchange> warps;
  int threads = 0, block_arrived = 0;
  unsigned block_generation = 0;
  bool progress = false;
  std::string error;
};

inline Machine& machine() {
  static thread_local Machine m;
  return m;
}
inline const ThreadView& current() { return machine().current->view; }

inline void yield() {
  Machine& m = machine();
  swapcontext(&m.current->context, &m.scheduler);
}

inline void fiber_entry() {
  Machine& m = machine();
  try {
    (*m.body)();
  } catch (const std::exception& e) {
    if (m.error.empty()) m.error = "thread " + std::to_string(m.current->view.thread) + ": " + e.what();
  }
  m.current->done = true;
  m.progress = true;
}  // returns to the scheduler (uc_link)

inline void syncthreads() {
  Machine& m = machine();
  const unsigned gen = m.block_generation;
  m.progress = true;
  if (++m.block_arrived == m.threads) {
    m.block_arrived = 0;
    ++m.block_generation;
    return;
  }
  while (m.block_generation == gen) yield();
}

// Enters a warp collective of `kind`: fill(exchange, lane) deposits this lane's operands;
// the last lane to enter runs compute(exchange) for the whole warp.
template <class Fill, class Compute>
void warp_collective(int kind, Fill&& fill, Compute&& compute) {
  Machine& m = machine();
  const int t = m.current->view.thread, lane = t % 32;
  WarpExchange& w = m.warps[size_t(t / 32)];
  if (w.arrived == 0) w.kind = kind;
  if (w.kind != kind) throw std::logic_error("lanes of one warp entered different collectives");
  fill(w, lane);
  const unsigned gen = w.generation;
  const int lanes = std::min(32, m.threads - t / 32 * 32);
  m.progress = true;
  if (++w.arrived == lanes) {
    compute(w);
    w.arrived = 0;
    ++w.generation;
    return;
  }
  while (w.generation == gen) yield();
}

inline float shfl_xor(float v, int lane_mask) {
  const int lane = current().thread % 32;
  float result = 0.f;
  warp_collective(
      1, [&](WarpExchange& w, int l) { w.in[l] = v, w.lane_mask[l] = lane_mask; },
      [](WarpExchange& w) {
        for (int l = 0; l < 32; ++l) w.out[l] = w.in[(l ^ w.lane_mask[l]) & 31];
      });
  result = machine().warps[size_t(current().thread / 32)].out[lane];
  return result;
}

// The PTX ISA's fragment tables for mma.m16n8k16 (.bf16/.f16 A and B, .f32 C and D), with
// groupID = lane >> 2 and threadID_in_group = lane % 4. Element i of a lane's fragment:
//   A (row-major 16×16, 8 elements in 4 registers, low half first):
//     row = groupID for i in {0,1,4,5}, groupID + 8 otherwise;
//     col = threadID_in_group·2 + (i & 1), + 8 for i ≥ 4
//   B (16×8 "col", 4 elements in 2 registers):
//     row = threadID_in_group·2 + (i & 1), + 8 for i ≥ 2;  col = groupID
//   C, D (16×8 fp32, 4 elements):
//     row = groupID for i < 2, groupID + 8 otherwise;  col = threadID_in_group·2 + (i & 1)
struct FragmentTables {
  static int a_row(int lane, int i) { return (lane >> 2) + ((i == 2 || i == 3 || i == 6 || i == 7) ? 8 : 0); }
  static int a_col(int lane, int i) { return (lane % 4) * 2 + (i & 1) + (i >= 4 ? 8 : 0); }
  static int b_row(int lane, int i) { return (lane % 4) * 2 + (i & 1) + (i >= 2 ? 8 : 0); }
  static int b_col(int lane, int) { return lane >> 2; }
  static int c_row(int lane, int i) { return (lane >> 2) + (i >= 2 ? 8 : 0); }
  static int c_col(int lane, int i) { return (lane % 4) * 2 + (i & 1); }
};

inline float half_bits(bool f16, uint16_t h) { return f16 ? f16_bits_to_float(h) : bf16_bits_to_float(h); }
inline uint16_t element(uint32_t reg, int i) { return uint16_t(i & 1 ? reg >> 16 : reg & 0xffffu); }

// The warp's D = A·B + C from its 32 lanes' fragments.
inline void mma_compute(bool f16, WarpExchange& w) {
  double A[16][16] = {}, B[16][8] = {}, C[16][8] = {};
  using T = FragmentTables;
  for (int l = 0; l < 32; ++l) {
    for (int i = 0; i < 8; ++i) A[T::a_row(l, i)][T::a_col(l, i)] = half_bits(f16, element(w.a[l][i / 2], i));
    for (int i = 0; i < 4; ++i) B[T::b_row(l, i)][T::b_col(l, i)] = half_bits(f16, element(w.b[l][i / 2], i));
    for (int i = 0; i < 4; ++i) C[T::c_row(l, i)][T::c_col(l, i)] = w.c[l][i];
  }
  for (int l = 0; l < 32; ++l)
    for (int i = 0; i < 4; ++i) {
      const int r = T::c_row(l, i), c = T::c_col(l, i);
      double x = C[r][c];
      for (int k = 0; k < 16; ++k) x += A[r][k] * B[k][c];
      w.d[l][i] = float(x);
    }
}

inline void mma(bool f16, float d[4], const uint32_t a[4], const uint32_t b[2]) {
  const int lane = current().thread % 32;
  warp_collective(
      f16 ? 3 : 2,
      [&](WarpExchange& w, int l) {
        std::memcpy(w.a[l], a, sizeof w.a[l]);
        std::memcpy(w.b[l], b, sizeof w.b[l]);
        std::memcpy(w.c[l], d, sizeof w.c[l]);
      },
      [&](WarpExchange& w) { mma_compute(f16, w); });
  std::memcpy(d, machine().warps[size_t(current().thread / 32)].d[lane], 4 * sizeof(float));
}

// Runs body() as every thread of every block of grid (blocks in x, then y, then z order)
// with `smem` bytes of dynamic shared memory per block. Throws std::runtime_error naming a
// deadlock or the first exception a thread threw.
inline void launch(Dim grid, Dim block, size_t smem, const std::function<void()>& body) {
  Machine& m = machine();
  m.threads = block.count();
  if (m.fibers.size() < size_t(m.threads)) m.fibers.resize(size_t(m.threads));
  m.body = &body;
  m.error.clear();
  for (int bz = 0; bz < grid.z; ++bz)
    for (int by = 0; by < grid.y; ++by)
      for (int bx = 0; bx < grid.x; ++bx) {
        m.smem.assign(std::max<size_t>(smem, 1), 0xff);
        m.warps.assign(size_t((m.threads + 31) / 32), WarpExchange{});
        m.block_arrived = 0;
        for (int t = 0; t < m.threads; ++t) {
          Fiber& f = m.fibers[size_t(t)];
          f.stack.resize(Machine::kStack);
          f.view = ThreadView{t, Dim{bx, by, bz}, m.smem.data()};
          f.done = false;
          getcontext(&f.context);
          f.context.uc_stack.ss_sp = f.stack.data();
          f.context.uc_stack.ss_size = f.stack.size();
          f.context.uc_link = &m.scheduler;
          makecontext(&f.context, fiber_entry, 0);
        }
        for (bool running = true; running;) {
          running = false;
          m.progress = false;
          for (int t = 0; t < m.threads; ++t) {
            Fiber& f = m.fibers[size_t(t)];
            if (f.done) continue;
            m.current = &f;
            swapcontext(&m.scheduler, &f.context);
            running |= !f.done;
          }
          if (running && !m.progress) {
            const std::string why = m.error.empty() ? "a collective that not every thread of its warp or block "
                                                      "entered (a divergent __syncthreads or shuffle)"
                                                    : m.error;
            m.current = nullptr;
            throw std::runtime_error("simt emulation: block (" + std::to_string(bx) + ", " + std::to_string(by) +
                                     ", " + std::to_string(bz) + ") deadlocked: " + why);
          }
        }
        m.current = nullptr;
        if (!m.error.empty()) throw std::runtime_error("simt emulation: " + m.error);
      }
}

}  // namespace host
}  // namespace simt
}  // namespace sb
