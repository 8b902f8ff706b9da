#!/usr/bin/env python3
"""bench/callgrind_builds.py: instructions per hot-path iteration of two builds of cachet.

The deterministic companion of compare_builds.py: time on a shared machine moves by more than
the 5% a refactor must stay within, instruction counts do not (the same binary and arguments give
the same count on every run). For each build directory (a configured and built tree with
gpu/libcachet_gpu.a and common/libcachet_common.a, e.g. the target cachet_bench or cachet_gpu
built), this compiles bench/hot_path_count.cpp (of THIS tree, so both builds run the same
driver) against that build's libraries and headers with the build's own compiler and Release
flags, then runs every host-backend pattern under
`valgrind --tool=callgrind --toggle-collect=cachet_count_*` at N and 2N iterations; the marginal
count (Ir(2N) - Ir(N)) / N is the instructions per steady-state iteration (pair: one allocate +
one free; window: one free + one allocate), warm-up and first-touch costs cancelled out.

usage: bench/callgrind_builds.py OLD_BUILD NEW_BUILD [--iterations N] [--filter REGEX]
                                 [--cache-sim] [--cold] [--pages] [--keep DIR] [--json OUT.json]
  --cache-sim  also simulate caches and branches (callgrind --cache-sim=yes --branch-sim=yes):
               adds L1 data misses and mispredicted branches per iteration (slower)
  --cold       (implies --cache-sim) 128 KiB of other data is written before every iteration
               (hot_path_count's `cold`), as PyTorch's own work does between two allocations:
               the L1 data misses per iteration are then the cache lines it touches
  --pages      instead, the 4 KiB pages and 64-byte lines of code and of data one steady-state
               iteration touches (valgrind --tool=lackey over `hot_path_count PATTERN 20 cold`,
               the 19th iteration): inside PyTorch the instruction TLB entries and cache lines
               the allocator needs are evicted between two calls (bench/RESULTS.md, "The c10
               backend", eighth measurement), so these are what an allocation costs there
  --keep DIR   keep the callgrind output files (DIR/<side>-<pattern>-<n>.out) for
               callgrind_annotate
Prints a markdown table (Ir per iteration old, new, new/old). Exit 0, or 2 on bad input.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

PATTERNS = [f"{peer}/{p}" for peer in ("Host", "HostCachetPolicy")
            for p in ("pair/512B", "pair/1MiB", "pair/64MiB", "window/1B-1MiB/64live",
                      "window/512B-256MiB/128live")]
HERE = os.path.dirname(os.path.abspath(__file__))


def die(msg):
    print(f"callgrind_builds: {msg}", file=sys.stderr)
    sys.exit(2)


def cache_vars(build):
    path = os.path.join(build, "CMakeCache.txt")
    if not os.path.isfile(path):
        die(f"{build} has no CMakeCache.txt (give a configured and built build directory)")
    out = {}
    with open(path) as f:
        for line in f:
            m = re.match(r"^([A-Za-z_0-9]+):[A-Z]+=(.*)$", line.rstrip("\n"))
            if m:
                out[m.group(1)] = m.group(2)
    return out


def compile_against(build, sources, out, extra=()):
    """Compiles `sources` (files of this tree's bench/) and links them with the libraries of
    `build`, with that build's compiler, Release flags and headers. Returns its source dir."""
    v = cache_vars(build)
    src = v.get("CMAKE_HOME_DIRECTORY")
    libs = [os.path.join(build, "gpu", "libcachet_gpu.a"), os.path.join(build, "common", "libcachet_common.a")]
    for lib in libs:
        if not os.path.isfile(lib):
            die(f"{lib} missing (build the target cachet_gpu in {build})")
    cxx = v.get("CMAKE_CXX_COMPILER") or "c++"
    btype = (v.get("CMAKE_BUILD_TYPE") or "Release").upper()
    flags = (v.get(f"CMAKE_CXX_FLAGS_{btype}") or "-O3 -DNDEBUG").split()
    cudart = v.get("CUDA_cudart_LIBRARY", "")
    cuda = [cudart, f"-Wl,-rpath,{os.path.dirname(cudart)}"] if cudart.endswith(".so") else []
    cmd = [cxx, *flags, "-std=c++20", "-fPIC", f"-I{src}/gpu/include", f"-I{src}/common/include",
           *[os.path.join(HERE, s) for s in sources], *extra, *libs, "-lfmt", "-lpthread", *cuda, "-o", out]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        die(f"compiling against {build} failed:\n{' '.join(cmd)}\n{r.stderr[-3000:]}")
    return src


def build_driver(build, exe):
    return compile_against(build, ["hot_path_count.cpp"], exe)


def count(exe, pattern, n, sim, keep, tag, cold=False):
    out = os.path.join(keep, f"{tag}-{pattern.replace('/', '_')}-{n}{'-cold' if cold else ''}.out")
    cmd = ["valgrind", "--tool=callgrind", "--toggle-collect=cachet_count_*", f"--callgrind-out-file={out}"]
    if sim:
        # The caches of the machines the figures come from (H100/H200 hosts: 48 KiB L1d, 2 MiB L2).
        cmd += ["--cache-sim=yes", "--branch-sim=yes", "--D1=49152,12,64", "--LL=2097152,16,64"]
    cmd += [exe, pattern, str(n)] + (["cold"] if cold else [])
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        die(f"`{' '.join(cmd)}` exited {r.returncode}:\n{r.stderr[-2000:]}")
    events = totals = None
    with open(out) as f:
        for line in f:
            if line.startswith("events:"):
                events = line.split()[1:]
            elif line.startswith("totals:") or line.startswith("summary:"):
                totals = [int(x) for x in line.split()[1:]]
    if events is None or totals is None:
        die(f"no totals in {out}")
    return dict(zip(events, totals))


def pages(exe, pattern, keep, tag):
    """Pages and lines of code and data touched by one steady-state iteration (the 19th of 20, each
    after 128 KiB of other data), from valgrind lackey's trace: what lies between an entry of
    cachet_count_one and the next entry of touch_other_data."""
    syms = {}
    nm = subprocess.run(["nm", exe], capture_output=True, text=True)
    for line in nm.stdout.splitlines():
        parts = line.split()
        if len(parts) == 3:
            syms[parts[2]] = int(parts[0], 16)
    one = syms.get("cachet_count_one")
    touch = next((v for k, v in syms.items() if "touch_other_data" in k), None)
    if one is None or touch is None:
        die(f"{exe} lacks cachet_count_one / touch_other_data (nm)")
    log = os.path.join(keep, f"{tag}-{pattern.replace('/', '_')}-lackey.log")
    cmd = ["valgrind", "--tool=lackey", "--trace-mem=yes", f"--log-file={log}", exe, pattern, "20", "cold"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        die(f"`{' '.join(cmd)}` exited {r.returncode}:\n{r.stderr[-2000:]}")
    events = []  # (kind, address): kind "I" for code, else data
    with open(log) as f:
        for line in f:
            if line[:3] in ("I  ", " L ", " S ", " M "):
                events.append((line[:3].strip(), int(line[3:].split(",")[0], 16)))
    code = {a for k, a in events if k == "I"}
    # A position-independent executable is loaded at valgrind's base: find it from the entry.
    base = next((b for b in (0, 0x108000, 0x400000, 0x4000000) if b + one in code), None)
    if base is None:
        die(f"cannot find cachet_count_one's load address in {log}")
    iters, cur = [], None
    for k, a in events:
        if k == "I" and a == base + one:
            cur = []
            iters.append(cur)
        elif k == "I" and a == base + touch:
            cur = None
        if cur is not None:
            cur.append((k, a))
    if len(iters) < 2:
        die(f"{log}: fewer than 2 iterations traced")
    it = iters[-2]  # the last one runs into the program's exit
    ins = [a for k, a in it if k == "I"]
    dat = [a for k, a in it if k != "I"]
    return {"instructions": len(ins), "code pages": len({a >> 12 for a in ins}), "code lines": len({a >> 6 for a in ins}),
            "data pages": len({a >> 12 for a in dat}), "data lines": len({a >> 6 for a in dat})}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--iterations", type=int, default=100000)
    ap.add_argument("--filter", default="")
    ap.add_argument("--cache-sim", action="store_true")
    ap.add_argument("--cold", action="store_true")
    ap.add_argument("--pages", action="store_true")
    ap.add_argument("--keep")
    ap.add_argument("--json")
    a = ap.parse_args()
    if shutil.which("valgrind") is None:
        die("valgrind not found (Debian package valgrind)")
    if a.iterations < 1:
        die("--iterations must be at least 1")
    if a.cold:
        a.cache_sim = True
    pats = [p for p in PATTERNS if re.search(a.filter, p)]
    if not pats:
        die(f"--filter {a.filter!r} matches none of {', '.join(PATTERNS)}")
    work = tempfile.mkdtemp(prefix="callgrind_builds.")
    keep = a.keep or work
    os.makedirs(keep, exist_ok=True)
    exes, srcs = {}, {}
    for side, build in (("old", a.old), ("new", a.new)):
        exes[side] = os.path.join(work, f"hot_path_count_{side}")
        srcs[side] = build_driver(build, exes[side])
    if a.pages:
        cols = ["instructions", "code pages", "code lines", "data pages", "data lines"]
        rows = []
        for p in pats:
            rows.append({"pattern": p, **{side: pages(exes[side], p, keep, side) for side in ("old", "new")}})
            print(f"callgrind_builds: {p} done", file=sys.stderr, flush=True)
        print("pages: one steady-state iteration (the 19th of 20, after 128 KiB of other data), valgrind lackey")
        print("| pattern | " + " | ".join(f"{c} old | {c} new" for c in cols) + " |")
        print("|---|" + "---|" * (2 * len(cols)))
        for r in rows:
            print(f"| {r['pattern']} | " + " | ".join(f"{r['old'][c]} | {r['new'][c]}" for c in cols) + " |")
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"old": a.old, "new": a.new, "sources": srcs, "rows": rows}, f, indent=1)
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
        return 0
    n = a.iterations
    rows = []
    for p in pats:
        per = {}
        for side in ("old", "new"):
            c1 = count(exes[side], p, n, a.cache_sim, keep, side, a.cold)
            c2 = count(exes[side], p, 2 * n, a.cache_sim, keep, side, a.cold)
            per[side] = {k: (c2[k] - c1[k]) / n for k in c2}
        rows.append({"pattern": p, "old": per["old"], "new": per["new"]})
        print(f"callgrind_builds: {p} done", file=sys.stderr, flush=True)
    cols = ["Ir"] + (["D1mr", "D1mw", "Bcm", "Bim"] if a.cache_sim else [])
    if a.cold:
        print("cold: 128 KiB of other data written before every iteration; D1mr + D1mw are the "
              "cache lines one iteration touches")
    head = " | ".join(f"{c} old | {c} new | {c} new/old" for c in cols)
    print(f"| pattern | {head} |")
    print("|---|" + "---|" * (3 * len(cols)))
    for r in rows:
        cells = []
        for c in cols:
            o, nw = r["old"].get(c, 0.0), r["new"].get(c, 0.0)
            cells += [f"{o:,.1f}", f"{nw:,.1f}", f"{nw / o:.3f}" if o else "-"]
        print(f"| {r['pattern']} | " + " | ".join(cells) + " |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"old": a.old, "new": a.new, "sources": srcs, "iterations": n, "rows": rows}, f, indent=1)
    if not a.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
