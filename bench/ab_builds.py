#!/usr/bin/env python3
"""bench/ab_builds.py: two builds of cachet in ONE process, timed in alternating slices.

Where compare_builds.py alternates whole cachet_bench processes, this loads both builds into one
process (bench/ab_plugin.cpp linked against each build into a shared object, bench/ab_driver.cpp
loading both) and alternates between them every SLICE_US microseconds on the same CPU, so the
two samples of a pair see the same machine (on a shared GPU host the speed of one CPU changes by
up to 1.8x from one second to the next; see bench/RESULTS.md). Each pattern runs in PROCESSES
processes (a fresh memory layout each; every other process loads the new build first), SLICES
pairs each.

usage:
  bench/ab_builds.py build OLD_BUILD NEW_BUILD --out DIR
      compiles DIR/old.so, DIR/new.so (bench/ab_plugin.cpp + bench/hot_path.h of THIS tree,
      against each build's gpu/libcachet_gpu.a, common/libcachet_common.a and headers, with
      the build's compiler and Release flags) and DIR/ab_driver. A build directory is a
      configured tree with the target cachet_gpu built.
  bench/ab_builds.py run DIR [--filter REGEX] [--processes 3] [--slices 200] [--slice-us 5000]
                             [--taskset CPUS] [--json OUT.json]
      runs the patterns (default: every pattern the driver knows; Cachet/... needs a CUDA build
      and a device) and prints a markdown table: per build the median ns per iteration over all
      slices and its spread, new/old of the medians, and the median paired ratio with its
      interquartile range. Run it with the same build as OLD and NEW (an A/A run) to see the
      method's noise.
  bench/ab_builds.py pyloop DIR [--filter REGEX] [--calls 100000] [--cpu N] [--json OUT.json]
      the allocator as PyTorch calls it: one iteration per call from a Python loop (ctypes), so
      the interpreter's own code and data run between two allocator calls and evict what they
      evict, as PyTorch's do between the two calls of torch.empty + free. Each call is timed on
      its own (time.perf_counter_ns); calls of old and new, with one iteration and with none (the
      call's own cost, the floor), rotate, so both builds see the same machine. Prints, per
      pattern, the mean of the fastest 80% of each kind's calls, each build's cost above its floor
      and new/old of those. Run it 3 or more times: A/A runs differ by up to 5% on a 2-core VM.
Exit 0, or 2 on bad input.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from callgrind_builds import HERE, compile_against, die  # noqa: E402

PATTERNS = [f"{peer}/{p}" for peer in ("Cachet", "Host", "HostCachetPolicy")
            for p in ("pair/512B", "pair/1MiB", "pair/64MiB", "window/1B-1MiB/64live",
                      "window/512B-256MiB/128live")]


def build(a):
    os.makedirs(a.out, exist_ok=True)
    vs = os.path.join(HERE, "ab_plugin.map")  # exports only cachet_ab_open/iterate/close
    srcs = {}
    for side, b in (("old", a.old), ("new", a.new)):
        srcs[side] = compile_against(b, ["ab_plugin.cpp"], os.path.join(a.out, f"{side}.so"),
                                     ["-shared", f"-Wl,--version-script={vs}"])
    cmd = ["c++", "-O2", "-std=c++20", os.path.join(HERE, "ab_driver.cpp"), "-ldl", "-o",
           os.path.join(a.out, "ab_driver")]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        die(f"compiling ab_driver failed:\n{' '.join(cmd)}\n{r.stderr[-3000:]}")
    with open(os.path.join(a.out, "BUILDS.txt"), "w") as f:
        f.write(f"old: {a.old} (source {srcs['old']})\nnew: {a.new} (source {srcs['new']})\n")
    print(f"ab_builds: {a.out}/old.so, new.so, ab_driver", file=sys.stderr)
    return 0


def quartiles(xs):
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[0], q[2]


def run(a):
    d = a.dir
    for f in ("old.so", "new.so", "ab_driver"):
        if not os.path.isfile(os.path.join(d, f)):
            die(f"{d}/{f} missing (make it with `bench/ab_builds.py build OLD NEW --out {d}`)")
    pats = [p for p in PATTERNS if re.search(a.filter, p)]
    if not pats:
        die(f"--filter {a.filter!r} matches none of {', '.join(PATTERNS)}")
    pre = ["taskset", "-c", a.taskset] if a.taskset else []
    rows, t0 = [], time.time()
    print("| pattern | old median ns | new median ns | new/old (medians) | paired new/old: median [p25, p75] "
          "| old IQR/med, (p95-p5)/med | new IQR/med, (p95-p5)/med | per-process paired medians | slices |")
    print("|---|---|---|---|---|---|---|---|---|")
    for p in pats:
        old, new, per_proc = [], [], []
        for i in range(a.processes):
            first, second = ("old", "new") if i % 2 == 0 else ("new", "old")
            cmd = pre + [os.path.join(d, "ab_driver"), os.path.join(d, f"{first}.so"),
                         os.path.join(d, f"{second}.so"), p, str(a.slices), str(a.slice_us)]
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                print(f"ab_builds: {p}: `{' '.join(cmd)}` exited {r.returncode}: {r.stderr.strip()[-500:]}",
                      file=sys.stderr)
                break
            j = json.loads(r.stdout)
            o, n = (j["old"], j["new"]) if first == "old" else (j["new"], j["old"])
            per_proc.append(statistics.median(b / c for b, c in zip(n, o)))
            old += o
            new += n
        if not old:
            continue
        mo, mn = statistics.median(old), statistics.median(new)
        paired = [b / c for b, c in zip(new, old)]
        pm = statistics.median(paired)
        p25, p75 = quartiles(paired)

        def spread(xs, m):
            q = statistics.quantiles(xs, n=20, method="inclusive")
            lo, hi = quartiles(xs)
            return (hi - lo) / m, (q[18] - q[0]) / m
        so, sn = spread(old, mo), spread(new, mn)
        row = {"pattern": p, "old": mo, "new": mn, "ratio": mn / mo, "paired_median": pm,
               "paired_p25": p25, "paired_p75": p75, "old_iqr": so[0], "old_p95_p5": so[1],
               "new_iqr": sn[0], "new_p95_p5": sn[1], "per_process": per_proc, "slices": len(old),
               "samples_old": old, "samples_new": new}
        rows.append(row)
        pp = ", ".join(f"{x:.3f}" for x in per_proc)
        print(f"| {p} | {mo:.1f} | {mn:.1f} | {mn / mo:.3f} | {pm:.3f} [{p25:.3f}, {p75:.3f}] "
              f"| {so[0]:.1%}, {so[1]:.1%} | {sn[0]:.1%}, {sn[1]:.1%} | {pp} | {len(old)} |", flush=True)
        print(f"ab_builds: {p} done ({time.time() - t0:.0f} s)", file=sys.stderr, flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"args": vars(a), "rows": rows}, f, indent=1)
    return 0


def pyloop(a):
    """One allocator iteration per Python call (see the module docstring)."""
    import ctypes
    d = a.dir
    pats = [p for p in PATTERNS if re.search(a.filter, p) and not p.startswith("Cachet/")]
    if not pats:
        die(f"--filter {a.filter!r} matches no host pattern of {', '.join(PATTERNS)}")
    if a.calls < 100:
        die("--calls must be at least 100")
    if a.cpu is not None:
        if a.cpu not in os.sched_getaffinity(0):
            die(f"--cpu {a.cpu}: this process may run on CPUs {sorted(os.sched_getaffinity(0))} only")
        os.sched_setaffinity(0, {a.cpu})
    libs = {}
    for side in ("old", "new"):
        path = os.path.join(d, f"{side}.so")
        if not os.path.isfile(path):
            die(f"{path} missing (make it with `bench/ab_builds.py build OLD NEW --out {d}`)")
        lib = ctypes.CDLL(os.path.abspath(path), mode=ctypes.RTLD_LOCAL)
        lib.cachet_ab_open.restype = ctypes.c_void_p
        lib.cachet_ab_open.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong]
        lib.cachet_ab_iterate.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_char_p, ctypes.c_ulong]
        lib.cachet_ab_close.argtypes = [ctypes.c_void_p]
        libs[side] = lib
    pc = time.perf_counter_ns
    rows = []
    print(f"pyloop: {a.calls} calls of each kind, one allocator iteration (or none: the floor) per Python "
          "call; ns = mean of the fastest 80% of the calls")
    print("| pattern | old floor ns | old ns above floor | new floor ns | new ns above floor | new/old above floor |")
    print("|---|---|---|---|---|---|")
    for p in pats:
        err = ctypes.create_string_buffer(512)
        runs = {}
        for side, lib in libs.items():
            r = lib.cachet_ab_open(p.encode(), err, 512)
            if not r:
                die(f"{side}: {p}: {err.value.decode(errors='replace')}")
            runs[side] = (lib.cachet_ab_iterate, ctypes.c_void_p(r))
        kinds = [(side, it) for side in ("old", "new") for it in (0, 1)]
        samples = {k: [] for k in kinds}
        for i in range(a.calls + 1000):  # the first 1000 rotations warm up
            for j in range(len(kinds)):
                side, it = kinds[(i + j) % len(kinds)]
                f, v = runs[side]
                t0 = pc()
                rc = f(v, it, err, 512)
                t1 = pc()
                if rc != 0:
                    die(f"{side}: {p}: {err.value.decode(errors='replace')}")
                if i >= 1000:
                    samples[(side, it)].append(t1 - t0)
        for side, lib in libs.items():
            lib.cachet_ab_close(runs[side][1])

        def fast_mean(xs):
            xs = sorted(xs)[: max(1, len(xs) * 8 // 10)]
            return sum(xs) / len(xs)

        m = {k: fast_mean(v) for k, v in samples.items()}
        above = {side: m[(side, 1)] - m[(side, 0)] for side in ("old", "new")}
        ratio = above["new"] / above["old"] if above["old"] > 0 else float("nan")
        rows.append({"pattern": p, "floor": {s: m[(s, 0)] for s in ("old", "new")}, "above_floor": above,
                     "new_over_old": ratio})
        print(f"| {p} | {m[('old', 0)]:.0f} | {above['old']:.1f} | {m[('new', 0)]:.0f} | {above['new']:.1f} "
              f"| {ratio:.3f} |", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"args": vars(a), "rows": rows}, f, indent=1)
    return 0


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("old")
    b.add_argument("new")
    b.add_argument("--out", required=True)
    r = sub.add_parser("run")
    r.add_argument("dir")
    r.add_argument("--filter", default="")
    r.add_argument("--processes", type=int, default=3)
    r.add_argument("--slices", type=int, default=200)
    r.add_argument("--slice-us", type=int, default=5000)
    r.add_argument("--taskset")
    r.add_argument("--json")
    y = sub.add_parser("pyloop")
    y.add_argument("dir")
    y.add_argument("--filter", default="pair/")
    y.add_argument("--calls", type=int, default=100000)
    y.add_argument("--cpu", type=int)
    y.add_argument("--json")
    a = ap.parse_args()
    if a.cmd == "build":
        return build(a)
    if a.cmd == "pyloop":
        return pyloop(a)
    if a.processes < 1 or a.slices < 2:
        die("--processes must be at least 1 and --slices at least 2")
    return run(a)


if __name__ == "__main__":
    sys.exit(main())
