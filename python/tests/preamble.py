"""What every test in python/tests does before it starts, in one place.

  start(devices=1)  PyTorch importable and at least `devices` CUDA devices, else a SKIP line and
                    exit code 77 (ctest's SKIP_RETURN_CODE); then the plug-in named by
                    CACHET_TORCH_LIB, else a FAIL line and exit code 1.
  child_env(lib)    the environment for a child interpreter: no allocator configuration
                    inherited (CACHET_ALLOC_CONF, PYTORCH_CUDA_ALLOC_CONF, PYTORCH_ALLOC_CONF),
                    PYDIR first on PYTHONPATH (cachet_torch), CACHET_TORCH_LIB = lib if given.
  PYDIR             python/ of the checkout, or $CACHET_TEST_PYDIR (an installed copy's directory).
  Checks            ok/FAIL lines, the failures kept.
  deterministic(t)  the deterministic settings of the training tests (seeds 0, deterministic
                    algorithms with warn_only, cuDNN deterministic without benchmark unless
                    asked, no TF32).
  run_worker(argv, out, label, checks)
                    a worker interpreter that writes its results as JSON to `out`: the results,
                    or None after a FAIL line (kept in `checks`) when it fails.
  rss_bytes()       this process's resident set size in bytes (/proc/self/status VmRSS; 0 if absent).
  library_symbols(lib), leaked_cxx_symbols(syms), dynamic_section(lib)
                    what a built library exports (nm -D) and needs (readelf -d), for the tests
                    that check libcachet_torch.so and libcachet_c10.so without a GPU.

Imported by the scripts beside it (their folder is first on sys.path when they run); it changes
nothing at import, so test_installed.py still finds the installed cachet_torch.
"""
import json
import os
import shutil
import subprocess
import sys

SKIP = 77  # the tests' exit code for "skipped" (SKIP_RETURN_CODE in python/CMakeLists.txt)
# python/ of the checkout, which holds the cachet_torch package; CACHET_TEST_PYDIR=DIR tests an
# installed copy instead (DIR holds cachet_torch/: `pip install --target DIR`, python/README.md).
PYDIR = os.environ.get("CACHET_TEST_PYDIR") or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ALLOC_CONF_VARS = ("CACHET_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")


def start(devices=1, plugin=True):
    """(torch, lib, None) to go on, or (None, None, exit code) after printing why not.

    No PyTorch, or fewer than `devices` CUDA devices: "SKIP: ..." and 77. With `plugin`, a
    CACHET_TORCH_LIB that is unset or names no file: "FAIL: ..." and 1 (lib is None without it).
    """
    try:
        import torch
    except ImportError:
        print("SKIP: PyTorch is not installed")
        return None, None, SKIP
    if devices <= 1 and not torch.cuda.is_available():
        print("SKIP: no CUDA device")
        return None, None, SKIP
    if devices > 1 and torch.cuda.device_count() < devices:
        print(f"SKIP: {torch.cuda.device_count()} CUDA device(s); {devices} are needed")
        return None, None, SKIP
    if not plugin:
        return torch, None, None
    lib = os.environ.get("CACHET_TORCH_LIB")
    if not lib or not os.path.exists(lib):
        print(f"FAIL: the plug-in was not found (CACHET_TORCH_LIB={lib!r}); set it to the built "
              "libcachet_torch.so (ctest sets it)")
        return None, None, 1
    return torch, lib, None


def child_env(lib=None, keep_alloc_conf=False):
    """os.environ for a child interpreter: allocator configuration dropped (unless keep_alloc_conf),
    python/ first on PYTHONPATH, CACHET_TORCH_LIB set when lib is given."""
    env = {k: v for k, v in os.environ.items() if keep_alloc_conf or k not in ALLOC_CONF_VARS}
    env["PYTHONPATH"] = PYDIR + os.pathsep + env.get("PYTHONPATH", "")
    if lib is not None:
        env["CACHET_TORCH_LIB"] = lib
    return env


class Checks:
    """check(cond, what) prints "ok    what" or "FAIL  what" and keeps the failures."""

    def __init__(self):
        self.failures = []

    def __call__(self, cond, what):
        print(("ok    " if cond else "FAIL  ") + what, flush=True)
        if not cond:
            self.failures.append(what)
        return cond



def deterministic(torch, benchmark=False):
    """Seeds 0, torch.use_deterministic_algorithms(True, warn_only=True), cuDNN deterministic and
    cudnn.benchmark = `benchmark`, no TF32 (CUBLAS_WORKSPACE_CONFIG is the caller's: it must be set
    before CUDA)."""
    torch.manual_seed(0)
    torch.cuda.manual_seed_all(0)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = benchmark
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def library_symbols(lib, nm=None):
    """{name: type letter} of `nm -D --defined-only lib` (`nm` if given and found, else nm on
    PATH); None when there is no nm."""
    tool = nm if nm and shutil.which(nm) else shutil.which("nm")
    if not tool:
        return None
    out = subprocess.run([tool, "-D", "--defined-only", lib], capture_output=True, text=True).stdout
    return {line.split()[-1]: line.split()[-2] for line in out.splitlines() if len(line.split()) >= 2}


def leaked_cxx_symbols(syms):
    """The C++ symbols of cachet or fmt among `syms` (a library of ours exports none)."""
    return [s for s in syms if s.startswith("_ZN6cachet") or s.startswith("_ZN3fmt")]


def dynamic_section(lib):
    """`readelf -d lib` (its NEEDED entries among the rest); None when there is no readelf."""
    readelf = shutil.which("readelf")
    if not readelf:
        return None
    return subprocess.run([readelf, "-d", lib], capture_output=True, text=True).stdout


def run_worker(argv, out, label, checks, env=None, timeout=1500):
    """Runs `python argv...`, a worker that writes its results as JSON to `out`; echoes the end of
    its output and returns the results. When it exits non-zero or writes nothing: a FAIL line with
    the end of its stderr, "`label`: worker exited N" kept in checks.failures, and None."""
    r = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=timeout, env=env)
    sys.stdout.write(r.stdout[-3000:])
    if r.returncode != 0 or not os.path.exists(out):
        print(f"FAIL  {label}: worker exited {r.returncode}\n{r.stderr[-4000:]}", flush=True)
        checks.failures.append(f"{label}: worker exited {r.returncode}")
        return None
    with open(out) as f:
        return json.load(f)


def rss_bytes():
    """This process's resident set size in bytes (VmRSS), 0 where /proc says nothing."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0
