#!/usr/bin/env python3
"""The replay side of `cachet predict`, against the GPU (tests/predict/CMakeLists.txt).

    predict_replay_test.py CACHET DATA_DIR"""
import json
import os
import subprocess
import sys

cachet, data = sys.argv[1], sys.argv[2]
truth = json.load(open(os.path.join(data, "truth.json")))
device = str(truth["device_memory_for_replay"])
known = truth["known_verdict_differences"]
fails = checked = 0


def replay(snap, *extra):
    r = subprocess.run([cachet, "replay", snap, "--json", "--device-memory", device, *extra],
                       capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise SystemExit(f"cachet replay {snap} failed ({r.returncode}): {r.stderr}")
    return json.loads(r.stdout)[0]


for name, t in truth["programs"].items():
    snap = os.path.join(data, f"{name}.pred.pickle.gz")
    row = replay(snap)
    for kind, key, bound in (("reserved", "peak_reserved", t["max_error_reserved"]),
                             ("allocated", "peak_allocated", t["max_error_allocated"])):
        native = t[f"native_peak_{kind}"][0]
        err = row[key] / native - 1
        ok = abs(err) <= bound + 1e-12
        checked += 1
        fails += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {name}: peak {kind} {row[key]} vs GPU {native}: {err:+.4%} (bound {bound:.2%})")
    for c in t["caps"]:
        gpu = c["gpu"]
        if gpu[0] != gpu[1]:
            print(f"skip {name} at {c['fraction_of_peak']}: the GPU's two runs disagree")
            continue
        r = replay(snap, "--cap", str(c["cap"]))
        predicted_oom = r["num_ooms"] > 0 or r["failed_allocs"] > 0
        gpu_oom = gpu[0] == "oom"
        key = f"{name}@{c['fraction_of_peak']:.2f}"
        expected_same = key not in known
        ok = (predicted_oom == gpu_oom) == expected_same
        checked += 1
        fails += not ok
        what = "OOM" if predicted_oom else "fits"
        note = "" if expected_same else f" (known difference: {known[key]})"
        print(f"{'ok  ' if ok else 'FAIL'} {key}: replay {what}, GPU {'OOM' if gpu_oom else 'fits'}{note}")
print(f"predict_replay_test: {checked - fails} passed, {fails} failed")
sys.exit(1 if fails else 0)
