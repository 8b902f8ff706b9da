#!/usr/bin/env python3
"""CUDA graphs and torch.cuda.MemPool with cachet as PyTorch's allocator (issue 16; ctests
cachet_torch_<scenario>, labels gpu and torch; exit 77 = skipped: no PyTorch or no CUDA device).

usage: test_pools.py SCENARIO      (one scenario per process: the allocator is chosen once)

Scenarios (python/README.md, "CUDA graphs and MemPool", gives the measured runs):
  graph_probe        an MLP forward captured in a CUDA graph, 96 new 4 MiB tensors filled with a
                     sentinel (48 on the capture stream, where the capture's freed blocks would
                     be reused without a private pool), five replays on new inputs: each output
                     allclose to eager
                     (atol = rtol = 1e-3) and every sentinel exactly intact; the graph's blocks
                     sit in segments of its private pool (cachet_torch.snapshot()).
  graphed_callables  torch.cuda.make_graphed_callables trains a small MLP 20 steps; the losses
                     equal, bit for bit, those of the same script under the native allocator (run
                     in a subprocess).
  shared_pool_reset  two graphs share one pool (pool=g1.pool()); reset g1 then g2, and (again,
                     from the state left) g2 then g1; after the resets and empty_cache, cachet's
                     reserved bytes equal those before the first capture and the device's free
                     memory (cudaMemGetInfo) is within 2 MiB of its value then.
  mempool_installed  torch.cuda.MemPool() with cachet installed: PyTorch 2.11's plug-in class has
                     no createOrIncrefPool, so PyTorch refuses with its message; if a later PyTorch
                     accepts it, the allocations under use_mem_pool must land in the pool.
  mempool_behind     cachet behind a MemPool without a global install
                     (MemPool(CUDAPluggableAllocator(lib, "cachet_malloc", "cachet_free")
                     .allocator())): allocate, free, drop the pool, torch.cuda.empty_cache() and
                     cachet_torch.empty_cache(): free device memory back within 2 MiB.
  compile            torch.compile(mode="reduce-overhead") of a small model with
                     install(cudagraph_trees=False): outputs allclose to eager over six calls, and
                     the CUDA graphs it captured allocated from a private pool.

Deterministic settings as tests/test_e2e.py: torch.use_deterministic_algorithms(True,
warn_only=True), cuDNN deterministic, no benchmark, no TF32, CUBLAS_WORKSPACE_CONFIG=:4096:8,
fixed seeds. Environment: CACHET_TORCH_LIB (the plug-in), CACHET_POOLS_OUT (a folder: each
scenario writes SCENARIO.json there).
"""
import json
import os
import subprocess
import sys

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
import preamble

sys.path.insert(0, preamble.PYDIR)
MiB = 1 << 20
SCENARIOS = ("graph_probe", "graphed_callables", "shared_pool_reset", "mempool_installed",
             "mempool_behind", "compile")
check = preamble.Checks()
failures = check.failures
deterministic = preamble.deterministic


def install(**kw):
    import cachet_torch
    cachet_torch.install(os.environ["CACHET_TORCH_LIB"], **kw)
    return cachet_torch


def install_twice(res, **kw):
    """install() twice, its stderr kept in res["install_stderr"]: each note must come once."""
    import io
    err, sys.stderr = sys.stderr, io.StringIO()
    try:
        install(**kw)
        install(**kw)
    finally:
        err, sys.stderr = sys.stderr.getvalue(), err
    sys.stderr.write(err)
    res["install_stderr"] = err
    import cachet_torch
    return cachet_torch


def pool_segments(cachet_torch, pool_id):
    return [s for s in cachet_torch.snapshot()["segments"] if tuple(s["segment_pool_id"]) == tuple(pool_id)]


def free_memory(torch):
    torch.cuda.synchronize()
    return torch.cuda.mem_get_info()[0]


def mlp(torch, dev):
    return torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 4096),
                               torch.nn.GELU(), torch.nn.Linear(4096, 1024)).to(dev)


# ----------------------------------------------------------------------------- scenarios

