"""cachet from PyTorch: installs libcachet_torch.so as PyTorch's CUDA allocator and reports its
numbers with PyTorch's names.

    import cachet_torch
    cachet_torch.install()          # before the first CUDA tensor
    ...                             # train as usual
    print(cachet_torch.memory_summary())

ctypes only: nothing to compile. torch is imported lazily, so the configuration check
(`check_config()`, and `install()` up to the point where it needs torch) works without it.

PyTorch's own torch.cuda.memory_stats(), memory_snapshot() and _record_memory_history() refuse to
work with a plug-in allocator; use memory_stats(), snapshot() / dump_snapshot() and
record_memory_history() here instead. dump_snapshot() writes PyTorch's pickle format, which
`python -m torch.cuda._memory_viz trace|stats FILE` and `cachet replay FILE` read.
"""

from __future__ import annotations

import collections
import ctypes
import json
import os
import pickle
import sys
from typing import Any, Optional

__all__ = [
    "library_path", "load", "check_config", "install", "installed", "wired_callbacks",
    "record_memory_history", "clear_history", "empty_cache", "memory_stats", "memory_summary",
    "memory_allocated", "memory_reserved", "max_memory_allocated", "max_memory_reserved",
    "reset_peak_memory_stats", "reset_accumulated_memory_stats", "snapshot", "dump_snapshot",
    "settings", "last_error", "backend", "c10_library_path",
    "tag", "current_tag", "sleep", "wake", "sleeping",
]

_LIB_NAME = "libcachet_torch.so"
_C10_LIB_NAME = "libcachet_c10.so"
# The c10 backend built by the same `cmake --install` (python/install_module.cmake writes it).
_INSTALLED_C10_LIB: Optional[str] = None
_backend: Optional[str] = None  # "c10" or "plugin" once install() succeeded
# The installed library: `cmake --install` writes its absolute path here (python/install_module.cmake).
_INSTALLED_LIB: Optional[str] = None
_lib: Optional[ctypes.CDLL] = None
_lib_path: Optional[str] = None
_allocator: Any = None  # the torch CUDAPluggableAllocator, kept alive
_wired: list = []
_announced: set = set()  # the stderr notes already printed (each once per process)

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


_BUILD_DIRS = ("build/gpu", "build/default", "build/release", "build-python", "build")


def _find_library(name: str, env_var: str, target: str, installed: Optional[str],
                  extra: tuple = (), subdirs: tuple = ("python",)) -> tuple:
    """(path or None, the places looked at) for `name`, first found of: $`env_var` (which must
    exist); the library `cmake --install` installed with this file (`installed`); next to this
    file; `extra`; a build tree of this checkout (build*/<subdir>/)."""
    env = os.environ.get(env_var)
    if env:
        if not os.path.exists(env):
            raise FileNotFoundError(f"{env_var}={env}: no such file (unset it, or point it at the {name} "
                                    f"that the target {target} builds)")
        return env, [env]
    here = os.path.dirname(os.path.abspath(__file__))
    candidates = [installed] if installed else []
    candidates.append(os.path.join(here, name))
    candidates.extend(extra)
    root = os.path.dirname(here)
    for sub in _BUILD_DIRS:
        for d in subdirs:
            candidates.append(os.path.join(root, sub, d, name))
    for c in candidates:
        if c and os.path.exists(c):
            return c, candidates
    return None, candidates


def library_path() -> str:
    """Where libcachet_torch.so is, first found of: $CACHET_TORCH_LIB; the library that
    `cmake --install` installed with this file (its path is written here at install); next to this
    file; a build tree (build*/python/) of the checkout this file belongs to."""
    path, looked = _find_library(_LIB_NAME, "CACHET_TORCH_LIB", "cachet_torch", _INSTALLED_LIB)
    if path is None:
        raise FileNotFoundError(
            f"{_LIB_NAME} not found (set CACHET_TORCH_LIB, or build the target cachet_torch and "
            f"`cmake --install` it); looked at: {', '.join(looked)}")
    return path


