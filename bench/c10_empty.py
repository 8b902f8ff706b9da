#!/usr/bin/env python3
"""torch.empty + free through PyTorch, native allocator against cachet (issue 22): each allocator
in a fresh process (the allocator is chosen once per process), the same loop; rounds that run
native and each backend one after the other, so drift of the machine falls on all alike. The
figures are medians over the rounds; each ratio is the median of the rounds' ratios, with its
range. bench/RESULTS.md, "The c10 backend", has the figures.

Every process runs pinned to one CPU (--cpu, default the highest the bench may use): unpinned, a
process's whole run came out either about 2.2 or about 4.1 us a pair on an H200 host (both
allocators alike, 2026-11-28), which is where the scheduler put it, not the allocator.

--in-process: one process instead, cachet's c10 backend installed, that switches PyTorch's allocator
atomic between cachet and the native allocator it replaced (cachet_c10_bench_select, a bench-only
entry of libcachet_c10) before each timed loop: every repeat runs one loop under each, back to
back in alternating order, and the ratio of that adjacent pair is kept. Both allocators then share
the process's speed, whichever mode it drew and however often it changes (a process's speed also
changed mid-run, for seconds at a time); only the c10 backend (the plug-in path cannot be switched).
Each repeat also times torch.empty(0) under cachet, the floor: PyTorch's own part of the pair
(tensor, storage, dispatcher, device guard) with no allocator work; "floor/native" is the lowest
ratio any allocator could reach on that machine.

usage: bench/c10_empty.py [--backends c10,plugin | --in-process] [--rounds N (default 7)] [--cpu N] [--json FILE]
Environment: CACHET_TORCH_LIB / CACHET_C10_LIB as for cachet_torch.install(); PYTHONPATH holding
python/ (cachet_torch).
"""
import json
import os
import statistics
import subprocess
import sys
import time

SIZES = {"512 B": 512, "1 MiB": 1 << 20, "64 MiB": 64 << 20}
LOOPS = 20000
REPEATS = 9


def loop_ns(torch, n):
    """ns per torch.empty(n) + free pair over one loop of LOOPS pairs."""
    t0 = time.perf_counter()
    for _ in range(LOOPS):
        x = torch.empty(n, dtype=torch.uint8, device="cuda")
        del x
    return (time.perf_counter() - t0) / LOOPS * 1e9


def time_sizes(torch):
    """ns per torch.empty + free pair for each size: the median of REPEATS loops (a dropped warm-up)."""
    return {name: statistics.median([loop_ns(torch, n) for _ in range(REPEATS + 1)][1:]) for name, n in SIZES.items()}


def child(mode, cpu):
    os.sched_setaffinity(0, {cpu})
    if mode != "native":
        import cachet_torch
        cachet_torch.install(backend=mode)
    import torch
    torch.empty(1, device="cuda")
    print(json.dumps(time_sizes(torch)))
    return 0


