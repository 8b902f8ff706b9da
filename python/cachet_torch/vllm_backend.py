"""vLLM's sleep mode over cachet (python/README.md, "vLLM"): a CuMemAllocator-compatible object
and a SleepModeBackend plug-in (vLLM PR #44074: `--sleep-mode-backend cachet`, registered from the
`vllm.general_plugins` entry point `cachet = cachet_torch.vllm_backend:register`).

  * CuMemAllocator: get_instance(), use_memory_pool(tag), sleep(offload_tags), wake_up(tags),
    discard(tags), get_current_usage(), with vLLM's meaning. A pool is a cachet tag ("vllm.<tag>"),
    not a torch.cuda.MemPool: so a CUDA graph captured inside use_memory_pool(tag) (its private
    pool) sleeps with the tag, expandable segments stay allowed, and empty_cache() works.
  * CachetSleepModeBackend: suspend(level) is sleep(offload_tags=("weights",)) at level 1 and
    sleep(()) at level 2, resume(tags) is wake_up(tags); creating it makes vLLM's
    get_mem_allocator_instance() and CuMemAllocator.get_instance() give cachet's allocator (vLLM's
    class patched in place), so the worker's use_memory_pool("weights"/"kv_cache") lands in
    cachet's tags; CACHET_VLLM_ALLOCATOR=1 does that already when the plug-in is loaded.
  * The first use_memory_pool() installs cachet with cachet_sleep:True added to CACHET_ALLOC_CONF
    (memory_saver.ensure_cachet); $CACHET_TORCH_AUTOINSTALL_BACKEND ("c10", "plugin"; default
    "auto") picks the backend. A program that installs cachet itself must put cachet_sleep:True
    in CACHET_ALLOC_CONF first, else use_memory_pool() raises RuntimeError saying so. Neither
    creating the backend nor suspend()/resume() before any pool installs anything.

No torch and no vllm at import.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from typing import Iterator, Optional, Sequence, Union

from . import _library as L
from .memory_saver import ensure_cachet

__all__ = ["CuMemAllocator", "CachetSleepModeBackend", "register", "BACKEND_NAME"]

BACKEND_NAME = "cachet"
_PREFIX = "vllm."


def _cachet_tag(tag: str) -> str:
    import re  # noqa: PLC0415
    if not isinstance(tag, str) or not re.match(r"^[A-Za-z0-9_.-]{1,59}$", tag):
        raise ValueError(f"cachet CuMemAllocator: the tag {tag!r} must be 1 to 59 of [A-Za-z0-9_.-]")
    return _PREFIX + tag


def _tag_list(tags: Union[None, str, Sequence[str]]) -> Optional[list]:
    if tags is None:
        return None
    if isinstance(tags, str):
        return [tags]
    return list(tags)


class CuMemAllocator:
    """vLLM's CuMemAllocator over cachet. One instance per process (get_instance())."""

    default_tag: str = "default"
    instance: Optional["CuMemAllocator"] = None

    @staticmethod
    def get_instance() -> "CuMemAllocator":
        if CuMemAllocator.instance is None:
            CuMemAllocator.instance = CuMemAllocator()
        return CuMemAllocator.instance

    def __init__(self) -> None:
        self.current_tag: str = CuMemAllocator.default_tag
        self._tags: set = set()

    @contextlib.contextmanager
    def use_memory_pool(self, tag: Optional[str] = None) -> Iterator[None]:
        """Allocations of this thread inside carry `tag` (default "default"); sleep() gives their
        memory back. CUDA graphs captured inside are in it too."""
        tag = tag or self.default_tag
        ensure_cachet("vLLM's CuMemAllocator")
        t = _cachet_tag(tag)
        self._tags.add(t)
        from ._sleep import tag as _tag  # noqa: PLC0415
        previous = self.current_tag
        self.current_tag = tag
        try:
            with _tag(t):
                yield
        finally:
            self.current_tag = previous

    def _selected(self, tags: Optional[list]) -> list:
        if tags is None:
            return sorted(self._tags)
        return [t for t in (_cachet_tag(x) for x in tags) if t in self._tags]

    def sleep(self, offload_tags: Union[None, str, Sequence[str]] = None) -> None:
        """Gives the memory of every pool back to the driver; the pools in offload_tags (default:
        ("default",), as vLLM) are copied to pinned host memory first, the others discarded."""
        offload = _tag_list(offload_tags)
        if offload is None:
            offload = [self.default_tag]
        tags = self._selected(None)
        if not tags:
            return
        backup = [t for t in self._selected(offload)]
        from ._sleep import sleep  # noqa: PLC0415
        sleep(tags=tags, backup=backup)

    def wake_up(self, tags: Optional[Sequence[str]] = None) -> None:
        """Maps the memory of the pools `tags` (None: all) again at the same addresses and restores
        what was offloaded. Out of memory: torch.OutOfMemoryError (a RuntimeError), everything
        stays asleep, the backups kept."""
        sel = self._selected(_tag_list(tags))
        if not sel:
            return
        from ._sleep import wake  # noqa: PLC0415
        wake(tags=sel)

    def discard(self, tags: Union[str, Sequence[str]]) -> None:
        """Gives the memory of the pools `tags` back without keeping their contents (a sleep of
        those pools without offload); wake_up() maps it again, contents undefined."""
        sel = self._selected(_tag_list(tags))
        if not sel:
            return
        from ._sleep import sleep  # noqa: PLC0415
        sleep(tags=sel, backup=())

    def get_current_usage(self) -> int:
        """Bytes of allocated blocks on the device now (not asleep), every device cachet serves."""
        from ._stats import memory_stats  # noqa: PLC0415
        lib = L.load()
        total = 0
        for d in range(lib.cachet_torch_device_count()):
            if lib.cachet_torch_has_device(d):
                st = memory_stats(d)
                total += st["allocated_bytes.all.current"] - st.get("sleep.sleeping_allocated_bytes.current", 0)
        return total