def c10_library_path() -> Optional[str]:
    """Where libcachet_c10.so (cachet as PyTorch's own CUDA allocator, the c10 backend) is, first
    found of: $CACHET_C10_LIB; the one `cmake --install` installed with this file; next to this
    file; beside $CACHET_TORCH_LIB (a build tree's plug-in); a build tree of this checkout. None
    when there is none (it is built only where a torch was found at build time)."""
    plug = os.environ.get("CACHET_TORCH_LIB")
    extra = (os.path.join(os.path.dirname(plug), _C10_LIB_NAME),
             os.path.join(os.path.dirname(plug), "c10", _C10_LIB_NAME)) if plug else ()
    return _find_library(_C10_LIB_NAME, "CACHET_C10_LIB", "cachet_c10", _INSTALLED_C10_LIB, extra,
                         ("python", "python/c10"))[0]


def _declare(lib: ctypes.CDLL) -> None:
    c = ctypes
    if hasattr(lib, "cachet_malloc"):  # the plug-in's entry points (not in the c10 backend)
        lib.cachet_malloc.restype = c.c_void_p
        lib.cachet_malloc.argtypes = [c.c_ssize_t, c.c_int, c.c_void_p]
        lib.cachet_free.restype = None
        lib.cachet_free.argtypes = [c.c_void_p, c.c_ssize_t, c.c_int, c.c_void_p]
    if hasattr(lib, "cachet_c10_install"):  # the c10 backend's own entry points
        lib.cachet_c10_torch_version.restype = c.c_char_p
        lib.cachet_c10_torch_version.argtypes = []
        lib.cachet_c10_install.restype = c.c_int
        lib.cachet_c10_install.argtypes = [c.c_char_p]
        lib.cachet_c10_installed.restype = c.c_int
        lib.cachet_c10_installed.argtypes = []
    lib.cachet_torch_init.restype = c.c_int
    lib.cachet_torch_init.argtypes = []
    lib.cachet_torch_config_error.restype = c.c_char_p
    lib.cachet_torch_config_error.argtypes = []
    for name in ("cachet_torch_last_error", "cachet_torch_settings_json"):
        getattr(lib, name).restype = c.c_void_p
        getattr(lib, name).argtypes = []
    for name in ("cachet_torch_stats_json", "cachet_torch_snapshot_json", "cachet_torch_trace_json"):
        getattr(lib, name).restype = c.c_void_p
        getattr(lib, name).argtypes = [c.c_int]
    lib.cachet_torch_summary.restype = c.c_void_p
    lib.cachet_torch_summary.argtypes = [c.c_int, c.c_int]
    lib.cachet_torch_string_free.restype = None
    lib.cachet_torch_string_free.argtypes = [c.c_void_p]
    lib.cachet_torch_record_history.restype = None
    lib.cachet_torch_record_history.argtypes = [c.c_int]
    lib.cachet_torch_clear_trace.restype = None
    lib.cachet_torch_clear_trace.argtypes = []
    lib.cachet_torch_device_count.restype = c.c_int
    lib.cachet_torch_device_count.argtypes = []
    lib.cachet_torch_has_device.restype = c.c_int
    lib.cachet_torch_has_device.argtypes = [c.c_int]
    for name in ("cachet_torch_reset_peak_stats", "cachet_torch_reset_accumulated_stats"):
        getattr(lib, name).restype = c.c_int
        getattr(lib, name).argtypes = [c.c_int]
    lib.cachet_torch_empty_cache.restype = None
    lib.cachet_torch_empty_cache.argtypes = []
    if hasattr(lib, "cachet_torch_sleep"):  # sleep and wake (docs/sleep-wake.md)
        lib.cachet_torch_set_tag.restype = c.c_int
        lib.cachet_torch_set_tag.argtypes = [c.c_char_p]
        lib.cachet_torch_current_tag.restype = c.c_void_p
        lib.cachet_torch_current_tag.argtypes = []
        lib.cachet_torch_sleep.restype = c.c_longlong
        lib.cachet_torch_sleep.argtypes = [c.c_char_p, c.c_char_p, c.c_int]
        lib.cachet_torch_wake.restype = c.c_int
        lib.cachet_torch_wake.argtypes = [c.c_char_p, c.c_int]
        for name in ("cachet_torch_sleeping_json", "cachet_torch_sleep_stats_json", "cachet_torch_sleep_summary"):
            getattr(lib, name).restype = c.c_void_p
            getattr(lib, name).argtypes = [c.c_int]
    if hasattr(lib, "cachet_torch_pool_callback"):
        lib.cachet_torch_pool_callback.restype = c.c_void_p
        lib.cachet_torch_pool_callback.argtypes = [c.c_char_p]


