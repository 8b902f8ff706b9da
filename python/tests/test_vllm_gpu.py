#!/usr/bin/env python3
"""vLLM's CuMemAllocator behaviour through cachet_torch.vllm_backend on a GPU (ctests
cachet_vllm_<scenario>, labels gpu, torch; exit 77 without PyTorch or a CUDA device). The cases
are those of vLLM's tests/basic_correctness/test_cumem.py that need only the allocator, written
here from vLLM's documented behaviour (not vLLM's code; vLLM is not needed):

  basic      tensors in the pools "weights" and "kv_cache"; sleep(offload_tags="weights") gives
             their memory back (device free memory rises by >= 90% of their bytes,
             get_current_usage() drops by their bytes); wake_up(): same data_ptr()s, weights
             bitwise equal.
  discard    sleep(("weights",)); wake_up(["weights"]) wakes the weights only (kv_cache still
             asleep); wake_up(["kv_cache"]); discard("kv_cache") gives the KV cache's memory back
             while the weights stay; wake_up() maps it again at the same address.
  graph      a CUDA graph captured inside use_memory_pool("cuda_graph") over weights of the pool
             "weights": sleep(offload_tags=("weights",)) gives the graph's private pool back too
             (free memory rises by >= 90% of weights + graph memory), wake_up(), new input
             copied in, replay equal to eager.
  error      a tensor of 70% of the device in a pool; sleep(()); another 70% allocated outside;
             wake_up() raises RuntimeError (torch.OutOfMemoryError) and everything stays asleep;
             after that tensor is freed, wake_up() succeeds at the same address. An exception
             raised inside use_memory_pool() leaves the allocator and the tag as they were.

The worker never calls cachet_torch.install(): as in a vLLM worker, the allocator's first
use_memory_pool() installs cachet (cachet_sleep:True added to CACHET_ALLOC_CONF); --backend c10 or
plugin insists on one through $CACHET_TORCH_AUTOINSTALL_BACKEND, the variable that choice is
made with (set in the environment, it reaches the ctests too).

usage: test_vllm_gpu.py SCENARIO [--expandable on|off] [--backend auto|c10|plugin]
"""
import json
import os
import sys
import tempfile

import preamble

SCENARIOS = ("basic", "discard", "graph", "error")
MiB = 1 << 20
check = preamble.Checks()


