#!/usr/bin/env python3
"""A program written against torch_memory_saver's README, run unchanged under cachet (issue 37,
Done-when 2). A benchmark with checks, not a ctest: run it on a GPU machine.

The program (the part after `# ---- the program`) imports only torch and torch_memory_saver:
regions "weights" (with CPU backup, WEIGHTS_GIB GiB) and "kv_cache", a CUDA graph captured with
torch_memory_saver.cuda_graph(tag="cuda_graph"), then CYCLES cycles of: pause kv_cache, weights,
cuda_graph (SGLang's order), a trainer step (an MLP trained with AdamW) in the freed memory,
resume in the reverse order. Checked each cycle: every data_ptr() kept, the weights bitwise equal
(a checksum of every tensor against the one taken at the start), the graph's replay equal to its
first, device free memory after the cycle within 2 MiB of its value after the first. Timed: each
pause and resume, against a pinned copy of the backed-up bytes in the same run (device to host
for pause, host to device for resume); both within 1.25x in every cycle, the first included. The
host buffers of the backup (cudaHostAlloc, many times the copy) are pinned when the program leaves
its region with enable_cpu_backup (cachet's torch_memory_saver, docs/sleep-wake.md section 6) and
kept for every pause, torch.cuda.empty_cache() in between included. CACHET_TMS_PREPARE_BACKUP=0
leaves the pinning to the first pause, whose time is then many times the copy (the failure this
check catches).

The launcher starts the program under cachet_torch.memory_saver.configure_subprocess() with
CACHET_TORCH_MEMORY_SAVER=1, so the program's `import torch_memory_saver` is cachet's and cachet is
PyTorch's allocator from its `import torch` on.

usage: python3 bench/tms_readme.py [--weights-gib 2] [--cycles 5] [--expandable on|off] [--json FILE]
  (PYTHONPATH: python/ of the checkout or the installed cachet_torch; CACHET_TORCH_LIB or an
  installed/pip cachet_torch with its libraries)
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
MiB = 1 << 20


def launcher():
    ap = argparse.ArgumentParser()
    ap.add_argument("--weights-gib", type=float, default=2.0)
    ap.add_argument("--cycles", type=int, default=5)
    ap.add_argument("--expandable", default="off", choices=("off", "on"))
    ap.add_argument("--json")
    a = ap.parse_args()
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
    from cachet_torch.memory_saver import configure_subprocess
    if a.expandable == "on":
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    with configure_subprocess():
        env = dict(os.environ, CACHET_TORCH_MEMORY_SAVER="1")
    out = a.json or os.path.join("/tmp", f"tms_readme_{os.getpid()}.json")
    r = subprocess.run([sys.executable, os.path.abspath(__file__), "--program", str(a.weights_gib), str(a.cycles), out],
                       env=env)
    if r.returncode != 0 or not os.path.exists(out):
        print(f"the program exited {r.returncode}")
        return 1
    res = json.load(open(out))
    print(json.dumps({k: v for k, v in res.items() if k != "cycles"}, indent=1))
    print(f"{'cycle':>5} {'pause s':>9} {'D2H s':>9} {'ratio':>6} {'resume s':>9} {'H2D s':>9} {'ratio':>6} "
          f"{'free MiB':>10} ptrs weights graph")
    for c in res["cycles"]:
        print(f"{c['cycle']:5d} {c['pause_s']:9.4f} {c['d2h_s']:9.4f} {c['pause_s'] / c['d2h_s']:6.2f} "
              f"{c['resume_s']:9.4f} {c['h2d_s']:9.4f} {c['resume_s'] / c['h2d_s']:6.2f} "
              f"{c['free_after'] / MiB:10.1f} {c['ptrs_kept']} {c['weights_equal']} {c['graph_equal']}"
              )
    print("\n".join(f"FAIL  {f}" for f in res["failures"]) or "all checks passed")
    return 1 if res["failures"] else 0


def program(weights_gib, cycles, out):
    # ---- the program, as torch_memory_saver's README writes it (only torch and torch_memory_saver)
    import time

    import torch
    from torch_memory_saver import torch_memory_saver

    torch.manual_seed(0)
    n_weights = int(weights_gib * (1 << 30)) // 4 // 8
    t_region = time.perf_counter()
    with torch_memory_saver.region(tag="weights", enable_cpu_backup=True):
        weights = [torch.randn(n_weights, device="cuda") for _ in range(8)]
        w_small = torch.randn(1024, 1024, device="cuda")
    torch.cuda.synchronize()
    weights_region_s = time.perf_counter() - t_region  # the weights' allocation, and their pinning at exit
    with torch_memory_saver.region(tag="kv_cache"):
        kv_cache = torch.zeros(256 * MiB, dtype=torch.uint8, device="cuda").view(-1)
    static_in = torch.randn(512, 1024, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        (static_in @ w_small).tanh()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch_memory_saver.cuda_graph(cuda_graph=graph, tag="cuda_graph"):
        static_out = (static_in @ w_small).tanh() @ w_small.t()
    graph.replay()
    torch.cuda.synchronize()
    graph_ref = static_out.clone()

    def checksums():
        return [float(w.double().sum().item()) for w in weights] + [float(w_small.double().sum().item())]

    ptrs = [w.data_ptr() for w in weights] + [w_small.data_ptr(), kv_cache.data_ptr(), static_out.data_ptr()]
    sums = checksums()
    backed_up = sum(w.nbytes for w in weights) + w_small.nbytes
    host = torch.empty(backed_up, dtype=torch.uint8, pin_memory=True)

    def pinned_copies():
        """(seconds of a pinned D2H copy, of a pinned H2D copy) of the backed-up bytes; the device
        buffer is given back after, so that it holds no memory during the cycles."""
        dev = torch.empty(backed_up, dtype=torch.uint8, device="cuda")
        times = []
        for to_host in (True, False):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            if to_host:
                host.copy_(dev, non_blocking=True)
            else:
                dev.copy_(host, non_blocking=True)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        del dev
        torch.cuda.empty_cache()
        return times

    pinned_copies()  # warm

    class Trainer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(2048, 8192), torch.nn.ReLU(), torch.nn.Linear(8192, 2048))

    results, failures, free_first = [], [], None
    for cycle in range(cycles):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        torch_memory_saver.pause("kv_cache")
        torch_memory_saver.pause("weights")
        torch_memory_saver.pause("cuda_graph")
        torch.cuda.synchronize()
        pause_s = time.perf_counter() - t0
        trainer = Trainer().cuda()
        opt = torch.optim.AdamW(trainer.parameters(), lr=1e-4)
        for _ in range(3):
            x = torch.randn(4096, 2048, device="cuda")
            loss = trainer.net(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        torch.cuda.synchronize()
        del trainer, opt, x, loss
        torch.cuda.empty_cache()
        t0 = time.perf_counter()
        torch_memory_saver.resume("cuda_graph")
        torch_memory_saver.resume("weights")
        torch_memory_saver.resume("kv_cache")
        torch.cuda.synchronize()
        resume_s = time.perf_counter() - t0
        graph.replay()
        torch.cuda.synchronize()
        free_after = torch.cuda.mem_get_info()[0]
        if free_first is None:
            free_first = free_after
        d2h, h2d = pinned_copies()
        now = [w.data_ptr() for w in weights] + [w_small.data_ptr(), kv_cache.data_ptr(), static_out.data_ptr()]
        row = {"cycle": cycle, "pause_s": pause_s, "resume_s": resume_s, "d2h_s": d2h, "h2d_s": h2d,
               "free_after": free_after, "ptrs_kept": now == ptrs, "weights_equal": checksums() == sums,
               "graph_equal": bool(torch.equal(static_out, graph_ref))}
        results.append(row)
        for what, ok in (("pointers kept", row["ptrs_kept"]), ("weights bitwise equal", row["weights_equal"]),
                         ("graph replay equal", row["graph_equal"]),
                         ("free memory within 2 MiB of the first cycle's", abs(free_after - free_first) <= 2 * MiB),
                         (f"pause {pause_s:.4f} s within 1.25x of a pinned D2H copy {d2h:.4f} s",
                          pause_s <= 1.25 * d2h),
                         (f"resume {resume_s:.4f} s within 1.25x of a pinned H2D copy {h2d:.4f} s",
                          resume_s <= 1.25 * h2d)):
            if not ok:
                failures.append(f"cycle {cycle}: {what}")
    import cachet_torch
    json.dump({"backend": cachet_torch.backend(), "conf": cachet_torch.settings()["canonical"],
               "device": torch.cuda.get_device_name(), "backed_up_bytes": backed_up,
               "weights_region_s": weights_region_s, "cycles": results,
               "failures": failures}, open(out, "w"))
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--program"]:
        sys.exit(program(float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]))
    sys.exit(launcher())
