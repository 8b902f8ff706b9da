"""The allocator's statistics as Prometheus metrics: metrics_text() (the Prometheus text exposition
format, version 0.0.4), serve_metrics(port) (an HTTP endpoint, through prometheus_client where it
is installed, else through the standard library) and collector() (for a prometheus_client registry
of your own). No torch here.

Every memory_stats() key has one metric sample (python/README.md, "Metrics", has the table):

  <array>.<pool>.<stat>  -> cachet_<name>{device, pool, stat}   gauge; pool all|small|large,
                                                                 stat current|peak|allocated|freed
  oversize_*.<stat>      -> cachet_oversize_*{device, stat}      gauge
  max_split_size         -> cachet_max_split_size_bytes{device}  gauge (-1: unlimited)
  num_*                  -> cachet_*_total{device}               counter
  sleep.<stat>.<s>       -> cachet_sleep_*{device, stat}         gauge
  sleep.num_*            -> cachet_*_total{device}               counter

"allocated" and "freed" are PyTorch's cumulative sums of a statistic (reset by
reset_accumulated_memory_stats(), so gauges, not counters). The counts and durations of
cachet_torch.sleep() and wake() calls, process-wide, come from the package itself
(cachet_sleep_calls_total, cachet_sleep_call_seconds_total, ...).

The statistics are cachet's own (cachet_torch.memory_stats(), through the plug-in or the c10
backend alike), read once per scrape for every device that has an allocator; scraping never
creates one. Or give them: `stats` is {device: memory_stats() dict}, one dict (device 0), or a
callable returning either (torch.cuda.memory_stats() of the native allocator works too).
"""

from __future__ import annotations

import http.server
import os
import re
import threading
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

from . import _library as L
from . import _sleep

