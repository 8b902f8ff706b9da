"""install(): making cachet PyTorch's CUDA allocator, through the c10 backend (libcachet_c10.so)
or the plug-in (libcachet_torch.so through CUDAPluggableAllocator). torch is imported only here,
inside install(), never when the package is imported."""

from __future__ import annotations

import ctypes
import os
import sys
from typing import Any, Optional

from . import _library as L

_allocator: Any = None  # the torch CUDAPluggableAllocator, kept alive
_wired: list = []

# CUDAPluggableAllocator's optional callbacks install() connects: (setter, what libcachet_torch.so
# gives it). The pool setters take C++ functions (plugin.cpp, "Private pools"), whose addresses
# cachet_torch_pool_callback returns by setter name.
_C_CALLBACKS = (("set_record_stream_fn", "cachet_torch_record_stream"),
                ("set_reset_fn", "cachet_torch_empty_cache"),
                ("set_memory_fraction_fn", "cachet_torch_set_memory_fraction"))
_POOL_CALLBACKS = ("set_begin_allocate_to_pool", "set_end_allocate_to_pool_fn", "set_release_pool")

_TREES_OFF = ("cachet_torch: torch._inductor.config.triton.cudagraph_trees = False: "
              "torch.compile(mode=\"reduce-overhead\") captures plain CUDA graphs into cachet's "
              "private pools (CUDA graph trees need _cuda_getCheckpointState, which PyTorch 2.11 "
              "refuses for every plug-in allocator)")
_TREES_NOTE = ("cachet_torch: note: torch.compile(mode=\"reduce-overhead\") fails with cachet "
               "installed while inductor's CUDA graph trees are on (they need "
               "_cuda_getCheckpointState, which PyTorch 2.11 refuses for every plug-in allocator); "
               "use cachet_torch.install(cudagraph_trees=False)")


def check_config(path: Optional[str] = None) -> None:
    """Reads the configuration the plug-in will use (CACHET_ALLOC_CONF, else
    PYTORCH_CUDA_ALLOC_CONF, else PYTORCH_ALLOC_CONF) and raises ValueError with the parser's
    message if it is refused. The plug-in reads the environment once, on first use."""
    lib = L.load(path)
    if lib.cachet_torch_init() != 0:
        raise ValueError(lib.cachet_torch_config_error().decode("utf-8", "replace"))


def installed() -> bool:
    return L._backend is not None


def backend() -> Optional[str]:
    """Which door install() used: "c10" (libcachet_c10.so: cachet is PyTorch's own CUDA allocator,
    every torch.cuda memory API works), "plugin" (libcachet_torch.so through
    CUDAPluggableAllocator: PyTorch 2.11 refuses stats, snapshots, history, OOM observers, MemPool()
    and CUDA graph trees for it; use this package's functions), or None before install()."""
    return L._backend


def _torch_minor(version: str) -> str:
    """"2.11.0+cu130" -> "2.11"."""
    return ".".join(version.split("+")[0].split(".")[:2])


def wired_callbacks() -> list:
    """Which optional CUDAPluggableAllocator callbacks install() connected to cachet, of
    set_record_stream_fn, set_reset_fn, set_memory_fraction_fn and the private-pool callbacks
    set_begin_allocate_to_pool, set_end_allocate_to_pool_fn, set_release_pool (CUDA graph
    capture); those this PyTorch does not have are left out."""
    return list(_wired)


