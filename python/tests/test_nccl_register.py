#!/usr/bin/env python3
"""ProcessGroupNCCL's tensor-register hook (TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK=1) on one
GPU, native against cachet's c10 backend (issue 38). The hook is a trace tracker
(attachAllocatorTraceTracker): ncclCommRegister at SEGMENT_ALLOC, ncclCommDeregister at
SEGMENT_FREE, for every pool (or the pools registered with the communicator, by
TraceEntry::mempool_); PyTorch turns it off under expandable segments. Exit 77 = skipped (no
PyTorch, no CUDA device, no NCCL, no libcachet_c10.so for this torch, or no tracker library).

usage: test_nccl_register.py [--expandable off|on] [--sleep]

Each run is a fresh process with a world-size-1 NCCL process group (a FileStore, device_id given
so the communicator exists at once) and, attached beside the hook, this test's own tracker
(libcachet_test_tracker.so, tests/tracker_probe.cpp: each entry's action, address, size, pool id,
and whether the device still had memory at the address when the tracker was called). The
program, phase by phase: tensors before the group; the group; all_reduce of small and large
tensors; empty_cache; a torch.cuda.MemPool entered with use_mem_pool, all_reduce in it, the pool
dropped (its segments go with ~MemPool's emptyCache); a memory-fraction cap under which an
allocation's retry frees a cached segment; the group destroyed and empty_cache.

Checked (native is checked by the same rules: a rule it breaks is this test's mistake):
  - every SEGMENT_FREE reached the trackers while its memory was still there (before cudaFree),
    every SEGMENT_ALLOC once it was there;
  - the MemPool's segment entries name the pool's id, every other one {0, 0};
  - cachet's entries of the kinds the hook consumes (segment_alloc, segment_free) and of
    segment_map/segment_unmap equal native's, phase by phase, entry by entry: action, size, pool,
    address (by order of first appearance), memory there;
  - expandable segments on: PyTorch's own config says so in both runs (the hook is off), and no
    segment_alloc/segment_free of the default pools reaches a tracker, as in native;
  - the all_reduce results, and the run completing (NCCL's deregisterSegment refuses a segment it
    never registered: an entry too many or too few fails the run).
With --sleep (cachet only, cachet_sleep:True, expandable segments off): after an all_reduce,
cachet_torch.sleep() and wake(): every segment's SEGMENT_FREE reaches the trackers before its
memory goes and a SEGMENT_ALLOC after the wake, memory there; all_reduce after the wake gives the
same results; NCCL holds no registration of unmapped memory in between (the run completes).

Every process runs with NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1,
NVSHMEM_DISABLE_NVLS=1. Environment: as tests/test_c10.py (CACHET_TORCH_LIB or CACHET_C10_LIB);
CACHET_TRACKER_LIB (libcachet_test_tracker.so; else looked for beside libcachet_c10.so);
CACHET_NCCL_OUT (a folder: nccl-register-es-<off|on>[-sleep].json, both runs' entries).
"""
import ctypes
import json
import os
import subprocess
import sys
import tempfile

import preamble

THIS = os.path.abspath(__file__)
MiB = 1 << 20
ACTIONS = ["alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "segment_map",
           "segment_unmap", "snapshot", "oom"]
SEGMENT_KINDS = {"segment_alloc", "segment_free", "segment_map", "segment_unmap"}
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
check = preamble.Checks()
failures = check.failures


# ------------------------------------------------------------------------------------- worker

