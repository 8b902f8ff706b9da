"""Finding and loading cachet's libraries (libcachet_torch.so, the plug-in; libcachet_c10.so, the
c10 backend), their ctypes declarations, and the state the rest of the package shares: which
library is loaded and which door install() used. No torch here."""

from __future__ import annotations

import ctypes
import os
import sys
from typing import Optional

_LIB_NAME = "libcachet_torch.so"
_C10_LIB_NAME = "libcachet_c10.so"
# The c10 backend built by the same `cmake --install` (python/install_module.cmake writes it).
_INSTALLED_C10_LIB: Optional[str] = None
# The installed library: `cmake --install` writes its absolute path here (python/install_module.cmake).
_INSTALLED_LIB: Optional[str] = None

# Shared state (read through this module, never copied: install() changes it).
_backend: Optional[str] = None  # "c10" or "plugin" once install() succeeded
_lib: Optional[ctypes.CDLL] = None
_lib_path: Optional[str] = None
_announced: set = set()  # the stderr notes already printed (each once per process)

_BUILD_DIRS = ("build/gpu", "build/default", "build/release", "build-python", "build")
_HERE = os.path.dirname(os.path.abspath(__file__))  # the package: python/cachet_torch/ in a checkout


def _find_library(name: str, env_var: str, target: str, installed: Optional[str],
                  extra: tuple = (), subdirs: tuple = ("python",)) -> tuple:
    """(path or None, the places looked at) for `name`, first found of: $`env_var` (which must
    exist); the library `cmake --install` installed with this package (`installed`); inside the
    package (where `pip install` puts it); next to the package; `extra`; a build tree of this
    checkout (build*/<subdir>/)."""
    env = os.environ.get(env_var)
    if env:
        if not os.path.exists(env):
            raise FileNotFoundError(f"{env_var}={env}: no such file (unset it, or point it at the {name} "
                                    f"that the target {target} builds)")
        return env, [env]
    parent = os.path.dirname(_HERE)  # python/ of a checkout, or the directory the package is installed in
    candidates = [installed] if installed else []
    candidates.append(os.path.join(_HERE, name))
    candidates.append(os.path.join(parent, name))
    candidates.extend(extra)
    root = os.path.dirname(parent)  # the checkout, when the package is python/cachet_torch
    for sub in _BUILD_DIRS:
        for d in subdirs:
            candidates.append(os.path.join(root, sub, d, name))
    for c in candidates:
        if c and os.path.exists(c):
            return c, candidates
    return None, candidates


def library_path() -> str:
    """Where libcachet_torch.so is, first found of: $CACHET_TORCH_LIB; the library that
    `cmake --install` installed with this package (its path is written here at install); inside
    the package (`pip install`); next to the package; a build tree (build*/python/) of the
    checkout this package belongs to."""
    path, looked = _find_library(_LIB_NAME, "CACHET_TORCH_LIB", "cachet_torch", _INSTALLED_LIB)
    if path is None:
        raise FileNotFoundError(
            f"{_LIB_NAME} not found (set CACHET_TORCH_LIB, or build the target cachet_torch and "
            f"`cmake --install` it); looked at: {', '.join(looked)}")
    return path


def c10_library_path() -> Optional[str]:
    """Where libcachet_c10.so (cachet as PyTorch's own CUDA allocator, the c10 backend) is, first
    found of: $CACHET_C10_LIB; the one `cmake --install` installed with this package; inside the
    package; next to it; beside $CACHET_TORCH_LIB (a build tree's plug-in); a build tree of this
    checkout. None when there is none (it is built only where a torch was found at build time)."""
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
    if hasattr(lib, "cachet_torch_prepare_backup_buffers"):
        lib.cachet_torch_prepare_backup_buffers.restype = c.c_longlong
        lib.cachet_torch_prepare_backup_buffers.argtypes = [c.c_char_p, c.c_int]
    if hasattr(lib, "cachet_torch_release_backup_buffers"):
        lib.cachet_torch_release_backup_buffers.restype = c.c_longlong
        lib.cachet_torch_release_backup_buffers.argtypes = [c.c_int]
    if hasattr(lib, "cachet_torch_begin_thread_pool"):  # disable()'s pool (memory_saver.py)
        lib.cachet_torch_begin_thread_pool.restype = c.c_int
        lib.cachet_torch_begin_thread_pool.argtypes = [c.c_int, c.POINTER(c.c_ulonglong)]
        lib.cachet_torch_end_thread_pool.restype = c.c_int
        lib.cachet_torch_end_thread_pool.argtypes = [c.c_int, c.c_ulonglong]
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


def _use(lib: ctypes.CDLL, path: str) -> None:
    """Makes `lib` (the c10 backend, once installed) the library every function here reads."""
    global _lib, _lib_path
    _lib, _lib_path = lib, path


def _set_backend(name: str) -> None:
    global _backend
    _backend = name


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


def _announce(text: str) -> None:
    if text not in _announced:
        _announced.add(text)
        print(text, file=sys.stderr, flush=True)


def _device_index(device) -> int:
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
