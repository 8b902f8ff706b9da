"""The allocator's history and snapshot in PyTorch's form: record_memory_history(),
clear_history(), snapshot() (torch.cuda.memory._snapshot()'s dict) and dump_snapshot() (its
pickle, which `python -m torch.cuda._memory_viz` and `cachet replay` read)."""

from __future__ import annotations

import json
import pickle
import sys

from . import _library as L
from ._stats import settings


def record_memory_history(enabled: bool = True) -> None:
    """torch.cuda.memory._record_memory_history(enabled="all"/None). Through the c10 backend this
    is PyTorch's own (with Python and C++ stack frames); through the plug-in, cachet's trace
    without frames. Recording from the start (install(record_history=True)) is what `cachet
    replay` needs."""
    if L._backend == "c10":
        import torch  # noqa: PLC0415
        torch.cuda.memory._record_memory_history("all" if enabled else None)
        return
    L.load().cachet_torch_record_history(1 if enabled else 0)


def clear_history() -> None:
    L.load().cachet_torch_clear_trace()


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
    if L._backend == "c10":
        import torch  # noqa: PLC0415
        return torch.cuda.memory._snapshot()
    lib = L.load()
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
        text = L._take_string(lib.cachet_torch_snapshot_json(d))
        if text is None:
            raise RuntimeError(f"cachet_torch.snapshot(): device {d}: {L.last_error()}")
        for seg in json.loads(text):
            seg["segment_pool_id"] = tuple(seg["segment_pool_id"])
            seg["frames"] = []
            for b in seg["blocks"]:
                b["frames"] = []
            segments.append(seg)
        text = L._take_string(lib.cachet_torch_trace_json(d))
        if text is None:
            raise RuntimeError(f"cachet_torch.snapshot(): trace of device {d}: {L.last_error()}")
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