def _base() -> type:
    try:
        from vllm.device_allocator.sleep_mode_backend import SleepModeBackend  # noqa: PLC0415
        return SleepModeBackend
    except ImportError:
        class SleepModeBackend:  # the interface of vLLM PR #44074, where vLLM is not installed
            def __init__(self) -> None:
                self._state = "RUNNING"

            def state(self) -> str:
                return self._state
        return SleepModeBackend


def _patch_vllm_allocator() -> None:
    """vLLM's worker asks get_mem_allocator_instance() / CuMemAllocator.get_instance() for its
    pools: give it cachet's. vLLM's own class is patched in place (its get_instance), so modules
    that imported it by name before see cachet's too; the module attributes are rebound."""
    for name in ("vllm.device_allocator", "vllm.device_allocator.cumem"):
        mod = sys.modules.get(name)
        if mod is None:
            try:
                mod = importlib.import_module(name)
            except Exception:  # noqa: BLE001: a vLLM without it (or without its CUDA extension)
                continue
        theirs = getattr(mod, "CuMemAllocator", None)
        if isinstance(theirs, type) and theirs is not CuMemAllocator:
            theirs.get_instance = staticmethod(CuMemAllocator.get_instance)
            mod.CuMemAllocator = CuMemAllocator
        if hasattr(mod, "get_mem_allocator_instance"):
            mod.get_mem_allocator_instance = CuMemAllocator.get_instance


class CachetSleepModeBackend(_base()):  # type: ignore[misc]
    """vLLM's SleepModeBackend over cachet: suspend(level), resume(tags), graph memory included."""

    def __init__(self) -> None:
        super().__init__()
        _patch_vllm_allocator()

    @classmethod
    def name(cls) -> str:
        return BACKEND_NAME

    def suspend(self, level: int = 1) -> None:
        self._state = "SUSPENDED"
        CuMemAllocator.get_instance().sleep(offload_tags=("weights",) if level == 1 else tuple())

    def resume(self, tags: Optional[list] = None) -> None:
        self._state = "RESUMING"
        CuMemAllocator.get_instance().wake_up(tags)
        self._state = "RUNNING"

    @classmethod
    def is_supported(cls) -> bool:
        try:
            L.library_path()
        except FileNotFoundError:
            return False
        return True

    @classmethod
    def preserves_communicators(cls) -> bool:
        return True  # NCCL's buffers are not the caching allocator's: untouched

    @classmethod
    def preserves_compiled_artifacts(cls) -> bool:
        return True  # the process and its kernels stay

    @classmethod
    def preserves_graphs_with_communicators(cls) -> bool:
        return True  # graphs keep their addresses, communicators are kept

    @classmethod
    def supports_durable_storage(cls) -> bool:
        return False


def register() -> None:
    """The vllm.general_plugins entry point: registers the backend "cachet" with vLLM's
    SleepModeBackendFactory (no-op when this vLLM has no pluggable sleep-mode backends)."""
    try:
        from vllm.device_allocator.sleep_mode_backend import SleepModeBackendFactory  # noqa: PLC0415
    except ImportError:
        return
    registry = getattr(SleepModeBackendFactory, "_registry", {})
    if BACKEND_NAME not in registry:
        SleepModeBackendFactory.register_backend(BACKEND_NAME, __name__, "CachetSleepModeBackend")
    if os.environ.get("CACHET_VLLM_ALLOCATOR") == "1":
        # The worker's pools are cachet's from the plug-in's load on, before any backend exists
        # (for a vLLM that creates its sleep-mode backend after loading the model).
        _patch_vllm_allocator()
