#!/usr/bin/env python3
"""Writes fuzz/corpus/fuzz_cachet_policy/seed-*: op sequences for fuzz_cachet_policy, encoded in
its byte format (fuzz/README.md; FuzzedDataProvider takes integers from the END of the input,
most significant byte first). The encoder mirrors fuzz/src/cachet_interp.cpp's decoding; it
tracks the number of live handles because a handle index takes as many bytes as that count
needs."""
import os
import sys

MiB = 1 << 20
PAGE = 2 * MiB
SMALL = MiB
BOUNDARIES = [1, 511, 512, 513, 4096, SMALL - 512, SMALL - 1, SMALL, SMALL + 1, SMALL + 512, PAGE - 512,
              PAGE - 1, PAGE, PAGE + 1, PAGE + 512, 2 * PAGE - 512, 2 * PAGE, 3 * PAGE + 1, 10 * MiB,
              10 * MiB + 1, 20 * MiB, 64 * MiB, 128 * MiB - 512, 256 * MiB]


class Enc:
    def __init__(self, capacity_idx, streams, capped, fraction_idx=3, pool=False):
        # config byte: bits 0-1 capacity (256 MiB, 1 GiB, 4 GiB, 64 MiB), bits 2-3 streams - 1
        # (3: pool mode, three streams), bits 4-6 the starting fraction's index - 1
        # (kFractions[1..7]), bit 7 capped.
        if pool:
            streams = 3
        c = capacity_idx | ((3 if pool else streams - 1) << 2) | ((fraction_idx - 1) << 4)
        if capped:
            c |= 0x80
        self.seq = []
        self.live = 0
        self.streams = streams
        self.byte(c)

    def byte(self, v):
        self.seq.append(v & 0xFF)

    def ranged(self, v, lo, hi):  # ConsumeIntegralInRange(lo, hi) returning v
        rng, off, n = hi - lo, 0, 0
        while off < 64 and (rng >> off) > 0:
            n += 1
            off += 8
        x = v - lo
        for i in reversed(range(n)):
            self.byte(x >> (8 * i))

    def alloc(self, size, stream=1):
        # sel < 120: stream 1 + sel % streams, size class (sel >> 2) & 7; class 0 = boundary index,
        # 1: 1..512, 2-3: 513..1 MiB, 4: 1 MiB+1..16 MiB, 5: 16..256 MiB.
        if size in BOUNDARIES:
            cls = 0
        elif size <= 512:
            cls = 1
        elif size <= SMALL:
            cls = 2
        elif size <= 16 * MiB:
            cls = 4
        else:
            cls = 5
        sel = next(s for s in range(120) if (s >> 2) & 7 == cls and 1 + s % self.streams == stream)
        self.byte(sel)
        if cls == 0:
            self.ranged(BOUNDARIES.index(size), 0, len(BOUNDARIES) - 1)
        elif cls == 1:
            self.ranged(size, 1, 512)
        elif cls == 2:
            self.ranged(size, 513, SMALL)
        elif cls == 4:
            self.ranged(size, SMALL + 1, 16 * MiB)
        else:
            self.ranged(size, 16 * MiB, 256 * MiB)
        self.live += 1

    def free(self, idx):  # idx: position among live handles in address order
        self.byte(150)
        self.ranged(idx, 0, self.live - 1)
        self.live -= 1

    def record_free(self, idx, use_streams):
        sel = 190 if len(use_streams) == 1 else 191
        self.byte(sel)
        self.ranged(idx, 0, self.live - 1)
        for u in use_streams:
            self.ranged(u, 1, 5)
        self.live -= 1

    def complete(self, stream):
        self.byte(next(s for s in range(205, 228) if 1 + s % 5 == stream))

    def empty_cache(self):
        self.byte(230)

    def fraction(self, i):  # kFractions[i]: 0, .05, .1, .25, .5, .75, .9, 1
        self.byte(next(s for s in range(240, 256) if s % 8 == i))

    # Pool mode: selectors [88, 120) are the pool and capture ops (sub = sel - 88, fuzz/src/pool_ops.h);
    # an argument byte >= 0x80 names MemPool or graph k = byte % 8 directly.
    def pool_op(self, sub, k):
        self.byte(88 + sub)
        self.byte(0x80 | k)

    def use_pool(self, k):
        self.pool_op(0, k)

    def end_pool(self, k):
        self.pool_op(6, k)

    def release_pool(self, k):
        self.pool_op(12, k)

    def capture_begin(self, g, stream, share=None):
        self.pool_op(15, g)
        self.byte(next(b for b in range(1, 256) if b & 7 and 1 + b % 3 == stream))
        self.byte(0xFF if share is None else 0x80 | share)

    def capture_end(self, g):
        self.pool_op(21, g)

    def graph_reset(self, g):
        self.pool_op(27, g)

    def data(self):
        return bytes(reversed(self.seq))


