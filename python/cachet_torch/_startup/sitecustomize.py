"""cachet's process start hook (cachet_torch.memory_saver.configure_subprocess() puts this folder
first on PYTHONPATH): with CACHET_TORCH_AUTOINSTALL=1, cachet is installed right after the process
imports torch, before anything can touch CUDA; with CACHET_TORCH_MEMORY_SAVER=1 also
`import torch_memory_saver` gives cachet_torch.memory_saver. Then the next sitecustomize on the
path (the environment's own, if any) runs as it would have."""
import os
import sys

_here = os.path.dirname(os.path.abspath(__file__))
if os.environ.get("CACHET_TORCH_AUTOINSTALL") == "1":
    try:
        from cachet_torch import _autoinstall
        _autoinstall.arm()
    except Exception as e:  # noqa: BLE001: never break the interpreter's start
        print(f"cachet_torch: the start hook failed: {e!r}", file=sys.stderr)

# Chain to the sitecustomize this one hides (when there is none, this module stays the one
# imported: the import system expects sys.modules["sitecustomize"] when this file ends).
_this = sys.modules.pop("sitecustomize", None)
_saved = sys.path[:]
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]
try:
    import sitecustomize  # noqa: F401
except ImportError:
    if _this is not None:
        sys.modules["sitecustomize"] = _this
finally:
    sys.path[:] = _saved