def graph_probe(torch, res):
    ct = install_twice(res)
    notes = res["install_stderr"].count("cachet_torch: note: torch.compile(mode=\"reduce-overhead\")")
    check(notes == 1, f"install() without cudagraph_trees=False says once that reduce-overhead needs it "
                      f"({notes} times)")
    res["wired"] = ct.wired_callbacks()
    for setter in ("set_begin_allocate_to_pool", "set_end_allocate_to_pool_fn", "set_release_pool"):
        check(setter in res["wired"], f"install() wired {setter}")
    deterministic(torch)
    dev = torch.device("cuda")
    model = mlp(torch, dev)
    x = torch.randn(256, 1024, device=dev)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.no_grad():
        for _ in range(3):
            model(x)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(g, stream=s):
        y = model(x)
    res["pool"] = list(g.pool())
    res["pool_segments"] = len(pool_segments(ct, g.pool()))
    check(res["pool_segments"] > 0, f"the capture allocated in its private pool {tuple(g.pool())}: "
                                    f"{res['pool_segments']} segment(s)")
    # Half the sentinels on the capture stream: blocks the capture freed there would be handed to
    # them if the graph's blocks were not kept in its private pool (blocks never change stream).
    fillers = [torch.full((1 << 20,), 7.0, device=dev) for _ in range(48)]
    with torch.cuda.stream(s):
        fillers += [torch.full((1 << 20,), 7.0, device=dev) for _ in range(48)]
    torch.cuda.synchronize()
    out_ok, fill_ok = [], []
    for _ in range(5):
        x.copy_(torch.randn(256, 1024, device=dev))
        g.replay()
        torch.cuda.synchronize()
        with torch.no_grad():
            ref = model(x)
        out_ok.append(bool(torch.allclose(y, ref, atol=1e-3, rtol=1e-3)))
        fill_ok.append(all(bool((f == 7.0).all()) for f in fillers))
    res["replay_output_correct"], res["fillers_intact"] = out_ok, fill_ok
    check(all(out_ok), f"five replays give the eager result (allclose 1e-3): {out_ok}")
    check(all(fill_ok), f"every sentinel of the 96 tensors intact after each replay: {fill_ok}")
    del g, y
    torch.cuda.synchronize()


