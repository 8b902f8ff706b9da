"""What every test in python/tests does before it starts, in one place.

  start(devices=1)  PyTorch importable and at least `devices` CUDA devices, else a SKIP line and
                    exit code 77 (ctest's SKIP_RETURN_CODE); then the plug-in named by
                    CACHET_TORCH_LIB, else a FAIL line and exit code 1.
  child_env(lib)    the environment for a child interpreter: no allocator configuration
                    inherited (CACHET_ALLOC_CONF, PYTORCH_CUDA_ALLOC_CONF, PYTORCH_ALLOC_CONF),
                    python/ first on PYTHONPATH (cachet_torch), CACHET_TORCH_LIB = lib if given.
  Checks            ok/FAIL lines, the failures kept.
  deterministic(t)  the deterministic settings of the training tests (seeds 0, deterministic
                    algorithms with warn_only, cuDNN deterministic without benchmark, no TF32).

Imported by the scripts beside it (their folder is first on sys.path when they run); it changes
nothing at import, so test_installed.py still finds the installed cachet_torch.
"""
import os

SKIP = 77  # the tests' exit code for "skipped" (SKIP_RETURN_CODE in python/CMakeLists.txt)
PYDIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # python/: cachet_torch.py
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



def deterministic(torch):
    """Seeds 0, torch.use_deterministic_algorithms(True, warn_only=True), cuDNN deterministic and
    no benchmark, no TF32 (CUBLAS_WORKSPACE_CONFIG is the caller's: it must be set before CUDA)."""
    torch.manual_seed(0)
    torch.cuda.manual_seed_all(0)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
