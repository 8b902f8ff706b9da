#!/usr/bin/env python3
"""bench/report.py: cachet_bench's --benchmark_out JSON as a markdown table with ratios.

    python3 bench/report.py build/gpu-out/bench.json [--peer-table]

Rows are patterns, columns the peers found (Cachet, PyTorch, CudaMallocAsync, Host), figures
in ns per pair or per op (the benchmarks' ns_per_pair / ns_per_op counters), then the ratios
cachet/PyTorch and cachet/cudaMallocAsync (below 1: cachet is faster). --peer-table adds the
oracle's recorded peer latencies (H200, tests/data/oracle/ORACLE_README.md) for comparison. When
the run has both host-backend peers, a second table puts the two policies side by side: Host
(policy:pytorch) and HostCachetPolicy (policy:cachet), with cachet/pytorch (target: <= 1.2,
"hot path within 1.2x of the pytorch policy"). The trace benchmarks (Trace/...) follow with
their targets. Standard library only (python3 on the GPU machine has nothing beyond torch).
"""
import json
import re
import sys

PEERS = ["Cachet", "PyTorch", "CudaMallocAsync", "Host"]
# The host backend under each policy: (peer for policy:pytorch, peer for policy:cachet).
POLICY_PEERS = ("Host", "HostCachetPolicy")
POLICY_TARGET = 1.2  # cachet policy / pytorch policy on the hot path
PATTERNS = [  # (pattern name in the benchmark, label, counter)
    ("pair/512B", "same-size pair, 512 B", "ns_per_pair"),
    ("pair/1MiB", "same-size pair, 1 MiB", "ns_per_pair"),
    ("pair/64MiB", "same-size pair, 64 MiB", "ns_per_pair"),
    ("window/1B-1MiB/64live", "random 1 B..1 MiB, 64 live, per op", "ns_per_op"),
    ("window/512B-256MiB/128live", "random 512 B..256 MiB, 128 live, per op", "ns_per_op"),
    ("pair_mt/1MiB@1", "1 MiB pairs, 1 thread, aggregate per pair", "ns_per_pair"),
    ("pair_mt/1MiB@2", "1 MiB pairs, 2 threads, aggregate per pair", "ns_per_pair"),
    ("pair_mt/1MiB@4", "1 MiB pairs, 4 threads, aggregate per pair", "ns_per_pair"),
    ("pair_mt/1MiB@8", "1 MiB pairs, 8 threads, aggregate per pair", "ns_per_pair"),
]
# The oracle's H200 figures (PyTorch, cudaMallocAsync), ns; None = not recorded.
ORACLE = {
    "pair/512B": (461, 816), "pair/1MiB": (469, 865), "pair/64MiB": (377, 798),
    "window/1B-1MiB/64live": (339, 637), "window/512B-256MiB/128live": (460, 1559),
    "pair_mt/1MiB@8": (3341, 3771),
}
UNIT_NS = {"ns": 1.0, "us": 1e3, "ms": 1e6, "s": 1e9}


def key_of(name, threads):
    """'Cachet/pair_mt/1MiB/real_time/threads:4' -> ('Cachet', 'pair_mt/1MiB@4')."""
    parts = [p for p in name.split("/") if p != "real_time" and not p.startswith("threads:")
             and not p.startswith("min_time:") and not p.startswith("iterations:")]
    peer, pattern = parts[0], "/".join(parts[1:])
    if pattern.startswith("pair_mt/"):
        pattern += "@%d" % threads
    return peer, pattern


def fmt(v):
    return "—" if v is None else ("{:,.0f}".format(v) if v >= 100 else "{:.1f}".format(v))


def ratio(a, b):
    return "—" if a is None or b is None or b == 0 else "{:.2f}".format(a / b)


def policy_table(figures):
    """The host backend's two policies side by side, or [] when the run lacks one of them."""
    py, ca = POLICY_PEERS
    if not any(k[0] == py for k in figures) or not any(k[0] == ca for k in figures):
        return []
    out = ["", "Host backend, policy:pytorch (%s) vs policy:cachet (%s):" % POLICY_PEERS, "",
           "| pattern | pytorch policy ns | cachet policy ns | cachet/pytorch |", "|---|---|---|---|"]
    met = total = 0
    for pattern, label, _ in PATTERNS:
        a, b = figures.get((py, pattern)), figures.get((ca, pattern))
        if a is None and b is None:
            continue
        out.append("| %s | %s | %s | %s |" % (label, fmt(a), fmt(b), ratio(b, a)))
        if a and b is not None:
            total += 1
            met += b / a <= POLICY_TARGET
    out.append("")
    out.append("cachet/pytorch <= %.1f on %d of %d patterns" % (POLICY_TARGET, met, total))
    return out


