#!/usr/bin/env python3
"""DDP training of GPT-2 small on two GPUs (NCCL) under PyTorch's native allocator and under
cachet's c10 backend (issue 22): `torchrun --nproc_per_node=N` twice, every rank's losses equal,
bit for bit, between the two runs. ctest cachet_c10_ddp, labels gpu and torch; exit 77 = skipped
(no PyTorch, fewer than 2 CUDA devices, no transformers, or no libcachet_c10.so).

usage: test_ddp.py [--steps N]          (orchestrator; it starts torchrun itself)
Environment: CACHET_TORCH_LIB or CACHET_C10_LIB, CACHET_C10_OUT (a folder for ddp.json).
"""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
PYDIR = os.path.dirname(HERE)
sys.path.insert(0, PYDIR)


def rank_main(mode, out_dir, steps):
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    backend = None
    if mode == "cachet":
        import cachet_torch
        cachet_torch.install(backend="c10")
        backend = cachet_torch.backend()
    import torch
    import torch.distributed as dist
    from transformers import GPT2Config, GPT2LMHeadModel
    rank = int(os.environ["RANK"])
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl")
    torch.manual_seed(0)
    torch.cuda.manual_seed_all(0)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    model = GPT2LMHeadModel(GPT2Config(attn_implementation="eager")).cuda()
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local])
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-4)
    g = torch.Generator(device="cpu").manual_seed(100 + rank)
    losses = []
    for _ in range(steps):
        ids = torch.randint(0, 50257, (4, 256), generator=g).cuda()
        opt.zero_grad(set_to_none=True)
        loss = ddp(ids, labels=ids).loss
        loss.backward()
        opt.step()
        losses.append(loss.item())
    st = torch.cuda.memory_stats()
    res = {"rank": rank, "mode": mode, "backend": backend, "losses": [float.hex(x) for x in losses],
           "loss_values": losses, "peak_reserved": st["reserved_bytes.all.peak"],
           "allocator": torch.cuda.memory.get_allocator_backend()}
    with open(os.path.join(out_dir, f"{mode}-rank{rank}.json"), "w") as f:
        json.dump(res, f)
    dist.destroy_process_group()
    return 0


def main():
    if len(sys.argv) >= 2 and sys.argv[1] == "--rank":
        return rank_main(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    steps = 10
    if "--steps" in sys.argv:
        steps = int(sys.argv[sys.argv.index("--steps") + 1])
    try:
        import torch
        import transformers  # noqa: F401
    except ImportError as e:
        print(f"skipped: {e}")
        return 77
    n = torch.cuda.device_count()
    if n < 2:
        print(f"skipped: {n} CUDA device(s), DDP needs 2")
        return 77
    import cachet_torch
    if cachet_torch.c10_library_path() is None:
        print("skipped: no libcachet_c10.so")
        return 77
    tmp = tempfile.mkdtemp(prefix="cachet-ddp-")
    failures = []
    for mode in ("native", "cachet"):
        r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                            f"--nproc_per_node={n}", os.path.abspath(__file__), "--rank", mode, tmp,
                            str(steps)], capture_output=True, text=True, timeout=1200)
        if r.returncode != 0:
            print(f"FAIL  torchrun ({mode}) exited {r.returncode}\n{r.stderr[-4000:]}")
            return 1
    report = {"ranks": n, "steps": steps, "per_rank": []}
    for rank in range(n):
        with open(os.path.join(tmp, f"native-rank{rank}.json")) as f:
            a = json.load(f)
        with open(os.path.join(tmp, f"cachet-rank{rank}.json")) as f:
            b = json.load(f)
        same = a["losses"] == b["losses"]
        print(("ok    " if same else "FAIL  ") + f"rank {rank}: {steps} losses equal native's "
              f"(last {b['loss_values'][-1]:.6f} vs {a['loss_values'][-1]:.6f}); backend {b['backend']}, "
              f"allocator {b['allocator']!r}; peak reserved {b['peak_reserved']} vs {a['peak_reserved']}")
        if not same or b["backend"] != "c10":
            failures.append(rank)
        report["per_rank"].append({"native": a, "cachet": b, "equal": same})
    out = os.environ.get("CACHET_C10_OUT")
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "ddp.json"), "w") as f:
            json.dump(report, f, indent=1)
    print(f"ddp: {'FAIL' if failures else 'ok'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
