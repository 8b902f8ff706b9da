#!/usr/bin/env python3
"""The installed plug-in on a GPU (scripts/gpu-run, after `cmake --install`): run with the installed
module's directory on PYTHONPATH and CACHET_TORCH_LIB unset. Checks that cachet_torch is the
installed copy, that it uses the installed library, and that a few training steps run through it
with cachet's stats moving. Exit 77 without torch or a GPU.

usage: test_installed.py PREFIX_LIBDIR   (e.g. /opt/cachet/lib)
"""
import os
import sys

import preamble


def main():
    libdir = os.path.realpath(sys.argv[1])
    torch, _, stop = preamble.start(plugin=False)
    if stop is not None:
        return stop
    import cachet_torch
    mod = os.path.realpath(cachet_torch.__file__)
    lib = os.path.realpath(cachet_torch.library_path())
    ok = True
    for cond, what in ((mod.startswith(libdir + os.sep), f"module {mod} is the installed one (under {libdir})"),
                       (lib == os.path.join(libdir, "libcachet_torch.so"), f"library {lib} is the installed one")):
        print(("ok    " if cond else "FAIL  ") + what)
        ok &= cond
    cachet_torch.install()
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
    cond = st["allocation.all.allocated"] > 0 and st["reserved_bytes.all.current"] > 0
    print(("ok    " if cond else "FAIL  ") + f"training through the installed plug-in: loss {loss.item():.4f}, "
          f"{st['allocation.all.allocated']} allocations, {st['reserved_bytes.all.current']} B reserved")
    ok &= cond
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
