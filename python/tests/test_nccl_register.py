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
allocation's retry frees a cached segment; empty_cache with the group alive ("end"); the group
destroyed ("destroyed": no segment comes or goes after it).

Why empty_cache comes before destroy_process_group: in PyTorch 2.11, destroy_process_group's
ProcessGroupNCCL::shutdown() ncclCommDestroy's the communicator and poisons it (NCCLComm::destroy
sets aborted_) but leaves it in the global ncclCommMemPoolMap with its registered segment handles,
and a trace tracker cannot be detached. The next SEGMENT_FREE of a segment registered with it (or
any SEGMENT_ALLOC) reaches cacheAllocatorDeregisterHook (RegisterHook), whose deregisterSegment
calls getNcclComm(), which raises DistBackendError "NCCL communicator was aborted on rank 0." out
of torch.cuda.empty_cache(): the first GPU run's failure, under native as under cachet. It is not
world size 1's doing and NCCL is never reached. So with the hook, every registered segment must be
freed while its communicator lives, and none allocated after the destroy.

A worker that dies writes what it had (the phases so far, the exception) and exits 3. Native
dying too is this test's or the environment's limit: reported as LIMIT, with native's reason, and
not as cachet's failure when cachet dies in the same phase with the same exception (exit 3); cachet
dying where native does not, or not dying where native does, is a difference (FAIL, exit 1).

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
    never registered: an entry too many or too few fails the run);
  - no segment_alloc/segment_free after destroy_process_group.
