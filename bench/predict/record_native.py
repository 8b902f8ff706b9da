#!/usr/bin/env python3
"""The GPU's truth for bench/predict: run a program natively on the GPU with PyTorch's memory
history on, and write its snapshot (torch.cuda.memory._dump_snapshot's pickle) and its peaks.

    python3 record_native.py --out DIR/NAME [--stacks python|all] [--fraction F] -- SCRIPT ARGS...

Writes NAME.pickle and NAME.json (peak reserved and allocated from memory_stats(), the device's
name and total memory from mem_get_info, whether the program ran out of memory, seconds)."""
import argparse
import json
import os
import runpy
import sys
import time
import traceback

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--stacks", default="python")
ap.add_argument("--fraction", type=float)
split = sys.argv.index("--")
a = ap.parse_args(sys.argv[1:split])
prog = sys.argv[split + 1:]
import torch  # noqa: E402

torch.cuda.init()
if a.fraction:
    torch.cuda.set_per_process_memory_fraction(a.fraction)
torch.cuda.memory._record_memory_history(max_entries=2**31 - 1, stacks=a.stacks)
t0 = time.time()
status = "ended"
sys.argv = prog
sys.path.insert(0, os.path.dirname(os.path.abspath(prog[0])))
try:
    runpy.run_path(prog[0], run_name="__main__")
except torch.OutOfMemoryError:
    status = "oom"
    traceback.print_exc()
torch.cuda.synchronize()
secs = time.time() - t0
torch.cuda.memory._dump_snapshot(a.out + ".pickle")
st = torch.cuda.memory_stats()
free, total = torch.cuda.mem_get_info()
json.dump({"status": status, "peak_reserved": st["reserved_bytes.all.peak"],
           "peak_allocated": st["allocated_bytes.all.peak"], "num_ooms": st["num_ooms"],
           "device": torch.cuda.get_device_name(0), "total_memory": total, "free_at_end": free,
           "reserved_at_end": torch.cuda.memory_reserved(), "seconds": secs,
           "fraction": a.fraction, "argv": prog}, open(a.out + ".json", "w"), indent=1)
print(f"native {os.path.basename(a.out)}: {status} peak reserved {st['reserved_bytes.all.peak']} "
      f"allocated {st['allocated_bytes.all.peak']} ({secs:.1f} s)")