def load(path: Optional[str] = None) -> ctypes.CDLL:
    """Loads libcachet_torch.so (once). PyTorch's CUDAPluggableAllocator opens the same file, so
    both see the same allocators."""
    global _lib, _lib_path
    if _lib is not None:
        if path is not None and os.path.realpath(path) != os.path.realpath(_lib_path or ""):
            raise RuntimeError(f"cachet_torch: {_lib_path} is already loaded; cannot switch to {path}")
        return _lib
    p = os.path.realpath(path or library_path())
    lib = ctypes.CDLL(p)
    _declare(lib)
    _lib, _lib_path = lib, p
    return lib


def _take_string(ptr: Optional[int]) -> Optional[str]:
    if not ptr:
        return None
    try:
        return ctypes.string_at(ptr).decode("utf-8", "replace")
    finally:
        load().cachet_torch_string_free(ptr)


def last_error() -> str:
    """The plug-in's last error message ("" when none)."""
    return _take_string(load().cachet_torch_last_error()) or ""


def check_config(path: Optional[str] = None) -> None:
    """Reads the configuration the plug-in will use (CACHET_ALLOC_CONF, else
    PYTORCH_CUDA_ALLOC_CONF, else PYTORCH_ALLOC_CONF) and raises ValueError with the parser's
    message if it is refused. The plug-in reads the environment once, on first use."""
    lib = load(path)
    if lib.cachet_torch_init() != 0:
        raise ValueError(lib.cachet_torch_config_error().decode("utf-8", "replace"))


def installed() -> bool:
    return _backend is not None


def backend() -> Optional[str]:
    """Which door install() used: "c10" (libcachet_c10.so: cachet is PyTorch's own CUDA allocator,
    every torch.cuda memory API works), "plugin" (libcachet_torch.so through
    CUDAPluggableAllocator: PyTorch 2.11 refuses stats, snapshots, history, OOM observers, MemPool()
    and CUDA graph trees for it; use this module's functions), or None before install()."""
    return _backend


def _torch_minor(version: str) -> str:
    """"2.11.0+cu130" -> "2.11"."""
    return ".".join(version.split("+")[0].split(".")[:2])


def wired_callbacks() -> list:
    """Which optional CUDAPluggableAllocator callbacks install() connected to cachet, of
    set_record_stream_fn, set_reset_fn, set_memory_fraction_fn and the private-pool callbacks
    set_begin_allocate_to_pool, set_end_allocate_to_pool_fn, set_release_pool (CUDA graph
    capture); those this PyTorch does not have are left out."""
    return list(_wired)


def _announce(text: str) -> None:
    if text not in _announced:
        _announced.add(text)
        print(text, file=sys.stderr, flush=True)


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
    global _backend
    if backend not in ("auto", "c10", "plugin"):
        raise ValueError(f"cachet_torch.install(backend={backend!r}): use 'auto', 'c10' or 'plugin'")
    if _backend is None:
        _backend = _install_any(path, record_history, backend)
    elif backend != "auto" and backend != _backend:
        raise RuntimeError(f"cachet_torch.install(backend={backend!r}): cachet is already installed "
                           f"through the {_backend} backend in this process")
    if not cudagraph_trees:
        import torch._inductor.config as inductor_config  # noqa: PLC0415
        inductor_config.triton.cudagraph_trees = False
        if _backend == "plugin":
            _announce(_TREES_OFF)
    elif _backend == "plugin":
        inductor = sys.modules.get("torch._inductor.config")
        if inductor is None or inductor.triton.cudagraph_trees:
            _announce(_TREES_NOTE)


def _install_any(path: Optional[str], record_history: bool, backend: str) -> str:
    if backend == "plugin":
        _install(path, record_history)
        return "plugin"
    # A refused configuration is a ValueError before torch is imported, whichever library is
    # installed (both parse it with the same code, torch_common.cpp); the plug-in can say so
    # before torch is loaded, the c10 backend only after. Without the plug-in the backend says it.
    try:
        plugin_path = path or library_path()
    except FileNotFoundError:
        plugin_path = None
    if plugin_path is not None:
        check_config(plugin_path)
    import torch  # noqa: PLC0415 (lazy on purpose)
    running = _torch_minor(torch.__version__)
    why = None
    c10 = c10_library_path()
    if c10 is None:
        why = (f"no {_C10_LIB_NAME} was found (set CACHET_C10_LIB, or build the target cachet_c10 "
               f"on a machine with torch {running} and `cmake --install` it)")
    else:
        lib = ctypes.CDLL(os.path.realpath(c10))  # after torch: its libc10 is the one resolved
        _declare(lib)
        built = lib.cachet_c10_torch_version().decode()
        if built != running:
            why = (f"{c10} was built for torch {built}, this is torch {torch.__version__} "
                   f"({running}); rebuild cachet against this torch")
    if why is not None:
        if backend == "c10":
            raise RuntimeError(f"cachet_torch.install(backend='c10'): {why}")
        _announce("cachet_torch: installed through CUDAPluggableAllocator (the plug-in path: "
                  "PyTorch refuses its memory_stats, snapshots, history, OOM observers, MemPool() "
                  f"and CUDA graph trees for plug-in allocators), because {why}")
        _install(path, record_history)
        return "plugin"
    _install_c10(lib, os.path.realpath(c10), record_history, torch.__version__)
    return "c10"


