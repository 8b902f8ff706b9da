#!/usr/bin/env python3
"""Diffs a predicted trace against the GPU's, event by event (bench/predict, docs/predict.md section 6).

    diff_traces.py PREDICTED.pickle NATIVE.pickle [--context N]

Both are torch.cuda.memory._dump_snapshot pickles (no torch needed to read them). Events are
compared as (action, size, stream index); addresses differ by construction and are left out. Prints
the counts of each action on both sides, the first divergence with the stacks of both events and
the N events before it, and the sizes only one side allocated (a multiset difference)."""
import argparse
import collections
import pickle
import sys

KEEP = ("alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "segment_map",
        "segment_unmap", "oom", "empty_cache")


class _Unpickler(pickle.Unpickler):
    """Reads a snapshot without torch: a torch class in it becomes a plain stand-in."""

    def find_class(self, module, name):
        if module.split(".")[0] == "torch":
            return type(name, (), {"__init__": lambda self, *a, **k: None,
                                   "__setstate__": lambda self, st: None})
        return super().find_class(module, name)


def load(path):
    with open(path, "rb") as f:
        return _Unpickler(f).load()


def events(path):
    snap = load(path)
    traces = [t for t in snap.get("device_traces", []) if t]
    evs = traces[0] if traces else []
    streams = {}
    out = []
    for e in evs:
        if e.get("action") not in KEEP:
            continue
        s = streams.setdefault(e.get("stream", 0), len(streams))
        out.append((e["action"], int(e.get("size", 0)), s, e.get("frames") or []))
    return out


def where(frames, n=3):
    return " <- ".join(f"{f.get('filename', '?').split('/')[-1]}:{f.get('line', '?')} {f.get('name', '?')}"
                       for f in frames[:n]) or "(no frames)"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("predicted")
    ap.add_argument("native")
    ap.add_argument("--context", type=int, default=3)
    a = ap.parse_args()
    p, n = events(a.predicted), events(a.native)
    cp = collections.Counter(e[0] for e in p)
    cn = collections.Counter(e[0] for e in n)
    print("action           predicted     native")
    for k in KEEP:
        if cp[k] or cn[k]:
            print(f"{k:16} {cp[k]:9} {cn[k]:10}")
    first = next((i for i, (x, y) in enumerate(zip(p, n)) if x[:3] != y[:3]), None)
    if first is None and len(p) == len(n):
        print("identical: every event has the same action, size and stream")
    else:
        i = first if first is not None else min(len(p), len(n))
        print(f"first divergence at event {i}:")
        for j in range(max(0, i - a.context), i):
            print(f"  both  {p[j][0]:14} {p[j][1]:>12} s{p[j][2]}  {where(p[j][3], 1)}")
        for side, ev in (("pred", p), ("gpu ", n)):
            if i < len(ev):
                print(f"  {side}  {ev[i][0]:14} {ev[i][1]:>12} s{ev[i][2]}  {where(ev[i][3])}")
            else:
                print(f"  {side}  (trace ended)")
    pa = collections.Counter(e[1] for e in p if e[0] == "alloc")
    na = collections.Counter(e[1] for e in n if e[0] == "alloc")
    only_p, only_n = pa - na, na - pa
    if only_p or only_n:
        print("allocation sizes only the prediction has:", sorted(only_p.items())[:12])
        print("allocation sizes only the GPU has:       ", sorted(only_n.items())[:12])
    return 0


if __name__ == "__main__":
    sys.exit(main())
