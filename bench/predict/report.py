#!/usr/bin/env python3
"""The table of bench/predict/run_suite.sh: predicted against native peaks and verdicts.

    report.py OUTDIR PROGRAM...

Per program: peak reserved and peak allocated of the two native runs and of the prediction (its
device row), the error |predicted / native - 1| against the first native run, the spread of the
two native runs, and at each cap whether the prediction's verdict (out of memory or not) equals the
GPU's where the GPU's two runs agree. Ends with the median and worst errors and the verdict count."""
import json
import os
import statistics
import sys

out, progs = sys.argv[1], sys.argv[2:]


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


rows, errs_r, errs_a, verdicts, times = [], [], [], [], []
print("| program | native reserved (run 1 / 2) | predicted | error | native allocated (1 / 2) | predicted | error | "
      "verdicts at 0.95/0.85/0.70 | predict s |")
print("|---|---|---|---|---|---|---|---|---|")
for p in progs:
    n1, n2, pr = (load(os.path.join(out, f"{p}.{s}.json")) for s in ("native1", "native2", "pred"))
    if not (n1 and n2 and pr):
        print(f"| {p} | missing: native1 {bool(n1)}, native2 {bool(n2)}, pred {bool(pr)} |")
        continue
    dev = next(r for r in pr["results"] if r["cap"] is None)
    er = dev["peak_reserved"] / n1["peak_reserved"] - 1
    ea = dev["peak_allocated"] / n1["peak_allocated"] - 1
    errs_r.append(abs(er))
    errs_a.append(abs(ea))
    marks = []
    for f in ("0.95", "0.85", "0.70"):
        r1, r2 = (load(os.path.join(out, f"{p}.cap{f}.r{r}.json")) for r in (1, 2))
        capped = [r for r in pr["results"] if r["cap"] is not None]
        idx = ("0.95", "0.85", "0.70").index(f)
        if not (r1 and r2) or idx >= len(capped):
            marks.append("?")
            continue
        g1, g2 = r1["status"] == "oom", r2["status"] == "oom"
        pred = capped[idx]["oom"]
        if g1 != g2:
            marks.append("GPU runs disagree")
            continue
        verdicts.append(pred == g1)
        marks.append(("OOM" if g1 else "fits") + ("" if pred == g1 else " (predicted the opposite)"))
    t = open(os.path.join(out, f"{p}.pred.time")).read().strip() if os.path.exists(os.path.join(out, f"{p}.pred.time")) else "?"
    times.append(t)
    print(f"| {p} | {n1['peak_reserved']} / {n2['peak_reserved']} | {dev['peak_reserved']} | {er:+.2%} | "
          f"{n1['peak_allocated']} / {n2['peak_allocated']} | {dev['peak_allocated']} | {ea:+.2%} | {', '.join(marks)} | {t} |")
if errs_r:
    print()
    print(f"peak reserved: median |error| {statistics.median(errs_r):.2%}, worst {max(errs_r):.2%} ({len(errs_r)} programs)")
    print(f"peak allocated: median |error| {statistics.median(errs_a):.2%}, worst {max(errs_a):.2%}")
    print(f"verdicts equal to the GPU's: {sum(verdicts)} of {len(verdicts)} (where the GPU's two runs agree)")
