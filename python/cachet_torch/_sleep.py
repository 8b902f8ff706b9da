"""Sleep and wake (docs/sleep-wake.md): tags, sleep(), wake(), sleeping(), prepare_backup_buffers(),
release_backup_buffers().

Needs CACHET_ALLOC_CONF with cachet_sleep:True set before the first CUDA allocation (the segments
are then mapped with the CUDA VMM calls, so their addresses outlive their memory)."""

from __future__ import annotations

import ctypes
import json
import sys
import threading
import time
from typing import Any, Dict, Optional

from . import _library as L

# The calls of sleep() and wake() that returned, process-wide (cachet_torch.metrics exports them):
# how many, the seconds they took in all and the last one's, and the bytes sleep() gave back.
_calls_lock = threading.Lock()
_calls: Dict[str, Dict[str, float]] = {
    "sleep": {"calls": 0, "seconds": 0.0, "last_seconds": 0.0, "bytes": 0},
    "wake": {"calls": 0, "seconds": 0.0, "last_seconds": 0.0, "bytes": 0},
}


def _count_call(what: str, seconds: float, nbytes: int = 0) -> None:
    with _calls_lock:
        c = _calls[what]
        c["calls"] += 1
        c["seconds"] += seconds
        c["last_seconds"] = seconds
        c["bytes"] += nbytes


def call_totals() -> Dict[str, Dict[str, float]]:
    """{"sleep": {...}, "wake": {...}}: calls that returned, seconds in all, the last call's
    seconds, bytes given back (sleep), since the process started."""
    with _calls_lock:
        return {k: dict(v) for k, v in _calls.items()}


def _sleep_lib() -> ctypes.CDLL:
    lib = L.load()
    if not hasattr(lib, "cachet_torch_sleep"):
        raise RuntimeError(f"cachet_torch: {L._lib_path} has no sleep/wake (an older build): rebuild cachet")
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
    return -1 if device is None else L._device_index(device)


def current_tag() -> str:
    """The calling thread's current tag: every allocation it makes carries it ("default")."""
    return L._take_string(_sleep_lib().cachet_torch_current_tag()) or "default"


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
            raise ValueError(f"cachet_torch.tag({self.name!r}): {L.last_error()}")
        self._previous.append(previous)
        return self

    def __exit__(self, *exc) -> None:
        _sleep_lib().cachet_torch_set_tag(self._previous.pop().encode())


def _raise_sleep_error(what: str, rc: int) -> None:
    message = f"{what}: {L.last_error()}"
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
    t0 = time.perf_counter()
    rc = lib.cachet_torch_sleep(_tag_text(tags, "tags"), _tag_text(backup, "backup") or b"", _device_arg(device))
    if rc < 0:
        _raise_sleep_error(what, rc)
    _count_call("sleep", time.perf_counter() - t0, int(rc))
    return int(rc)


def wake(tags: Any = None, device: Any = None) -> None:
    """Maps memory again at the addresses of every sleeping segment of `tags` (None: every tag) and
    restores its backups; blocks without a backup come back with undefined contents. Every pointer
    is as before the sleep. If the memory cannot be had, raises torch.OutOfMemoryError and
    everything stays asleep, backups kept: wake again once memory is free."""
    lib = _sleep_lib()
    t0 = time.perf_counter()
    rc = lib.cachet_torch_wake(_tag_text(tags, "tags"), _device_arg(device))
    if rc != 0:
        _raise_sleep_error(f"cachet_torch.wake(tags={tags!r})", rc)
    _count_call("wake", time.perf_counter() - t0)


def sleeping(device: Any = None) -> list:
    """The tags with sleeping blocks (on `device`; None: any device), sorted."""
    text = L._take_string(_sleep_lib().cachet_torch_sleeping_json(_device_arg(device)))
    if text is None:
        raise RuntimeError(f"cachet_torch.sleeping(): {L.last_error()}")
    return json.loads(text)


def prepare_backup_buffers(backup: Any = ("weights",), device: Any = None) -> int:
    """Pins now the host memory that the next sleep(backup=backup) would pin for the blocks of
    those tags allocated so far, and keeps it for that sleep, so that its backup costs a pinned
    copy only (pinning 1 GiB costs about 18x its copy). Returns the bytes pinned. The buffers are
    the ones release_backup_buffers() gives back. Host memory short raises torch.OutOfMemoryError
    (nothing is lost: the sleep pins what it lacks)."""
    what = f"cachet_torch.prepare_backup_buffers(backup={backup!r})"
    lib = _sleep_lib()
    if not hasattr(lib, "cachet_torch_prepare_backup_buffers"):
        raise RuntimeError(f"{what}: this cachet library is older than prepare_backup_buffers(); rebuild it")
    rc = lib.cachet_torch_prepare_backup_buffers(_tag_text(backup, "backup") or b"", _device_arg(device))
    if rc < 0:
        _raise_sleep_error(what, rc)
    return int(rc)


def release_backup_buffers(device: Any = None) -> int:
    """Gives back the pinned host memory cachet keeps between sleeps for the next sleep's backups
    (a wake's buffers are kept, not unpinned: pinning 1 GiB costs about 18x its copy), and returns
    its bytes. torch.cuda.empty_cache() and cachet_torch.empty_cache() give back device memory
    only and keep these buffers; what is kept never exceeds the most that backups held at once.
    Buffers holding the backups of memory still asleep stay. `device` None: every device cachet
    serves (none is created). 0 where nothing is kept (and with a build older than this call's)."""
    lib = L.load()
    if not hasattr(lib, "cachet_torch_release_backup_buffers"):
        return 0
    given = lib.cachet_torch_release_backup_buffers(_device_arg(device))
    if given < 0:
        raise RuntimeError(f"cachet_torch.release_backup_buffers(): {L.last_error()}")
    return int(given)