def seeds():
    out = {}
    e = Enc(1, 1, False)  # 1 GiB, 1 stream: small blocks pack at the high end of their pages
    for _ in range(30):
        e.alloc(100000)
    for i in range(0, 20, 3):
        e.free(i % e.live)
    for s in (513, SMALL, SMALL + 1, 4096, 1):
        e.alloc(s)
    out["seed-small-pack"] = e.data()

    e = Enc(1, 3, False)  # three streams: freed pages move between streams only through unmaps
    for i in range(12):
        e.alloc([PAGE, SMALL, 3 * PAGE + 1][i % 3], 1 + i % 3)
    for i in range(6):
        e.free(0)
    for i in range(8):
        e.alloc(PAGE - 512, 1 + (i + 1) % 3)
    out["seed-streams"] = e.data()

    e = Enc(0, 2, True, 3)  # 256 MiB x 0.25: 64 MiB cap, OOMs and page moves
    for i in range(10):
        e.alloc(10 * MiB + 1, 1 + i % 2)
    for i in range(4):
        e.free(i)
    for i in range(6):
        e.alloc(20 * MiB, 1 + i % 2)
    e.empty_cache()
    e.alloc(64 * MiB, 1)
    out["seed-capped"] = e.data()

    e = Enc(1, 2, False)  # record_stream: pending blocks until their events complete
    for i in range(8):
        e.alloc(2 * PAGE, 1 + i % 2)
    e.record_free(0, [3])
    e.record_free(0, [4, 5])
    e.alloc(2 * PAGE, 1)
    e.complete(3)
    e.alloc(2 * PAGE, 1)
    e.complete(4)
    e.complete(5)
    e.alloc(2 * PAGE, 2)
    e.record_free(1, [3])
    e.empty_cache()
    e.alloc(PAGE, 1)
    out["seed-pending"] = e.data()

    e = Enc(3, 1, False)  # 64 MiB device: fraction changes, empty_cache, running out of device
    e.alloc(10 * MiB, 1)
    e.fraction(6)
    for i in range(5):
        e.alloc(10 * MiB, 1)
    e.free(2)
    e.fraction(7)
    e.alloc(20 * MiB, 1)
    e.empty_cache()
    e.alloc(64 * MiB, 1)
    out["seed-fraction"] = e.data()

    e = Enc(1, 3, False, pool=True)  # a graph's private pool, a default request beside it, reset
    e.alloc(4 * MiB, 2)
    e.capture_begin(0, 1)
    for i in range(4):
        e.alloc([SMALL, 3 * PAGE + 1, 512, 10 * MiB][i], 1)
    e.free(e.live - 1)
    e.alloc(SMALL + 512, 1)
    e.capture_end(0)
    e.alloc(3 * MiB, 2)  # the default pool: the graph's free blocks stay its own
    e.capture_begin(1, 3, share=0)
    e.alloc(PAGE, 3)
    e.capture_end(1)
    e.graph_reset(0)
    e.alloc(2 * MiB, 1)
    e.graph_reset(1)
    e.empty_cache()
    out["seed-pool-graph"] = e.data()

    e = Enc(1, 3, False, pool=True)  # a MemPool: allocations in it, a deferred free, its release
    e.use_pool(0)
    for i in range(5):
        e.alloc([2 * PAGE, SMALL, 4096, 6 * MiB, 20 * MiB][i], 1)
    e.record_free(0, [2])  # no event while the pool is active: deferred
    e.free(0)
    e.end_pool(0)
    e.alloc(2 * PAGE, 1)  # the default pool (no fit there) must not take the MemPool's free block
    e.complete(2)
    e.release_pool(0)
    e.free(0)  # freed after its pool's release: back to the default pool
    e.alloc(20 * MiB, 2)
    e.use_pool(1)
    e.alloc(PAGE, 1)
    e.end_pool(1)
    e.empty_cache()
    out["seed-pool-mempool"] = e.data()
    return out


def main():
    d = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "corpus", "fuzz_cachet_policy")
    os.makedirs(d, exist_ok=True)
    for name, data in seeds().items():
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)
        print(name, len(data), "bytes")


if __name__ == "__main__":
    main()