def worker(mode, store, out):
    for k, v in NO_MULTICAST.items():
        os.environ.setdefault(k, v)
    res = {"mode": mode, "phases": []}
    if mode != "native":
        import cachet_torch
        cachet_torch.install(backend="c10")
        res["backend"] = cachet_torch.backend()
    import torch
    import torch.distributed as dist
    torch.cuda.init()
    lib = ctypes.CDLL(os.environ["CACHET_TRACKER_LIB"])
    lib.cachet_test_tracker_take.restype = ctypes.c_void_p
    lib.cachet_test_tracker_free.argtypes = [ctypes.c_void_p]
    if lib.cachet_test_tracker_attach() != 0:
        raise RuntimeError("the test's tracker could not be attached")
    res["pytorch_expandable"] = bool(lib.cachet_test_tracker_expandable())

    def phase(name):
        torch.cuda.synchronize()
        p = lib.cachet_test_tracker_take()
        entries = json.loads(ctypes.string_at(p).decode())
        lib.cachet_test_tracker_free(p)
        res["phases"].append([name, [[ACTIONS[e[0]]] + e[1:] for e in entries]])

    results = []
    early = [torch.ones(256 * 1024, device="cuda") for _ in range(3)]  # segments before the group
    phase("before the group")
    dist.init_process_group("nccl", rank=0, world_size=1, init_method=f"file://{store}",
                            device_id=torch.device("cuda", 0))
    phase("group")
    small = torch.arange(1 << 18, device="cuda", dtype=torch.float32)
    dist.all_reduce(small)
    big = torch.ones(48 * MiB // 4, device="cuda")
    dist.all_reduce(big)
    results.append(float(small.sum().item()) + float(big.sum().item()))
    del big
    phase("collectives")
    torch.cuda.empty_cache()
    phase("empty_cache")
    pool = torch.cuda.MemPool()
    res["pool"] = list(pool.id)
    with torch.cuda.use_mem_pool(pool):
        t = torch.full((8 * MiB // 4,), 2.0, device="cuda")
        dist.all_reduce(t)
        results.append(float(t.sum().item()))
    del t
    torch.cuda.synchronize()
    del pool
    phase("mempool")
    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(0.1)
    cap = int(total * 0.1)
    used = torch.cuda.memory_reserved()
    room = (cap - used) // (20 * MiB) * (20 * MiB)
    a = torch.empty(room * 6 // 10 // (2 * MiB) * (2 * MiB), dtype=torch.uint8, device="cuda")
    n = a.numel()
    del a
    b = torch.empty(n + 2 * MiB, dtype=torch.uint8, device="cuda")  # the retry frees a's segment
    res["retries"] = torch.cuda.memory_stats().get("num_alloc_retries", 0)
    del b
    torch.cuda.set_per_process_memory_fraction(1.0)
    phase("retry")
    if mode == "cachet-sleep":
        w = torch.full((16 * MiB // 4,), 3.0, device="cuda")
        dist.all_reduce(w)
        before = float(w.sum().item())
        phase("before sleep")
        import cachet_torch
        res["slept_bytes"] = cachet_torch.sleep(backup=("default",))
        phase("sleep")
        cachet_torch.wake()
        phase("wake")
        dist.all_reduce(w)  # world size 1: the values stay
        results.append([before, float(w.sum().item())])
        del w
        phase("after wake")
    del early, small
    dist.destroy_process_group()
    torch.cuda.empty_cache()
    phase("end")
    res["results"] = results
    with open(out, "w") as f:
        json.dump(res, f)
    return 0


# ---------------------------------------------------------------------------------- comparing

def canonical(run):
    """Each phase's segment entries as (action, size, pool, address index, memory there)."""
    index = {}
    out = []
    for name, entries in run["phases"]:
        seg = []
        for action, addr, size, p0, p1, there in entries:
            if action not in SEGMENT_KINDS:
                continue
            seg.append((action, size, (p0, p1), index.setdefault(addr, len(index)), bool(there)))
        out.append((name, seg))
    return out


def check_rules(label, run, expandable):
    pool = tuple(run.get("pool", (0, 0)))
    owner = {}  # address index -> the pool its segment_alloc named
    for name, entries in canonical(run):
        for action, size, p, addr, there in entries:
            if action not in ("segment_alloc", "segment_free"):
                continue
            check(there, f"{label} [{name}]: {action} of {size} bytes reached the trackers with its memory there "
                  f"({'before the device free' if action == 'segment_free' else 'after the allocation'})")
            if action == "segment_alloc":
                want = pool if name == "mempool" else owner.get(addr, (0, 0))
                check(p == want, f"{label} [{name}]: segment_alloc names the pool {want} (it names {p})")
                owner.setdefault(addr, p)
            else:
                want = owner.get(addr, (0, 0))
                check(p == want, f"{label} [{name}]: segment_free names its segment's pool {want} (it names {p})")
            if expandable:
                check(p != (0, 0), f"{label} [{name}]: expandable segments: no {action} of the default pools")
    if not expandable:
        check(pool in owner.values(), f"{label}: the MemPool's segments were heard of with its id {pool}")
    else:  # its segments are expandable too (only a MemPool with its own allocator's are not)
        maps = [e for name, es in canonical(run) if name == "mempool" for e in es if e[0] == "segment_map"]
        check(bool(maps) and all(e[2] == pool for e in maps),
              f"{label}: the MemPool's segment_map entries name its id {pool} ({len(maps)} entries)")
    check(run["pytorch_expandable"] == expandable,
          f"{label}: PyTorch's own config has expandable_segments={run['pytorch_expandable']} (the hook is "
          f"{'off' if run['pytorch_expandable'] else 'on'})")
    frees = [e for _, es in canonical(run) for e in es if e[0] in ("segment_free", "segment_unmap")]
    check(bool(frees), f"{label}: segments were given back ({len(frees)} segment_free/segment_unmap entries)")


def compare(native, cachet, expandable):
    n, c = canonical(native), canonical(cachet)
    for (name, ne), (_, ce) in zip(n, c):
        diff = next((i for i, (x, y) in enumerate(zip(ne, ce)) if x != y), None)
        if diff is None and len(ne) != len(ce):
            diff = min(len(ne), len(ce))
        detail = "" if diff is None else (f": first difference at entry {diff}: native "
                                          f"{ne[diff] if diff < len(ne) else None}, cachet "
                                          f"{ce[diff] if diff < len(ce) else None}")
        check(diff is None, f"[{name}]: cachet's segment entries equal native's ({len(ne)} native, {len(ce)} "
              f"cachet){detail}")
    check([x for x, _ in n] == [x for x, _ in c], "both runs went through the same phases")
    check(native["results"] == cachet["results"][:len(native["results"])],
          f"all_reduce results equal: native {native['results']}, cachet {cachet['results']}")
    # (Expandable segments grow the freed block by the missing pages: no retry, in either run.)
    check(cachet.get("retries") == native.get("retries") and (expandable or native.get("retries", 0) >= 1),
          f"the allocation retries equal ({native.get('retries')} native, {cachet.get('retries')} cachet)")


def check_sleep(run):
    phases = dict((name, es) for name, es in canonical(run))
    slept = [e for e in phases.get("sleep", []) if e[0] == "segment_free"]
    woken = [e for e in phases.get("wake", []) if e[0] == "segment_alloc"]
    check(run.get("slept_bytes", 0) > 0 and sum(e[1] for e in slept) == run.get("slept_bytes"),
          f"sleep: one segment_free per segment given back ({sum(e[1] for e in slept)} bytes in "
          f"{len(slept)} entries, sleep gave back {run.get('slept_bytes')})")
    check(all(e[4] for e in slept), "sleep: every segment_free reached the trackers before the memory went")
    live = {e[3] for e in slept}
    check(bool(woken) and {e[3] for e in woken} <= live and all(e[4] for e in woken),
          f"wake: segment_alloc, memory there, for segments that slept ({len(woken)} entries)")
    before, after = run["results"][-1]
    check(before == after, f"all_reduce after the wake: {after}, before the sleep: {before}")


def run_worker(mode, env, tmp, label):
    out = os.path.join(tmp, f"{label}.json")
    store = os.path.join(tmp, f"{label}.store")
    p = subprocess.run([sys.executable, THIS, "--worker", mode, store, out], env=env, capture_output=True,
                       text=True, timeout=600)
    if p.returncode != 0 or not os.path.exists(out):
        check(False, f"{label}: worker exited {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-4000:]}")
        return None
    with open(out) as f:
        return json.load(f)


def main():
    if len(sys.argv) >= 5 and sys.argv[1] == "--worker":
        return worker(sys.argv[2], sys.argv[3], sys.argv[4])
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--expandable", choices=("off", "on"), default="off")
    ap.add_argument("--sleep", action="store_true", help="cachet_torch.sleep and wake with the hook (cachet only)")
    args = ap.parse_args()
    torch, _, skip = preamble.start(plugin=False)
    if skip is not None:
        return skip
    import torch.distributed as dist
    if not dist.is_available() or not dist.is_nccl_available():
        print("SKIP: this torch has no NCCL")
        return preamble.SKIP
    sys.path.insert(0, preamble.PYDIR)
    import cachet_torch
    c10 = cachet_torch.c10_library_path()
    if c10 is None:
        print("SKIP: no libcachet_c10.so (built only where a torch was found)")
        return preamble.SKIP
    tracker = os.environ.get("CACHET_TRACKER_LIB") or os.path.join(os.path.dirname(c10), "libcachet_test_tracker.so")
    if not os.path.exists(tracker):
        print(f"SKIP: no tracker library ({tracker}); build the cachet_test_tracker target")
        return preamble.SKIP
    print(f"c10 backend: {c10}, tracker: {tracker}", flush=True)
    tmp = tempfile.mkdtemp(prefix=f"cachet-nccl-register-{args.expandable}-")
    env = preamble.child_env()
    env.update(NO_MULTICAST)
    env["TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK"] = "1"
    env["CACHET_TRACKER_LIB"] = tracker
    expandable = args.expandable == "on"
    if expandable:  # both read it: PyTorch's own config then says so (the hook turns itself off)
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    runs = {}
    if args.sleep:
        senv = dict(env, CACHET_ALLOC_CONF="cachet_sleep:True" + (",expandable_segments:True" if expandable else ""))
        runs["cachet-sleep"] = run_worker("cachet-sleep", senv, tmp, "cachet-sleep")
        if runs["cachet-sleep"]:
            check(runs["cachet-sleep"].get("backend") == "c10", "cachet through the c10 backend")
            check_rules("cachet-sleep", runs["cachet-sleep"], expandable)
            check_sleep(runs["cachet-sleep"])
    else:
        for mode in ("native", "cachet"):
            runs[mode] = run_worker(mode, env, tmp, mode)
            if runs[mode]:
                check_rules(mode, runs[mode], expandable)
        if runs.get("cachet"):
            check(runs["cachet"].get("backend") == "c10", "cachet through the c10 backend")
        if runs.get("native") and runs.get("cachet"):
            compare(runs["native"], runs["cachet"], expandable)
    outdir = os.environ.get("CACHET_NCCL_OUT")
    if outdir:
        os.makedirs(outdir, exist_ok=True)
        name = f"nccl-register-es-{args.expandable}{'-sleep' if args.sleep else ''}.json"
        with open(os.path.join(outdir, name), "w") as f:
            json.dump({"args": vars(args), "runs": runs, "failures": failures}, f, indent=1)
    what = f"NCCL register hook (expandable {args.expandable}{', sleep' if args.sleep else ''})"
    print(f"{what}: {'FAIL' if failures else 'ok'} ({len(failures)} failures)", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