def child_in_process(cpu, rounds):
    os.sched_setaffinity(0, {cpu})
    import ctypes
    import cachet_torch
    cachet_torch.install(backend="c10")
    if cachet_torch.backend() != "c10":
        print("--in-process needs the c10 backend (libcachet_c10.so for this torch)", file=sys.stderr)
        return 1
    lib = ctypes.CDLL(cachet_torch._lib_path)
    lib.cachet_c10_bench_select.restype = ctypes.c_int
    lib.cachet_c10_bench_select.argtypes = [ctypes.c_int]
    import torch

    def select(mode):
        if lib.cachet_c10_bench_select(1 if mode == "native" else 0) != 0:
            raise RuntimeError(f"cachet_c10_bench_select({mode}) failed: {cachet_torch.last_error()}")

    for mode in ("native", "c10"):  # both initialised and warm before the first timed round
        select(mode)
        torch.empty(1, device="cuda")
        time_sizes(torch)
    # Interleaved at the finest grain that still times whole loops: every repeat of every size
    # runs one loop under each allocator, back to back, in alternating order, and the ratio of
    # that adjacent pair is kept; speed changes of the process (which last seconds) then fall on
    # both halves of nearly every pair.
    runs = {"native": [], "c10": []}
    pair_ratios = {name: [] for name in SIZES}
    floor_ratios = {name: [] for name in SIZES}
    for r in range(rounds):
        per_mode = {"native": {}, "c10": {}}
        for name, n in SIZES.items():
            reps = {"native": [], "c10": []}
            for rep in range(REPEATS + 1):
                order = ("native", "c10") if (r + rep) % 2 == 0 else ("c10", "native")
                t = {}
                for mode in order:
                    select(mode)
                    t[mode] = loop_ns(torch, n)
                # The floor: torch.empty(0) under cachet asks the allocator for nothing (PyTorch
                # still calls allocate(0), which cachet answers without a device or stream
                # lookup), so it is what the pair costs PyTorch without allocator work: no
                # allocator could bring the pair below it.
                select("c10")
                floor = loop_ns(torch, 0)
                if rep == 0:
                    continue  # warm-up after the switch of sizes
                for mode in t:
                    reps[mode].append(t[mode])
                pair_ratios[name].append(t["c10"] / t["native"])
                floor_ratios[name].append(floor / t["native"])
            for mode in reps:
                per_mode[mode][name] = statistics.median(reps[mode])
        for mode in per_mode:
            runs[mode].append(per_mode[mode])
    select("c10")
    print(json.dumps({"runs": runs, "pair_ratios": pair_ratios, "floor_ratios": floor_ratios}))
    return 0


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        return child(sys.argv[2], int(sys.argv[3]))
    if len(sys.argv) == 4 and sys.argv[1] == "--child-in-process":
        return child_in_process(int(sys.argv[2]), int(sys.argv[3]))
    in_process = "--in-process" in sys.argv
    backends = ["c10", "plugin"]
    if "--backends" in sys.argv:
        backends = sys.argv[sys.argv.index("--backends") + 1].split(",")
    json_out = sys.argv[sys.argv.index("--json") + 1] if "--json" in sys.argv else None
    rounds = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 7
    if rounds < 1:
        print("--rounds must be at least 1", file=sys.stderr)
        return 2
    allowed = sorted(os.sched_getaffinity(0))
    cpu = int(sys.argv[sys.argv.index("--cpu") + 1]) if "--cpu" in sys.argv else allowed[-1]
    if cpu not in allowed:
        print(f"--cpu {cpu}: this process may run on CPUs {allowed} only", file=sys.stderr)
        return 2
    if in_process:
        backends = ["c10"]
        p = subprocess.run([sys.executable, os.path.abspath(__file__), "--child-in-process", str(cpu), str(rounds)],
                           capture_output=True, text=True, timeout=3600)
        if p.returncode != 0:
            print(f"in-process: exited {p.returncode}: {p.stderr[-1500:]}", file=sys.stderr)
            return 1
        child_out = json.loads(p.stdout.strip().splitlines()[-1])
        runs, pair_ratios, floor_ratios = child_out["runs"], child_out["pair_ratios"], child_out["floor_ratios"]
    else:
        runs = {m: [] for m in ["native"] + backends}
    for r in range(0 if in_process else rounds):
        for mode in ["native"] + backends:
            p = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", mode, str(cpu)],
                               capture_output=True, text=True, timeout=900)
            if p.returncode != 0:
                print(f"{mode}: exited {p.returncode}: {p.stderr[-1500:]}", file=sys.stderr)
                return 1
            runs[mode].append(json.loads(p.stdout.strip().splitlines()[-1]))
        print(f"round {r + 1} of {rounds} done", file=sys.stderr, flush=True)
    med = {m: {n: statistics.median(x[n] for x in runs[m]) for n in SIZES} for m in runs}
    if in_process:  # the adjacent pairs' ratios (rounds x repeats of them)
        ratios = {"c10": pair_ratios}
        print(f"{rounds} rounds, one process switching between both allocators on CPU {cpu}, each of "
              f"{REPEATS} repeats a pair of adjacent loops of {LOOPS}; ns are medians over rounds, ratios "
              "the median of the adjacent pairs' ratios (range)")
    else:  # one ratio a round, of the processes' medians
        ratios = {b: {n: [runs[b][i][n] / runs["native"][i][n] for i in range(rounds)] for n in SIZES}
                  for b in backends}
        print(f"{rounds} rounds, every process on CPU {cpu}; ns are medians over rounds, ratios the median "
              "of the rounds' ratios (range)")
    floor_head = " floor/native (torch.empty(0)) |" if in_process else ""
    print("| torch.empty + free | native ns | " + " | ".join(f"{b} ns | {b}/native" for b in backends) + " |"
          + floor_head)
    print("|---|---|" + "---|---|" * len(backends) + ("---|" if in_process else ""))
    for name in SIZES:
        row = [f"{med['native'][name]:.0f}"]
        for b in backends:
            rs = ratios[b][name]
            row += [f"{med[b][name]:.0f}", f"{statistics.median(rs):.2f} ({min(rs):.2f}-{max(rs):.2f})"]
        if in_process:
            fs = floor_ratios[name]
            row += [f"{statistics.median(fs):.2f} ({min(fs):.2f}-{max(fs):.2f})"]
        print(f"| {name} | " + " | ".join(row) + " |")
    results = {"rounds": rounds, "cpu": cpu, "in_process": in_process, "median_ns": med, "runs": runs,
               "ratio_median": {b: {n: statistics.median(v) for n, v in ratios[b].items()} for b in backends}}
    if in_process:
        results["pair_ratios"] = pair_ratios
        results["floor_ratios"] = floor_ratios
    if json_out:
        with open(json_out, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
