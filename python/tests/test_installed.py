#!/usr/bin/env python3
"""The installed cachet on a GPU: run from a neutral directory with the installation's package
directory on PYTHONPATH and CACHET_TORCH_LIB / CACHET_C10_LIB unset, after `cmake --install`
(scripts/gpu-run: DIR is PREFIX/lib) or `pip install --no-build-isolation --target DIR` (DIR holds
cachet_torch/ with both libraries inside it, and bin/cachet). Checks that cachet_torch is the
installed copy, that it uses the installed libraries (both under DIR), that a few training steps run
through the backend asked for with cachet's stats moving (c10: torch.cuda.memory_stats() equal to
cachet_torch.memory_stats()), and with --command that `cachet` on PATH is DIR's and runs. Exit 77
without torch or a GPU.

usage: test_installed.py DIR [--backend auto|c10|plugin] [--command]
"""
import argparse
import os
import shutil
import subprocess
import sys

import preamble


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--backend", default="auto", choices=("auto", "c10", "plugin"))
    ap.add_argument("--command", action="store_true")
    a = ap.parse_args()
    root = os.path.realpath(a.dir)
    torch, _, stop = preamble.start(plugin=False)
    if stop is not None:
        return stop
    check = preamble.Checks()
    import cachet_torch
    mod = os.path.realpath(cachet_torch.__file__)
    lib = os.path.realpath(cachet_torch.library_path())
    check(mod.startswith(root + os.sep), f"module {mod} is the installed one (under {root})")
    check(lib.startswith(root + os.sep) and os.path.basename(lib) == "libcachet_torch.so",
          f"library {lib} is the installed one")
    if a.backend == "c10":
        c10 = cachet_torch.c10_library_path()
        check(c10 is not None and os.path.realpath(c10).startswith(root + os.sep),
              f"c10 backend {c10} is the installed one")
    if a.command:
        cmd = shutil.which("cachet")
        r = subprocess.run([cmd or "cachet", "--version"], capture_output=True, text=True) if cmd else None
        check(cmd is not None and os.path.realpath(cmd).startswith(root + os.sep) and r.returncode == 0
              and r.stdout.startswith("cachet "), f"cachet on PATH is {cmd}: {r.stdout.strip() if r else ''}")
    cachet_torch.install(backend=a.backend)
    check(a.backend == "auto" or cachet_torch.backend() == a.backend, f"installed through {cachet_torch.backend()}")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 10)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(5):
        x = torch.randn(256, 512, device="cuda")
        loss = torch.nn.functional.cross_entropy(model(x), torch.randint(0, 10, (256,), device="cuda"))
        opt.zero_grad()
        loss.backward()
        opt.step()
    torch.cuda.synchronize()
    st = cachet_torch.memory_stats()
    check(st["allocation.all.allocated"] > 0 and st["reserved_bytes.all.current"] > 0,
          f"training through the installed {cachet_torch.backend()} backend: loss {loss.item():.4f}, "
          f"{st['allocation.all.allocated']} allocations, {st['reserved_bytes.all.current']} B reserved")
    if cachet_torch.backend() == "c10":
        native = torch.cuda.memory_stats()
        diff = [k for k, v in st.items() if not k.startswith("sleep.") and native.get(k) != v]
        check(not diff, f"torch.cuda.memory_stats() equals cachet_torch.memory_stats() ({diff[:3]})")
    print(f"{len(check.failures)} failure(s)")
    return 1 if check.failures else 0


if __name__ == "__main__":
    sys.exit(main())
