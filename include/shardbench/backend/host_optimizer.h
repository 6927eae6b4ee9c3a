// The optimizers' update (backend.h, OptimizerConfig) on plain host memory: the CPU backend's
// optimizer_update, and the host update of anything else that keeps parameters and optimizer
// state in host memory (CPU offload). It depends on no backend class.
//
// A region's state (optimizer_state_bytes(cfg, n) bytes, at least 8-byte aligned):
//   adamw       float m[n], then float v[n]
//   sgd         float momentum_buffer[n]   (nothing with momentum 0)
//   adamw-8bit  float absmax1[B], float absmax2[B], uint8 code1[n], uint8 code2[n],
//               B = ceil(n / kOptimizerBlock); block b holds elements [256 b, 256 b + 256) of
//               the region; m[i] = dynamic_map(true)[code1[i]] · absmax1[i / 256],
//               v[i] = dynamic_map(false)[code2[i]] · absmax2[i / 256]
//
// Deterministic per element: an element's new value depends only on its own inputs (and, for
// adamw-8bit, its block's), never on the region's length, where a vector body ends or the
// thread count. The file is compiled without floating-point contraction (no FMA), so the
// vectorised loops and their scalar tails round alike (tests/test_backend.cpp checks it).
#pragma once
#include <array>
#include <cstdint>

#include "shardbench/backend/backend.h"

namespace sb {

// bitsandbytes' dynamic (tree) quantisation map, functional.create_dynamic_map(signed) with
// its defaults (7 exponent bits, 8 bits): 256 codes in ascending order, in [-1, 1] signed (the
// first moment), [0, 1] unsigned (the second); both hold 0 and 1.
const std::array<float, 256>& dynamic_map(bool is_signed);
// The index of the code nearest to x in a sorted map (x beyond the ends: the end code). As
// bitsandbytes' quantize_2D: between neighbouring codes a and b, b when x > (a + b) / 2.
uint8_t quantize_to_map(const std::array<float, 256>& map, float x);
// quantize_to_map(dynamic_map(is_signed), x) for x in [-1, 1] (what a moment over its block's
// absmax is) or NaN (0), by a table instead of a search: what the host update runs.
uint8_t quantize_dynamic(bool is_signed, float x);
// The index of the code 0.
uint8_t zero_code(bool is_signed);

// The step's scalars every implementation (host and CUDA) derives from the config the same way.
struct OptimizerStepConstants {
  float step_size = 0;  // adamw: lr / bc1; adamw-8bit: -lr·sqrt(bc2) / bc1 (bitsandbytes'); sgd: lr
  float inv_bc2 = 0;    // adamw: 1 / bc2
  float eps = 0;        // adamw: eps; adamw-8bit: eps·sqrt(bc2)
  float decay = 1;      // adamw, adamw-8bit: 1 - lr·weight_decay
  bool decays = false;  // weight_decay > 0 (adamw, adamw-8bit)
};
// bc1 = 1 - beta1^step, bc2 = 1 - beta2^step in fp32 (std::pow), as the suite's Adam always did.
OptimizerStepConstants optimizer_step_constants(const OptimizerConfig& cfg, int step);

// Zero moments: adamw and sgd all zero bytes; adamw-8bit every absmax 0 and every code the
// code of 0.
void host_optimizer_init_state(const OptimizerConfig& cfg, void* state, int64_t n);

// One step of the optimizer over a region of n parameters: param (fp32) and state in place,
// grad of any training precision (read as fp32, times cfg.grad_unscale), copy (may be null)
// the new parameters rounded to its type. `threads` >= 1 threads split the region at block
// boundaries (the result is the same for any count).
void host_optimizer_update(const OptimizerConfig& cfg, int step, float* param, CBuf grad, void* state, int64_t n,
                           Buf copy = {}, int threads = 1);

}  // namespace sb
