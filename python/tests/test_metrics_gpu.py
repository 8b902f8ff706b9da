#!/usr/bin/env python3
"""The metrics endpoint on a GPU (ctest cachet_torch_metrics_gpu, labels gpu, torch; exit 77 without
PyTorch or a CUDA device; the c10 backend run is skipped where libcachet_c10.so was not built).

For each backend (plug-in and c10, each in a fresh process, CACHET_ALLOC_CONF=cachet_sleep:True):
tensors are allocated under the tags "weights" and "kv_cache", some freed, "kv_cache" put to sleep
with "weights" backed up, woken, and put to sleep again; then, with nothing allocating,
memory_stats() is read, /metrics is fetched over loopback (serve_metrics(0), and through
prometheus_client where it is installed) and memory_stats() is read again. The two reads are
equal, and every one of their keys (PyTorch's 122 and the 21 sleep.* keys) has its sample in the
scrape with exactly that value; with the c10 backend also equal to torch.cuda.memory_stats();
cachet_sleep_calls_total and cachet_wake_calls_total count the calls made.

usage: test_metrics_gpu.py            (CACHET_TORCH_LIB as ctest sets it)
"""
import os
import subprocess
import sys
import tempfile
import textwrap

import preamble

check = preamble.Checks()

WORKER = textwrap.dedent(r"""
    import json, sys, urllib.request
    import cachet_torch
    from cachet_torch import metrics
    backend, out = sys.argv[1], sys.argv[2]
    cachet_torch.install(backend=backend)
    import torch
    keep = []
    with cachet_torch.tag("weights"):
        keep += [torch.full((1 << 20,), float(i), device="cuda") for i in range(8)]
    with cachet_torch.tag("kv_cache"):
        kv = [torch.empty(3 << 20, device="cuda") for _ in range(4)]
    junk = [torch.empty(1000 + 37 * i, device="cuda") for i in range(50)]
    del junk[::2]
    torch.cuda.synchronize()
    cachet_torch.sleep(tags=("kv_cache",), backup=("weights",))
    cachet_torch.wake()
    cachet_torch.sleep(tags=("kv_cache",), backup=())
    torch.cuda.synchronize()
    res = {"backend": cachet_torch.backend(), "scrapes": []}
    for via in (False, True):
        try:
            server = cachet_torch.serve_metrics(0, "127.0.0.1", use_prometheus_client=via)
        except ImportError:
            continue
        before = dict(cachet_torch.memory_stats())
        body = urllib.request.urlopen(server.url, timeout=30).read().decode()
        after = dict(cachet_torch.memory_stats())
        server.close()
        res["scrapes"].append({"via": server.via, "before": before, "after": after, "body": body})
    if cachet_torch.backend() == "c10":
        res["torch_stats"] = {k: v for k, v in torch.cuda.memory_stats().items()}
        res["cachet_stats"] = dict(cachet_torch.memory_stats())
    json.dump(res, open(out, "w"))
""")


def samples(body):
    import re
    out = {}
    for line in body.splitlines():
        if line.startswith("#") or not line:
            continue
        m = re.match(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$', line)
        labels = frozenset(re.findall(r'([a-zA-Z_]+)="([^"]*)"', m.group(2) or ""))
        out[(m.group(1), labels)] = float(m.group(3))
    return out


def main():
    torch, lib, stop = preamble.start()
    if stop is not None:
        return stop
    sys.path.insert(0, preamble.PYDIR)
    from cachet_torch import metrics
    backends = ["plugin"]
    env = preamble.child_env(lib)
    env["CACHET_ALLOC_CONF"] = "cachet_sleep:True"
    code = "import cachet_torch; print(cachet_torch.c10_library_path())"
    c10 = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True).stdout.strip()
    if c10 and c10 != "None":
        backends.append("c10")
    else:
        print("note: no libcachet_c10.so: the c10 backend is not checked")
    tmp = tempfile.mkdtemp(prefix="cachet-metrics-gpu-")
    worker = os.path.join(tmp, "worker.py")
    with open(worker, "w") as f:
        f.write(WORKER)
    for backend in backends:
        out = os.path.join(tmp, f"{backend}.json")
        res = preamble.run_worker([worker, backend, out], out, backend, check, env=env, timeout=600)
        if res is None:
            continue
        check(res["backend"] == backend, f"{backend}: installed through {res['backend']}")
        for s in res["scrapes"]:
            label = f"{backend} via {s['via']}"
            before, after = s["before"], s["after"]
            check(before == after, f"{label}: memory_stats() unchanged across the scrape")
            check(len(before) == 143 and sum(k.startswith("sleep.") for k in before) == 21,
                  f"{label}: 122 + 21 keys ({len(before)})")
            got = samples(s["body"])
            wrong = []
            for k, v in before.items():
                name, _, _, labels = metrics.metric_for_key(k, 0)
                if got.get((name, frozenset(labels))) != float(v):
                    wrong.append((k, v, got.get((name, frozenset(labels)))))
            check(not wrong, f"{label}: every key's sample equals memory_stats() ({len(wrong)} differ: {wrong[:3]})")
            check(before["sleep.sleeping_bytes.current"] > 0 and before["sleep.num_sleeps"] == 2
                  and before["sleep.num_wakes"] == 1,
                  f"{label}: asleep at the scrape ({before['sleep.sleeping_bytes.current']} B asleep, "
                  f"{before['sleep.num_sleeps']} sleeps, {before['sleep.num_wakes']} wakes)")
            check(got.get(("cachet_sleep_calls_total", frozenset())) == 2.0
                  and got.get(("cachet_wake_calls_total", frozenset())) == 1.0
                  and got.get(("cachet_backend_info", frozenset({("backend", backend)}))) == 1.0,
                  f"{label}: cachet_sleep_calls_total 2, cachet_wake_calls_total 1, backend {backend}")
        if backend == "c10":
            pt = {k: v for k, v in res["torch_stats"].items()}
            ours = {k: v for k, v in res["cachet_stats"].items() if not k.startswith("sleep.")}
            check(all(pt.get(k) == v for k, v in ours.items()),
                  "c10: cachet_torch.memory_stats()'s 122 keys equal torch.cuda.memory_stats()'s")
    print(f"\n{len(check.failures)} failure(s)")
    return 1 if check.failures else 0


if __name__ == "__main__":
    sys.exit(main())