__all__ = ["metrics_text", "serve_metrics", "collector", "metric_for_key", "MetricsServer",
           "CONTENT_TYPE"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# PyTorch's stat arrays: key stem -> (metric name, what one unit is).
_ARRAYS = {
    "active": ("cachet_active_blocks", "blocks allocated or waiting for their stream uses (PyTorch's active)"),
    "active_bytes": ("cachet_active_bytes", "bytes of active blocks"),
    "allocated_bytes": ("cachet_allocated_bytes", "bytes of allocated blocks, rounded sizes"),
    "allocation": ("cachet_allocations", "blocks handed out and not yet freed (PyTorch's allocation)"),
    "inactive_split": ("cachet_inactive_split_blocks", "free blocks inside split segments"),
    "inactive_split_bytes": ("cachet_inactive_split_bytes", "bytes of free blocks inside split segments"),
    "requested_bytes": ("cachet_requested_bytes", "bytes the program asked for, of active blocks"),
    "reserved_bytes": ("cachet_reserved_bytes", "bytes obtained from the device (segments)"),
    "segment": ("cachet_segments", "segments obtained from the device"),
}
_POOLS = {"all": "all", "small_pool": "small", "large_pool": "large"}
_STATS = ("current", "peak", "allocated", "freed")
_SINGLE = {
    "oversize_allocations": ("cachet_oversize_allocations", "allocated blocks of max_split_size or more"),
    "oversize_segments": ("cachet_oversize_segments", "segments of max_split_size or more"),
}
_COUNTERS = {
    "num_alloc_retries": ("cachet_alloc_retries_total", "allocations retried after freeing the cache"),
    "num_device_alloc": ("cachet_device_allocs_total", "device allocations (cudaMalloc, page maps)"),
    "num_device_free": ("cachet_device_frees_total", "device frees (cudaFree, page unmaps)"),
    "num_ooms": ("cachet_ooms_total", "out-of-memory errors raised"),
    "num_sync_all_streams": ("cachet_sync_all_streams_total", "synchronizations of every stream to free cached blocks"),
}
_GAUGES = {
    "max_split_size": ("cachet_max_split_size_bytes", "max_split_size as configured (-1: unlimited)"),
}
_SLEEP_STATS = {
    "backup_bytes": ("cachet_sleep_backup_bytes", "pinned host bytes holding backups of sleeping blocks"),
    "sleeping_allocated_bytes": ("cachet_sleep_sleeping_allocated_bytes", "bytes of allocated blocks in sleeping ranges"),
    "sleeping_bytes": ("cachet_sleep_sleeping_bytes", "bytes asleep: in reserved, none of them on the device"),
    "sleeping_segments": ("cachet_sleep_sleeping_segments", "ranges asleep"),
}
_SLEEP_COUNTERS = {
    "num_backup_failures": ("cachet_sleep_backup_failures_total", "sleeps refused because a host backup could not be had"),
    "num_frees_while_asleep": ("cachet_sleep_frees_while_asleep_total", "frees of sleeping blocks, applied at wake"),
    "num_sleeps": ("cachet_sleeps_total", "sleeps that gave memory back"),
    "num_wake_ooms": ("cachet_wake_ooms_total", "wakes that ran out of memory (and stayed asleep)"),
    "num_wakes": ("cachet_wakes_total", "wakes that returned"),
}
_UNMAPPED = ("cachet_unmapped_stat", "a memory_stats() key this version of cachet_torch has no metric for")

Labels = Tuple[Tuple[str, str], ...]


def metric_for_key(key: str, device: int = 0) -> Tuple[str, str, str, Labels]:
    """(metric name, "gauge" or "counter", help text, labels) of one memory_stats() key; a key
    this version does not know maps to cachet_unmapped_stat{key=...}."""
    dev = (("device", str(device)),)
    parts = key.split(".")
    if parts[0] == "sleep" and len(parts) == 3 and parts[1] in _SLEEP_STATS and parts[2] in _STATS:
        name, text = _SLEEP_STATS[parts[1]]
        return name, "gauge", text, dev + (("stat", parts[2]),)
    if parts[0] == "sleep" and len(parts) == 2 and parts[1] in _SLEEP_COUNTERS:
        name, text = _SLEEP_COUNTERS[parts[1]]
        return name, "counter", text, dev
    if len(parts) == 3 and parts[0] in _ARRAYS and parts[1] in _POOLS and parts[2] in _STATS:
        name, text = _ARRAYS[parts[0]]
        return name, "gauge", text, dev + (("pool", _POOLS[parts[1]]), ("stat", parts[2]))
    if len(parts) == 2 and parts[0] in _SINGLE and parts[1] in _STATS:
        name, text = _SINGLE[parts[0]]
        return name, "gauge", text, dev + (("stat", parts[1]),)
    if len(parts) == 1 and key in _COUNTERS:
        name, text = _COUNTERS[key]
        return name, "counter", text, dev
    if len(parts) == 1 and key in _GAUGES:
        name, text = _GAUGES[key]
        return name, "gauge", text, dev
    return _UNMAPPED[0], "gauge", _UNMAPPED[1], dev + (("key", key),)


class _Family:
    __slots__ = ("name", "kind", "help", "samples")

    def __init__(self, name: str, kind: str, text: str):
        self.name, self.kind, self.help = name, kind, text
        self.samples: List[Tuple[Labels, float]] = []


def _order(labels: Labels) -> tuple:
    d = dict(labels)
    pool = list(_POOLS.values()).index(d["pool"]) if d.get("pool") in _POOLS.values() else -1
    stat = _STATS.index(d["stat"]) if d.get("stat") in _STATS else -1
    return (int(d.get("device", "0")), pool, stat, d.get("key", ""))


def _live_stats() -> Dict[int, Dict[str, int]]:
    from ._stats import memory_stats  # noqa: PLC0415
    lib = L.load()
    return {d: memory_stats(d) for d in range(lib.cachet_torch_device_count())
            if lib.cachet_torch_has_device(d)}


def _per_device(stats: Any) -> Dict[int, Dict[str, Any]]:
    if stats is None:
        return _live_stats()
    if callable(stats):
        stats = stats()
    if isinstance(stats, dict) and stats and all(isinstance(v, dict) for v in stats.values()):
        return {int(d): s for d, s in stats.items()}
    return {0: dict(stats)}


def _families(stats: Any = None) -> List[_Family]:
    fams: Dict[str, _Family] = {}

    def add(name: str, kind: str, text: str, labels: Labels, value: float) -> None:
        fam = fams.get(name)
        if fam is None:
            fam = fams[name] = _Family(name, kind, text)
        fam.samples.append((labels, value))

    for device, st in sorted(_per_device(stats).items()):
        for key, value in st.items():
            name, kind, text, labels = metric_for_key(key, device)
            add(name, kind, text, labels, value)
    add("cachet_backend_info", "gauge", "1, labelled with the door install() used (none before install())",
        (("backend", L._backend or "none"),), 1)
    for what, c in _sleep.call_totals().items():
        add(f"cachet_{what}_calls_total", "counter", f"cachet_torch.{what}() calls that returned", (), c["calls"])
        add(f"cachet_{what}_call_seconds_total", "counter", f"seconds spent in cachet_torch.{what}() calls that returned",
            (), c["seconds"])
        add(f"cachet_{what}_last_call_seconds", "gauge", f"seconds the last cachet_torch.{what}() call took", (),
            c["last_seconds"])
    add("cachet_sleep_released_bytes_total", "counter", "bytes cachet_torch.sleep() gave back to the driver", (),
        _sleep.call_totals()["sleep"]["bytes"])
    for fam in fams.values():
        fam.samples.sort(key=lambda s: _order(s[0]))
    return list(fams.values())


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(v: Any) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, int):
        return str(v)
    f = float(v)
    if f != f:
        return "NaN"
    if f in (float("inf"), float("-inf")):
        return "+Inf" if f > 0 else "-Inf"
    return repr(f)


