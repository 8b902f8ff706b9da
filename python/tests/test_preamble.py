#!/usr/bin/env python3
"""preamble.py, the start every test in python/tests shares (ctest cachet_torch_preamble, label
unit; no GPU, no PyTorch, no plug-in needed): each case runs preamble.start() in a fresh
interpreter against a stand-in `torch` package (none, no CUDA device, one device, two) and checks
the exact line printed and the exit code; child_env() drops the allocator configuration and puts
python/ first on PYTHONPATH; Checks keeps its failures; deterministic() makes every setting; the
library helpers (nm -D, readelf -d) read a library of this machine.
"""
import os
import subprocess
import sys
import tempfile

import preamble

HERE = os.path.dirname(os.path.abspath(__file__))
check = preamble.Checks()

FAKE_TORCH = """class cuda:
    @staticmethod
    def is_available():
        return {n} > 0

    @staticmethod
    def device_count():
        return {n}
"""


def start(fake_devices, lib, **kw):
    """preamble.start(**kw) in a fresh interpreter: (exit code or 0, what it printed)."""
    with tempfile.TemporaryDirectory() as d:
        path = [HERE]
        if fake_devices is not None:
            os.makedirs(os.path.join(d, "torch"))
            with open(os.path.join(d, "torch", "__init__.py"), "w") as f:
                f.write(FAKE_TORCH.format(n=fake_devices))
            path.insert(0, d)
        env = {k: v for k, v in os.environ.items() if k != "CACHET_TORCH_LIB"}
        env["PYTHONPATH"] = os.pathsep.join(path)
        if lib is not None:
            env["CACHET_TORCH_LIB"] = lib
        code = ("import sys, preamble\n"
                f"torch, lib, stop = preamble.start(**{kw!r})\n"
                "print('GO', torch is not None, lib) if stop is None else None\n"
                "sys.exit(stop or 0)\n")
        r = subprocess.run([sys.executable, "-S", "-c", code], env=env, capture_output=True, text=True,
                           timeout=60)
        return r.returncode, r.stdout + r.stderr


