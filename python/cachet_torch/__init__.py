"""cachet from PyTorch: installs cachet as PyTorch's CUDA allocator (the c10 backend,
libcachet_c10.so, or the plug-in, libcachet_torch.so) and reports its numbers with PyTorch's
names.

    import cachet_torch
    cachet_torch.install()          # before the first CUDA tensor
    ...                             # train as usual
    print(cachet_torch.memory_summary())

ctypes only: nothing to compile. `import cachet_torch` never imports torch: install() does, when
it needs it, so the configuration check (`check_config()`, and `install()` up to the point where
it needs torch) works without it.

PyTorch's own torch.cuda.memory_stats(), memory_snapshot() and _record_memory_history() refuse to
work with a plug-in allocator; use memory_stats(), snapshot() / dump_snapshot() and
record_memory_history() here instead. dump_snapshot() writes PyTorch's pickle format, which
`python -m torch.cuda._memory_viz trace|stats FILE` and `cachet replay FILE` read.

The package, one concept a module (python/README.md, "The package"):
  _library   finding and loading the libraries, their ctypes declarations, the shared state
  _install   install(), backend(), check_config(), wired_callbacks()
  _stats     memory_stats() and what is built on it, memory_summary(), resets, settings()
  _snapshot  record_memory_history(), snapshot(), dump_snapshot()
  _sleep     tag(), sleep(), wake(), sleeping(), prepare_backup_buffers(), release_backup_buffers()
  metrics    metrics_text(), serve_metrics(), collector(): Prometheus (python/README.md, "Metrics")
  memory_saver  torch_memory_saver's API over cachet (alias() makes it `import torch_memory_saver`)
  vllm_backend  vLLM's CuMemAllocator and a SleepModeBackend plug-in over cachet
  _autoinstall, _startup/  configure_subprocess()'s start hook: cachet installed as torch is imported
(predict.py is the lead's: `cachet predict`.)
"""

from __future__ import annotations

from . import _library
from ._install import backend, check_config, install, installed, wired_callbacks
from ._library import c10_library_path, last_error, library_path, load
from ._sleep import current_tag, prepare_backup_buffers, release_backup_buffers, sleep, sleeping, tag, wake
from ._snapshot import clear_history, dump_snapshot, record_memory_history, snapshot
from .metrics import metrics_text, serve_metrics
from ._stats import (empty_cache, max_memory_allocated, max_memory_reserved, memory_allocated,
                     memory_reserved, memory_stats, memory_summary, reset_accumulated_memory_stats,
                     reset_peak_memory_stats, settings)

__all__ = [
    "library_path", "load", "check_config", "install", "installed", "wired_callbacks",
    "record_memory_history", "clear_history", "empty_cache", "memory_stats", "memory_summary",
    "memory_allocated", "memory_reserved", "max_memory_allocated", "max_memory_reserved",
    "reset_peak_memory_stats", "reset_accumulated_memory_stats", "snapshot", "dump_snapshot",
    "settings", "last_error", "backend", "c10_library_path",
    "tag", "current_tag", "sleep", "wake", "sleeping", "prepare_backup_buffers", "release_backup_buffers",
    "metrics_text", "serve_metrics",
]

# The shared state, read where it lives (install() changes it): cachet_torch._lib_path is the
# library loaded (bench/c10_empty.py reads it), _lib the ctypes handle, _backend the door.
_STATE = ("_lib", "_lib_path", "_backend", "_INSTALLED_LIB", "_INSTALLED_C10_LIB")


def __getattr__(name: str):
    if name in _STATE:
        return getattr(_library, name)
    raise AttributeError(f"module 'cachet_torch' has no attribute {name!r}")
