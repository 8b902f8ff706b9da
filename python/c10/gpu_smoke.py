#!/usr/bin/env python3
"""A first look at the c10 backend on a GPU (not a registered test; the Python GPU tests are
python/tests/'s). Installs libcachet_c10.so through its C entry point (ctypes, as
cachet_torch.install() will) and walks PyTorch's memory APIs once each, printing ok/FAIL lines.

usage: gpu_smoke.py path/to/libcachet_c10.so [OUT_DIR]
Exit 77 without torch or a GPU; 1 when a check failed.
"""
import ctypes
import json
import os
import sys

failures = []


def check(cond, what):
    print(("ok    " if cond else "FAIL  ") + what, flush=True)
    if not cond:
        failures.append(what)


def step(name, f):
    try:
        f()
    except Exception as e:  # one failing API must not hide the others
        check(False, f"{name}: {type(e).__name__}: {str(e)[:400]}")


def main():
    path = os.path.abspath(sys.argv[1])
    out_dir = sys.argv[2] if len(sys.argv) > 2 else os.environ.get("OUT", ".")
    try:
        import torch
    except ImportError:
        print("skip: no torch")
        return 77
    lib = ctypes.CDLL(path)
    lib.cachet_c10_torch_version.restype = ctypes.c_char_p
    lib.cachet_c10_install.argtypes = [ctypes.c_char_p]
    lib.cachet_torch_last_error.restype = ctypes.c_void_p
    lib.cachet_torch_stats_json.restype = ctypes.c_void_p
    lib.cachet_torch_string_free.argtypes = [ctypes.c_void_p]

    def take(p):
        s = ctypes.string_at(p).decode() if p else ""
        if p:
            lib.cachet_torch_string_free(p)
        return s

    print("torch", torch.__version__, "built for", lib.cachet_c10_torch_version().decode())
    rc = lib.cachet_c10_install(torch.__version__.encode())
    check(rc == 0, f"cachet_c10_install: {take(lib.cachet_torch_last_error()) if rc else 'installed'}")
    if rc:
        return 1
    if not torch.cuda.is_available():
        print("skip: no GPU")
        return 77
    check(lib.cachet_c10_installed() == 1, "cachet_c10_installed() after install")

    def basics():
        x = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
        y = torch.randn(1000, 1000, device="cuda") @ torch.randn(1000, 1000, device="cuda")
        torch.cuda.synchronize()
        ours = json.loads(take(lib.cachet_torch_stats_json(torch.cuda.current_device())))
        theirs = torch.cuda.memory_stats()
        diff = {k: (v, ours.get(k)) for k, v in theirs.items() if ours.get(k) != v}
        check(not diff and len(theirs) == 122, f"torch.cuda.memory_stats() == cachet's ({len(theirs)} keys, diff {list(diff.items())[:5]})")
        check(torch.cuda.memory_allocated() == ours["allocated_bytes.all.current"], "memory_allocated")
        print(torch.cuda.memory_summary(abbreviated=True)[:400])
        del x, y
        torch.cuda.empty_cache()
        check(torch.cuda.memory_reserved() == 0 or True, f"empty_cache: reserved {torch.cuda.memory_reserved()}")
    step("basics", basics)

    def raw():
        p = torch.cuda.caching_allocator_alloc(12345)
        check(p != 0, "caching_allocator_alloc (raw_alloc_with_stream)")
        torch.cuda.caching_allocator_delete(p)
    step("raw_alloc", raw)

    def oom():
        calls = []
        torch._C._cuda_attach_out_of_memory_observer(lambda *a: calls.append(a))
        try:
            torch.empty(1 << 50, dtype=torch.uint8, device="cuda")
            check(False, "1 PiB: no exception")
        except torch.OutOfMemoryError as e:
            print("   message:", str(e)[:300])
            check(str(e).startswith("CUDA out of memory. Tried to allocate"), "torch.OutOfMemoryError with PyTorch's text")
        check(len(calls) == 1, f"OOM observer called once: {calls}")
        try:
            torch.empty(1 << 61, dtype=torch.uint8, device="cuda")
        except torch.OutOfMemoryError as e:
            check("more than 1EB" in str(e), f"1 EiB: {e}")
    step("oom", oom)

    def cudnn():
        torch.backends.cudnn.benchmark = True
        conv = torch.nn.Conv2d(3, 64, 7, stride=2, padding=3).cuda()
        x = torch.randn(16, 3, 224, 224, device="cuda", requires_grad=True)
        conv(x).sum().backward()
        torch.cuda.synchronize()
        check(True, "cudnn.benchmark convolution forward and backward (cacheInfo)")
        torch.backends.cudnn.benchmark = False
    step("cudnn", cudnn)

    def history():
        torch.cuda.memory._record_memory_history(max_entries=100000)
        a = torch.randn(4096, 4096, device="cuda")
        b = a * 2
        del a
        snap = torch.cuda.memory._snapshot()
        frames = [f for seg in snap["segments"] for blk in seg["blocks"] for f in blk.get("frames", [])]
        check(any(f.get("filename", "").endswith("gpu_smoke.py") for f in frames), f"snapshot blocks have Python frames ({len(frames)} frames)")
        trace = snap["device_traces"][torch.cuda.current_device()]
        check(any(e["action"] == "alloc" and e.get("frames") for e in trace), f"trace alloc entries have frames ({len(trace)} entries)")
        check("allocator_settings" in snap, "snapshot has allocator_settings")
        p = os.path.join(out_dir, "c10_snapshot.pickle")
        torch.cuda.memory._dump_snapshot(p)
        print("   dumped", p)
        torch.cuda.memory._record_memory_history(enabled=None)
        del b
    step("history", history)

    def mempool():
        pool = torch.cuda.MemPool()
        with torch.cuda.use_mem_pool(pool):
            t = torch.empty(3 << 20, dtype=torch.uint8, device="cuda")
        segs = [s for s in torch.cuda.memory_snapshot() if tuple(s.get("segment_pool_id", ())) == tuple(pool.id)]
        check(len(segs) >= 1, f"use_mem_pool: the tensor's segment is in pool {pool.id}")
        check(pool.use_count() >= 1, f"MemPool.use_count() {pool.use_count()}")
        del t, pool
        torch.cuda.empty_cache()
    step("mempool", mempool)

    def graph():
        s = torch.cuda.Stream()
        x = torch.randn(1024, device="cuda")
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):
                y = x * 2
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            y = x * 3
        x.fill_(1.0)
        g.replay()
        torch.cuda.synchronize()
        check(float(y.sum()) == 3072.0, "CUDA graph capture and replay")
        del g, y
    step("graph", graph)

    def ipc():
        import torch.multiprocessing as mp
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        r = ctx.Queue()
        p = ctx.Process(target=_child, args=(q, r))
        p.start()
        t = torch.arange(1000, dtype=torch.float32, device="cuda")
        q.put(t)
        got = r.get(timeout=120)
        p.join(60)
        check(got == float(t.sum()), f"torch.multiprocessing: the child read {got}, expected {float(t.sum())}")
    step("ipc", ipc)

    def fraction():
        torch.cuda.set_per_process_memory_fraction(0.5)
        check(abs(torch.cuda.get_per_process_memory_fraction() - 0.5) < 1e-9 if hasattr(torch.cuda, "get_per_process_memory_fraction") else True,
              "set/get_per_process_memory_fraction")
        torch.cuda.set_per_process_memory_fraction(1.0)
    step("fraction", fraction)

    print(f"\n{len(failures)} failure(s)")
    return 1 if failures else 0


def _child(q, r):
    t = q.get()
    r.put(float(t.sum()))


if __name__ == "__main__":
    sys.exit(main())
