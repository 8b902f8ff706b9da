#!/usr/bin/env python3
"""Several GPUs (ctest cachet_torch_multi_gpu, labels gpu and torch; exit 77 = skipped: no
PyTorch or fewer than two CUDA devices).

Two processes, rank r on device r, each with cachet installed: each trains a small MLP on its
device and checks that cachet's per-device statistics see its tensors on its device only. Rank 0
also allocates on device 1 to check that one process keeps one allocator per device (the two
devices' statistics stay apart). Stream uses (record_stream) on a side stream are exercised too.
"""
import json
import os
import subprocess
import sys

import preamble
from preamble import PYDIR


def worker(rank):
    sys.path.insert(0, PYDIR)
    import cachet_torch
    cachet_torch.install()
    import torch
    dev = torch.device("cuda", rank)
    torch.cuda.set_device(dev)
    torch.manual_seed(rank)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(),
                                torch.nn.Linear(4096, 1024)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    for _ in range(10):
        x = torch.randn(256, 1024, device=dev)
        loss = model(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    side = torch.cuda.Stream(dev)
    t = torch.empty(1 << 20, device=dev)
    with torch.cuda.stream(side):
        t.mul_(2)
    t.record_stream(side)
    del t
    torch.cuda.synchronize(dev)
    out = {"rank": rank, "loss": float(loss.item()),
           "own_allocated": cachet_torch.memory_stats(rank)["allocated_bytes.all.current"],
           "own_segments": cachet_torch.memory_stats(rank)["segment.all.current"],
           "wired": cachet_torch.wired_callbacks()}
    other = 1 - rank
    out["other_has_allocator_before"] = bool(cachet_torch.load().cachet_torch_has_device(other))
    if rank == 0:
        before = cachet_torch.memory_stats(0)["allocated_bytes.all.current"]
        y = torch.empty(3 << 20, dtype=torch.uint8, device=torch.device("cuda", 1))
        out["cross_device_allocated"] = cachet_torch.memory_stats(1)["allocated_bytes.all.current"]
        out["own_unchanged"] = cachet_torch.memory_stats(0)["allocated_bytes.all.current"] == before
        del y
        out["cross_device_after_free"] = cachet_torch.memory_stats(1)["allocated_bytes.all.current"]
    print("RESULT " + json.dumps(out), flush=True)
    return 0


def main():
    _, _, stop = preamble.start(devices=2)
    if stop is not None:
        return stop
    env = preamble.child_env(keep_alloc_conf=True)
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--rank", str(r)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    failures, results = [], {}
    for r, p in enumerate(procs):
        so, se = p.communicate(timeout=240)
        line = next((ln for ln in so.splitlines() if ln.startswith("RESULT ")), None)
        if p.returncode != 0 or line is None:
            failures.append(f"rank {r} failed (rc {p.returncode}): {se[-1500:]}")
            continue
        results[r] = json.loads(line[len("RESULT "):])
        print(f"rank {r}: {results[r]}")
    for r, res in results.items():
        if res["own_allocated"] <= 0:
            failures.append(f"rank {r}: cachet saw nothing allocated on device {r}")
        if res["other_has_allocator_before"]:
            failures.append(f"rank {r}: an allocator for device {1 - r} existed before it was used")
    if 0 in results:
        res = results[0]
        if res.get("cross_device_allocated") != 3 << 20 or not res.get("own_unchanged") \
                or res.get("cross_device_after_free") != 0:
            failures.append(f"rank 0: per-device statistics mixed up: {res}")
    print("PASS" if not failures else "FAIL:\n  " + "\n  ".join(failures))
    return 0 if not failures else 1


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--rank":
        sys.exit(worker(int(sys.argv[2])))
    sys.exit(main())
