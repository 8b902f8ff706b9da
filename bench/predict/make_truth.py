#!/usr/bin/env python3
"""tests/data/predict from run_suite.sh's output (docs/predict.md section 6): the GPU's truth
(both native runs' peaks, both capped runs' verdicts) and each predicted snapshot, gzipped, for
tests/predict/predict_replay_test.py, which replays the snapshots in CI against this truth.

    make_truth.py DATA_DIR SOURCE_TEXT SET=OUTDIR[,PROGRAM...] [SET=OUTDIR ...]

Each program's error bound is the error measured in that run, rounded up to 0.01%: a replay that
moves further from the GPU fails the test."""
import glob
import gzip
import json
import math
import os
import shutil
import sys

data, source = sys.argv[1], sys.argv[2]
truth = {"source": source, "device_memory_for_replay": 149305819136,
         "note": "peak errors bound: |predicted/native - 1| as measured on the GPU, rounded up to 0.01%; "
                 "a larger error fails the test", "programs": {}, "known_verdict_differences": {}}
old = os.path.join(data, "truth.json")
if os.path.exists(old):
    truth["known_verdict_differences"] = json.load(open(old)).get("known_verdict_differences", {})
for f in glob.glob(os.path.join(data, "*.pred.pickle.gz")):
    os.remove(f)


def bound(pred, native):
    return math.ceil(abs(pred / native - 1) * 1e4 + 1e-9) / 1e4


for arg in sys.argv[3:]:
    set_name, out = arg.split("=", 1)
    names = sorted(os.path.basename(p)[:-len(".pred.json")] for p in glob.glob(os.path.join(out, "*.pred.json")))
    for name in names:
        n = [json.load(open(os.path.join(out, f"{name}.native{r}.json"))) for r in (1, 2)]
        pred = json.load(open(os.path.join(out, f"{name}.pred.json")))["results"][0]
        caps = [int(c) for c in open(os.path.join(out, f"{name}.caps")).read().split() if c != "--cap"]
        rows = []
        for frac, cap in zip((0.95, 0.85, 0.7), caps):
            gpu = [json.load(open(os.path.join(out, f"{name}.cap{frac:.2f}.r{r}.json")))["status"] for r in (1, 2)]
            rows.append({"fraction_of_peak": frac, "cap": cap, "gpu": gpu})
        truth["programs"][name] = {
            "set": set_name,
            "native_peak_reserved": [x["peak_reserved"] for x in n],
            "native_peak_allocated": [x["peak_allocated"] for x in n],
            "max_error_reserved": bound(pred["peak_reserved"], n[0]["peak_reserved"]),
            "max_error_allocated": bound(pred["peak_allocated"], n[0]["peak_allocated"]),
            "caps": rows,
        }
        with open(os.path.join(out, f"{name}.pred.pickle"), "rb") as src, \
                gzip.GzipFile(os.path.join(data, f"{name}.pred.pickle.gz"), "wb", mtime=0) as dst:
            shutil.copyfileobj(src, dst)
with open(old, "w") as f:
    json.dump(truth, f, indent=1)
    f.write("\n")
print(f"{len(truth['programs'])} programs written to {data}")