def main(argv):
    if len(argv) < 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    with open(argv[1]) as f:
        doc = json.load(f)
    peer_table = "--peer-table" in argv[2:]
    ctx = doc.get("context", {})
    figures, errors, trace = {}, {}, []
    for b in doc.get("benchmarks", []):
        if b.get("run_type") == "aggregate" and b.get("aggregate_name") != "mean":
            continue
        name = b["name"]
        if name.startswith("Trace/"):
            trace.append(b)
            continue
        peer, pattern = key_of(b.get("run_name", name), int(b.get("threads", 1)))
        if b.get("error_occurred"):
            errors[(peer, pattern)] = b.get("error_message", "error")
            continue
        counter = "ns_per_pair" if "ns_per_pair" in b else "ns_per_op"
        v = b.get(counter)
        if v is None:  # no counter: real time per iteration (per thread), an approximation
            v = b["real_time"] * UNIT_NS.get(b.get("time_unit", "ns"), 1.0)
        figures[(peer, pattern)] = v

    present = [p for p in PEERS if any(k[0] == p for k in figures)]
    out = []
    out.append("cachet_bench on %s (%s, %s CPUs, %s)" % (
        ctx.get("cachet_cuda_device", "?"), ctx.get("host_name", "?"), ctx.get("num_cpus", "?"),
        ctx.get("date", "?")))
    out.append("")
    head = ["pattern"] + ["%s ns" % p for p in present]
    has_c = "Cachet" in present
    if has_c and "PyTorch" in present:
        head.append("cachet/PyTorch")
    if has_c and "CudaMallocAsync" in present:
        head.append("cachet/cudaMallocAsync")
    if peer_table:
        head += ["oracle PyTorch ns", "oracle cudaMallocAsync ns", "cachet/oracle PyTorch"]
    out.append("| " + " | ".join(head) + " |")
    out.append("|" + "---|" * len(head))
    for pattern, label, _ in PATTERNS:
        row = [label] + [fmt(figures.get((p, pattern))) for p in present]
        c = figures.get(("Cachet", pattern))
        if has_c and "PyTorch" in present:
            row.append(ratio(c, figures.get(("PyTorch", pattern))))
        if has_c and "CudaMallocAsync" in present:
            row.append(ratio(c, figures.get(("CudaMallocAsync", pattern))))
        if peer_table:
            o = ORACLE.get(pattern, (None, None))
            row += [fmt(o[0]), fmt(o[1]), ratio(c, o[0])]
        out.append("| " + " | ".join(row) + " |")
    out += policy_table(figures)
    if errors:
        out.append("")
        out.append("Skipped or failed:")
        seen = set()
        for (peer, pattern), msg in sorted(errors.items()):
            if (peer, msg) in seen:
                continue
            seen.add((peer, msg))
            out.append("- %s (%s ...): %s" % (peer, pattern, msg))
    if trace:
        out.append("")
        out.append("| trace benchmark | time | events | events/s | target |")
        out.append("|---|---|---|---|---|")
        for b in trace:
            if b.get("error_occurred"):
                out.append("| %s | skipped: %s | | | |" % (b["name"], b.get("error_message", "")))
                continue
            t = "%.3f %s" % (b["real_time"], b.get("time_unit", "ns"))
            eps = b.get("events_per_s")
            target = ""
            secs = b["real_time"] * UNIT_NS.get(b.get("time_unit", "ns"), 1.0) / 1e9
            if b["name"].startswith("Trace/replay/"):
                target = ">= 5,000,000 events/s: %s" % ("met" if eps and eps >= 5e6 else "NOT met")
            elif b["name"].startswith("Trace/tune/"):
                target = "< 10 s on 2 cores: %s" % ("met" if secs < 10 else "NOT met")
            out.append("| %s | %s | %s | %s | %s |" % (
                b["name"].split("/real_time")[0], t, fmt(b.get("events")), fmt(eps), target))
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
