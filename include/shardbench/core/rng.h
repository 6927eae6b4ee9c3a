// Counter-based random numbers: value i of stream `key` depends on (key, i) only, so a
// tensor, a shard of it, or a token can be generated anywhere without the rest. Same
// function on host and device.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define SB_HOST_DEVICE __host__ __device__
#else
#define SB_HOST_DEVICE
#endif

namespace sb {

SB_HOST_DEVICE inline uint64_t mix64(uint64_t x) {  // splitmix64 finaliser
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

SB_HOST_DEVICE inline uint64_t hash_index(uint64_t key, uint64_t i) { return mix64(mix64(key) ^ i); }

// Uniform in [-1, 1), 24 bits.
SB_HOST_DEVICE inline float uniform_pm1(uint64_t key, uint64_t i) {
  return float(hash_index(key, i) >> 40) * (2.0f / 16777216.0f) - 1.0f;
}

SB_HOST_DEVICE inline uint64_t combine_key(uint64_t a, uint64_t b) { return mix64(a * 0x100000001B3ull ^ b); }

}  // namespace sb
