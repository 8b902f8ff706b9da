#!/usr/bin/env python3
"""bench/compare_builds.py: the hot path of two builds of cachet, side by side in one run.

Runs two cachet_bench binaries (say, before and after a refactor) alternately, REPS times each
(A B A B ...), so both see the same machine state, and prints a markdown table with each
benchmark's median ns per op (Google Benchmark's real time per iteration; the pair and window
patterns count 2 allocator calls per iteration, as cachet_bench's ns_per_op counter does) for
both builds and the ratio new/old of the medians.

usage: bench/compare_builds.py OLD_BENCH NEW_BENCH [--reps 10] [--filter REGEX] [--min-time 0.2]
                               [--json OUT.json]
Exit 0, or 2 on bad input (a binary missing or a run failing).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys


def run(binary, flt, min_time):
    cmd = [binary, f"--benchmark_filter={flt}", f"--benchmark_min_time={min_time}",
           "--benchmark_format=json"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        print(f"compare_builds: `{' '.join(cmd)}` exited {r.returncode}:\n{r.stderr.strip()[-2000:]}",
              file=sys.stderr)
        sys.exit(2)
    out = {}
    for b in json.loads(r.stdout)["benchmarks"]:
        if b.get("run_type", "iteration") != "iteration" or b.get("error_occurred"):
            continue
        ns = b["real_time"] * {"ns": 1, "us": 1e3, "ms": 1e6, "s": 1e9}[b.get("time_unit", "ns")]
        out[b["name"]] = ns
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--filter", default="^(Host|HostCachetPolicy|Cachet)/(pair|window)/")
    ap.add_argument("--min-time", default="0.2")
    ap.add_argument("--json")
    a = ap.parse_args()
    for b in (a.old, a.new):
        if not (os.path.isfile(b) and os.access(b, os.X_OK)):
            print(f"compare_builds: no benchmark binary at {b} (build the target cachet_bench)", file=sys.stderr)
            sys.exit(2)
    if a.reps < 1:
        print("compare_builds: --reps must be at least 1", file=sys.stderr)
        sys.exit(2)
    samples = {"old": {}, "new": {}}
    for i in range(a.reps):
        for side, binary in (("old", a.old), ("new", a.new)):
            for name, ns in run(binary, a.filter, a.min_time).items():
                samples[side].setdefault(name, []).append(ns)
        print(f"compare_builds: repetition {i + 1}/{a.reps} done", file=sys.stderr, flush=True)
    names = [n for n in samples["old"] if n in samples["new"]]
    print(f"| benchmark | old median (ns/iter) | new median (ns/iter) | new/old | reps |")
    print("|---|---|---|---|---|")
    rows = []
    for n in names:
        mo, mn = statistics.median(samples["old"][n]), statistics.median(samples["new"][n])
        rows.append({"name": n, "old": mo, "new": mn, "ratio": mn / mo, "reps": len(samples["new"][n])})
        print(f"| {n} | {mo:.1f} | {mn:.1f} | {mn / mo:.3f} | {len(samples['new'][n])} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rows": rows, "samples": samples}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
