#!/usr/bin/env python3
"""Writes fuzz/corpus/fuzz_ops: the oracle's recorded op lists (tests/data/oracle/ops/*.json.gz)
encoded in fuzz_ops's byte format (fuzz/src/ops_interp.h), one seed per regime and preset
configuration, each cut to its first MAX_OPS ops; and the H100 MemPool and graph-capture
recordings (tests/data/oracle-h100/ops) in pool mode, cut to POOL_MAX_OPS ops.

The format is read with LLVM's FuzzedDataProvider, which takes integers from the END of the
input, most significant byte first: a seed is the reversed list of the bytes the interpreter
consumes. Run from anywhere: python3 fuzz/seeds/make_ops_seeds.py
"""
import gzip, json, pathlib

root = pathlib.Path(__file__).resolve().parents[2]
out = root / "fuzz/corpus/fuzz_ops"
MAX_OPS = 150
# Preset indices of kPresetConfigs in ops_interp.cpp, and capacity indices of kCapacities.
PRESETS = {"default": 0, "expandable": 1, "gc": 2, "msplit128": 3, "msplit256_r4": 4, "rdivlist": 5}
CAP_INDEX, CAPACITY = 5, 150109880320  # the H200 of the recordings
PRESSURE_CAP_INDEX, PRESSURE_CAPACITY = 4, 6 * 2**30  # res_pressure_*: cap 6 GiB


class Writer:
    def __init__(self):
        self.consumed = []  # bytes in the order the interpreter consumes them

    def integral(self, value, lo, hi):
        rng = hi - lo
        v = value - lo
        assert 0 <= v <= rng, (value, lo, hi)
        n = 0
        while n < 8 and (rng >> (8 * n)) > 0:
            n += 1
        for i in reversed(range(n)):  # most significant first
            self.consumed.append((v >> (8 * i)) & 0xFF)

    def u8(self, v):
        self.integral(v, 0, 255)

    def data(self):
        return bytes(reversed(self.consumed))


def encode(ops, preset, cap_index, capacity):
    w = Writer()
    w.u8(preset)
    w.u8(cap_index)
    handle_of = {}  # recorded id -> handle
    live = []       # live handles, ascending (Lockstep::live_handles)
    next_handle = 0
    n = 0
    for op in ops:
        if n >= MAX_OPS:
            break
        if op[0] == "a":
            _, ident, size, stream = op
            if size > 2 * capacity:
                continue
            w.u8((6 << 2) | (stream & 3))  # allocate, exact size class
            w.integral(size, 0, 2 * capacity)
            if size > 0:
                handle_of[ident] = next_handle
                live.append(next_handle)
                next_handle += 1
        elif op[0] == "f":
            h = handle_of.pop(op[1], None)
            if h is None:
                continue
            w.u8(128)  # free a live handle
            w.integral(live.index(h), 0, 65535)
            live.remove(h)
        elif op[0] == "e":
            w.u8(240)
        else:
            continue
        n += 1
    return w.data()


# Pool mode (capacity byte bit 7, ops_interp.cpp decode_pool_op): selectors 96 + sub; an argument
# byte 0x80 | k names MemPool or graph k (0..7) directly.
POOL_MODE, POOL_SEL = 0x80, 96
POOL_MAX_OPS = 400


def encode_pools(ops, preset, cap_index, capacity):
    """The H100 pool and graph recordings (tests/data/oracle-h100/ops): recorded MemPool and graph
    numbers are mapped to the lowest of 0..7 free at their first use (ops on a ninth at once are
    left out, with the allocations' frees kept consistent)."""
    w = Writer()
    w.u8(preset)
    w.u8(cap_index | POOL_MODE)
    handle_of, live, next_handle, n = {}, [], 0, 0
    slot = {"p": {}, "g": {}}  # recorded k -> 0..7

    def take(kind, k):
        if k not in slot[kind]:
            used = set(slot[kind].values())
            free = [i for i in range(8) if i not in used]
            if not free:
                return None
            slot[kind][k] = free[0]
        return slot[kind][k]

    for op in ops:
        if n >= POOL_MAX_OPS:
            break
        kind = op[0]
        if kind == "a":
            _, ident, size, stream = op
            if size > 2 * capacity:
                continue
            w.u8((6 << 2) | (stream & 3))
            w.integral(size, 0, 2 * capacity)
            if size > 0:
                handle_of[ident] = next_handle
                live.append(next_handle)
                next_handle += 1
        elif kind == "f":
            h = handle_of.pop(op[1], None)
            if h is None:
                continue
            w.u8(128)
            w.integral(live.index(h), 0, 65535)
            live.remove(h)
        elif kind == "e":
            w.u8(240)
        elif kind in ("pb", "pe", "pr"):
            k = take("p", op[1])
            if k is None:
                continue
            w.u8(POOL_SEL + {"pb": 0, "pe": 6, "pr": 12}[kind])
            w.u8(0x80 | k)
            if kind == "pr":
                del slot["p"][op[1]]
        elif kind == "gb":
            _, g, stream, share = op
            k = take("g", g)
            if k is None or (share >= 0 and share not in slot["g"]):
                continue
            w.u8(POOL_SEL + 15)
            w.u8(0x80 | k)
            w.u8(0 if stream == 0 else stream + 2)  # decodes as 1 + b % 3 = stream
            w.u8(0xFF if share < 0 else 0x80 | slot["g"][share])
        elif kind in ("ge", "gx"):
            k = slot["g"].get(op[1])
            if k is None:
                continue
            w.u8(POOL_SEL + (21 if kind == "ge" else 27))
            w.u8(0x80 | k)
            if kind == "gx":
                del slot["g"][op[1]]
        else:
            continue
        n += 1
    return w.data()


def main():
    out.mkdir(parents=True, exist_ok=True)
    for f in sorted((root / "tests/data/oracle/ops").glob("ops_*.json.gz")):
        regime = f.name[len("ops_"):-len(".json.gz")]
        ops = json.loads(gzip.decompress(f.read_bytes()))
        cap_index, capacity = (PRESSURE_CAP_INDEX, PRESSURE_CAPACITY) if regime == "pressure" else (CAP_INDEX, CAPACITY)
        for name, preset in PRESETS.items():
            (out / f"{regime}_{name}").write_bytes(encode(ops, preset, cap_index, capacity))
    for regime in ("pools", "graphs"):
        ops = json.loads(gzip.decompress((root / f"tests/data/oracle-h100/ops/ops_{regime}.json.gz").read_bytes()))
        for name in ("default", "expandable", "gc", "msplit128"):
            (out / f"h100_{regime}_{name}").write_bytes(encode_pools(ops, PRESETS[name], 0, 8 * 2**30))
    print(f"fuzz_ops seeds: {len(list(out.iterdir()))} files in {out}")


if __name__ == "__main__":
    main()
