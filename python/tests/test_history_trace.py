#!/usr/bin/env python3
"""The memory history's device trace through the c10 backend against native's (issue 36): the same
seeded random program runs under PyTorch's native allocator and under cachet installed with
cachet_torch.install(backend="c10"), each in a fresh process, with
torch.cuda.memory._record_memory_history(stacks="python"), and the whole device trace of its
final _dump_snapshot() is compared entry for entry. ctests cachet_c10_history_trace_es_<off|on>,
labels gpu and torch; exit 77 = skipped (no PyTorch, no CUDA device, or no libcachet_c10.so built
for this torch).

usage: test_history_trace.py [--seeds N] [--expandable off|on] [--policy pytorch|cachet]
                             [--steps N] [--jobs J]

The program (one per seed, random.Random(seed)): about STEPS/2 requests of 1 B to 700 MiB
(log-uniform) on the current stream and on a second stream, frees, record_stream onto the second
stream (each such free followed by a synchronize, so that when its event is seen complete does not
depend on timing), empty_cache, a torch.cuda.MemPool entered with use_mem_pool and dropped, small
CUDA graph captures (torch.cuda.graph, replayed, dropped later), a memory-fraction cap of 3 GiB
whose torch.OutOfMemoryErrors are caught, and _snapshot()/memory_snapshot() calls along the way.

Checked, for every seed:
  policy:pytorch  the final trace equals native's entry for entry: action, size, stream (by order
                  of appearance), address as (segment in allocation order, offset in it) (for
                  expandable segments: the reservation, in order of its first mapping), whether
                  the entry has frames, and its frames (file, function, line) where native's has
                  them, compile_context, user_metadata; the same number of OOMs.
  both policies   every entry but `snapshot` has frames naming this file, and no `snapshot` entry
                  has any, as in native's trace (checked there too); each _snapshot() call's trace
                  is the final trace up to that call's own `snapshot` entry, which it does not
                  hold (native takes trace() before its snapshot() records the entry), and the
                  final trace holds one `snapshot` entry per earlier snapshot call, not its own;
                  the HTML `python -m torch.cuda._memory_viz trace_plot` writes for cachet's
                  snapshot embeds (base64 pickle) every segment_free and segment_unmap entry with
                  its frames.

Environment: as tests/test_c10.py (CACHET_TORCH_LIB, or CACHET_C10_LIB); CACHET_HISTORY_OUT (a
folder: the run writes history-POLICY-es-EXPANDABLE.json there, the mismatches found).
"""
import base64
import json
import math
import os
import pickle
import random
import re
import subprocess
import sys
import tempfile

import preamble

THIS = os.path.abspath(__file__)
MiB = 1 << 20
GiB = 1 << 30
CAP = 3 * GiB
MAX_REQUEST = 700 * MiB
MAX_LIVE = 64
check = preamble.Checks()
failures = check.failures


# ------------------------------------------------------------------------------------ the program
# The same code runs in both processes: the frames of its entries name these lines.

