#!/usr/bin/env python3
"""The capture side of `cachet predict` on a machine with torch, the device hidden
(CUDA_VISIBLE_DEVICES=): a training step with backward, autocast, GradScaler, a side stream and
.item() runs on the fake device and gives exact JSON; bad input exits 2 with its reason.

    test_predict.py CACHET   (exit 77 when this Python has no CUDA build of torch)"""
import json
import os
import pickle
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
cachet = sys.argv[1]
try:
    import torch  # noqa: F401
except ImportError:
    print("skipped: no torch in this Python")
    sys.exit(77)
if not torch.version.cuda:
    print("skipped: torch without CUDA")
    sys.exit(77)
env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
prog = os.path.join(HERE, "predict", "train_step.py")
fails = 0


def check(cond, what):
    global fails
    print(("ok   " if cond else "FAIL ") + what)
    fails += 0 if cond else 1


def predict(*args):
    return subprocess.run([cachet, "predict", "--python", sys.executable, *args], env=env, capture_output=True,
                          text=True, timeout=300)


snap = "/tmp/cachet_predict_test.pickle"
r = predict("--gpu", "H100", "--json", "--cap", "64M", "--dump-snapshot", snap, "--", prog)
check(r.returncode == 0, f"train step predicted, exit 0 (got {r.returncode}: {r.stderr[-2000:]})")
j = json.loads(r.stdout) if r.returncode == 0 else {}
check(j.get("gpu") == "NVIDIA H100 80GB HBM3" and j.get("arch") == "sm_90", "target is the H100, sm_90")
check(j.get("device_memory") == 85017362432, "H100 total memory as cudaMemGetInfo reports it")
res = j.get("results", [])
check(len(res) == 2 and res[0]["cap"] is None and res[1]["cap"] == 64 << 20, "one row for the device, one for the cap")
if len(res) == 2:
    # 1024x4096 + 4096x1024 fp32 weights, grads and two Adam states: at least 4 x 33.6 MB.
    check(res[0]["peak_allocated"] >= 4 * 2 * 1024 * 4096 * 4, f"peak allocated counts weights, grads, Adam state ({res[0]['peak_allocated']})")
    check(res[0]["peak_reserved"] >= res[0]["peak_allocated"], "peak reserved >= peak allocated")
    check(not res[0]["oom"] and res[1]["oom"], "fits on the device, runs out of memory under a 64 MiB cap")
    check(res[1]["first_oom"] is not None, "the capped row explains its first out-of-memory error")
check(any(h["kind"] == "cublas_workspace" and h["bytes"] >= 32 << 20 for h in j.get("hidden", [])),
      "the cuBLAS workspace (32 MiB on sm_90) is in the trace")
check(any("record_stream" in a for a in j.get("assumptions", [])), "assumptions name the event timing")
check(j.get("partial") is False, "not partial")
if os.path.exists(snap):
    s = pickle.load(open(snap, "rb"))
    check(s.get("cachet_predicted", {}).get("gpu") == "NVIDIA H100 80GB HBM3", "the snapshot says it was predicted, for which GPU")
    check(any(e.get("action") == "alloc" and e.get("frames") for e in s["device_traces"][0]), "allocations carry Python frames")
    rr = subprocess.run([cachet, "replay", snap, "--json", "--device-memory", str(85017362432 - j["outside_allocator_bytes"])],
                        capture_output=True, text=True)
    rows = json.loads(rr.stdout) if rr.returncode == 0 else []
    check(bool(rows) and rows[0]["peak_reserved"] == res[0]["peak_reserved"], "cachet replay of the snapshot gives the prediction's peak")
r = predict("--gpu", "H100", "--json", "--", prog, "--raise-at", "1")
check(r.returncode == 2, f"a program that raises: exit 2 (got {r.returncode})")
check("planted failure at step 1" in r.stderr, "its traceback is shown")
j = json.loads(r.stdout) if r.stdout.strip().startswith("{") else {}
check(j.get("partial") is True and j.get("results"), "partial: true, with the prediction up to there")
r = predict("--gpu", "H900", "--", prog)
check(r.returncode == 2 and "NVIDIA H200" in r.stderr, "unknown GPU: exit 2 with the list")
r = subprocess.run([cachet, "predict", "--python", "/nonexistent/python", "--gpu", "H100", "--", prog], env=env,
                   capture_output=True, text=True)
check(r.returncode == 2 and "--python" in r.stderr, "no such Python: exit 2, names --python")
print(f"test_predict: {fails} failed")
sys.exit(1 if fails else 0)
