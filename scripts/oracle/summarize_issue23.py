"""What issue 23's recordings say, in a few lines (run by record-issue23; any folder of results).
Usage: python3 summarize_issue23.py RESULTS_DIR
"""
import glob, gzip, json, os, sys

def load(path):
    op = gzip.open if path.endswith(".gz") else open
    with op(path, "rt") as f:
        return json.load(f)

d = sys.argv[1]
def files(pat):
    return sorted(glob.glob(os.path.join(d, pat)) + glob.glob(os.path.join(d, pat + ".gz")))

for f in files("res_issue23_deferred_free*.json"):
    r = load(f)
    print(f"{os.path.basename(f)}: busy_s0={r['busy_s0']} last allocation at offset {r['last_offset']} "
          f"({'reused' if r['reused_1gib_block_start'] else 'not reused'}); torch {r['torch']} {r['device']}")

def ptrs(r, ops):
    """allocation id -> pointer, from the steps (one per op)."""
    out = {}
    for op, st in zip(ops, r["steps"]):
        if op[0] == "a" and isinstance(st[0], int):
            out[op[1]] = st[0]
    return out

for name, cand, before, after in [("reclaim_2_streams", 1, 3, 4), ("reclaim_4_streams", 0, 6, 7)]:
    for f in files(f"res_{name}.json"):
        r = load(f)
        ops = json.load(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "ops", f"ops_{name}.json")))
        p = ptrs(r, ops)
        print(f"{name}: data1 {hex(p[cand])} data2 {hex(p[before])} (reuse before the join: {p[before] == p[cand]}) "
              f"data3 {hex(p[after])} (reuse after the join: {p[after] == p[cand]}); errors {r.get('errors')}")

for f in files("res_reuse_*.json") + files("res_threads_*.json"):
    r = load(f)
    fs = r["final_stats"]
    print(f"{os.path.basename(f)}: conf '{r['conf']}' ops {len(r['steps'])} errors {len(r.get('errors', []))} "
          f"peak_reserved {fs.get('reserved_bytes.all.peak')} thread_ops {r.get('thread_ops', 0)}")

for kind in ("pair", "many"):
    seen = {}
    for f in files(f"res_deferred_order_{kind}_j*.json"):
        r = load(f)
        tr = r["trace"]
        # the rows after the last capture's end: the free_completed rows of the deferred frees
        rows = [t for t in tr if t[0] == "free_completed"]
        base = min([t[1] for t in tr if t[0] == "alloc"] or [0])
        order = tuple(hex(t[1] - base) for t in rows[-(2 if kind == "pair" else 8):])
        peak = r["final_stats"].get("inactive_split.all.peak")
        seen.setdefault((order, peak), []).append(r.get("heap_jitter", 0))
    for (order, peak), js in seen.items():
        print(f"deferred_order_{kind}: free_completed order {' '.join(order)} inactive_split.all.peak {peak} "
              f"(heap jitter {js})")