class Program:
    def __init__(self, torch, seed):
        self.torch = torch
        self.rng = random.Random(seed)
        self.side = torch.cuda.Stream()
        self.live = []        # [tensor, on the side stream, record_stream'd]
        self.graphs = []      # (CUDAGraph, its tensors)
        self.pool = None      # a MemPool while one is kept
        self.pool_live = []
        self.ooms = 0
        self.captures = 0
        self.snapshot_calls = []  # per snapshot call: {"kind", "trace": [[action, size], ...]}

    def size(self, top=MAX_REQUEST):
        return max(1, int(math.exp(self.rng.uniform(0.0, math.log(top)))))

    def empty(self, n, stream=None):
        torch = self.torch
        try:
            if stream is None:
                return torch.empty(n, dtype=torch.uint8, device="cuda")
            with torch.cuda.stream(stream):
                return torch.empty(n, dtype=torch.uint8, device="cuda")
        except torch.OutOfMemoryError:
            self.ooms += 1
            return None

    def allocate(self):
        on_side = self.rng.random() < 0.3
        t = self.empty(self.size(), self.side if on_side else None)
        if t is not None:
            self.live.append([t, on_side, False])

    def free(self):
        if not self.live:
            return
        i = self.rng.randrange(len(self.live))
        recorded = self.live[i][2]
        self.live.pop(i)
        if recorded:  # its event, recorded at the free, complete before the next allocator call
            self.torch.cuda.synchronize()

    def record_stream(self):
        mine = [e for e in self.live if not e[1] and not e[2]]
        if mine:
            e = mine[self.rng.randrange(len(mine))]
            e[0].record_stream(self.side)
            e[2] = True

    def mempool(self):
        torch = self.torch
        if self.pool is None:
            self.pool = torch.cuda.MemPool()
            with torch.cuda.use_mem_pool(self.pool):
                for _ in range(self.rng.randint(1, 6)):
                    t = self.empty(self.size(64 * MiB))
                    if t is not None:
                        self.pool_live.append(t)
                if self.pool_live and self.rng.random() < 0.5:
                    self.pool_live.pop(self.rng.randrange(len(self.pool_live)))
        else:
            self.pool_live.clear()
            self.pool = None  # ~MemPool: releasePool, then emptyCache of the pool

    def capture(self):
        torch = self.torch
        torch.cuda.set_per_process_memory_fraction(1.0)  # no OOM inside a capture
        g = torch.cuda.CUDAGraph()
        x = torch.zeros(self.rng.choice([256, 4096, 65536, 1 << 20]), device="cuda")
        n = self.rng.randint(1, 4)
        extra = self.size(32 * MiB)
        with torch.cuda.graph(g):
            ys = [x * (k + 2) for k in range(n)]
            z = ys[0] + 1
            del ys[1:]
            w = torch.empty(extra, dtype=torch.uint8, device="cuda")
            if self.rng.random() < 0.5:
                del w
                w = None
        g.replay()
        torch.cuda.synchronize()
        self.graphs.append((g, x, ys, z, w))
        self.captures += 1
        self.cap()

    def drop_graph(self):
        if self.graphs:
            self.graphs.pop(self.rng.randrange(len(self.graphs)))

    def snapshot(self):
        torch = self.torch
        if self.rng.random() < 0.7:
            s = torch.cuda.memory._snapshot()
            trace = s["device_traces"][0] if s["device_traces"] else []
            self.snapshot_calls.append({"kind": "_snapshot", "trace": [[e["action"], e.get("size", 0)] for e in trace]})
        else:
            torch.cuda.memory_snapshot()
            self.snapshot_calls.append({"kind": "memory_snapshot"})

    def cap(self):
        total = self.torch.cuda.get_device_properties(0).total_memory
        self.torch.cuda.set_per_process_memory_fraction(CAP / total)

    def run(self, steps):
        torch = self.torch
        self.cap()
        for _ in range(steps):
            r = self.rng.random()
            if len(self.live) >= MAX_LIVE or (0.50 <= r < 0.86):
                self.free()
            elif r < 0.50:
                self.allocate()
            elif r < 0.92:
                self.record_stream()
            elif r < 0.94:
                torch.cuda.empty_cache()
            elif r < 0.96:
                self.mempool()
            elif r < 0.975:
                self.capture()
            elif r < 0.99:
                self.drop_graph()
            elif r < 0.995:
                self.snapshot()
        torch.cuda.synchronize()
        last = self.empty(4096)  # the final trace does not end at a snapshot call
        del last


def worker(mode, seed, steps, out, pickle_path):
    res = {"mode": mode, "seed": seed}
    if mode == "cachet":
        import cachet_torch
        cachet_torch.install(backend="c10")
        res["backend"] = cachet_torch.backend()
    import torch
    res["torch"] = torch.__version__
    torch.cuda.memory._record_memory_history(max_entries=1_000_000, stacks="python")
    p = Program(torch, seed)
    p.run(steps)
    torch.cuda.memory._dump_snapshot(pickle_path)
    torch.cuda.memory._record_memory_history(None)
    res.update(ooms=p.ooms, captures=p.captures, snapshot_calls=p.snapshot_calls,
               num_ooms=torch.cuda.memory_stats().get("num_ooms"))
    with open(out, "w") as f:
        json.dump(res, f)
    return 0


