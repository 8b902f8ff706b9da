#!/usr/bin/env python3
"""Sleep and wake speed (issue 24, Done-when 5; cachet's rules: docs/sleep-wake.md): in one run
on one GPU, beside a pinned cudaMemcpy of the same bytes (torch's copy_ between a pinned host
tensor and a device tensor), the time of cachet_torch.sleep() and wake() of 1, 8 and 32 GiB,
all backed up and none backed up, for each configuration in one fresh process each:
policy:pytorch and policy:cachet, expandable segments off and on (2 MiB pages).

Targets (the issue's): a wake of 8 GiB all backed up takes at most 1.25x the pinned host-to-device
copy of 8 GiB, a sleep at most 1.25x the device-to-host copy; with nothing backed up each takes
at most 2 ms per GiB. The script prints one row per (configuration, size, backup) with the
median of REPEATS runs, the copy baselines, the ratios and PASS/FAIL against the targets, and
exits 1 when any 8 GiB target fails.

usage: bench/sleep_bench.py [--sizes 1,8,32] [--configs pytorch,cachet-expandable,...] [--json FILE]
Environment: CACHET_TORCH_LIB / CACHET_C10_LIB as for cachet_torch.install(); PYTHONPATH holding
python/ (cachet_torch). 32 GiB needs 32 GiB free on the device and 64 GiB of host memory.
"""
import json
import os
import statistics
import subprocess
import sys

GiB = 1 << 30
REPEATS = 5
CONFIGS = {
    "pytorch": "policy:pytorch,cachet_sleep:True",
    "pytorch-expandable": "policy:pytorch,cachet_sleep:True,expandable_segments:True",
    "cachet": "policy:cachet,cachet_sleep:True",
    "cachet-expandable": "policy:cachet,cachet_sleep:True,expandable_segments:True",
}


def child(sizes):
    import time
    import cachet_torch as ct
    ct.install(backend="c10")
    import torch
    out = {"rows": []}
    for gib in sizes:
        n = gib * GiB
        # The baselines: one pinned copy each way of the same bytes.
        host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
        with ct.tag("bench"):
            dev = torch.empty(n, dtype=torch.uint8, device="cuda")
        dev.fill_(7)
        h2d, d2h = [], []
        for _ in range(REPEATS):
            torch.cuda.synchronize()
            t = time.perf_counter()
            dev.copy_(host, non_blocking=True)
            torch.cuda.synchronize()
            h2d.append(time.perf_counter() - t)
            t = time.perf_counter()
            host.copy_(dev, non_blocking=True)
            torch.cuda.synchronize()
            d2h.append(time.perf_counter() - t)
        del host
        for backup in (True, False):
            sl, wk = [], []
            for _ in range(REPEATS):
                torch.cuda.synchronize()
                t = time.perf_counter()
                ct.sleep(tags=("bench",), backup=("bench",) if backup else ())
                sl.append(time.perf_counter() - t)
                t = time.perf_counter()
                ct.wake(tags=("bench",))
                torch.cuda.synchronize()
                wk.append(time.perf_counter() - t)
            out["rows"].append({"gib": gib, "backup": backup, "sleep_s": statistics.median(sl),
                                "wake_s": statistics.median(wk), "h2d_s": statistics.median(h2d),
                                "d2h_s": statistics.median(d2h)})
        del dev
        torch.cuda.empty_cache()
    out["device"] = torch.cuda.get_device_name(0)
    print(json.dumps(out))


def main():
    args = sys.argv[1:]
    if len(args) >= 2 and args[0] == "--child":
        child([int(x) for x in args[1].split(",")])
        return 0
    sizes, out_json = "1,8,32", None
    if "--sizes" in args:
        sizes = args[args.index("--sizes") + 1]
    if "--json" in args:
        out_json = args[args.index("--json") + 1]
    names = list(CONFIGS)
    if "--configs" in args:
        names = args[args.index("--configs") + 1].split(",")
        unknown = [n for n in names if n not in CONFIGS]
        if unknown:
            print(f"--configs: unknown {', '.join(unknown)} (known: {', '.join(CONFIGS)})", file=sys.stderr)
            return 2
    results, failed = {}, False
    for name in names:
        conf = CONFIGS[name]
        env = dict(os.environ, CACHET_ALLOC_CONF=conf)
        r = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", sizes], env=env,
                           capture_output=True, text=True, timeout=3000)
        if r.returncode != 0:
            print(f"{name}: FAILED (exit {r.returncode})\n{r.stderr[-3000:]}")
            failed = True
            continue
        res = json.loads(r.stdout.strip().splitlines()[-1])
        results[name] = res
        print(f"{name} on {res['device']}")
        print(f"  {'GiB':>4} {'backup':>6} {'sleep ms':>9} {'wake ms':>9} {'D2H ms':>8} {'H2D ms':>8}  verdict")
        for row in res["rows"]:
            g, b = row["gib"], row["backup"]
            s_ms, w_ms = row["sleep_s"] * 1e3, row["wake_s"] * 1e3
            if b:
                ok = s_ms <= 1.25 * row["d2h_s"] * 1e3 and w_ms <= 1.25 * row["h2d_s"] * 1e3
                verdict = f"sleep/D2H {s_ms / (row['d2h_s'] * 1e3):.2f}x, wake/H2D {w_ms / (row['h2d_s'] * 1e3):.2f}x"
            else:
                ok = s_ms <= 2.0 * g and w_ms <= 2.0 * g
                verdict = f"{s_ms / g:.2f} / {w_ms / g:.2f} ms per GiB"
            verdict += " PASS" if ok else " FAIL"
            if g == 8 and not ok:
                failed = True
            print(f"  {g:>4} {str(b):>6} {s_ms:>9.2f} {w_ms:>9.2f} {row['d2h_s'] * 1e3:>8.2f} "
                  f"{row['h2d_s'] * 1e3:>8.2f}  {verdict}")
    if out_json:
        with open(out_json, "w") as f:
            json.dump(results, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