def install(path: Optional[str] = None, record_history: bool = False,
            cudagraph_trees: bool = True, backend: str = "auto") -> None:
    """Makes cachet PyTorch's CUDA allocator. Call before anything allocates CUDA memory.

    backend: "auto" (the default) installs the c10 backend (libcachet_c10.so, cachet behind
    c10::cuda::CUDACachingAllocator like PyTorch's own allocator: torch.cuda.memory_stats(),
    memory_snapshot(), _record_memory_history(), OOM errors and observers, MemPool(), CUDA graph
    trees, cudnn.benchmark all work) when one built for the running torch's minor version is found
    (c10_library_path()), else the plug-in (libcachet_torch.so through CUDAPluggableAllocator) and
    says once on stderr why; "c10" or "plugin" insist on one (an error says what is missing).
    backend() tells which was used. `path` names the plug-in library (the plug-in path only).

    Raises ValueError with the parser's message if the configuration is refused (before anything
    is allocated), RuntimeError if PyTorch's allocator is already in use or the c10 backend was
    built for another torch. record_history=True records the allocator trace from the first
    allocation on (for snapshot()/dump_snapshot() and `cachet replay`).

    cudagraph_trees=False sets torch._inductor.config.triton.cudagraph_trees = False (either
    backend). The plug-in path needs it for torch.compile(mode="reduce-overhead"): PyTorch 2.11's
    CUDA graph trees cannot work with any plug-in allocator; there install() says so once on
    stderr. The c10 backend works with graph trees on."""
    if backend not in ("auto", "c10", "plugin"):
        raise ValueError(f"cachet_torch.install(backend={backend!r}): use 'auto', 'c10' or 'plugin'")
    if L._backend is None:
        L._set_backend(_install_any(path, record_history, backend))
    elif backend != "auto" and backend != L._backend:
        raise RuntimeError(f"cachet_torch.install(backend={backend!r}): cachet is already installed "
                           f"through the {L._backend} backend in this process")
    if not cudagraph_trees:
        import torch._inductor.config as inductor_config  # noqa: PLC0415
        inductor_config.triton.cudagraph_trees = False
        if L._backend == "plugin":
            L._announce(_TREES_OFF)
    elif L._backend == "plugin":
        inductor = sys.modules.get("torch._inductor.config")
        if inductor is None or inductor.triton.cudagraph_trees:
            L._announce(_TREES_NOTE)


def _install_any(path: Optional[str], record_history: bool, backend: str) -> str:
    if backend == "plugin":
        _install(path, record_history)
        return "plugin"
    # A refused configuration is a ValueError before torch is imported, whichever library is
    # installed (both parse it with the same code, torch_common.cpp); the plug-in can say so
    # before torch is loaded, the c10 backend only after. Without the plug-in the backend says it.
    try:
        plugin_path = path or L.library_path()
    except FileNotFoundError:
        plugin_path = None
    if plugin_path is not None:
        check_config(plugin_path)
    import torch  # noqa: PLC0415 (lazy on purpose)
    running = _torch_minor(torch.__version__)
    why = None
    c10 = L.c10_library_path()
    if c10 is None:
        why = (f"no {L._C10_LIB_NAME} was found (set CACHET_C10_LIB, or build the target cachet_c10 "
               f"on a machine with torch {running} and `cmake --install` it)")
    else:
        lib = ctypes.CDLL(os.path.realpath(c10))  # after torch: its libc10 is the one resolved
        L._declare(lib)
        built = lib.cachet_c10_torch_version().decode()
        if built != running:
            why = (f"{c10} was built for torch {built}, this is torch {torch.__version__} "
                   f"({running}); rebuild cachet against this torch")
    if why is not None:
        if backend == "c10":
            raise RuntimeError(f"cachet_torch.install(backend='c10'): {why}")
        L._announce("cachet_torch: installed through CUDAPluggableAllocator (the plug-in path: "
                    "PyTorch refuses its memory_stats, snapshots, history, OOM observers, MemPool() "
                    f"and CUDA graph trees for plug-in allocators), because {why}")
        _install(path, record_history)
        return "plugin"
    _install_c10(lib, os.path.realpath(c10), record_history, torch.__version__)
    return "c10"


def _install_c10(lib: ctypes.CDLL, path: str, record_history: bool, version: str) -> None:
    if lib.cachet_torch_init() != 0:
        raise ValueError(lib.cachet_torch_config_error().decode("utf-8", "replace"))
    L._use(lib, path)  # this package's functions now read the backend's allocators
    if lib.cachet_c10_install(version.encode()) != 0:
        raise RuntimeError(f"cachet_torch.install(): the c10 backend refused: {L.last_error()}")
    if record_history:
        lib.cachet_torch_record_history(1)


def _install(path: Optional[str], record_history: bool) -> None:
    global _allocator
    check_config(path)
    lib = L.load(path)
    if record_history:
        lib.cachet_torch_record_history(1)
    import torch  # noqa: PLC0415 (lazy on purpose)

    alloc = torch.cuda.memory.CUDAPluggableAllocator(L._lib_path, "cachet_malloc", "cachet_free")
    native = alloc.allocator()
    _wired.clear()
    callbacks = [(setter, ctypes.cast(getattr(lib, fn), ctypes.c_void_p).value)
                 for setter, fn in _C_CALLBACKS]
    callbacks += [(setter, lib.cachet_torch_pool_callback(setter.encode()))
                  for setter in _POOL_CALLBACKS]
    for setter, address in callbacks:
        set_fn = getattr(native, setter, None)
        if callable(set_fn) and address:
            set_fn(address)
            _wired.append(setter)
    torch.cuda.memory.change_current_allocator(alloc)
    _allocator = alloc
