"""PyTorch's statistics for cachet: memory_stats() (the 122 keys, and the sleep.* keys with
cachet_sleep:True), the functions built on it, memory_summary(), the resets, empty_cache() and
the configuration in use (settings())."""

from __future__ import annotations

import collections
import json
from typing import Any

from . import _library as L


def empty_cache() -> None:
    """Gives cachet's cached free segments back to the driver, on every device. Installed,
    torch.cuda.empty_cache() does this (set_reset_fn). Behind a torch.cuda.MemPool without
    install(), PyTorch's empty_cache() hands the pool's segments back to cachet (raw_delete), and
    this gives them to the driver."""
    L.load().cachet_torch_empty_cache()


def memory_stats(device: Any = None) -> "collections.OrderedDict[str, int]":
    """torch.cuda.memory_stats(device): the 122 keys ("allocated_bytes.all.current", ...), sorted,
    with PyTorch's meaning."""
    d = L._device_index(device)
    text = L._take_string(L.load().cachet_torch_stats_json(d))
    if text is None:
        raise RuntimeError(f"cachet_torch.memory_stats(device={d}): {L.last_error()}")
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
    d = L._device_index(device)
    if L.load().cachet_torch_reset_peak_stats(d) != 0:
        raise RuntimeError(f"cachet_torch.reset_peak_memory_stats(device={d}): {L.last_error()}")


def reset_accumulated_memory_stats(device: Any = None) -> None:
    d = L._device_index(device)
    if L.load().cachet_torch_reset_accumulated_stats(d) != 0:
        raise RuntimeError(f"cachet_torch.reset_accumulated_memory_stats(device={d}): {L.last_error()}")


def memory_summary(device: Any = None, abbreviated: bool = False) -> str:
    """torch.cuda.memory_summary(device, abbreviated), byte for byte; once anything has slept on
    the device, cachet's two sleep lines follow (docs/sleep-wake.md, section 5)."""
    d = L._device_index(device)
    lib = L.load()
    text = L._take_string(lib.cachet_torch_summary(d, 1 if abbreviated else 0))
    if text is None:
        raise RuntimeError(f"cachet_torch.memory_summary(device={d}): {L.last_error()}")
    if hasattr(lib, "cachet_torch_sleep_summary"):
        text += L._take_string(lib.cachet_torch_sleep_summary(d)) or ""
    return text


def settings() -> dict:
    """The configuration in use: the variable it came from, its text, the canonical form and
    the fields of _snapshot()["allocator_settings"]."""
    text = L._take_string(L.load().cachet_torch_settings_json())
    if text is None:
        from ._install import check_config  # noqa: PLC0415
        check_config()  # raises ValueError with the parser's message
        raise RuntimeError("cachet_torch.settings(): no configuration")
    return json.loads(text)
