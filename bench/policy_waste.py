#!/usr/bin/env python3
"""bench/policy_waste.py: issue 9's waste, cap and steady-state figures, one table.

Replays every workload trace and every recorded op sequence in tests/data/oracle (or the
directories given with --workloads/--results) with `cachet replay --json --addresses synthetic`
under PyTorch's default, PyTorch with expandable segments, and policy:cachet, and prints a
markdown table: waste (peak reserved / peak requested), the goal limit, OOMs and device calls
in the second half of the trace.

Usage: bench/policy_waste.py --cachet build/tools/cachet [--workloads DIR] [--results DIR]
Exit 1 when a goal is not met (so CI-style runs can use it), 0 otherwise.
"""
import argparse, glob, json, math, os, subprocess, sys

MiB = 1 << 20
PAGE = 2 * MiB


def replay(cachet, trace, policy, confs):
    cmd = [cachet, "replay", trace, "--json", "--addresses", "synthetic", "--policy", policy]
    for c in confs:
        cmd += ["--conf", c]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def streams_in_use(trace):
    """Streams of the allocations in a trace or recording (count of distinct ones)."""
    import gzip
    op = gzip.open if trace.endswith(".gz") else open
    with op(trace, "rt") as f:
        d = json.load(f)
    s = set()
    if isinstance(d, dict) and "steps" in d:  # a recording (tests/data/oracle/results)
        for e in d.get("trace", []):
            if e[0] == "alloc":
                s.add(e[3])
    elif isinstance(d, dict):  # a PyTorch trace/snapshot
        for dev in d.get("device_traces", []):
            for e in dev:
                if e.get("action") == "alloc":
                    s.add(e.get("stream", 0))
    return max(1, len(s))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cachet", required=True)
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "oracle")
    ap.add_argument("--workloads", default=os.path.join(root, "workloads"))
    ap.add_argument("--results", default=os.path.join(root, "results"))
    a = ap.parse_args()
    traces = sorted(glob.glob(os.path.join(a.workloads, "*.trace.json.gz")))
    traces += sorted(glob.glob(os.path.join(a.results, "*_default.json.gz")))
    print("| trace | streams | peak requested (B) | pytorch default | pytorch expandable | cachet | cachet peak reserved (B) "
          "| limit: 1.05x + 2 MiB/stream (B) | met | OOMs default / expandable / cachet | 2nd-half device calls default / cachet |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    ok = True
    for t in traces:
        name = os.path.basename(t).replace(".trace.json.gz", "").replace(".json.gz", "")
        py = replay(a.cachet, t, "pytorch", ["", "expandable_segments:True"])
        ca = replay(a.cachet, t, "cachet", [""])[0]
        d, e = py
        n = streams_in_use(t)
        preq = ca["peak_requested"]
        limit = 1.05 * preq + n * PAGE
        pressure = "pressure" in name
        met_waste = ca["peak_reserved"] <= limit and ca["peak_reserved"] <= min(d["peak_reserved"], e["peak_reserved"])
        met_ooms = ca["num_ooms"] <= min(d["num_ooms"], e["num_ooms"])
        train = "train" in name
        met_steady = (not train) or ca["second_half_device_calls"] <= d["second_half_device_calls"]
        met = (met_waste or pressure) and met_ooms and met_steady
        ok = ok and met
        print(f"| {name} | {n} | {preq:,} | {d['peak_reserved']/preq:.3f} | {e['peak_reserved']/preq:.3f} | "
              f"**{ca['waste']:.4f}** | {ca['peak_reserved']:,} | {int(limit):,} | {'yes' if met else '**no**'} | "
              f"{d['num_ooms']} / {e['num_ooms']} / {ca['num_ooms']} | "
              f"{d['second_half_device_calls']} / {ca['second_half_device_calls']} |")
        sys.stdout.flush()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