# ---------------------------------------------------------------------------------- comparing

def frames_of(e):
    return tuple((f.get("filename"), f.get("name"), f.get("line")) for f in e.get("frames", []) or [])


def canonical(trace):
    """Per entry: (action, size, stream index, address key, frames). Address key: (segment number,
    offset) where segments are numbered in allocation order (cudaMalloc segments from their
    segment_alloc to their segment_free, expandable reservations from their first segment_map to
    the unmap that leaves nothing mapped); None for oom (addr is the device's free memory) and
    snapshot entries; ("?", addr) for an address in no segment."""
    streams = {}
    segs = []  # open: dicts base, hi, n, kind, mapped
    count = [0]

    def containing(addr, for_map=False, kind=None):
        best = None
        for s in segs:
            if kind is not None and s["kind"] != kind:
                continue
            if s["base"] <= addr and (addr < s["hi"] or (for_map and addr == s["hi"])):
                if best is None or s["base"] > best["base"]:
                    best = s
        return best

    def new(base, hi, kind):
        s = {"base": base, "hi": hi, "n": count[0], "kind": kind, "mapped": 0}
        count[0] += 1
        segs.append(s)
        return s

    out = []
    for e in trace:
        a, addr, size = e["action"], e.get("addr", 0), e.get("size", 0)  # oom/snapshot entries may lack them
        key = None
        if a == "segment_alloc":
            s = new(addr, addr + size, "seg")
            key = (s["n"], 0)
        elif a == "segment_free":
            s = containing(addr, kind="seg")
            key = (s["n"], addr - s["base"]) if s else ("?", addr)
            if s:
                segs.remove(s)
        elif a == "segment_map":
            s = containing(addr, for_map=True, kind="es")
            if s is None:
                s = new(addr, addr + size, "es")
            s["hi"] = max(s["hi"], addr + size)
            s["mapped"] += size
            key = (s["n"], addr - s["base"])
        elif a == "segment_unmap":
            s = containing(addr, kind="es")
            key = (s["n"], addr - s["base"]) if s else ("?", addr)
            if s:
                s["mapped"] -= size
                if s["mapped"] <= 0:
                    segs.remove(s)
        elif a in ("oom", "snapshot"):
            key = None
        else:
            s = containing(addr)
            key = (s["n"], addr - s["base"]) if s else ("?", addr)
        stream = streams.setdefault(e.get("stream"), len(streams))
        out.append({"action": a, "size": size, "stream": stream, "key": key, "frames": frames_of(e),
                    "compile_context": e.get("compile_context"), "user_metadata": e.get("user_metadata")})
    return out


def show(c):
    top = [f"{os.path.basename(f[0] or '?')}:{f[2]} {f[1]}" for f in c["frames"][:3]]
    return f"{c['action']} {c['size']} stream {c['stream']} at {c['key']} frames {len(c['frames'])} {top}"


def compare_traces(label, nat, cac):
    """The mismatches between two canonical traces, at most 8 described."""
    out = []
    if len(nat) != len(cac):
        out.append(f"{label}: {len(cac)} entries, native {len(nat)}")
    for i, (n, c) in enumerate(zip(nat, cac)):
        same = (n["action"], n["size"], n["stream"], n["key"], bool(n["frames"]), n["compile_context"],
                n["user_metadata"]) == (c["action"], c["size"], c["stream"], c["key"], bool(c["frames"]),
                                        c["compile_context"], c["user_metadata"])
        if same and n["frames"] and n["frames"] != c["frames"]:
            same = False
        if not same:
            out.append(f"{label}: entry {i}: cachet {show(c)}; native {show(n)}")
            if len(out) >= 8:
                break
    return out


