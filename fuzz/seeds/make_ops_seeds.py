#!/usr/bin/env python3
"""Writes fuzz/corpus/fuzz_ops: the oracle's recorded op lists (tests/data/oracle/ops/*.json.gz)
encoded in fuzz_ops's byte format (fuzz/src/ops_interp.h), one seed per regime and preset
configuration, each cut to its first MAX_OPS ops.

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


def main():
    out.mkdir(parents=True, exist_ok=True)
    for f in sorted((root / "tests/data/oracle/ops").glob("ops_*.json.gz")):
        regime = f.name[len("ops_"):-len(".json.gz")]
        ops = json.loads(gzip.decompress(f.read_bytes()))
        cap_index, capacity = (PRESSURE_CAP_INDEX, PRESSURE_CAPACITY) if regime == "pressure" else (CAP_INDEX, CAPACITY)
        for name, preset in PRESETS.items():
            (out / f"{regime}_{name}").write_bytes(encode(ops, preset, cap_index, capacity))
    print(f"fuzz_ops seeds: {len(list(out.iterdir()))} files in {out}")


if __name__ == "__main__":
    main()