def graphed_worker(torch, allocator):
    if allocator == "cachet":
        install()
    deterministic(torch)
    dev = torch.device("cuda")
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
                                torch.nn.ReLU(), torch.nn.Linear(512, 10)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(1234)
    xs = torch.randn(20, 64, 256, generator=g)
    ys = torch.randint(0, 10, (20, 64), generator=g)
    sample = torch.randn(64, 256, device=dev)
    graphed = torch.cuda.make_graphed_callables(model, (sample,))
    losses = []
    for i in range(20):
        x, y = xs[i].to(dev), ys[i].to(dev)
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(graphed(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    out = {"allocator": allocator, "losses": [float.hex(v) for v in losses], "values": losses}
    if allocator == "cachet":
        import cachet_torch
        out["private_pool_segments"] = sum(1 for s in cachet_torch.snapshot()["segments"]
                                           if tuple(s["segment_pool_id"]) != (0, 0))
    print("RESULT " + json.dumps(out), flush=True)


def graphed_callables(torch, res):
    runs = {}
    for allocator in ("native", "cachet"):
        p = subprocess.run([sys.executable, os.path.abspath(__file__), "--graphed-worker", allocator],
                           capture_output=True, text=True, timeout=600)
        line = next((ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")), None)
        check(p.returncode == 0 and line is not None,
              f"{allocator} run of make_graphed_callables (rc {p.returncode}) {p.stderr.strip()[-1500:]}")
        if line:
            runs[allocator] = json.loads(line[len("RESULT "):])
    res["runs"] = runs
    if len(runs) == 2:
        same = runs["native"]["losses"] == runs["cachet"]["losses"]
        check(same, "20 losses identical bit for bit: native " + " ".join(runs["native"]["losses"][:3]) +
              " ... cachet " + " ".join(runs["cachet"]["losses"][:3]) + " ...")
        check(runs["cachet"].get("private_pool_segments", 0) > 0,
              f"the graphs allocated from a private pool ({runs['cachet'].get('private_pool_segments')} segments)")


def shared_pool_reset(torch, res):
    ct = install()
    deterministic(torch)
    dev = torch.device("cuda")
    model = mlp(torch, dev)
    x = torch.randn(256, 1024, device=dev)
    # Warm-up on the capture stream and on the current stream, where the replays are checked: the
    # cuBLAS workspaces PyTorch keeps per stream (32 MiB each with CUBLAS_WORKSPACE_CONFIG=:4096:8)
    # exist before the first measurement.
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.no_grad():
        for _ in range(3):
            model(x), model(x * 2)
    torch.cuda.current_stream().wait_stream(s)
    with torch.no_grad():
        model(x), model(x * 2)
    torch.cuda.synchronize()
    rounds = []
    for order in ((1, 2), (2, 1)):
        torch.cuda.empty_cache()
        before = {"reserved": ct.memory_reserved(), "free": free_memory(torch)}
        graphs = {1: torch.cuda.CUDAGraph(), 2: torch.cuda.CUDAGraph()}
        with torch.no_grad():
            with torch.cuda.graph(graphs[1], stream=s):
                y1 = model(x)
            with torch.cuda.graph(graphs[2], pool=graphs[1].pool(), stream=s):
                y2 = model(x * 2)
        pool = tuple(graphs[1].pool())
        shared = tuple(graphs[2].pool()) == pool
        during = {"reserved": ct.memory_reserved(), "pool_segments": len(pool_segments(ct, pool))}
        graphs[1].replay()
        graphs[2].replay()
        torch.cuda.synchronize()
        with torch.no_grad():
            ok = bool(torch.allclose(y1, model(x), atol=1e-3, rtol=1e-3)) and \
                bool(torch.allclose(y2, model(x * 2), atol=1e-3, rtol=1e-3))
        del y1, y2
        for k in order:
            graphs[k].reset()
        del graphs
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        after = {"reserved": ct.memory_reserved(), "free": free_memory(torch),
                 "pool_segments": len(pool_segments(ct, pool))}
        r = {"order": f"g{order[0]} then g{order[1]}", "pool": list(pool), "shared": shared, "replays_ok": ok,
             "before": before, "during": during, "after": after}
        rounds.append(r)
        name = r["order"]
        check(shared, f"{name}: the second graph captured into the first one's pool {pool}")
        check(during["pool_segments"] > 0 and during["reserved"] > before["reserved"],
              f"{name}: the captures grew the pool ({during})")
        check(ok, f"{name}: both graphs replay to the eager result")
        check(after["reserved"] == before["reserved"],
              f"{name}: reserved after reset and empty_cache {after['reserved']} == before the capture "
              f"{before['reserved']}")
        check(after["pool_segments"] == 0, f"{name}: no segment of pool {pool} left")
        diff = after["free"] - before["free"]
        check(abs(diff) <= 2 * MiB, f"{name}: device free memory back within 2 MiB "
                                    f"(before {before['free']}, after {after['free']}, {diff:+d} B)")
    res["rounds"] = rounds


def mempool_installed(torch, res):
    ct = install()
    dev = torch.device("cuda")
    torch.ones(1, device=dev)
    try:
        pool = torch.cuda.MemPool()
    except RuntimeError as e:
        msg = str(e).splitlines()[0]
        res["outcome"] = "refused"
        res["message"] = msg
        check("does not yet support createOrIncrefPool" in msg,
              f"PyTorch refuses torch.cuda.MemPool() with the plug-in installed: {msg!r}")
        return
    res["outcome"] = "accepted"
    res["pool"] = list(pool.id)
    with torch.cuda.use_mem_pool(pool):
        t = torch.empty(8 * MiB, dtype=torch.uint8, device=dev)
    n = len(pool_segments(ct, pool.id))
    res["pool_segments"] = n
    check(n > 0, f"MemPool accepted; the allocation under use_mem_pool landed in pool {tuple(pool.id)}")
    del t


def mempool_behind(torch, res):
    import cachet_torch
    dev = torch.device("cuda")
    keep = torch.ones(1, device=dev)  # the context and the native allocator's first segment
    torch.cuda.empty_cache()
    before = free_memory(torch)
    lib = cachet_torch.library_path()
    alloc = torch.cuda.memory.CUDAPluggableAllocator(lib, "cachet_malloc", "cachet_free")
    pool = torch.cuda.MemPool(alloc.allocator())
    with torch.cuda.use_mem_pool(pool):
        ts = [torch.randn(1 << n, device=dev) for n in range(10, 27, 2)]
    torch.cuda.synchronize()
    st = cachet_torch.memory_stats(0)
    res["cachet_allocated"] = st["allocated_bytes.all.current"]
    res["cachet_reserved"] = st["reserved_bytes.all.current"]
    res["pool_segments"] = [(s["total_size"], list(s["segment_pool_id"])) for s in pool.snapshot()]
    check(st["allocated_bytes.all.current"] > 0, f"cachet served the pool's device memory "
                                                 f"({st['reserved_bytes.all.current']} B reserved)")
    check(len(res["pool_segments"]) > 0, f"PyTorch's pool holds {len(res['pool_segments'])} segment(s)")
    del ts
    torch.cuda.synchronize()
    del pool
    torch.cuda.empty_cache()
    cachet_torch.empty_cache()
    after = free_memory(torch)
    st = cachet_torch.memory_stats(0)
    res.update(before=before, after=after, cachet_reserved_after=st["reserved_bytes.all.current"])
    check(st["reserved_bytes.all.current"] == 0, "cachet gave every segment back")
    check(abs(after - before) <= 2 * MiB,
          f"device free memory back within 2 MiB (before {before}, after {after}, {after - before:+d} B)")
    del keep


def compile_reduce_overhead(torch, res):
    ct = install_twice(res, cudagraph_trees=False)
    said = res["install_stderr"].count("cachet_torch: torch._inductor.config.triton.cudagraph_trees = False")
    check(said == 1 and "note:" not in res["install_stderr"],
          f"install(cudagraph_trees=False) announces it once on stderr, with no note ({said} times)")
    import torch._inductor.config as inductor_config
    res["cudagraph_trees"] = inductor_config.triton.cudagraph_trees
    check(inductor_config.triton.cudagraph_trees is False, "install(cudagraph_trees=False) turned CUDA graph trees off")
    deterministic(torch)
    dev = torch.device("cuda")
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 512)).to(dev)
    model.eval()
    compiled = torch.compile(model, mode="reduce-overhead")
    g = torch.Generator(device=dev).manual_seed(7)
    oks = []
    try:
        with torch.no_grad():
            for _ in range(6):
                inp = torch.randn(64, 512, device=dev, generator=g)
                out = compiled(inp).clone()
                oks.append(bool(torch.allclose(out, model(inp), atol=1e-3, rtol=1e-3)))
    except Exception as e:  # noqa: BLE001 (reported, then failed)
        res["error"] = f"{type(e).__name__}: {str(e)[:600]}"
        check(False, f"torch.compile(mode='reduce-overhead') ran: {res['error']}")
        return
    torch.cuda.synchronize()
    res["allclose"] = oks
    check(len(oks) == 6 and all(oks), f"six compiled calls allclose to eager (1e-3): {oks}")
    private = sorted({tuple(s["segment_pool_id"]) for s in ct.snapshot()["segments"]} - {(0, 0)})
    res["private_pools"] = [list(p) for p in private]
    check(len(private) > 0, f"the CUDA graphs allocated from private pools {private}")


# ----------------------------------------------------------------------------- driver

def main(scenario):
    if scenario not in SCENARIOS:
        print(f"test_pools.py: unknown scenario {scenario!r}; one of {', '.join(SCENARIOS)}")
        return 2
    torch, lib, stop = preamble.start()
    if stop is not None:
        return stop
    res = {"scenario": scenario, "torch": torch.__version__}  # nothing may touch CUDA before install()
    fn = {"graph_probe": graph_probe, "graphed_callables": graphed_callables,
          "shared_pool_reset": shared_pool_reset, "mempool_installed": mempool_installed,
          "mempool_behind": mempool_behind, "compile": compile_reduce_overhead}[scenario]
    try:
        fn(torch, res)
    except Exception as e:  # noqa: BLE001 (a failure, with its message)
        import traceback
        traceback.print_exc()
        check(False, f"{scenario} raised {type(e).__name__}: {str(e)[:600]}")
    res["device"] = torch.cuda.get_device_name(0)
    res["failures"] = failures
    out = os.environ.get("CACHET_POOLS_OUT")
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, scenario + ".json"), "w") as f:
            json.dump(res, f, indent=1)
    print(json.dumps(res)[:4000])
    print("PASS" if not failures else f"FAIL ({len(failures)})")
    return 0 if not failures else 1


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--graphed-worker":
        import torch as _torch
        graphed_worker(_torch, sys.argv[2])
        sys.exit(0)
    if len(sys.argv) != 2:
        print(__doc__)
        sys.exit(2)
    sys.exit(main(sys.argv[1]))
