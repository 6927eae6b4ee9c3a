// A map from non-null pointers to small values, for the backends' allocation ledgers (private
// to the backend: backend.cpp's Backend::Allocations; tests/test_backend.cpp checks it): asked
// on every alloc and release, hundreds of thousands of times in one memory plan, where
// std::unordered_map's node per entry and prime-modulo buckets took a fifth of the plan's
// time. Open addressing: a power-of-two table at most half full, Fibonacci hashing, linear
// probing, and deletion by shifting the probe chain back (no tombstones).
#pragma once
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace sb {

template <typename V>
class PointerMap {
 public:
  // False (and nothing changed) when the key is there already.
  bool insert(const void* key, V value) {
    if (2 * (size_ + 1) > slots_.size()) grow();
    size_t i = home(key);
    for (; slots_[i].key; i = next(i))
      if (slots_[i].key == key) return false;
    slots_[i] = {key, std::move(value)};
    ++size_;
    return true;
  }
  // Removes the key, its value into *out; false when the key is not there.
  bool take(const void* key, V* out) {
    size_t i = home(key);
    for (; slots_[i].key != key; i = next(i))
      if (!slots_[i].key) return false;
    *out = std::move(slots_[i].value);
    // Close the gap: a later entry of the chain moves back into it unless its home lies
    // cyclically in (gap, j], where it must stay to remain reachable.
    for (size_t j = next(i); slots_[j].key; j = next(j)) {
      const size_t h = home(slots_[j].key);
      const bool stays = i < j ? (i < h && h <= j) : (i < h || h <= j);
      if (!stays) slots_[i] = std::move(slots_[j]), i = j;
    }
    slots_[i].key = nullptr;
    --size_;
    return true;
  }
  const V* find(const void* key) const {
    for (size_t i = home(key); slots_[i].key; i = next(i))
      if (slots_[i].key == key) return &slots_[i].value;
    return nullptr;
  }
  size_t size() const { return size_; }
  template <typename F>
  void for_each(F f) const {  // f(key, value), in no particular order
    for (const Slot& s : slots_)
      if (s.key) f(s.key, s.value);
  }

 private:
  struct Slot {
    const void* key = nullptr;
    V value{};
  };
  size_t home(const void* key) const {
    return size_t((uint64_t(reinterpret_cast<uintptr_t>(key)) * 0x9E3779B97F4A7C15ull) >> shift_);
  }
  size_t next(size_t i) const { return (i + 1) & (slots_.size() - 1); }
  void grow() {
    std::vector<Slot> old(slots_.size() * 2);
    old.swap(slots_);
    --shift_;
    size_ = 0;
    for (Slot& s : old)
      if (s.key) insert(s.key, std::move(s.value));
  }

  std::vector<Slot> slots_ = std::vector<Slot>(16);
  size_t size_ = 0;
  int shift_ = 60;  // 64 - log2(slots_.size())
};

}  // namespace sb
