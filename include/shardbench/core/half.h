// bfloat16 and IEEE half on the host: storage types and round-to-nearest-even conversions,
// bit-identical to CUDA's __float2bfloat16 / __float2half (and to PyTorch's casts). The CPU
// backend holds bf16/fp16 tensors in these and computes in fp32, as GPU kernels do.
#pragma once
#include <cstdint>
#include <cstring>

namespace sb {

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t float_to_bf16_bits(float f) {
  const uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // NaN stays NaN
  return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);                 // round to nearest even
}
inline float bf16_bits_to_float(uint16_t h) { return bits_float(uint32_t(h) << 16); }

inline uint16_t float_to_f16_bits(float f) {
  const uint32_t u = float_bits(f);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00u;            // NaN
  if (a >= 0x477ff000u) return sign | 0x7c00u;           // rounds to ≥ 65520: infinity
  if (a < 0x38800000u) {                                 // below 2^-14: subnormal or zero
    const float sub = bits_float(a) * 16777216.f;        // × 2^24: the subnormal's integer
    const uint32_t m = uint32_t(sub);
    const float rest = sub - float(m);
    return sign | uint16_t(m + (rest > 0.5f || (rest == 0.5f && (m & 1u))));
  }
  const uint32_t r = a + 0xfffu + ((a >> 13) & 1u) - 0x38000000u;  // rebias 127 → 15, round
  return sign | uint16_t(r >> 13);
}
inline float f16_bits_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0) return bits_float(sign) + (sign ? -1.f : 1.f) * float(m) * (1.f / 16777216.f);
  if (e == 31) return bits_float(sign | 0x7f800000u | (m << 13));
  return bits_float(sign | ((e + 112u) << 23) | (m << 13));
}

// Arithmetic goes through float, like a GPU kernel that loads, computes and stores.
struct bf16 {
  uint16_t bits = 0;
  bf16() = default;
  explicit bf16(float f) : bits(float_to_bf16_bits(f)) {}
  operator float() const { return bf16_bits_to_float(bits); }
};
struct f16 {
  uint16_t bits = 0;
  f16() = default;
  explicit f16(float f) : bits(float_to_f16_bits(f)) {}
  operator float() const { return f16_bits_to_float(bits); }
};
static_assert(sizeof(bf16) == 2 && sizeof(f16) == 2, "16-bit storage types");

}  // namespace sb
