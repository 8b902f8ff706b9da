// cachet/gpu/pinned_keep.h: PinnedKeep, the bookkeeping of the pinned host buffers a backend keeps
// between sleeps (docs/sleep-wake.md section 6), apart from the calls that pin and unpin them, so
// that the CUDA VMM backend's rule is tested on the host (tests/gpu/pinned_keep_test.cpp).
//
// Pinning costs more than the copy it serves (cudaHostAlloc about 0.35 s per GiB on an H100 host,
// against a 54 GB/s copy), so a buffer a sleep's backup no longer needs is kept for the next
// sleep, not unpinned. The rule that bounds what is kept:
//
//   held = in use + kept never exceeds peak, the most bytes of buffers in use at once.
//
// * take(n): the smallest kept buffer of at least n bytes (no pinning; held unchanged).
// * Else the caller pins a new one; first make_room(n) names the kept buffers to unpin, smallest
//   first (each is smaller than n, or take would have found it), until held + n fits under
//   max(peak, in use + n). So several tags backed up at once count together (they are in use at
//   once), and a backup that grows by a little each cycle replaces the smaller buffer instead of
//   adding to it: kept memory never exceeds the largest set of backups ever held at once.
// * give(h): a buffer whose backup was restored or dropped is kept.
// * release_kept(): every kept buffer, for the caller to unpin (an explicit release, the retry of
//   a failed cudaHostAlloc); the peak restarts from what is in use.
//
// Not thread-safe: the allocator's lock is held around every backend call.
#pragma once

#include <algorithm>
#include <map>
#include <utility>
#include <vector>

#include "cachet/types.h"

namespace cachet::gpu {

class PinnedKeep {
 public:
  // The smallest kept buffer of at least n bytes, now in use; nullptr when none is that large.
  void* take(Bytes n) {
    auto it = kept_.lower_bound(n);
    if (it == kept_.end()) return nullptr;
    void* h = it->second;
    kept_bytes_ -= it->first;
    in_use_bytes_ += it->first;
    peak_ = std::max(peak_, in_use_bytes_);
    kept_.erase(it);
    return h;
  }

  // Before a new buffer of n bytes is pinned: the kept buffers the caller unpins first (forgotten
  // here), smallest first, so that held stays within the peak once it is pinned.
  std::vector<void*> make_room(Bytes n) {
    const Bytes peak = std::max(peak_, in_use_bytes_ + n);
    std::vector<void*> out;
    while (!kept_.empty() && in_use_bytes_ + n + kept_bytes_ > peak) {
      auto it = kept_.begin();
      out.push_back(it->second);
      kept_bytes_ -= it->first;
      size_.erase(it->second);
      kept_.erase(it);
    }
    return out;
  }

  // A buffer of n bytes was pinned; it is in use.
  void pinned(void* h, Bytes n) {
    size_[h] = n;
    in_use_bytes_ += n;
    peak_ = std::max(peak_, in_use_bytes_);
  }

  // A buffer in use is kept. False (nothing changes) when h is no buffer of this keep, or kept.
  bool give(void* h) {
    auto it = size_.find(h);
    if (it == size_.end()) return false;
    for (auto [k, e] = kept_.equal_range(it->second); k != e; ++k)
      if (k->second == h) return false;
    kept_.emplace(it->second, h);
    kept_bytes_ += it->second;
    in_use_bytes_ -= it->second;
    return true;
  }

  // Every kept buffer with its size, forgotten here (the caller unpins them); the peak restarts
  // from the buffers in use.
  std::vector<std::pair<void*, Bytes>> release_kept() {
    std::vector<std::pair<void*, Bytes>> out;
    for (auto& [n, h] : kept_) {
      out.emplace_back(h, n);
      size_.erase(h);
    }
    kept_.clear();
    kept_bytes_ = 0;
    peak_ = in_use_bytes_;
    return out;
  }

  // Every buffer held, in use or kept (a destructor unpins them all).
  std::vector<void*> all() const {
    std::vector<void*> out;
    for (const auto& [h, n] : size_) out.push_back(h);
    return out;
  }

  Bytes kept_bytes() const { return kept_bytes_; }
  Bytes in_use_bytes() const { return in_use_bytes_; }
  Bytes held_bytes() const { return in_use_bytes_ + kept_bytes_; }
  Bytes peak_bytes() const { return peak_; }  // the most bytes of buffers in use at once
  std::size_t kept_count() const { return kept_.size(); }

 private:
  std::map<void*, Bytes> size_;         // every buffer held, in use or kept
  std::multimap<Bytes, void*> kept_;    // the kept ones, by size
  Bytes kept_bytes_ = 0;
  Bytes in_use_bytes_ = 0;
  Bytes peak_ = 0;
};

}  // namespace cachet::gpu
