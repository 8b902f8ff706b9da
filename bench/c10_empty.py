#!/usr/bin/env python3
"""torch.empty + free through PyTorch, native allocator against cachet (issue 22): one run, each
allocator in a fresh process (the allocator is chosen once per process), the same loop, ratios
cachet / native. bench/RESULTS.md, "The c10 backend", has the figures.

usage: bench/c10_empty.py [--backends c10,plugin] [--json FILE]
Environment: CACHET_TORCH_LIB / CACHET_C10_LIB as for cachet_torch.install(); PYTHONPATH holding
python/ (cachet_torch).
"""
import json
import os
import statistics
import subprocess
import sys

SIZES = {"512 B": 512, "1 MiB": 1 << 20, "64 MiB": 64 << 20}
LOOPS = 20000
REPEATS = 9


def child(mode):
    if mode != "native":
        import cachet_torch
        cachet_torch.install(backend=mode)
    import time
    import torch
    torch.empty(1, device="cuda")
    out = {}
    for name, n in SIZES.items():
        reps = []
        for _ in range(REPEATS + 1):
            t0 = time.perf_counter()
            for _ in range(LOOPS):
                x = torch.empty(n, dtype=torch.uint8, device="cuda")
                del x
            reps.append((time.perf_counter() - t0) / LOOPS * 1e9)
        out[name] = statistics.median(reps[1:])
    print(json.dumps(out))
    return 0


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        return child(sys.argv[2])
    backends = ["c10", "plugin"]
    if "--backends" in sys.argv:
        backends = sys.argv[sys.argv.index("--backends") + 1].split(",")
    json_out = sys.argv[sys.argv.index("--json") + 1] if "--json" in sys.argv else None
    results = {}
    for mode in ["native"] + backends:
        r = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", mode],
                           capture_output=True, text=True, timeout=900)
        if r.returncode != 0:
            print(f"{mode}: exited {r.returncode}: {r.stderr[-1500:]}", file=sys.stderr)
            return 1
        results[mode] = json.loads(r.stdout.strip().splitlines()[-1])
    print("| torch.empty + free | native ns | " + " | ".join(f"{b} ns | {b}/native" for b in backends) + " |")
    print("|---|---|" + "---|---|" * len(backends))
    for name in SIZES:
        row = [f"{results['native'][name]:.0f}"]
        for b in backends:
            row += [f"{results[b][name]:.0f}", f"{results[b][name] / results['native'][name]:.2f}"]
        print(f"| {name} | " + " | ".join(row) + " |")
    if json_out:
        with open(json_out, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