def main():
    lib = os.path.abspath(__file__)  # any file that exists stands for the plug-in
    cases = [
        # (stand-in devices, CACHET_TORCH_LIB, start's arguments, exit code, output)
        (None, lib, {}, 77, "SKIP: PyTorch is not installed\n"),
        (0, lib, {}, 77, "SKIP: no CUDA device\n"),
        (0, lib, {"plugin": False}, 77, "SKIP: no CUDA device\n"),
        (1, lib, {"devices": 2}, 77, "SKIP: 1 CUDA device(s); 2 are needed\n"),
        (1, None, {}, 1, "FAIL: the plug-in was not found (CACHET_TORCH_LIB=None); set it to the built "
                         "libcachet_torch.so (ctest sets it)\n"),
        (1, "/nonexistent/libcachet_torch.so", {}, 1,
         "FAIL: the plug-in was not found (CACHET_TORCH_LIB='/nonexistent/libcachet_torch.so'); set it to "
         "the built libcachet_torch.so (ctest sets it)\n"),
        (1, lib, {}, 0, f"GO True {lib}\n"),
        (2, lib, {"devices": 2}, 0, f"GO True {lib}\n"),
        (1, None, {"plugin": False}, 0, "GO True None\n"),
    ]
    for devices, l, kw, want_rc, want_out in cases:
        rc, out = start(devices, l, **kw)
        check(rc == want_rc and out == want_out,
              f"start({kw}) with {devices} stand-in device(s), CACHET_TORCH_LIB={l!r}: exit {rc}, "
              f"{out!r} (want {want_rc}, {want_out!r})")

    saved = dict(os.environ)
    try:
        os.environ.update({"CACHET_ALLOC_CONF": "policy:cachet", "PYTORCH_CUDA_ALLOC_CONF": "x",
                           "PYTORCH_ALLOC_CONF": "y", "PYTHONPATH": "/elsewhere", "KEEP_ME": "1"})
        env = preamble.child_env("/lib.so")
        check(not any(k in env for k in preamble.ALLOC_CONF_VARS) and env["KEEP_ME"] == "1"
              and env["CACHET_TORCH_LIB"] == "/lib.so"
              and env["PYTHONPATH"] == preamble.PYDIR + os.pathsep + "/elsewhere",
              "child_env drops the allocator configuration, puts python/ first on PYTHONPATH")
        env = preamble.child_env(keep_alloc_conf=True)
        check(env["PYTORCH_CUDA_ALLOC_CONF"] == "x" and env["CACHET_ALLOC_CONF"] == "policy:cachet",
              "child_env(keep_alloc_conf=True) keeps it")
    finally:
        os.environ.clear()
        os.environ.update(saved)
    check(os.path.exists(os.path.join(preamble.PYDIR, "cachet_torch", "__init__.py")),
          "PYDIR is python/ (the cachet_torch package)")

    inner = preamble.Checks()
    import contextlib
    import io
    with contextlib.redirect_stdout(io.StringIO()) as out:
        inner(True, "a")
        inner(False, "b")
    check(inner.failures == ["b"] and out.getvalue() == "ok    a\nFAIL  b\n", "Checks prints and keeps the failures")

    # deterministic(): every setting on a recording stand-in.
    from types import SimpleNamespace as NS
    calls = []
    fake = NS(manual_seed=lambda n: calls.append(("seed", n)),
              use_deterministic_algorithms=lambda on, warn_only: calls.append(("algorithms", on, warn_only)),
              cuda=NS(manual_seed_all=lambda n: calls.append(("cuda seed", n))),
              backends=NS(cudnn=NS(deterministic=False, benchmark=True, allow_tf32=True),
                          cuda=NS(matmul=NS(allow_tf32=True))))
    preamble.deterministic(fake)
    check(calls == [("seed", 0), ("cuda seed", 0), ("algorithms", True, True)]
          and fake.backends.cudnn.deterministic and not fake.backends.cudnn.benchmark
          and not fake.backends.cudnn.allow_tf32 and not fake.backends.cuda.matmul.allow_tf32,
          f"deterministic() sets the seeds, the algorithms, cuDNN and TF32: {calls}")
    preamble.deterministic(fake, benchmark=True)
    check(fake.backends.cudnn.deterministic and fake.backends.cudnn.benchmark,
          "deterministic(benchmark=True) leaves cuDNN deterministic with benchmark on")

    # run_worker(): the worker's JSON; a failing worker is one FAIL kept in the checks.
    tmp = tempfile.mkdtemp(prefix="cachet-preamble-")
    out = os.path.join(tmp, "w.json")
    ok = os.path.join(tmp, "ok.py")
    with open(ok, "w") as f:
        f.write("import json, sys\njson.dump({'n': 3}, open(sys.argv[1], 'w'))\n")
    mine = preamble.Checks()
    check(preamble.run_worker([ok, out], out, "ok/w", mine) == {"n": 3} and not mine.failures,
          "run_worker() returns the worker's JSON")
    bad = os.path.join(tmp, "bad.py")
    with open(bad, "w") as f:
        f.write("import sys\nsys.exit(3)\n")
    check(preamble.run_worker([bad, out + ".none"], out + ".none", "bad/w", mine) is None
          and mine.failures == ["bad/w: worker exited 3"], f"run_worker() keeps a failing worker: {mine.failures}")

    # The library helpers: the C++ symbols a library must not export; nm and readelf on a library
    # of this machine (the C library), or None without the tool.
    check(preamble.leaked_cxx_symbols(["cachet_malloc", "_ZN6cachet3gpu1xEv", "_ZN3fmt2v97vformatE", "_ZN3c104XEv"])
          == ["_ZN6cachet3gpu1xEv", "_ZN3fmt2v97vformatE"],
          "leaked_cxx_symbols() names the symbols of cachet and fmt only")
    libc = next((p for p in ("/lib/x86_64-linux-gnu/libc.so.6", "/lib64/libc.so.6", "/usr/lib/libc.so.6")
                 if os.path.exists(p)), None)
    if libc is not None:
        syms = preamble.library_symbols(libc)
        check(syms is None or any(k.split("@")[0] == "malloc" and t == "T" for k, t in syms.items()),
              f"library_symbols({libc}): malloc is a function")
        dyn = preamble.dynamic_section(libc)
        check(dyn is None or "ld-linux" in dyn, f"dynamic_section({libc}) lists its NEEDED ld-linux")

    print(f"\n{len(check.failures)} failure(s)")
    return 1 if check.failures else 0


if __name__ == "__main__":
    sys.exit(main())
