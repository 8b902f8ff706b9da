"""torch_memory_saver's API over cachet (python/README.md, "torch_memory_saver over cachet").

    from cachet_torch.memory_saver import torch_memory_saver   # or, after alias(): import torch_memory_saver
    with torch_memory_saver.region("weights", enable_cpu_backup=True):
        model = build().cuda()
    with torch_memory_saver.region("kv_cache"):
        kv = torch.empty(..., device="cuda")
    torch_memory_saver.pause()          # every region's memory back to the driver, weights backed up
    torch_memory_saver.resume()         # same addresses, weights restored

The names, arguments and meaning of torch_memory_saver 0.0.10's entrypoint (TorchMemorySaver, the
singleton torch_memory_saver, configure_subprocess(), the TMS_* variables), with cachet as
PyTorch's allocator underneath (the first use calls cachet_torch.install(); CACHET_ALLOC_CONF gets
cachet_sleep:True; $CACHET_TORCH_AUTOINSTALL_BACKEND, "c10" or "plugin", picks the backend):

  * a region is a cachet tag: allocations inside carry "tms.<tag>" (with enable_cpu_backup,
    "tms.<tag>.cpu"); pause(tag) is cachet_torch.sleep() of those tags with the ".cpu" ones backed
    up, resume(tag) cachet_torch.wake(). Memory allocated outside every region ("default") is never
    paused. pause()/resume() with no tag: every region's tag seen in this process.
  * hook_mode "preload" and "torch" are both accepted and mean the same: cachet owns every segment
    either way (no LD_PRELOAD, no MemPool per tag), so cuda_graph() is pauseable in both, and
    expandable segments are allowed (torch_memory_saver refuses them).
  * Leaving a region with enable_cpu_backup pins the host memory the next pause() will back every
    backed-up region up to (cachet_torch.prepare_backup_buffers()), so pause() costs a pinned copy
    from the first one on: the pinning (about 0.35 s per GiB) is paid where the weights were
    loaded, once, not in the first pause. The buffers are kept between pauses, as they would be
    after the first one; cachet_torch.release_backup_buffers() gives them back.
    CACHET_TMS_PREPARE_BACKUP=0 leaves the pinning to the first pause. Under TMS_INIT_ENABLE (no
    region is left) the first pause pins.
  * cuda_graph(...) is torch.cuda.graph(...) with the capture's allocations (the graph's private
    pool) under the region's tag.
  * disable(): allocations inside carry cachet's "default" tag (never paused) and go to a private
    pool of their own (a torch.cuda.MemPool with the c10 backend; cachet's own pool calls with the
    plug-in, which PyTorch refuses MemPool for) whose free memory goes back on exit, and nothing
    else: free memory that slept with pause() stays asleep and comes back with resume(), as
    torch_memory_saver drops its MemPool. pause() inside disable() is refused.
  * Not there: disk backup (enable_disk_backup=True raises NotImplementedError; set_disk_backup_dir
    is kept), a paused tensor's host copy (get_cpu_backup of a paused tensor raises
    NotImplementedError), memory_margin_bytes (kept; cachet's wake is all or nothing: an
    out-of-memory wake raises and leaves everything asleep). cpu_backup_backend "mmap" is accepted
    and backs up to pinned memory as "pinned" does.

No torch at import: torch is imported by the first region(), pause() or resume().
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import sys
import threading
from typing import Any, Iterator, Optional

__all__ = ["TorchMemorySaver", "torch_memory_saver", "configure_subprocess", "alias"]

_TAG_DEFAULT = "default"
_PREFIX = "tms."
_BACKUP_SUFFIX = ".cpu"
_TAG_RE = re.compile(r"^[A-Za-z0-9_.-]{1,55}$")  # 64 less "tms." and ".cpu"
_HOOK_MODES = ("preload", "torch")
_CPU_BACKENDS = ("pinned", "mmap")

AUTOINSTALL_ENV = "CACHET_TORCH_AUTOINSTALL"  # set by configure_subprocess(): the child installs cachet
_STARTUP_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_startup")

CUDA_ALREADY_INITIALISED = (
    "cachet_torch.memory_saver: CUDA was already initialised in this process "
    "(torch.cuda.is_initialized()), so cachet cannot become PyTorch's allocator any more and "
    "nothing could be paused. Use torch_memory_saver (region, pause, ...) before the first CUDA "
    "call, call cachet_torch.install() first thing, or start this process under "
    "torch_memory_saver.configure_subprocess() (its children install cachet when they import torch)")


def _truthy(value: Optional[str]) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def cachet_tag(tag: str, enable_cpu_backup: bool = False) -> str:
    """The cachet tag of a torch_memory_saver region: "tms.<tag>", "tms.<tag>.cpu" with backup."""
    if not isinstance(tag, str) or not _TAG_RE.match(tag):
        raise ValueError(f"torch_memory_saver (cachet): the tag {tag!r} must be 1 to 55 of [A-Za-z0-9_.-]")
    return _PREFIX + tag + (_BACKUP_SUFFIX if enable_cpu_backup else "")


def _sleep_conf() -> None:
    """Puts cachet_sleep:True into CACHET_ALLOC_CONF (keeping what the process configured: cachet
    reads CACHET_ALLOC_CONF first, so PYTORCH_CUDA_ALLOC_CONF's keys are carried over)."""
    conf = os.environ.get("CACHET_ALLOC_CONF")
    if conf is None:
        conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or os.environ.get("PYTORCH_ALLOC_CONF") or ""
    if "cachet_sleep:" in conf:
        return
    os.environ["CACHET_ALLOC_CONF"] = (conf + "," if conf.strip() else "") + "cachet_sleep:True"


BACKEND_ENV = "CACHET_TORCH_AUTOINSTALL_BACKEND"  # the backend cachet installs itself with


def ensure_cachet(who: str = "torch_memory_saver") -> None:
    """Installs cachet (with cachet_sleep:True) unless it is: the first use of torch_memory_saver's
    API or of vLLM's CuMemAllocator (`who`) does it, through the backend named by
    $CACHET_TORCH_AUTOINSTALL_BACKEND ("auto" when unset, else "c10" or "plugin", as
    configure_subprocess()'s children take it). The message above when CUDA was initialised first;
    RuntimeError when cachet already runs without cachet_sleep:True (installed by the program
    itself before CACHET_ALLOC_CONF had the key)."""
    from . import _install, _stats  # noqa: PLC0415
    if not _install.installed():
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            raise RuntimeError(CUDA_ALREADY_INITIALISED)
        _sleep_conf()
        _install.install(backend=os.environ.get(BACKEND_ENV) or "auto")
    canonical = _stats.settings().get("canonical", "")
    if "cachet_sleep:True" not in canonical:
        raise RuntimeError(f"{who} (cachet): cachet runs with {canonical!r}, without cachet_sleep:True, so "
                           "nothing can be paused: cachet was installed before CACHET_ALLOC_CONF had "
                           "cachet_sleep:True. Let the first use of "
                           f"{who} install cachet (${BACKEND_ENV}=c10|plugin picks the backend), or "
                           "add cachet_sleep:True to CACHET_ALLOC_CONF before cachet_torch.install()")


class TorchMemorySaver:
    """torch_memory_saver.TorchMemorySaver over cachet (the module's text says how)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._initialized = False
        self._hook_mode = "preload"
        self._tags: set = set()          # cachet tags of every region entered
        self._margin = 0
        self._retain_cpu_backup = _truthy(os.environ.get("TMS_RETAIN_CPU_BACKUP"))
        self._disk_backup_dir = os.environ.get("TMS_DISK_BACKUP_DIR")
        backend = os.environ.get("TMS_INIT_CPU_BACKUP_BACKEND") or "pinned"
        if backend not in _CPU_BACKENDS:
            raise ValueError(f"TMS_INIT_CPU_BACKUP_BACKEND={backend!r}: use 'pinned' or 'mmap'")
        self._cpu_backup_backend = backend
        self._init_region: Optional[Any] = None
        self._initialized_at_start = False

    # ---- configuration
    @property
    def enabled(self) -> bool:
        return True

    @property
    def hook_mode(self) -> str:
        return self._hook_mode

    @hook_mode.setter
    def hook_mode(self, hook_mode: str) -> None:
        # Initialised at the process's start (TMS_INIT_ENABLE in a configure_subprocess() child),
        # the program still sets its mode first thing, as it does under torch_memory_saver.
        assert not self._initialized or self._initialized_at_start, "Cannot configure after initialization"
        if hook_mode not in _HOOK_MODES:
            raise ValueError(f"torch_memory_saver (cachet): hook_mode {hook_mode!r}: use 'preload' or 'torch' "
                             "(both mean the same under cachet)")
        self._hook_mode = hook_mode

    @property
    def memory_margin_bytes(self) -> int:
        raise NotImplementedError("Only setter is supported")

    @memory_margin_bytes.setter
    def memory_margin_bytes(self, value: int) -> None:
        self._ensure_initialized()
        self._margin = int(value)

    @property
    def retain_cpu_backup(self) -> bool:
        self._ensure_initialized()
        return self._retain_cpu_backup

    @retain_cpu_backup.setter
    def retain_cpu_backup(self, value: bool) -> None:
        self._ensure_initialized()
        self._retain_cpu_backup = bool(value)

    def set_disk_backup_dir(self, path: str) -> None:
        self._ensure_initialized()
        os.makedirs(path, exist_ok=True)
        self._disk_backup_dir = path

    # ---- regions
    def _ensure_initialized(self) -> None:
        with self._lock:
            if self._initialized:
                return
            ensure_cachet()
            self._initialized = True
            if _truthy(os.environ.get("TMS_INIT_ENABLE")):
                # The whole process is region memory from the start (preload mode's TMS_INIT_ENABLE):
                # the initialising thread's allocations carry the default region's tag.
                backup = _truthy(os.environ.get("TMS_INIT_ENABLE_CPU_BACKUP"))
                t = cachet_tag(_TAG_DEFAULT, backup)
                self._tags.add(t)
                from ._sleep import tag as _tag  # noqa: PLC0415
                self._init_region = _tag(t)
                self._init_region.__enter__()

    def _check_backend(self, enable_cpu_backup: bool, cpu_backup_backend: Optional[str]) -> None:
        if cpu_backup_backend is None:
            return
        if not enable_cpu_backup:
            raise ValueError("cpu_backup_backend requires enable_cpu_backup=True")
        if cpu_backup_backend not in _CPU_BACKENDS:
            raise ValueError(f"cpu_backup_backend {cpu_backup_backend!r}: use 'pinned' or 'mmap'")

    @contextlib.contextmanager
    def region(self, tag: str = _TAG_DEFAULT, enable_cpu_backup: bool = False,
               enable_disk_backup: bool = False, cpu_backup_backend: Optional[str] = None) -> Iterator[None]:
        """Allocations inside are paused by pause(tag) (backed up to pinned host memory with
        enable_cpu_backup, else discarded) and come back at the same addresses on resume(tag)."""
        self._check_backend(enable_cpu_backup, cpu_backup_backend)
        assert not (enable_cpu_backup and enable_disk_backup), \
            "enable_cpu_backup and enable_disk_backup are mutually exclusive"
        if enable_disk_backup:
            raise NotImplementedError("torch_memory_saver (cachet): disk backup is not supported; cachet "
                                      "backs up to pinned host memory (enable_cpu_backup=True)")
        self._ensure_initialized()
        t = cachet_tag(tag, enable_cpu_backup)
        self._tags.add(t)
        from ._sleep import tag as _tag  # noqa: PLC0415
        with _tag(t):
            yield
        if enable_cpu_backup:
            self._prepare_backups()

    def _prepare_backups(self) -> None:
        """The host buffers of the next pause's backups, pinned now (module docstring)."""
        if os.environ.get("CACHET_TMS_PREPARE_BACKUP", "1").strip() == "0":
            return
        from ._sleep import prepare_backup_buffers  # noqa: PLC0415
        import torch  # noqa: PLC0415
        try:
            prepare_backup_buffers(backup=sorted(t for t in self._tags if t.endswith(_BACKUP_SUFFIX)))
        except (MemoryError, torch.OutOfMemoryError) as e:  # host memory short: the pause pins what it lacks
            import warnings  # noqa: PLC0415
            warnings.warn(f"torch_memory_saver (cachet): {e}; the first pause() will pin its backup", stacklevel=3)

    @contextlib.contextmanager
    def cuda_graph(self, cuda_graph: Any, pool: Any = None, stream: Any = None,
                   capture_error_mode: str = "global", tag: str = _TAG_DEFAULT,
                   enable_cpu_backup: bool = False, cpu_backup_backend: Optional[str] = None) -> Iterator[None]:
        """torch.cuda.graph(cuda_graph, pool, stream, capture_error_mode) whose memory (the graph's
        private pool) pause(tag) gives back, in either hook mode."""
        self._check_backend(enable_cpu_backup, cpu_backup_backend)
        self._ensure_initialized()
        import torch  # noqa: PLC0415
        t = cachet_tag(tag, enable_cpu_backup)
        self._tags.add(t)
        from ._sleep import tag as _tag  # noqa: PLC0415
        with torch.cuda.graph(cuda_graph, pool=pool, stream=stream, capture_error_mode=capture_error_mode):
            with _tag(t):
                yield

    @contextlib.contextmanager
    def disable(self) -> Iterator[None]:
        """Allocations of this thread inside belong to no region (cachet's "default" tag: never
        paused) and to a private pool of their own, whose free memory goes back to the driver on
        exit: only what was allocated inside, as torch_memory_saver allocates them in a fresh
        torch.cuda.MemPool() and drops it. What was paused stays paused, free cached memory that
        slept with pause() included, so resume() brings all of it back.

          * c10 backend: torch.cuda.MemPool() + torch.cuda.use_mem_pool(pool), then the pool is
            dropped (~MemPool: releasePool and emptyCache of that pool only), as upstream.
          * plug-in: PyTorch 2.11 refuses MemPool for CUDAPluggableAllocator, so cachet makes the
            same pool calls on its own allocator (cachet_torch_begin_thread_pool/_end_thread_pool:
            a pool taking this thread's allocations on the current device, given back on exit).
            Before anything was ever allocated on the device there is nothing to keep apart: the
            exit is empty_cache().
          * Tensors allocated inside and still alive at exit keep their memory; it returns to the
            pool when they are freed and goes back at a later empty_cache().
          * Inside, pause() is refused (cachet does not start a sleep while a pool is in use:
            docs/sleep-wake.md section 3).
          * policy:cachet: a pool's memory joins the default pool when it is dropped (R11), so the
            exit is a whole empty_cache(), which also gives back free memory that slept.
          * Expandable segments: PyTorch 2.11's own limit on a private pool's expandable segments
            applies (docs/pytorch-allocator.md section 14.8, case 1): a tensor allocated inside and
            kept past the exit can make the pool's release refused, as PyTorch's own assertion
            fails there (c10 backend: raised inside ATen's ~MemPool, a destructor, where native
            PyTorch's assertion fails too and can end the process; plug-in: RuntimeError). Free
            what was allocated inside before leaving."""
        self._ensure_initialized()
        from ._sleep import tag as _tag  # noqa: PLC0415
        with _tag("default"), _own_pool():
            yield

    def _start(self) -> None:
        """At the process's start (configure_subprocess()'s hook, right after cachet is installed):
        with TMS_INIT_ENABLE=1 the starting thread's allocations are region memory from now on."""
        if _truthy(os.environ.get("TMS_INIT_ENABLE")) and not self._initialized:
            self._ensure_initialized()
            self._initialized_at_start = True

    # ---- pause and resume
    def _selected(self, tag: Optional[str]) -> list:
        if tag is None:
            return sorted(self._tags)
        return [t for t in (cachet_tag(tag, False), cachet_tag(tag, True)) if t in self._tags]

    def pause(self, tag: Optional[str] = None) -> None:
        """Gives the memory of the region `tag` (None: every region) back to the driver; regions
        with enable_cpu_backup are copied to pinned host memory first."""
        self._ensure_initialized()
        tags = self._selected(tag)
        if not tags:
            return
        from ._sleep import sleep  # noqa: PLC0415
        sleep(tags=tags, backup=[t for t in tags if t.endswith(_BACKUP_SUFFIX)])

    def resume(self, tag: Optional[str] = None) -> None:
        """Maps the memory of the region `tag` (None: every region) again at the same addresses and
        restores the backed-up contents."""
        self._ensure_initialized()
        tags = self._selected(tag)
        if not tags:
            return
        from ._sleep import wake  # noqa: PLC0415
        wake(tags=tags)

    def get_cpu_backup(self, x: Any, zero_copy: bool = False) -> Any:
        """The host copy of x's backup: with retain_cpu_backup and x awake, its contents on the host
        (what the last resume restored or what is there now); None when x is awake without
        retain_cpu_backup; a paused tensor's backup is not exposed by cachet (NotImplementedError)."""
        self._ensure_initialized()
        assert x.is_cuda, f"{x.device=}"
        assert x.is_contiguous(), f"{x.shape=} {x.stride()=} {x.dtype=}"
        from ._sleep import sleeping  # noqa: PLC0415
        paused = set(sleeping()) & self._tags
        if paused:
            raise NotImplementedError("torch_memory_saver (cachet): get_cpu_backup() of paused memory: cachet "
                                      f"does not expose a sleeping block's host backup (asleep: {sorted(paused)})")
        if not self._retain_cpu_backup:
            return None
        return x.detach().to("cpu", copy=True)


@contextlib.contextmanager
def _own_pool() -> Iterator[None]:
    """disable()'s pool: this thread's allocations inside go to a private pool whose free memory
    goes back on exit, and nothing else (disable()'s text says how, by backend)."""
    from . import _install, _library as L  # noqa: PLC0415
    if _install.backend() == "c10":
        import torch  # noqa: PLC0415
        pool = torch.cuda.MemPool()
        try:
            with torch.cuda.use_mem_pool(pool):
                yield
        finally:
            del pool  # the last reference: ~MemPool releases it and empties its cache only
        return
    lib = L.load()
    device = L._device_index(None)
    if not hasattr(lib, "cachet_torch_begin_thread_pool") or not lib.cachet_torch_has_device(device):
        try:
            yield
        finally:
            from ._stats import empty_cache  # noqa: PLC0415
            empty_cache()
        return
    pool = ctypes.c_ulonglong(0)
    if lib.cachet_torch_begin_thread_pool(device, ctypes.byref(pool)) != 0:
        raise RuntimeError(f"torch_memory_saver (cachet): disable(): {L.last_error()}")
    try:
        yield
    finally:
        if lib.cachet_torch_end_thread_pool(device, pool.value) != 0:
            raise RuntimeError(f"torch_memory_saver (cachet): disable(): {L.last_error()}")


torch_memory_saver = TorchMemorySaver()


@contextlib.contextmanager
def configure_subprocess() -> Iterator[None]:
    """Inside, processes started by this one install cachet when they import torch (before any CUDA
    call), as torch_memory_saver's preload mode makes them load its hook: the environment gets
    CACHET_TORCH_AUTOINSTALL=1, cachet_sleep:True in CACHET_ALLOC_CONF, and this package's startup
    directory (a sitecustomize that chains to any other) and its parent first on PYTHONPATH.
    Restored on exit."""
    saved = {k: os.environ.get(k) for k in (AUTOINSTALL_ENV, "CACHET_ALLOC_CONF", "PYTHONPATH")}
    try:
        os.environ[AUTOINSTALL_ENV] = "1"
        _sleep_conf()
        parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        rest = [p for p in (saved["PYTHONPATH"] or "").split(os.pathsep) if p and p not in (_STARTUP_DIR, parent)]
        os.environ["PYTHONPATH"] = os.pathsep.join([_STARTUP_DIR, parent] + rest)
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def alias(force: bool = False) -> Any:
    """Makes `import torch_memory_saver` give this module (its singleton torch_memory_saver,
    TorchMemorySaver, configure_subprocess). Refuses, naming it, when a real torch_memory_saver is
    importable, unless force=True: cachet never shadows an installed one silently.
    CACHET_TORCH_MEMORY_SAVER=1 in a process started under configure_subprocess() does it at startup."""
    import importlib.util  # noqa: PLC0415
    this = sys.modules[__name__]
    current = sys.modules.get("torch_memory_saver")
    if current is this:
        return this
    if not force:
        found = current if current is not None else None
        if found is None:
            try:
                spec = importlib.util.find_spec("torch_memory_saver")
            except (ImportError, ValueError):
                spec = None
            found = spec.origin if spec is not None else None
        if found is not None:
            raise RuntimeError(f"cachet_torch.memory_saver.alias(): a torch_memory_saver is installed ({found}); "
                               "cachet does not shadow it silently: uninstall it, or alias(force=True)")
    sys.modules["torch_memory_saver"] = this
    return this
