#!/usr/bin/env python3
"""bench/policy_waste.py: issue 9's waste, cap and steady-state figures, one table.

Replays every workload trace and every recorded op sequence in tests/data/oracle (or the
directories given with --workloads/--results) with `cachet replay --json --addresses synthetic`
under PyTorch's default, PyTorch with expandable segments, and policy:cachet, and prints a
markdown table: waste (peak reserved / peak requested), the goal limit, OOMs and device calls
in the second half of the trace.

Usage: bench/policy_waste.py [--cachet build/default/tools/cachet] [--workloads DIR] [--results DIR]
(--cachet defaults to the default preset's build: `cmake --preset default && cmake --build
build/default --target cachet`.)
Exit 1 when a goal is not met (so CI-style runs can use it), 2 on bad input, 0 otherwise.
"""
import argparse, glob, json, math, os, subprocess, sys

MiB = 1 << 20
PAGE = 2 * MiB


def replay(cachet, trace, policy, confs):
    cmd = [cachet, "replay", trace, "--json", "--addresses", "synthetic", "--policy", policy]
    for c in confs:
        cmd += ["--conf", c]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        print(f"policy_waste: `{' '.join(cmd)}` exited {r.returncode}:\n{r.stderr.strip()}", file=sys.stderr)
        sys.exit(2)
    return json.loads(r.stdout)


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
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--cachet", default=os.path.join(repo, "build", "default", "tools", "cachet"),
                    help="the cachet command (default: build/default/tools/cachet of this checkout)")
    root = os.path.join(repo, "tests", "data", "oracle")
    ap.add_argument("--workloads", default=os.path.join(root, "workloads"))
    ap.add_argument("--results", default=os.path.join(root, "results"))
    a = ap.parse_args()
    if not (os.path.isfile(a.cachet) and os.access(a.cachet, os.X_OK)):
        print(f"policy_waste: no cachet command at {a.cachet}: build it with `cmake --preset default "
              f"&& cmake --build build/default --target cachet`, or pass --cachet PATH", file=sys.stderr)
        sys.exit(2)
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