def _install_c10(lib: ctypes.CDLL, path: str, record_history: bool, version: str) -> None:
    global _lib, _lib_path
    if lib.cachet_torch_init() != 0:
        raise ValueError(lib.cachet_torch_config_error().decode("utf-8", "replace"))
    _lib, _lib_path = lib, path  # this module's functions now read the backend's allocators
    if lib.cachet_c10_install(version.encode()) != 0:
        raise RuntimeError(f"cachet_torch.install(): the c10 backend refused: {last_error()}")
    if record_history:
        lib.cachet_torch_record_history(1)


def _install(path: Optional[str], record_history: bool) -> None:
    global _allocator
    check_config(path)
    lib = load(path)
    if record_history:
        lib.cachet_torch_record_history(1)
    import torch  # noqa: PLC0415 (lazy on purpose)

    alloc = torch.cuda.memory.CUDAPluggableAllocator(_lib_path, "cachet_malloc", "cachet_free")
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


def record_memory_history(enabled: bool = True) -> None:
    """torch.cuda.memory._record_memory_history(enabled="all"/None). Through the c10 backend this
    is PyTorch's own (with Python and C++ stack frames); through the plug-in, cachet's trace
    without frames. Recording from the start (install(record_history=True)) is what `cachet
    replay` needs."""
    if _backend == "c10":
        import torch  # noqa: PLC0415
        torch.cuda.memory._record_memory_history("all" if enabled else None)
        return
    load().cachet_torch_record_history(1 if enabled else 0)


def clear_history() -> None:
    load().cachet_torch_clear_trace()


def empty_cache() -> None:
    """Gives cachet's cached free segments back to the driver, on every device. Installed,
    torch.cuda.empty_cache() does this (set_reset_fn). Behind a torch.cuda.MemPool without
    install(), PyTorch's empty_cache() hands the pool's segments back to cachet (raw_delete), and
    this gives them to the driver."""
    load().cachet_torch_empty_cache()


def _device_index(device: Any) -> int:
    if device is None:
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            return int(torch.cuda.current_device())
        return 0
    if isinstance(device, int):
        return device
    if isinstance(device, str):
        _, _, idx = device.partition(":")
        return int(idx) if idx else _device_index(None)
    idx = getattr(device, "index", None)  # torch.device
    return _device_index(None) if idx is None else int(idx)


def memory_stats(device: Any = None) -> "collections.OrderedDict[str, int]":
    """torch.cuda.memory_stats(device): the 122 keys ("allocated_bytes.all.current", ...), sorted,
    with PyTorch's meaning."""
    d = _device_index(device)
    text = _take_string(load().cachet_torch_stats_json(d))
    if text is None:
        raise RuntimeError(f"cachet_torch.memory_stats(device={d}): {last_error()}")
    return collections.OrderedDict(sorted(json.loads(text).items()))


def memory_allocated(device: Any = None) -> int:
    return memory_stats(device)["allocated_bytes.all.current"]


def max_memory_allocated(device: Any = None) -> int:
    return memory_stats(device)["allocated_bytes.all.peak"]


def memory_reserved(device: Any = None) -> int:
    return memory_stats(device)["reserved_bytes.all.current"]


def max_memory_reserved(device: Any = None) -> int:
    return memory_stats(device)["reserved_bytes.all.peak"]


def reset_peak_memory_stats(device: Any = None) -> None:
    d = _device_index(device)
    if load().cachet_torch_reset_peak_stats(d) != 0:
        raise RuntimeError(f"cachet_torch.reset_peak_memory_stats(device={d}): {last_error()}")


