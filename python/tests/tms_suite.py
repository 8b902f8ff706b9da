#!/usr/bin/env python3
"""torch_memory_saver's own examples against cachet (ctests cachet_tms_suite_es_{off,on}, labels gpu,
torch; exit 77 without PyTorch, a CUDA device or the suite's folder).

The suite is torch_memory_saver's (MIT), kept in the shared folder beside the checkout (its
peers/torch_memory_saver-tests): this harness runs it from there and copies nothing.
Each example function runs in a fresh process started under
cachet_torch.memory_saver.configure_subprocess() (so cachet is PyTorch's allocator from the
moment the example imports torch, in both hook modes), with `import torch_memory_saver` giving
cachet_torch.memory_saver (alias(force=True): the harness means cachet's even where the real one
is installed) and `torch_memory_saver.testing_utils` / `.utils` served from the suite's
torch_memory_saver_helpers/. An example passes when its process exits 0, as upstream's preload
driver judges it.

The expected outcome of every example and hook mode is stated in EXPECTED below, before anything
runs: "pass", or "n/a" with the reason (it reads torch_memory_saver's internals, needs two GPUs
(the many-GPU issue runs those), or a feature cachet does not have). The table prints expected
against observed; the exit code is 1 when an expected pass does not pass. --all also runs the
n/a rows (observed, never judged).

usage: tms_suite.py [--suite DIR] [--expandable on|off] [--all] [--only NAME] [--out FILE.json]
"""
import argparse
import json
import os
import subprocess
import sys
import time

import preamble

BOTH = ("preload", "torch")
INTERNALS = "reads torch_memory_saver internals"
TWO_GPUS = "needs two GPUs (the many-GPU issue runs it)"
# (example module, function, hook modes, extra environment, expected: "pass" or "n/a: reason")
EXPECTED = [
    ("simple", "run", BOTH, {}, "pass"),
    ("cpu_backup", "run", BOTH, {},
     "n/a: reads a paused tensor's host backup (get_cpu_backup while paused; cachet does not expose it) and "
     f"{INTERNALS} (_impl._mem_pools, _impl._with_region_config, cudaHostGetFlags via _impl._binary_wrapper.cdll)"),
    ("cpu_backup", "run_retain_from_env", BOTH, {"TMS_RETAIN_CPU_BACKUP": "1"}, "pass"),
    ("cpu_backup", "run_backend_from_env", BOTH, {"TMS_INIT_CPU_BACKUP_BACKEND": "mmap"},
     f"n/a: {INTERNALS} (_impl._binary_wrapper.cdll.tms_get_cpu_backup_backend)"),
    ("cpu_backup", "run_preload_backend_from_env", ("preload",),
     {"TMS_INIT_ENABLE": "1", "TMS_INIT_ENABLE_CPU_BACKUP": "1", "TMS_INIT_CPU_BACKUP_BACKEND": "mmap"},
     f"n/a: {INTERNALS} (_impl._binary_wrapper.cdll.tms_get_*) and mmap backups' RSS"),
    ("cpu_backup", "run_rss", ("torch",), {},
     "n/a: measures the RSS reclaim of mmap backups; cachet backs up to pinned memory"),
    ("cpu_backup", "run_multi_device_mmap_restore", BOTH, {}, f"n/a: {TWO_GPUS}"),
    ("disk_backup", "run", BOTH, {}, "n/a: disk backup (enable_disk_backup) is not supported by cachet"),
    ("multi_device", "run", BOTH, {}, f"n/a: {TWO_GPUS}"),
    ("multi_device_torch_mode", "run", ("torch",), {}, f"n/a: {TWO_GPUS}"),
    ("training_engine", "run", ("preload",), {"TMS_INIT_ENABLE": "1", "TMS_INIT_ENABLE_CPU_BACKUP": "1"}, "pass"),
    ("nested_region", "run", ("preload",), {"TMS_INIT_ENABLE": "1", "TMS_INIT_ENABLE_CPU_BACKUP": "1"},
     f"n/a: {INTERNALS} (_impl._binary_wrapper.cdll.tms_get_* of the region configuration)"),
    ("cuda_vmm_granularity", "run", ("preload",), {"TMS_INIT_ENABLE": "1"},
     "n/a: calls the preload library's tms_pause/tms_resume through ctypes.CDLL(None)"),
]