def worker(scenario, out):
    # As a vLLM worker: cachet is not installed by the program; the allocator's first
    # use_memory_pool() installs it (with cachet_sleep:True, the backend of
    # $CACHET_TORCH_AUTOINSTALL_BACKEND).
    import cachet_torch
    import torch
    from cachet_torch.vllm_backend import CuMemAllocator
    alloc = CuMemAllocator.get_instance()
    res = {"installed_before": cachet_torch.installed()}
    free = lambda: torch.cuda.mem_get_info()[0]  # noqa: E731
    sync = torch.cuda.synchronize
    n = 64 * MiB // 4
    if scenario in ("basic", "discard"):
        with alloc.use_memory_pool(tag="weights"):
            w = torch.arange(4 * n, dtype=torch.float32, device="cuda")
        with alloc.use_memory_pool(tag="kv_cache"):
            kv = torch.ones(4 * n, device="cuda")
        ref = w.clone().cpu()
        ptrs = [w.data_ptr(), kv.data_ptr()]
        sync()
        f0, u0 = free(), alloc.get_current_usage()
        if scenario == "basic":
            alloc.sleep(offload_tags="weights")
            sync()
            res["freed"], res["usage_drop"] = free() - f0, u0 - alloc.get_current_usage()
            res["bytes"] = w.nbytes + kv.nbytes
            alloc.wake_up()
        else:
            alloc.sleep(offload_tags=("weights",))
            alloc.wake_up(["weights"])
            res["asleep_after_weights"] = cachet_torch.sleeping()
            alloc.wake_up(["kv_cache"])
            sync()
            f1 = free()
            alloc.discard("kv_cache")
            sync()
            res["discard_freed"], res["bytes"] = free() - f1, kv.nbytes
            res["asleep_after_discard"] = cachet_torch.sleeping()
            alloc.wake_up()
        sync()
        res["same_ptrs"] = [w.data_ptr(), kv.data_ptr()] == ptrs
        res["weights_equal"] = bool(torch.equal(w.cpu(), ref))
        res["asleep_at_end"] = cachet_torch.sleeping()
    elif scenario == "graph":
        torch.manual_seed(0)
        with alloc.use_memory_pool(tag="weights"):
            w = torch.randn(4096, 4096, device="cuda")
        static_in = torch.randn(2048, 4096, device="cuda")
        with alloc.use_memory_pool(tag="cuda_graph"):
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(2):
                    (static_in @ w).relu()
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                static_out = (static_in @ w).relu() * 2
        g.replay()
        sync()
        res["replay_before"] = bool(torch.allclose(static_out, (static_in @ w).relu() * 2))
        pool_bytes = static_out.nbytes
        f0 = free()
        alloc.sleep(offload_tags=("weights",))
        sync()
        res["freed"], res["bytes"] = free() - f0, w.nbytes + pool_bytes
        alloc.wake_up()
        static_in.copy_(torch.randn(2048, 4096, device="cuda"))
        g.replay()
        sync()
        res["replay_after"] = bool(torch.allclose(static_out, (static_in @ w).relu() * 2, rtol=1e-4, atol=1e-4))
    elif scenario == "error":
        try:
            with alloc.use_memory_pool(tag="weights"):
                raise ValueError("raised inside the pool")
        except ValueError:
            res["after_exception"] = [cachet_torch.current_tag(), alloc.current_tag]
        total = torch.cuda.get_device_properties(0).total_memory
        with alloc.use_memory_pool(tag="weights"):
            x = torch.empty(int(total * 0.7) // 4, dtype=torch.float32, device="cuda")
        ptr = x.data_ptr()
        alloc.sleep(offload_tags=())
        y = torch.empty(int(total * 0.7) // 4, dtype=torch.float32, device="cuda")
        try:
            alloc.wake_up()
            res["wake_error"] = None
        except RuntimeError as e:
            res["wake_error"] = type(e).__name__ + ": " + str(e)[:300]
        res["asleep_after_error"] = cachet_torch.sleeping()
        del y
        torch.cuda.empty_cache()
        alloc.wake_up()
        x.fill_(1)
        sync()
        res["same_ptr"] = x.data_ptr() == ptr
        res["asleep_at_end"] = cachet_torch.sleeping()
    res["backend"], res["conf"] = cachet_torch.backend(), cachet_torch.settings()["canonical"]
    with open(out, "w") as f:
        json.dump(res, f)
    return 0


def main():
    args = sys.argv[1:]
    if args[:1] == ["--worker"]:
        return worker(args[1], args[2])
    expandable, backend = "off", "auto"
    while len(args) > 1 and args[-2] in ("--expandable", "--backend"):
        if args[-2] == "--expandable":
            expandable = args[-1]
        else:
            backend = args[-1]
        args = args[:-2]
    if len(args) != 1 or args[0] not in SCENARIOS:
        print(f"usage: test_vllm_gpu.py {{{'|'.join(SCENARIOS)}}} [--expandable on|off] [--backend ...]", file=sys.stderr)
        return 2
    scenario = args[0]
    torch, _, stop = preamble.start(plugin=False)
    if stop is not None:
        return stop
    env = preamble.child_env(os.environ.get("CACHET_TORCH_LIB"))
    if backend != "auto":  # else the environment's choice, if any (CACHET_TORCH_AUTOINSTALL_BACKEND=plugin ctest ...)
        env["CACHET_TORCH_AUTOINSTALL_BACKEND"] = backend  # the backend cachet installs itself with
    if expandable == "on":
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    tmp = tempfile.mkdtemp(prefix=f"cachet-vllm-{scenario}-")
    out = os.path.join(tmp, "res.json")
    r = preamble.run_worker([os.path.abspath(__file__), "--worker", scenario, out], out, scenario, check, env=env,
                            timeout=600)
    if r is None:
        return 1
    print(f"backend {r['backend']}, configuration {r['conf']}")
    want = env.get("CACHET_TORCH_AUTOINSTALL_BACKEND") or "auto"
    check(not r["installed_before"] and r["backend"] is not None and want in ("auto", r["backend"]),
          f"the allocator's first use_memory_pool() installed cachet, through the {want} backend: {r['backend']}")
    check("cachet_sleep:True" in r["conf"] and (expandable == "off") == ("expandable_segments:True" not in r["conf"]),
          f"cachet_sleep:True added, expandable segments {expandable}: {r['conf']}")
    if scenario == "basic":
        check(r["freed"] >= 0.9 * r["bytes"] and r["usage_drop"] >= r["bytes"],
              f"sleep gives the pools' memory back: free +{r['freed']} B, usage -{r['usage_drop']} B of {r['bytes']} B")
        check(r["same_ptrs"] and r["weights_equal"] and r["asleep_at_end"] == [],
              "wake_up: same addresses, weights bitwise equal, nothing asleep")
    elif scenario == "discard":
        check(r["asleep_after_weights"] == ["vllm.kv_cache"], f"wake_up(['weights']) wakes the weights only: {r['asleep_after_weights']}")
        check(r["discard_freed"] >= 0.9 * r["bytes"] and r["asleep_after_discard"] == ["vllm.kv_cache"],
              f"discard('kv_cache') gives the KV cache's memory back (+{r['discard_freed']} B of {r['bytes']})")
        check(r["same_ptrs"] and r["weights_equal"] and r["asleep_at_end"] == [],
              "wake_up() after discard: same addresses, weights intact")
    elif scenario == "graph":
        check(r["replay_before"], "the graph replays before the sleep")
        check(r["freed"] >= 0.9 * r["bytes"], f"sleep gives weights and the graph's pool back: +{r['freed']} B of {r['bytes']} B")
        check(r["replay_after"], "after wake_up the graph replays new input equal to eager")
    elif scenario == "error":
        check(r["after_exception"] == ["default", "default"], f"an exception inside use_memory_pool: tag restored {r['after_exception']}")
        check(r["wake_error"] is not None and r["asleep_after_error"] == ["vllm.weights"],
              f"wake_up without the memory raises RuntimeError, everything stays asleep: {r['wake_error']}")
        check(r["same_ptr"] and r["asleep_at_end"] == [], "after the memory is freed, wake_up succeeds at the same address")
    print(f"{scenario}: {len(check.failures)} failure(s)")
    return 1 if check.failures else 0


if __name__ == "__main__":
    sys.exit(main())