def reset_accumulated_memory_stats(device: Any = None) -> None:
    d = _device_index(device)
    if load().cachet_torch_reset_accumulated_stats(d) != 0:
        raise RuntimeError(f"cachet_torch.reset_accumulated_memory_stats(device={d}): {last_error()}")


def memory_summary(device: Any = None, abbreviated: bool = False) -> str:
    """torch.cuda.memory_summary(device, abbreviated), byte for byte; once anything has slept on
    the device, cachet's two sleep lines follow (docs/sleep-wake.md, section 5)."""
    d = _device_index(device)
    lib = load()
    text = _take_string(lib.cachet_torch_summary(d, 1 if abbreviated else 0))
    if text is None:
        raise RuntimeError(f"cachet_torch.memory_summary(device={d}): {last_error()}")
    if hasattr(lib, "cachet_torch_sleep_summary"):
        text += _take_string(lib.cachet_torch_sleep_summary(d)) or ""
    return text


def settings() -> dict:
    """The configuration in use: the variable it came from, its text, the canonical form and
    the fields of _snapshot()["allocator_settings"]."""
    text = _take_string(load().cachet_torch_settings_json())
    if text is None:
        check_config()  # raises ValueError with the parser's message
        raise RuntimeError("cachet_torch.settings(): no configuration")
    return json.loads(text)


def _allocator_settings() -> dict:
    s = settings()
    return {
        "PYTORCH_CUDA_ALLOC_CONF": s["text"],
        "max_split_size": s["max_split_size"],
        "garbage_collection_threshold": s["garbage_collection_threshold"],
        "expandable_segments": s["expandable_segments"],
        "pinned_num_register_threads": s["pinned_num_register_threads"],
        "release_lock_on_cudamalloc": s["release_lock_on_cudamalloc"],
        "pinned_use_cuda_host_register": s["pinned_use_cuda_host_register"],
        "graph_capture_record_stream_reuse": s["graph_capture_record_stream_reuse"],
        "roundup_power2_divisions": {str(1 << i): v
                                     for i, v in enumerate(s["roundup_power2_divisions"])},
    }


def _trace_entry(e: dict) -> dict:
    out = {"action": e["action"]}
    if e["action"] == "oom":
        out["device_free"] = e["addr"]
    else:
        out["addr"] = e["addr"]
    out.update(size=e["size"], stream=e["stream"], time_us=e["time_us"],
               compile_context="N/A", user_metadata="", frames=[])
    return out


def snapshot() -> dict:
    """torch.cuda.memory._snapshot() for cachet (through the c10 backend, that very call): {"segments", "device_traces",
    "allocator_settings", "external_annotations"}, PyTorch's keys and layout (no stack frames:
    "frames" lists are empty). Like PyTorch's, it adds a "snapshot" event to each recorded
    trace."""
    if _backend == "c10":
        import torch  # noqa: PLC0415
        return torch.cuda.memory._snapshot()
    lib = load()
    n = lib.cachet_torch_device_count()
    torch = sys.modules.get("torch")
    count = n
    if torch is not None:
        try:
            count = max(n, int(torch.cuda.device_count()))
        except Exception:  # noqa: BLE001
            pass
    segments: list = []
    traces: list = [[] for _ in range(count)]
    for d in range(n):
        if not lib.cachet_torch_has_device(d):
            continue
        text = _take_string(lib.cachet_torch_snapshot_json(d))
        if text is None:
            raise RuntimeError(f"cachet_torch.snapshot(): device {d}: {last_error()}")
        for seg in json.loads(text):
            seg["segment_pool_id"] = tuple(seg["segment_pool_id"])
            seg["frames"] = []
            for b in seg["blocks"]:
                b["frames"] = []
            segments.append(seg)
        text = _take_string(lib.cachet_torch_trace_json(d))
        if text is None:
            raise RuntimeError(f"cachet_torch.snapshot(): trace of device {d}: {last_error()}")
        traces[d] = [_trace_entry(e) for e in json.loads(text)]
    segments.sort(key=lambda s: (s["device"], s["address"]))
    return {
        "segments": segments,
        "device_traces": traces,
        "allocator_settings": _allocator_settings(),
        "external_annotations": [],
    }


def dump_snapshot(path: str) -> None:
    """torch.cuda.memory._dump_snapshot(path) for cachet: pickles snapshot() as PyTorch does."""
    data = snapshot()
    with open(path, "wb") as f:
        pickle.dump(data, f)