BOOT = r"""
import importlib, os, sys
suite, helpers, name, fn, mode = sys.argv[1:6]
sys.path.insert(0, suite)
from cachet_torch import memory_saver
memory_saver.__path__ = [helpers]   # torch_memory_saver.testing_utils and .utils: the suite's own
memory_saver.alias(force=True)
mod = importlib.import_module("examples." + name)
getattr(mod, fn)(hook_mode=mode)
import cachet_torch
print(f"cachet: backend {cachet_torch.backend()}, {cachet_torch.settings()['canonical']}", flush=True)
"""


def default_suite():
    """A copy in the checkout's git-ignored .tms folder (what travels to the GPU machine: copy the
    shared folder's suite there), else the shared folder inside the checkout or beside it."""
    checkout = os.path.dirname(os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))
    candidates = [os.path.join(checkout, ".tms")] + [
        os.path.join(shared, "peers", "torch_memory_saver-tests")
        for shared in (os.path.join(checkout, "shared"), os.path.join(os.path.dirname(checkout), "shared"))]
    for suite in candidates:
        if os.path.isdir(os.path.join(suite, "examples")):
            return suite
    return candidates[-1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--suite", default=default_suite())
    ap.add_argument("--expandable", default="off", choices=("off", "on"))
    ap.add_argument("--all", action="store_true")
    ap.add_argument("--only")
    ap.add_argument("--out")
    ap.add_argument("--timeout", type=int, default=600)
    a = ap.parse_args()
    if not os.path.isdir(os.path.join(a.suite, "examples")):
        print(f"SKIP: torch_memory_saver's suite is not at {a.suite}")
        return preamble.SKIP
    torch, _, stop = preamble.start(plugin=False)
    if stop is not None:
        return stop
    sys.path.insert(0, preamble.PYDIR)
    from cachet_torch.memory_saver import configure_subprocess

    helpers = os.path.join(a.suite, "torch_memory_saver_helpers")
    print("expected outcomes (stated before running):")
    for name, fn, modes, extra, want in EXPECTED:
        print(f"  {name}.{fn} [{', '.join(modes)}]{' ' + str(extra) if extra else ''}: {want}")
    rows, failures = [], []
    for name, fn, modes, extra, want in EXPECTED:
        if a.only and a.only not in (name, f"{name}.{fn}"):
            continue
        for mode in modes:
            if want != "pass" and not a.all:
                rows.append((f"{name}.{fn}", mode, want, "not run", 0.0))
                continue
            env = {k: v for k, v in os.environ.items() if k not in preamble.ALLOC_CONF_VARS
                   and not k.startswith("TMS_")}
            env.update(extra)
            if a.expandable == "on":
                env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
            saved = dict(os.environ)
            os.environ.clear()
            os.environ.update(env)
            try:
                with configure_subprocess():
                    child_env = dict(os.environ, CACHET_TORCH_MEMORY_SAVER="1")
            finally:
                os.environ.clear()
                os.environ.update(saved)
            t0 = time.monotonic()
            try:
                r = subprocess.run([sys.executable, "-c", BOOT, a.suite, helpers, name, fn, mode], env=child_env,
                                   capture_output=True, text=True, timeout=a.timeout, cwd=a.suite)
                rc, log = r.returncode, r.stdout + r.stderr
            except subprocess.TimeoutExpired as e:
                rc, log = "timeout", f"{e}"
            secs = time.monotonic() - t0
            got = "pass" if rc == 0 else f"FAIL (exit {rc})"
            rows.append((f"{name}.{fn}", mode, want, got, secs))
            if want == "pass" and rc != 0:
                failures.append(f"{name}.{fn} [{mode}]")
                print(f"---- {name}.{fn} [{mode}] exited {rc}; the end of its output:\n{log[-4000:]}\n----")
            else:
                tail = [l for l in log.splitlines() if l.startswith("cachet: backend")]
                if tail:
                    print(f"  {name}.{fn} [{mode}]: {tail[-1]}")
    print(f"\ntorch_memory_saver's examples under cachet (expandable segments {a.expandable}):")
    print(f"{'example':42} {'mode':8} {'observed':16} {'s':>6}  expected")
    for ex, mode, want, got, secs in rows:
        print(f"{ex:42} {mode:8} {got:16} {secs:6.1f}  {want}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"expandable": a.expandable, "rows": rows, "failures": failures}, f, indent=1)
    print(f"\n{len(failures)} expected pass(es) failed: {failures}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
