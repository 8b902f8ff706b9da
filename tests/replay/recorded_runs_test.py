#!/usr/bin/env python3
"""Three real runs recorded on the H200 for the OOM doctor (issue 35), each beside the figures
PyTorch reported in the same process (its memory_stats(), tests/data/oracle/snapshots/NAME.json):

- t5_train: T5 training with fp16 and GradScaler (bench/predict/programs/t5_train_fp16_scaler.py
  --steps 2), no cap, stacks="all";
- t5_train_oom: the same at batch 32 under set_per_process_memory_fraction(0.02): PyTorch ran out of
  memory;
- resnet18_cxx: torchvision ResNet-18 training with stacks="all" (C++ frames in every entry).

Asserted against PyTorch's own figures: replay's peaks are PyTorch's to the byte; every command
says the capped T5 run does not fit and gives one pick; explain's sites on the C++-framed snapshot
name Python code or an autograd node, never PyTorch's own C++ frames.

    recorded_runs_test.py CACHET SNAPSHOT_DIR"""
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


def run(*args):
    r = subprocess.run([cachet, *args], capture_output=True, text=True, timeout=300)
    return r.returncode, r.stdout, r.stderr


def snap(name):
    return os.path.join(d, name + ".pickle.gz")


for name in ("t5_train", "resnet18_cxx"):
    truth = json.load(open(os.path.join(d, name + ".json")))
    rc, out, err = run("replay", snap(name), "--json")
    row = json.loads(out)[0] if rc == 0 else {}
    check(row.get("peak_reserved") == truth["peak_reserved"],
          f"{name}: replay's peak reserved {row.get('peak_reserved')} is PyTorch's {truth['peak_reserved']}")
    check(row.get("peak_allocated") == truth["peak_allocated"],
          f"{name}: replay's peak allocated {row.get('peak_allocated')} is PyTorch's {truth['peak_allocated']}")

oom = json.load(open(os.path.join(d, "t5_train_oom.json")))
cap = str(int(oom["fraction"] * oom["total_memory"]))
rc, out, err = run("tune", snap("t5_train_oom"), "--cap", cap, "--json")
tj = json.loads(out) if rc == 0 else {}
check(tj.get("verdict", {}).get("fits") is False, "tune: the recorded configuration does not fit under the cap (PyTorch ran out of memory)")
rc, out, err = run("explain", snap("t5_train_oom"), "--cap", cap, "--json")
ej = json.loads(out) if rc == 0 else {}
pick = tj["results"][tj["pick"]]["conf"] if tj.get("pick", -1) >= 0 else ""
check(ej.get("recommendation", {}).get("conf") == pick, f"explain's fix is tune's pick ({pick!r})")
rc, out, err = run("replay", snap("t5_train_oom"), "--cap", cap, "--json")
check(rc == 0 and json.loads(out)[0]["num_ooms"] >= 1, "replay under the cap runs out of memory, as PyTorch did")
rc, out, err = run("explain", snap("resnet18_cxx"), "--cap", "2G")
sites = out[out.find("Allocation sites"):].split("\n\n")[0].splitlines()[1:]
check(len(sites) >= 3, f"explain lists allocation sites ({len(sites)})")
bad = [s for s in sites if "torch::unwind" in s or "??" in s or " c10::" in s or " at::" in s]
check(not bad, f"no site is one of PyTorch's own C++ frames ({bad[:2]})")
check(any(".py:" in s for s in sites), "a site names the Python code")
print(f"recorded_runs_test: {fails} failed")
sys.exit(1 if fails else 0)