# ---- sleep and wake (docs/sleep-wake.md) ---------------------------------------------------------
# Needs CACHET_ALLOC_CONF with cachet_sleep:True set before the first CUDA allocation (the segments
# are then mapped with the CUDA VMM calls, so their addresses outlive their memory).

def _sleep_lib() -> ctypes.CDLL:
    lib = load()
    if not hasattr(lib, "cachet_torch_sleep"):
        raise RuntimeError(f"cachet_torch: {_lib_path} has no sleep/wake (an older build): rebuild cachet")
    return lib


def _tag_text(tags: Any, what: str) -> Optional[bytes]:
    if tags is None:
        return None
    if isinstance(tags, str):
        tags = (tags,)
    names = list(tags)
    for t in names:
        if not isinstance(t, str):
            raise TypeError(f"cachet_torch: {what} must be tag names (str), got {t!r}")
        if "," in t:
            raise ValueError(f"cachet_torch: the tag {t!r} has a comma; a tag is 1 to 64 of [A-Za-z0-9_.-]")
    return ",".join(names).encode()


def _device_arg(device: Any) -> int:
    return -1 if device is None else _device_index(device)


def current_tag() -> str:
    """The calling thread's current tag: every allocation it makes carries it ("default")."""
    return _take_string(_sleep_lib().cachet_torch_current_tag()) or "default"


class tag:
    """`with cachet_torch.tag("weights"):` every allocation the thread makes inside carries the
    tag (a block keeps the tag it was allocated under until it is freed). Tags nest and are per
    thread: work PyTorch runs on its own threads (autograd's backward on the device's worker
    thread) carries that thread's tag, "default". A tag is 1 to 64 of [A-Za-z0-9_.-], not
    "all" or "none"."""

    def __init__(self, name: str):
        if not isinstance(name, str):
            raise TypeError(f"cachet_torch.tag: the name must be a str, got {name!r}")
        self.name = name
        self._previous: list = []

    def __enter__(self) -> "tag":
        lib = _sleep_lib()
        previous = current_tag()
        if lib.cachet_torch_set_tag(self.name.encode()) != 0:
            raise ValueError(f"cachet_torch.tag({self.name!r}): {last_error()}")
        self._previous.append(previous)
        return self

    def __exit__(self, *exc) -> None:
        _sleep_lib().cachet_torch_set_tag(self._previous.pop().encode())


def _raise_sleep_error(what: str, rc: int) -> None:
    message = f"{what}: {last_error()}"
    if rc == -2:
        torch = sys.modules.get("torch")
        oom = getattr(torch, "OutOfMemoryError", None) if torch is not None else None
        raise (oom or MemoryError)(message)
    raise RuntimeError(message)


def sleep(tags: Any = None, backup: Any = ("weights",), device: Any = None) -> int:
    """Gives the physical memory of every segment holding blocks of `tags` (None: every tag), and
    of every free cached segment, back to the driver; their addresses stay reserved. The contents
    of blocks whose tag is in `backup` are copied to pinned host memory first (restored by wake).
    Returns the bytes given back. `device` None: every device cachet serves. Out of memory for the
    host backup raises torch.OutOfMemoryError and changes nothing."""
    what = f"cachet_torch.sleep(tags={tags!r}, backup={backup!r})"
    lib = _sleep_lib()
    rc = lib.cachet_torch_sleep(_tag_text(tags, "tags"), _tag_text(backup, "backup") or b"", _device_arg(device))
    if rc < 0:
        _raise_sleep_error(what, rc)
    return int(rc)


def wake(tags: Any = None, device: Any = None) -> None:
    """Maps memory again at the addresses of every sleeping segment of `tags` (None: every tag) and
    restores its backups; blocks without a backup come back with undefined contents. Every pointer
    is as before the sleep. If the memory cannot be had, raises torch.OutOfMemoryError and
    everything stays asleep, backups kept: wake again once memory is free."""
    rc = _sleep_lib().cachet_torch_wake(_tag_text(tags, "tags"), _device_arg(device))
    if rc != 0:
        _raise_sleep_error(f"cachet_torch.wake(tags={tags!r})", rc)


def sleeping(device: Any = None) -> list:
    """The tags with sleeping blocks (on `device`; None: any device), sorted."""
    text = _take_string(_sleep_lib().cachet_torch_sleeping_json(_device_arg(device)))
    if text is None:
        raise RuntimeError(f"cachet_torch.sleeping(): {last_error()}")
    return json.loads(text)
