// PtrMap: open-addressing map from a block's address to its Block (the allocator's
// active_blocks, docs/pytorch-allocator.md §2.1). Linear probing, backward-shift deletion, no tombstones; grows
// at 1/2 load, so lookups stay a probe or two and the cached hot path never allocates.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

namespace cachet::gpu::detail {

template <class V>
class PtrMap {
 public:
  PtrMap() { slots_.resize(mask_ + 1); }

  V* find(std::uint64_t key) const {
    const std::size_t i = slot_of(key);
    return i == npos ? nullptr : slots_[i].value;
  }

  // key must be non-zero and absent.
  void insert(std::uint64_t key, V* value) {
    if ((size_ + 1) * 2 > mask_ + 1) grow();
    place(key, value);
    ++size_;
  }

  bool erase(std::uint64_t key) {
    const std::size_t i = slot_of(key);
    if (i == npos) return false;
    erase_slot(i);
    return true;
  }

  // One probe for a find followed by an erase (free's): the slot holding `key`, or npos; its
  // value; erasing it (the slot index is valid until the next insert or erase).
  static constexpr std::size_t npos = ~std::size_t{0};
  std::size_t slot_of(std::uint64_t key) const {
    std::size_t i = index(key);
    for (;;) {
      if (slots_[i].key == key) return i;
      if (slots_[i].key == 0) return npos;
      i = (i + 1) & mask();
    }
  }
  V* value_at(std::size_t i) const { return slots_[i].value; }
  void erase_slot(std::size_t i) {
    // backward shift
    std::size_t j = i;
    for (;;) {
      j = (j + 1) & mask();
      if (slots_[j].key == 0) break;
      std::size_t home = index(slots_[j].key);
      // move j into i if home is not cyclically in (i, j]
      bool in_range = (i < j) ? (home > i && home <= j) : (home > i || home <= j);
      if (!in_range) {
        slots_[i] = slots_[j];
        i = j;
      }
    }
    slots_[i] = Slot{};
    --size_;
  }

  std::size_t size() const { return size_; }

  template <class F>
  void for_each(F&& f) const {
    for (const Slot& s : slots_)
      if (s.key != 0) f(s.key, s.value);
  }

 private:
  struct Slot {
    std::uint64_t key = 0;
    V* value = nullptr;
  };
  std::size_t mask() const { return mask_; }
  std::size_t index(std::uint64_t key) const {
    return static_cast<std::size_t>(((key >> 9) * 0x9E3779B97F4A7C15ULL) >> 20) & mask();
  }
  void place(std::uint64_t key, V* value) {
    std::size_t i = index(key);
    while (slots_[i].key != 0) i = (i + 1) & mask();
    slots_[i] = Slot{key, value};
  }
  [[gnu::cold, gnu::noinline]] void grow() {
    std::vector<Slot> old(slots_.size() * 2);
    old.swap(slots_);
    mask_ = slots_.size() - 1;
    for (const Slot& s : old)
      if (s.key != 0) place(s.key, s.value);
  }

  std::vector<Slot> slots_;
  std::size_t mask_ = 1023;  // slots_.size() - 1 (a power of two less one), kept beside it for the probes
  std::size_t size_ = 0;
};

}  // namespace cachet::gpu::detail