def check_rules(label, trace, res):
    """What holds of native's trace and must of cachet's, under either policy."""
    bad = []
    for i, e in enumerate(trace):
        fr = e.get("frames") or []
        if e["action"] == "snapshot":
            if fr:
                bad.append(f"entry {i}: a snapshot entry with {len(fr)} frames")
        elif not fr:
            bad.append(f"entry {i}: {e['action']} {e['size']} without frames")
        elif not any(f.get("filename") == THIS for f in fr):
            bad.append(f"entry {i}: {e['action']} {e['size']}: no frame of this file")
    check(not bad, f"{label}: every entry but snapshot has frames naming this file, no snapshot entry has any "
          f"({len(bad)} not: {bad[:4]})")
    positions = [i for i, e in enumerate(trace) if e["action"] == "snapshot"]
    calls = res["snapshot_calls"]
    check(len(positions) == len(calls), f"{label}: one snapshot entry per earlier snapshot call, none of the "
          f"final dump's own ({len(positions)} entries, {len(calls)} calls)")
    wrong = []
    for j, call in enumerate(calls):
        if call["kind"] != "_snapshot" or j >= len(positions):
            continue
        at = positions[j]
        prefix = [[e["action"], e.get("size", 0)] for e in trace[:at]]
        if len(call["trace"]) != at or call["trace"] != prefix:
            wrong.append(f"call {j}: its trace has {len(call['trace'])} entries, its snapshot entry is entry {at}")
    check(not wrong, f"{label}: each _snapshot() trace is the final trace up to its own snapshot entry, which it "
          f"does not hold ({wrong[:3]})")
    return len([e for e in trace if e["action"] in ("segment_free", "segment_unmap")])


def snapshot_in_html(text):
    """The snapshot trace_plot's HTML carries (torch/cuda/_memory_viz.py, _format_viz: the
    pickle, base64, in `const local_files = [{"name": ..., "base64": ...}]`), or None."""
    m = re.search(r"const local_files = (\[.*?\])\s*\n", text, re.S)
    if not m:
        return None
    files = json.loads(m.group(1))
    return pickle.loads(base64.b64decode(files[0]["base64"]))


def check_html(label, pickle_path, tmp):
    html = os.path.join(tmp, os.path.basename(pickle_path) + ".html")
    r = subprocess.run([sys.executable, "-m", "torch.cuda._memory_viz", "trace_plot", pickle_path, "-o", html],
                       capture_output=True, text=True, timeout=300)
    if not check(r.returncode == 0 and os.path.exists(html), f"{label}: _memory_viz trace_plot writes the HTML "
                 f"(rc {r.returncode}) {r.stderr[-300:]}"):
        return
    with open(html) as f:
        text = f.read()
    try:
        data = snapshot_in_html(text)
    except Exception as e:  # noqa: BLE001
        check(False, f"{label}: the HTML's embedded snapshot reads back ({e!r})")
        return
    if not check(data is not None, f"{label}: the HTML embeds the snapshot (local_files, base64 pickle)"):
        return
    frees = [e for tr in data["device_traces"] for e in tr if e["action"] in ("segment_free", "segment_unmap")]
    without = [e for e in frees if not e.get("frames")]
    check(bool(frees) and not without, f"{label}: the HTML's snapshot holds the frames of every segment free "
          f"({len(frees) - len(without)} of {len(frees)} segment_free/segment_unmap entries with frames)")