def metrics_text(stats: Any = None) -> str:
    """The statistics in the Prometheus text exposition format (version 0.0.4): one sample per
    memory_stats() key of every device cachet serves (or of `stats`: see the module's text),
    then cachet_backend_info and the sleep()/wake() call counts and durations. Integers are
    written exactly."""
    out: List[str] = []
    for fam in _families(stats):
        out.append(f"# HELP {fam.name} {fam.help}")
        out.append(f"# TYPE {fam.name} {fam.kind}")
        for labels, value in fam.samples:
            lab = ",".join(f'{k}="{_escape(v)}"' for k, v in labels)
            out.append(f"{fam.name}{{{lab}}} {_number(value)}" if lab else f"{fam.name} {_number(value)}")
    return "\n".join(out) + "\n"


def collector(stats: Any = None) -> Any:
    """A prometheus_client collector of the same metrics (register it in a registry of yours:
    `prometheus_client.REGISTRY.register(cachet_torch.metrics.collector())`). Needs
    prometheus_client (Debian: python3-prometheus-client)."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily  # noqa: PLC0415

    class CachetCollector:
        def collect(self) -> Iterable[Any]:
            for fam in _families(stats):
                names = sorted({k for labels, _ in fam.samples for k, _ in labels},
                               key=lambda k: ("device", "pool", "stat", "key", "backend").index(k)
                               if k in ("device", "pool", "stat", "key", "backend") else 9)
                cls = CounterMetricFamily if fam.kind == "counter" else GaugeMetricFamily
                m = cls(fam.name, fam.help, labels=names)
                for labels, value in fam.samples:
                    d = dict(labels)
                    m.add_metric([d.get(n, "") for n in names], float(value))
                yield m

    return CachetCollector()


def _have_prometheus_client() -> bool:
    try:
        import prometheus_client.exposition  # noqa: F401, PLC0415
    except ImportError:
        return False
    return True


class _TextHandler(http.server.BaseHTTPRequestHandler):
    stats: Any = None

    def do_GET(self) -> None:  # noqa: N802
        if self.path.split("?")[0] not in ("/", "/metrics"):
            self.send_error(404, "cachet: the metrics are at /metrics")
            return
        try:
            body = metrics_text(self.stats).encode()
        except Exception as e:  # noqa: BLE001: the scrape says why
            self.send_error(500, f"cachet: {e}")
            return
        self.send_response(200)
        self.send_header("Content-Type", CONTENT_TYPE)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:  # no line per scrape on stderr
        pass


class MetricsServer:
    """What serve_metrics() started: `port` (the one bound), `url`, `via` ("prometheus_client" or
    "http.server"), close()."""

    def __init__(self, server: http.server.HTTPServer, via: str):
        self._server = server
        self.addr, self.port = server.server_address[:2]
        self.via = via
        host = "127.0.0.1" if self.addr in ("0.0.0.0", "") else self.addr
        self.url = f"http://{host}:{self.port}/metrics"
        self._thread = threading.Thread(target=server.serve_forever, name="cachet-metrics", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def __enter__(self) -> "MetricsServer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _rank_offset() -> int:
    v = os.environ.get("LOCAL_RANK", "")
    return int(v) if re.fullmatch(r"\d+", v) else 0


def serve_metrics(port: int = 0, addr: str = "0.0.0.0", stats: Any = None, rank_offset: bool = True,
                  use_prometheus_client: Optional[bool] = None) -> MetricsServer:
    """Serves the metrics at http://addr:PORT/metrics from a daemon thread; returns the server
    (`.port`, `.url`, `.close()`). port 0 picks a free port; any other port gets the process's
    LOCAL_RANK added (torchrun sets it; 0 without it), so every rank of a node serves its own
    port: serve_metrics(9400) on local rank 3 serves 9403 (rank_offset=False: the port as given).
    Through prometheus_client's MetricsHandler where it is installed (it also answers OpenMetrics
    to scrapers that ask for it), else through the standard library's http.server
    (use_prometheus_client=True/False insists)."""
    if port and rank_offset:
        port += _rank_offset()
    if use_prometheus_client is None:
        use_prometheus_client = _have_prometheus_client()
    if use_prometheus_client:
        from prometheus_client import CollectorRegistry  # noqa: PLC0415
        from prometheus_client.exposition import MetricsHandler  # noqa: PLC0415
        registry = CollectorRegistry(auto_describe=False)
        registry.register(collector(stats))

        class Handler(MetricsHandler.factory(registry)):  # type: ignore[misc]
            def log_message(self, *args: Any) -> None:
                pass

        handler: Callable = Handler
        via = "prometheus_client"
    else:
        handler = type("CachetMetricsHandler", (_TextHandler,), {"stats": staticmethod(stats) if callable(stats)
                                                                  else stats})
        via = "http.server"
    server = http.server.ThreadingHTTPServer((addr, port), handler)
    server.daemon_threads = True
    return MetricsServer(server, via)
