#!/usr/bin/env python3
"""bench/compare_builds.py: the hot path of two builds of cachet, side by side in one run.

Runs two cachet_bench binaries (say, before and after a refactor) alternately, REPS times each,
and prints a markdown table per benchmark: each build's median ns per iteration (Google
Benchmark's real time per iteration; a pair or window iteration is one allocate + one free), the
spread of each build's samples, new/old of the medians, and the median of the paired ratios.

Alternation (--interleave):
  benchmark (default)  one process per (benchmark, build, repetition): for each repetition, for
                       each benchmark, both builds back to back, so an old and a new sample are
                       taken within a second of each other; the order within the pair flips
                       every repetition (old-new, new-old, ...), so an order effect (the first
                       process after a pause, a cold cache) falls on both builds equally
  suite                one process per (build, repetition) running every benchmark (A B A B ...)
Paired ratio: new/old of the two samples of one repetition; its median cancels slow drift of
the machine (frequency, other tenants) that the two medians alone do not.

Spread columns, per build: (max - min) / median and the interquartile range / median of its
samples. Run the script with the same binary as OLD and NEW (an A/A run) to see what the
method's ratios look like when nothing changed: a difference smaller than that is noise.

usage: bench/compare_builds.py OLD_BENCH NEW_BENCH [--reps 10] [--filter REGEX]
                               [--min-time 0.2] [--interleave benchmark|suite]
                               [--taskset CPUS] [--no-aslr] [--json OUT.json]
  --taskset CPUS  run every benchmark process pinned: `taskset -c CPUS`
  --no-aslr       run every benchmark process with address-space randomisation off
                  (`setarch <arch> -R`): the same memory layout in every process of one build
Exit 0, or 2 on bad input (a binary missing, a run failing, a filter matching nothing).
"""
import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time

UNIT_NS = {"ns": 1, "us": 1e3, "ms": 1e6, "s": 1e9}


def die(msg):
    print(f"compare_builds: {msg}", file=sys.stderr)
    sys.exit(2)


def prefix(a):
    p = []
    if a.taskset:
        p += ["taskset", "-c", a.taskset]
    if a.no_aslr:
        p += ["setarch", platform.machine(), "-R"]
    return p


def run(a, binary, flt):
    cmd = prefix(a) + [binary, f"--benchmark_filter={flt}", f"--benchmark_min_time={a.min_time}",
                       "--benchmark_format=json"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        die(f"`{' '.join(cmd)}` exited {r.returncode}:\n{r.stderr.strip()[-2000:]}")
    out = {}
    for b in json.loads(r.stdout)["benchmarks"]:
        if b.get("run_type", "iteration") != "iteration" or b.get("error_occurred"):
            continue
        u = UNIT_NS[b.get("time_unit", "ns")]
        out[b["name"]] = (b["real_time"] * u, b["cpu_time"] * u)
    return out


def anchor(name):
    """`name` as a regular expression matching itself: Google Benchmark's POSIX regex rejects
    Python's re.escape of '-' ('\\-'), so only the metacharacters are escaped."""
    return re.sub(r"([.^$*+?()\[\]{}|\\])", r"\\\1", name)


def list_benchmarks(binary, flt):
    r = subprocess.run([binary, f"--benchmark_filter={flt}", "--benchmark_list_tests=true"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        die(f"{binary} --benchmark_list_tests exited {r.returncode}:\n{r.stderr.strip()[-2000:]}")
    return [line.strip() for line in r.stdout.splitlines() if line.strip()]


def quartiles(xs):
    if len(xs) < 2:
        return xs[0], xs[0]
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[0], q[2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--filter", default="^(Host|HostCachetPolicy|Cachet)/(pair|window)/")
    ap.add_argument("--min-time", default="0.2")
    ap.add_argument("--interleave", choices=["benchmark", "suite"], default="benchmark")
    ap.add_argument("--taskset")
    ap.add_argument("--no-aslr", action="store_true")
    ap.add_argument("--json")
    a = ap.parse_args()
    for b in (a.old, a.new):
        if not (os.path.isfile(b) and os.access(b, os.X_OK)):
            die(f"no benchmark binary at {b} (build the target cachet_bench)")
    if a.reps < 1:
        die("--reps must be at least 1")
    for tool in (["taskset"] if a.taskset else []) + (["setarch"] if a.no_aslr else []):
        if shutil.which(tool) is None:
            die(f"{tool} not found (util-linux)")
    names = list_benchmarks(a.old, a.filter)
    if not names:
        die(f"--filter {a.filter!r} matches no benchmark of {a.old}")
    # samples[side][name] = [(real ns, cpu ns), ...], index = repetition
    samples = {"old": {}, "new": {}}
    t0 = time.time()
    for i in range(a.reps):
        order = (("old", a.old), ("new", a.new)) if i % 2 == 0 else (("new", a.new), ("old", a.old))
        if a.interleave == "suite":
            for side, binary in order:
                for name, v in run(a, binary, a.filter).items():
                    samples[side].setdefault(name, []).append(v)
        else:
            for name in names:
                for side, binary in order:
                    for n, v in run(a, binary, f"^{anchor(name)}$").items():
                        samples[side].setdefault(n, []).append(v)
        print(f"compare_builds: repetition {i + 1}/{a.reps} done ({time.time() - t0:.0f} s)",
              file=sys.stderr, flush=True)
    rows = []
    print("| benchmark | old median | new median | new/old (medians) | paired new/old: median [p25, p75] "
          "| old spread (max-min)/med, IQR/med | new spread (max-min)/med, IQR/med | real/cpu old, new | reps |")
    print("|---|---|---|---|---|---|---|---|---|")
    for n in names:
        if n not in samples["old"] or n not in samples["new"]:
            continue
        so, sn = samples["old"][n], samples["new"][n]
        ro, rn = [x[0] for x in so], [x[0] for x in sn]
        mo, mn = statistics.median(ro), statistics.median(rn)
        paired = [b / c for b, c in zip(rn, ro)]
        pm = statistics.median(paired)
        p25, p75 = quartiles(paired)
        qo, qn = quartiles(ro), quartiles(rn)
        row = {"name": n, "old": mo, "new": mn, "ratio": mn / mo, "paired_median": pm,
               "paired_p25": p25, "paired_p75": p75,
               "old_range": (max(ro) - min(ro)) / mo, "old_iqr": (qo[1] - qo[0]) / mo,
               "new_range": (max(rn) - min(rn)) / mn, "new_iqr": (qn[1] - qn[0]) / mn,
               "old_real_per_cpu": statistics.median(x[0] / x[1] for x in so),
               "new_real_per_cpu": statistics.median(x[0] / x[1] for x in sn),
               "reps": min(len(ro), len(rn))}
        rows.append(row)
        print(f"| {n} | {mo:.1f} | {mn:.1f} | {mn / mo:.3f} | {pm:.3f} [{p25:.3f}, {p75:.3f}] "
              f"| {row['old_range']:.1%}, {row['old_iqr']:.1%} | {row['new_range']:.1%}, {row['new_iqr']:.1%} "
              f"| {row['old_real_per_cpu']:.2f}, {row['new_real_per_cpu']:.2f} | {row['reps']} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"args": vars(a), "rows": rows, "samples": samples}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
