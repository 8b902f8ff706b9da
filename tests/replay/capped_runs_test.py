#!/usr/bin/env python3
"""Replays under a cap against the GPU's own run under that cap (docs/pytorch-allocator.md §3.2).

Two programs of bench/predict (ViT-B/16 with checkpointing; an MLP with a side stream and
record_stream) were run natively on an H200 (PyTorch 2.11, 2026-12-01, bench/predict/record_native.py)
twice each in one session: without a cap (NAME.native) and under set_per_process_memory_fraction at
0.95 of the uncapped peak reserved (NAME.cap95). Each JSON beside a snapshot holds PyTorch's own
memory_stats() figures of that run. Both capped runs fit (no out-of-memory) after one free-and-retry.

Asserted:
- the uncapped trace replayed under the capped run's cap fits, with the capped run's peak reserved
  to the byte (the replay leaves the recorded addresses, which answer other device calls, and
  places segments as the driver does; ascending addresses ran out of memory here);
- the capped trace replayed under its own cap keeps its recorded addresses and gives its peak.

    capped_runs_test.py CACHET SNAPSHOT_DIR"""
import json
import os
import subprocess
import sys

cachet, d = sys.argv[1], sys.argv[2]
fails = 0


def check(cond, what):
    global fails
    print(("ok   " if cond else "FAIL ") + what)
    fails += 0 if cond else 1


def replay(path, cap):
    r = subprocess.run([cachet, "replay", path, "--cap", str(cap), "--json"], capture_output=True, text=True,
                       timeout=300)
    if r.returncode != 0:
        print(r.stderr)
        return {}
    return json.loads(r.stdout)[0]


for name in ("vit_timm_checkpointing", "side_stream_mlp"):
    capped = json.load(open(os.path.join(d, name + ".cap95.json")))
    cap = int(capped["fraction"] * capped["total_memory"])  # PyTorch's allowed_memory_maximum
    check(capped["status"] == "ended" and capped["num_ooms"] == 0, f"{name}: the GPU's capped run fits")
    row = replay(os.path.join(d, name + ".native.pickle.gz"), cap)
    check(row.get("num_ooms") == 0, f"{name}: the uncapped trace under the cap {cap} fits ({row.get('num_ooms')} OOMs)")
    check(row.get("peak_reserved") == capped["peak_reserved"],
          f"{name}: its peak reserved under the cap {row.get('peak_reserved')} is the capped run's "
          f"{capped['peak_reserved']}")
    check(row.get("addresses") == "synthetic", f"{name}: it left the recorded addresses ({row.get('addresses')})")
    own = replay(os.path.join(d, name + ".cap95.pickle.gz"), cap)
    check(own.get("addresses") == "recorded" and own.get("peak_reserved") == capped["peak_reserved"]
          and own.get("num_ooms") == 0,
          f"{name}: the capped trace under its own cap: {own.get('addresses')} addresses, peak reserved "
          f"{own.get('peak_reserved')}, {own.get('num_ooms')} OOMs")

print(f"capped_runs_test: {fails} failure(s)")
sys.exit(1 if fails else 0)
