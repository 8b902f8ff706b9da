// fuzz/src/pool_ops.h: the pool and capture ops decoded from bytes, shared by the fuzz_ops
// interpreter (pool mode, src/ops_interp.cpp) and the fuzz_cachet_policy one (pool mode,
// src/cachet_interp.cpp): one selector's sub-range [0, 32) and its argument bytes become a
// use_pool, end_pool, release_pool, capture_begin, capture_end or graph_reset (cachet/ops.h), mostly
// valid for the front end's state (fuzz/README.md, "pool mode").
#pragma once

#include CACHET_FDP_HEADER

#include <cstdint>
#include <optional>
#include <vector>

#include "cachet/front_end/pool_front_end.h"
#include "cachet/ops.h"
#include "cachet/types.h"

namespace cachet::fuzz {

constexpr std::uint64_t kPoolKs = 8;  // MemPools and graphs are named 0..7

// An argument byte that names a MemPool or graph: below 0x80 one of `candidates` (valid for the
// front end's state) by index, else k = byte % 8 directly (seeds, and ops to be refused); with no
// candidate, `fallback`.
inline std::uint64_t pick(std::uint8_t b, const std::vector<std::uint64_t>& candidates, std::uint64_t fallback) {
  if (b >= 0x80) return b % kPoolKs;
  return candidates.empty() ? fallback : candidates[b % candidates.size()];
}

// sub = the selector's offset in the pool range: [0,6) use_pool, [6,12) end_pool, [12,15) release_pool, [15,21)
// capture_begin (graph byte, stream byte, share byte), [21,27) capture_end, [27,32) graph_reset.
inline ops::Op decode_pool_op(FuzzedDataProvider& p, const front_end::PoolFrontEnd& fe, unsigned sub) {
  using GS = front_end::PoolFrontEnd::GraphState;
  std::vector<std::uint64_t> idle, fresh_mempool, fresh_graph;
  for (std::uint64_t k = 0; k < kPoolKs; ++k) {
    if (fe.mempool_alive(k) && !fe.mempool_in_use(k)) idle.push_back(k);
    if (!fe.mempool_alive(k)) fresh_mempool.push_back(k);
    if (fe.graph(k) == GS::None) fresh_graph.push_back(k);
  }
  const auto b = p.ConsumeIntegral<std::uint8_t>();
  if (sub < 6) {
    std::vector<std::uint64_t> enter = idle;
    if (!fresh_mempool.empty()) enter.push_back(fresh_mempool.front());
    // Entered by thread 1 for b >= 0xC0, else by the main thread (docs/pytorch-allocator.md §14.10.2).
    return ops::UseMemPoolBegin{pick(b, enter, 0), b >= 0xC0 ? ThreadIndex{1} : ThreadIndex{0}};
  }
  if (sub < 12) return ops::UseMemPoolEnd{pick(b, fe.mempools_in_use(), 0)};
  if (sub < 15) return ops::ReleasePool{pick(b, idle, 0)};
  if (sub < 21) {
    const auto sb = p.ConsumeIntegral<std::uint8_t>();
    const auto share_b = p.ConsumeIntegral<std::uint8_t>();
    // Stream 1..3; 0 (the default stream, refused) for one byte value in eight.
    const StreamId stream = (sb & 7u) == 0 ? 0 : 1 + sb % 3u;
    std::optional<std::uint64_t> share;
    const auto captured = fe.graphs(GS::Captured);
    if (share_b == 0xFF) share.reset();
    else if (share_b >= 0x80) share = share_b % kPoolKs;
    else if (share_b % 3 == 0 && !captured.empty()) share = captured[share_b % captured.size()];
    return ops::CaptureBegin{pick(b, fresh_graph, 0), stream, share};
  }
  if (sub < 27) return ops::CaptureEnd{pick(b, fe.graphs(GS::Capturing), 0)};
  return ops::GraphReset{pick(b, fe.graphs(GS::Captured), 0)};
}

}  // namespace cachet::fuzz
