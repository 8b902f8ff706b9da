#!/usr/bin/env python3
"""`cachet predict`'s answers for a capture made on the GPU machine, without torch
(CACHET_PREDICT_USE_CAPTURE): the JSON contract's fields and values, asserted against the GPU's
truth (tests/data/predict/truth.json) and against what `cachet replay` and `cachet tune` say of the
same snapshot (one answer from every command).

    predict_offline_test.py CACHET DATA_DIR"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

cachet, data = sys.argv[1], sys.argv[2]
truth = json.load(open(os.path.join(data, "truth.json")))["programs"]["gpt2_train_bf16"]
cap_dir = tempfile.mkdtemp()
shutil.copy(os.path.join(data, "gpt2_train_bf16.pred.pickle.gz"), os.path.join(cap_dir, "snapshot.pickle"))
shutil.copy(os.path.join(data, "gpt2_train_bf16.capture.json"), os.path.join(cap_dir, "capture.json"))
script = os.path.join(cap_dir, "train.py")
open(script, "w").write("")
env = dict(os.environ, CACHET_PREDICT_USE_CAPTURE=cap_dir)
fails = 0


def check(cond, what):
    global fails
    print(("ok   " if cond else "FAIL ") + what)
    fails += 0 if cond else 1


caps = [c["cap"] for c in truth["caps"]]
r = subprocess.run([cachet, "predict", "--gpu", "H200", "--json", *sum((["--cap", str(c)] for c in caps), []),
                    "--", script], env=env, capture_output=True, text=True, timeout=120)
check(r.returncode == 0, f"exit 0 ({r.returncode}: {r.stderr[-500:]})")
j = json.loads(r.stdout)
for key in ("gpu", "device_memory", "arch", "conf_source", "results", "recommendation", "hidden",
            "outside_allocator_bytes", "assumptions", "partial", "batch", "seconds"):
    check(key in j, f"JSON has {key}")
check(j["gpu"] == "NVIDIA H200" and j["device_memory"] == 150109880320 and j["arch"] == "sm_90", "the H200 row")
check(j["conf_source"] == "none set: PyTorch's defaults", "conf_source says no variable was set")
rows = j["results"]
check([x["cap"] for x in rows] == [None] + caps, "the device row, then one row per cap in order")
check(rows[0]["peak_reserved"] == truth["native_peak_reserved"][0], "device row: peak reserved equals the GPU's, to the byte")
check(abs(rows[0]["peak_allocated"] / truth["native_peak_allocated"][0] - 1) <= truth["max_error_allocated"],
      "device row: peak allocated within the measured error of the GPU's")
gpu_oom = [c["gpu"][0] == "oom" for c in truth["caps"]]
check([x["oom"] for x in rows[1:]] == gpu_oom, f"verdicts at 0.95/0.85/0.70 equal the GPU's ({gpu_oom})")
check(all((x["first_oom"] is not None) == x["oom"] for x in rows), "first_oom exactly where a row runs out of memory")
check(any(h["kind"] == "cublas_workspace" and h["bytes"] == 2 * 33554432 for h in j["hidden"]),
      "two 32 MiB cuBLAS workspaces (two threads' handles)")
check(j["outside_allocator_bytes"] == 804061184, "outside the allocator: the H200 median")
check(j["partial"] is False and j["batch"] is None, "not partial, no batch search")
# One answer: predict's figures are cachet replay's and its recommendation is cachet tune's.
dev = str(150109880320 - 804061184)
rep = json.loads(subprocess.run([cachet, "replay", os.path.join(cap_dir, "snapshot.pickle"), "--json", "--cap",
                                 str(caps[0]), "--device-memory", dev], capture_output=True, text=True).stdout)[0]
check(rep["peak_reserved"] == rows[1]["peak_reserved"], "the 0.95 row is cachet replay's")
tune = json.loads(subprocess.run([cachet, "tune", os.path.join(cap_dir, "snapshot.pickle"), "--json", "--cap",
                                  str(caps[0]), "--device-memory", dev], capture_output=True, text=True).stdout)
check(j["recommendation"]["best"] == tune["best"] and j["recommendation"]["results"][tune["best"]]["conf"] ==
      tune["results"][tune["best"]]["conf"], "the recommendation is cachet tune's")
snap = os.path.join(cap_dir, "out.pickle")
r = subprocess.run([cachet, "predict", "--gpu", "H200", "--dump-snapshot", snap, "--", script], env=env,
                   capture_output=True, text=True, timeout=120)
check(r.returncode == 0 and "fits" in r.stdout and "peak reserved" in r.stdout, "text output with a verdict")
check(os.path.exists(snap), "--dump-snapshot writes the snapshot")
r = subprocess.run([cachet, "predict", "--gpu", "H200", "--fail-on-oom", "--cap", str(caps[2]), "--", script], env=env,
                   capture_output=True, text=True, timeout=120)
check(r.returncode == 1 and "OUT OF MEMORY" in r.stdout, "--fail-on-oom: exit 1 when an out-of-memory error is predicted")
print(f"predict_offline_test: {fails} failed")
sys.exit(1 if fails else 0)