PyTorch's own config: the probe reads libc10's AcceleratorAllocatorConfig::use_expandable_segments()
(what ProcessGroupNCCL's CUDAAllocatorConfig::expandable_segments() returns in libtorch_cuda), which
parses the worker's environment (PYTORCH_CUDA_ALLOC_CONF here, set before the worker starts) on its
own, under cachet's c10 backend as under native: cachet's CACHET_ALLOC_CONF is not in it.
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
import traceback

import preamble

THIS = os.path.abspath(__file__)
MiB = 1 << 20
ACTIONS = ["alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "segment_map",
           "segment_unmap", "snapshot", "oom"]
SEGMENT_KINDS = {"segment_alloc", "segment_free", "segment_map", "segment_unmap"}
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
WORKER_DIED = 3  # the worker caught an exception: its JSON has what it had, and "error"
LIMIT = 3        # the test's exit status when native fails too (and cachet as native does)
check = preamble.Checks()
failures = check.failures
limits = []


def limit(what):
    """A test/environment limit (native fails too): printed LIMIT, not a failure."""
    print("LIMIT " + what, flush=True)
    limits.append(what)


# ------------------------------------------------------------------------------------- worker

_TAKE = None  # the worker's take of the tracker's entries, once attached


def worker(mode, store, out):
    for k, v in NO_MULTICAST.items():
        os.environ.setdefault(k, v)
    res = {"mode": mode, "phases": [], "results": [], "error": None}
    try:
        body(mode, store, res)
    except BaseException as e:  # noqa: B036 (what it had goes back, with the reason)
        done = res["phases"][-1][0] if res["phases"] else None
        res["error"] = {"after": done, "type": type(e).__name__, "message": str(e).strip()[:2000],
                        "traceback": traceback.format_exc()[-4000:], "entries": None}
        try:  # what the trackers had heard since the last phase (the entry it died on among them)
            if _TAKE:
                res["error"]["entries"] = _TAKE()
        except BaseException as e2:  # noqa: B036
            res["error"]["entries"] = f"(none: {type(e2).__name__}: {e2})"
        print(f"worker {mode}: died after phase [{done}]: {type(e).__name__}: {str(e).strip()[:500]}",
              file=sys.stderr, flush=True)
    with open(out, "w") as f:
        json.dump(res, f)
    return WORKER_DIED if res["error"] else 0


def body(mode, store, res):
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

    def take():
        p = lib.cachet_test_tracker_take()
        entries = json.loads(ctypes.string_at(p).decode())
        lib.cachet_test_tracker_free(p)
        return [[ACTIONS[e[0]]] + e[1:] for e in entries]
    global _TAKE
    _TAKE = take
    try:  # (informative: libc10's AcceleratorAllocatorConfig's last settings string)
        res["pytorch_settings"] = torch._C._accelerator_getAllocatorSettings()
    except Exception as e:  # not in this torch
        res["pytorch_settings"] = f"({type(e).__name__})"

    def phase(name):
        torch.cuda.synchronize()
        res["phases"].append([name, take()])

    results = res["results"]
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
    torch.cuda.empty_cache()  # with the communicator alive (see the docstring)
    phase("end")
    dist.destroy_process_group()
    phase("destroyed")


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


def rules(run, expandable):
    """This test's rules on one run, as [(key, ok, what)]: the key names the rule the same way in
    every run (native's and cachet's are matched by it); a rule on a phase the run never reached
    is left out."""
    out = []
    pool = tuple(run.get("pool", (0, 0)))
    owner = {}  # address index -> the pool its latest segment_alloc named
    alloc_pools = set()  # every pool a segment_alloc named
    reached = [name for name, _ in run["phases"]]
    for name, entries in canonical(run):
        bad_there, bad_pool, default = [], [], []
        for action, size, p, addr, there in entries:
            if action not in ("segment_alloc", "segment_free"):
                continue
            if not there:
                bad_there.append((action, size))
            if action == "segment_alloc":  # an address freed before may come back in another pool
                want = pool if name == "mempool" else (0, 0)
                owner[addr] = p
                alloc_pools.add(p)
            else:
                want = owner.pop(addr, (0, 0))
            if p != want:
                bad_pool.append((action, size, want, p))
            if expandable and p == (0, 0):
                default.append((action, size))
        n = sum(1 for e in entries if e[0] in ("segment_alloc", "segment_free"))
        if name == "destroyed":
            out.append(("destroyed", n == 0, f"[destroyed]: no segment_alloc/segment_free after "
                        f"destroy_process_group ({n} entries)"))
        if n == 0:
            continue
        out.append((f"there [{name}]", not bad_there,
                    f"[{name}]: every segment_alloc/segment_free ({n}) reached the trackers with its memory "
                    f"there (a free before the device free, an alloc after the allocation)"
                    + (f"; not there: {bad_there[:4]}" if bad_there else "")))
        out.append((f"pool [{name}]", not bad_pool,
                    f"[{name}]: segment_alloc names the MemPool's id in [mempool], {{0, 0}} elsewhere, and "
                    f"segment_free its segment's" + (f"; (action, size, wanted, named): {bad_pool[:4]}"
                                                     if bad_pool else "")))
        if expandable:
            out.append((f"no default [{name}]", not default,
                        f"[{name}]: expandable segments: no segment_alloc/segment_free of the default pools"
                        + (f"; found {default[:4]}" if default else "")))
    if "mempool" in reached:
        if not expandable:
            out.append(("mempool id", pool in alloc_pools,
                        f"the MemPool's segments were heard of with its id {pool}"))
        else:  # its segments are expandable too (only a MemPool with its own allocator's are not)
            maps = [e for name, es in canonical(run) if name == "mempool" for e in es if e[0] == "segment_map"]
            out.append(("mempool id", bool(maps) and all(e[2] == pool for e in maps),
                        f"the MemPool's segment_map entries name its id {pool} ({len(maps)} entries)"))
    if "pytorch_expandable" in run:
        out.append(("pytorch config", run["pytorch_expandable"] == expandable,
                    f"PyTorch's own config has expandable_segments={run['pytorch_expandable']} (the hook is "
                    f"{'off' if run['pytorch_expandable'] else 'on'}; PyTorch's settings: "
                    f"{run.get('pytorch_settings')!r})"))
    if "empty_cache" in reached:
        frees = [e for _, es in canonical(run) for e in es if e[0] in ("segment_free", "segment_unmap")]
        out.append(("frees", bool(frees),
                    f"segments were given back ({len(frees)} segment_free/segment_unmap entries)"))
    return out


def check_rules(label, run, expandable):
    """One run alone (--sleep: no native to hold it against)."""
    for _, ok, what in rules(run, expandable):
        check(ok, f"{label} {what}")


def check_rules_against(native, cachet, expandable):
    """Both runs' rules: one native breaks is the test's or the environment's limit (LIMIT); cachet
    breaking it as well is cachet as native (ok), keeping it where native does not is a difference
    (FAIL), as is breaking one native keeps."""
    nr = {k: (ok, what) for k, ok, what in rules(native, expandable)}
    cr = {k: (ok, what) for k, ok, what in rules(cachet, expandable)}
    for k in list(nr) + [k for k in cr if k not in nr]:
        n_ok, n_what = nr.get(k, (None, None))
        c_ok, c_what = cr.get(k, (None, None))
        if n_ok is False:
            limit(f"native {n_what} -- native breaks this rule too: the test's or the environment's limit, "
                  f"not cachet's")
            check(c_ok is False, f"cachet as native on that rule: cachet {c_what}" if c_what is not None
                  else "cachet as native on that rule (cachet never got there)")
        elif n_ok:
            check(True, f"native {n_what}")
            if c_ok is not None:
                check(c_ok, f"cachet {c_what}")
        elif c_ok is not None:  # native never got there
            check(c_ok, f"cachet {c_what} (native never got there)")


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
    check([x for x, _ in n] == [x for x, _ in c], f"both runs went through the same phases (native "
          f"{[x for x, _ in n]}, cachet {[x for x, _ in c]})")
    check(native["results"] == cachet["results"],
          f"all_reduce results equal: native {native['results']}, cachet {cachet['results']}")
    # (Expandable segments grow the freed block by the missing pages: no retry, in either run.)
    if "retries" in native or "retries" in cachet:
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
    """The worker's run: its JSON (with "error" set where it died), or one made up when it left none."""
    out = os.path.join(tmp, f"{label}.json")
    store = os.path.join(tmp, f"{label}.store")
    try:
        p = subprocess.run([sys.executable, THIS, "--worker", mode, store, out], env=env, capture_output=True,
                           text=True, timeout=600)
        rc, tail = p.returncode, f"{p.stdout[-1500:]}\n{p.stderr[-3000:]}"
    except subprocess.TimeoutExpired as e:
        rc, tail = "timeout (600 s)", str(e)
    run = None
    if os.path.exists(out):
        try:
            with open(out) as f:
                run = json.load(f)
        except ValueError:
            run = None
    if run is None or (rc != 0 and not run.get("error")) or (rc == 0 and run.get("error")):
        run = dict(run or {"mode": mode, "phases": [], "results": []})
        done = run["phases"][-1][0] if run["phases"] else None
        run["error"] = {"after": done, "type": f"worker exit {rc}", "message": tail.strip()[-2000:],
                        "traceback": ""}
    if run["error"]:
        e = run["error"]
        print(f"{label}: the worker died after phase [{e['after']}]: {e['type']}: {e['message'][:600]}",
              flush=True)
        if e.get("traceback"):
            print("  " + e["traceback"].strip().replace("\n", "\n  ")[-2500:], flush=True)
    return run


def same_death(a, b):
    """The same phase, exception type and message (addresses aside)."""
    import re

    def key(e):
        return (e["after"], e["type"], re.sub(r"0x[0-9a-fA-F]+", "0x?", e["message"].splitlines()[0] if
                                             e["message"] else ""))
    return a is not None and b is not None and key(a) == key(b)


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
        run = runs["cachet-sleep"] = run_worker("cachet-sleep", senv, tmp, "cachet-sleep")
        check(run.get("backend") == "c10", "cachet through the c10 backend")
        check_rules("cachet-sleep", run, expandable)
        e = run["error"]
        check(e is None, "cachet-sleep: the worker completed" + (
            f" (it died after phase [{e['after']}]: {e['type']}: {e['message'][:400]}; no native run to hold "
            f"it against: see its reason)" if e else ""))
        if "after wake" in [name for name, _ in run["phases"]]:
            check_sleep(run)
    else:
        for mode in ("native", "cachet"):
            runs[mode] = run_worker(mode, env, tmp, mode)
        native, cachet = runs["native"], runs["cachet"]
        check(cachet.get("backend") == "c10", "cachet through the c10 backend")
        check_rules_against(native, cachet, expandable)
        compare(native, cachet, expandable)
        ne, ce = native["error"], cachet["error"]
        if ne:
            limit(f"native: the worker died after phase [{ne['after']}]: {ne['type']}: {ne['message'][:800]} "
                  f"-- native fails too: the test's or the environment's limit, not cachet's")
            check(same_death(ne, ce), "cachet dies where and as native does" + (
                f" (cachet died after phase [{ce['after']}]: {ce['type']}: {ce['message'][:400]})" if ce
                else " (cachet completed: it differs from native)"))
        else:
            check(ce is None, "cachet: the worker completed, as native's did" + (
                f" (cachet died after phase [{ce['after']}]: {ce['type']}: {ce['message'][:400]})" if ce else ""))
    outdir = os.environ.get("CACHET_NCCL_OUT")
    if outdir:
        os.makedirs(outdir, exist_ok=True)
        name = f"nccl-register-es-{args.expandable}{'-sleep' if args.sleep else ''}.json"
        with open(os.path.join(outdir, name), "w") as f:
            json.dump({"args": vars(args), "runs": runs, "failures": failures, "limits": limits}, f, indent=1)
    what = f"NCCL register hook (expandable {args.expandable}{', sleep' if args.sleep else ''})"
    if failures:
        print(f"{what}: FAIL ({len(failures)} failures, {len(limits)} limits where native fails too)", flush=True)
        return 1
    if limits:
        print(f"{what}: LIMIT (native fails too, cachet as native: {len(limits)} limits, 0 failures; "
              f"first: {limits[0][:200]})", flush=True)
        return LIMIT
    print(f"{what}: ok (0 failures)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
