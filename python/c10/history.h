// python/c10/history.h: the contexts the c10 backend keeps for _record_memory_history
// (docs/pytorch-allocator.md section 8; python/README.md, "The c10 backend").
//
// cachet's trace (gpu/) records the events; PyTorch's context recorder gives each one its stack.
// Contexts are gathered before cachet is called (outside its lock) and kept here by address, in
// the order the calls were made: the k-th "alloc" event of address A in cachet's trace gets the
// k-th context recorded for an allocation at A (the same for "free_requested"/"free_completed"
// and frees, and for "oom" events). An entry is kept for every call made while the history is
// on, with or without a context, so the counts stay aligned (the trace and these entries are
// cleared together); the oldest are dropped beyond the history's max_entries (their count is
// kept). A segment event takes the context of the allocation it served (the next "alloc" or
// "oom" in the trace), as PyTorch records it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <utility>

#include <c10/core/Allocator.h>

namespace cachet::c10_backend {

using Ctx = std::shared_ptr<c10::GatheredContext>;

struct CtxLog {
  std::uint64_t dropped = 0;
  std::deque<Ctx> q;
};

struct History {
  std::mutex mu;
  std::unordered_map<std::uint64_t, Ctx> live;  // context of each live allocation
  std::unordered_map<std::uint64_t, CtxLog> allocs, frees;
  CtxLog ooms;
  std::deque<std::pair<std::uint64_t, int>> order;  // (address, 0 alloc / 1 free / 2 oom)

  void clear() {
    live.clear();
    allocs.clear();
    frees.clear();
    ooms = {};
    order.clear();
  }
  void push(int kind, std::uint64_t addr, Ctx ctx, size_t max_entries) {
    CtxLog& log = kind == 0 ? allocs[addr] : kind == 1 ? frees[addr] : ooms;
    log.q.push_back(std::move(ctx));
    order.emplace_back(addr, kind);
    while (order.size() > std::max<size_t>(max_entries, 1)) {
      auto [a, k] = order.front();
      order.pop_front();
      CtxLog& old = k == 0 ? allocs[a] : k == 1 ? frees[a] : ooms;
      if (!old.q.empty()) {
        old.q.pop_front();
        ++old.dropped;
      }
    }
  }
  static Ctx nth(const CtxLog* log, std::uint64_t k) {
    if (!log || k < log->dropped) return nullptr;
    k -= log->dropped;
    return k < log->q.size() ? log->q[k] : nullptr;
  }
};

}  // namespace cachet::c10_backend