def run_pair(seed, args, tmp):
    """Both workers of one seed, at the same time; their results and pickles, or None."""
    procs = {}
    for mode in ("native", "cachet"):
        out = os.path.join(tmp, f"{seed}-{mode}.json")
        pk = os.path.join(tmp, f"{seed}-{mode}.pickle")
        env = preamble.child_env()
        conf = [] if args.expandable == "off" else ["expandable_segments:True"]
        if mode == "native":
            if conf:
                env["PYTORCH_CUDA_ALLOC_CONF"] = ",".join(conf)
        else:
            env["CACHET_ALLOC_CONF"] = ",".join([f"policy:{args.policy}"] + conf)
        cmd = [sys.executable, THIS, "--worker", mode, str(seed), str(args.steps), out, pk]
        procs[mode] = (subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env),
                       out, pk)
    results = {}
    for mode, (p, out, pk) in procs.items():
        try:
            so, se = p.communicate(timeout=900)
        except subprocess.TimeoutExpired:
            p.kill()
            so, se = p.communicate()
        if p.returncode != 0 or not os.path.exists(out):
            check(False, f"seed {seed}/{mode}: worker exited {p.returncode}\n{se[-3000:]}")
            results[mode] = None
            continue
        with open(out) as f:
            res = json.load(f)
        with open(pk, "rb") as f:
            snap = pickle.load(f)
        results[mode] = (res, snap, pk)
    return results


def judge(seed, args, results, tmp, found):
    if results.get("native") is None or results.get("cachet") is None:
        return
    (nres, nsnap, _), (cres, csnap, cpk) = results["native"], results["cachet"]
    check(cres.get("backend") == "c10", f"seed {seed}: cachet through the c10 backend ({cres.get('backend')!r})")
    ntrace = nsnap["device_traces"][0]
    ctrace = csnap["device_traces"][0]
    print(f"seed {seed}: native {len(ntrace)} entries, cachet {len(ctrace)}; OOMs {nres['ooms']}/{cres['ooms']}, "
          f"captures {nres['captures']}, snapshot calls {len(nres['snapshot_calls'])}", flush=True)
    nfree = check_rules(f"seed {seed} native", ntrace, nres)
    cfree = check_rules(f"seed {seed} cachet", ctrace, cres)
    check(nfree > 0 and cfree > 0, f"seed {seed}: segments were given back ({nfree} native, {cfree} cachet "
          "segment_free/segment_unmap entries)")
    if args.policy == "pytorch":
        mism = compare_traces(f"seed {seed}", canonical(ntrace), canonical(ctrace))
        found[str(seed)] = mism
        check(not mism, f"seed {seed}: the trace equals native's entry for entry ({len(ctrace)} entries)"
              + "".join("\n    " + m for m in mism))
        check(cres["ooms"] == nres["ooms"], f"seed {seed}: {cres['ooms']} OOMs caught, native {nres['ooms']}")
    check_html(f"seed {seed} cachet", cpk, tmp)


def main():
    if len(sys.argv) >= 7 and sys.argv[1] == "--worker":
        return worker(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6])
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--expandable", choices=("off", "on"), default="off")
    ap.add_argument("--policy", choices=("pytorch", "cachet"), default="pytorch")
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--jobs", type=int, default=4, help="seeds run at the same time (each: two processes)")
    args = ap.parse_args()
    _, _, skip = preamble.start(plugin=False)
    if skip is not None:
        return skip
    sys.path.insert(0, preamble.PYDIR)
    import cachet_torch
    lib = cachet_torch.c10_library_path()
    print(f"cachet_torch: {cachet_torch.__file__}, c10 backend: {lib}", flush=True)
    if lib is None:
        print("SKIP: no libcachet_c10.so (built only where a torch was found)")
        return preamble.SKIP
    tmp = tempfile.mkdtemp(prefix=f"cachet-history-{args.policy}-{args.expandable}-")
    found = {}
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as ex:
        futures = [(seed, ex.submit(run_pair, seed, args, tmp)) for seed in range(args.seeds)]
        for seed, fut in futures:
            judge(seed, args, fut.result(), tmp, found)
    outdir = os.environ.get("CACHET_HISTORY_OUT")
    if outdir:
        os.makedirs(outdir, exist_ok=True)
        with open(os.path.join(outdir, f"history-{args.policy}-es-{args.expandable}.json"), "w") as f:
            json.dump({"args": vars(args), "mismatches": found, "failures": failures}, f, indent=1)
    name = f"history trace (policy:{args.policy}, expandable {args.expandable}, {args.seeds} seeds)"
    print(f"{name}: {'FAIL' if failures else 'ok'} ({len(failures)} failures)", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
