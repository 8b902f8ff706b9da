"""Installs cachet in a process the moment it imports torch (the start hook of
configure_subprocess(), _startup/sitecustomize.py): a finder for "torch" on sys.meta_path runs
cachet_torch.install() right after torch's own module has run, before the program can make a CUDA
call (backend: $CACHET_TORCH_AUTOINSTALL_BACKEND, default "auto"). A failure raises from `import torch`, with the reason: a program that asked for cachet never
runs silently on PyTorch's own allocator."""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys

_armed = False


def _install_now() -> None:
    import cachet_torch  # noqa: PLC0415
    try:
        cachet_torch.install(backend=os.environ.get("CACHET_TORCH_AUTOINSTALL_BACKEND") or "auto")
    except Exception as e:
        raise RuntimeError(f"cachet_torch: configure_subprocess(): installing cachet after `import torch` "
                           f"failed in process {os.getpid()}: {e}") from e
    if os.environ.get("CACHET_TORCH_MEMORY_SAVER") == "1" or os.environ.get("TMS_INIT_ENABLE") == "1":
        from cachet_torch import memory_saver  # noqa: PLC0415
        if os.environ.get("CACHET_TORCH_MEMORY_SAVER") == "1":
            memory_saver.alias()
        memory_saver.torch_memory_saver._start()  # TMS_INIT_ENABLE: region memory from the start


class _TorchFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):  # noqa: ANN001
        if name != "torch":
            return None
        sys.meta_path.remove(self)  # once; and the search below must not find this finder again
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):  # noqa: ANN001
            run(module)
            _install_now()

        spec.loader.exec_module = exec_module
        return spec


def arm() -> None:
    """Installs cachet when torch is imported (now, if it already was)."""
    global _armed
    if _armed:
        return
    _armed = True
    if "torch" in sys.modules:
        _install_now()
    else:
        sys.meta_path.insert(0, _TorchFinder())
