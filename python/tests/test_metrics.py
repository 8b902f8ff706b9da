#!/usr/bin/env python3
"""cachet_torch.metrics without torch and without a GPU (ctest cachet_torch_metrics, label unit).

  * the keys: every memory_stats() key cachet has (PyTorch's 122 and the 21 sleep.* keys, read
    from common/src/stats.cpp, the code that names them) maps to one metric sample, the mapping
    is one-to-one, names and labels follow Prometheus' rules and the README's table says exactly
    what the code does;
  * the values: a stats dict of cachet's own (the final statistics of `cachet replay --json` on a
    recording of tests/data, with --cachet; else made up, said so), with the sleep keys added, in
    metrics_text() and over loopback through serve_metrics(), with the standard library's server
    and with prometheus_client's where it is installed (CACHET_REQUIRE_PROMETHEUS=1 makes its
    absence a failure: CI's fresh root has python3-prometheus-client), in both its formats: every
    key's sample equal to the dict's value; one read of the stats per scrape;
  * the port: 0 picks a free one; LOCAL_RANK is added to a port given;
  * with the plug-in (--lib, CUDA builds): metrics_text() before any allocation has no device
    samples and creates no allocator; sleep() and wake() are counted.

usage: test_metrics.py --stats-cpp common/src/stats.cpp --readme python/README.md
                       [--cachet path/to/cachet --trace tests/data/...] [--lib libcachet_torch.so]
"""
import argparse
import json
import os
import re
import socket
import subprocess
import sys
import textwrap
import urllib.error
import urllib.request

import preamble

sys.path.insert(0, preamble.PYDIR)
import cachet_torch  # noqa: E402
from cachet_torch import metrics  # noqa: E402

check = preamble.Checks()
NAME_RE = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
SAMPLE_RE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
LABEL_RE = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def keys_from_stats_cpp(path):
    """The 122 + 21 keys, as common/src/stats.cpp's tables name them."""
    src = open(path).read()

    def table(name):
        m = re.search(r"constexpr [^=;]*?\b" + name + r"\[[^\]]*\] = \{(.*?)\};", src, re.S)
        return re.findall(r'"([^"]+)"', m.group(1)) if m else []

    stats = ("allocated", "current", "freed", "peak")
    pytorch = [f"{a}.{t}.{s}" for a in table("kArrays") for t in table("kTypeNames") for s in stats]
    pytorch += [f"{n}.{s}" for n in table("kStats") for s in stats] + table("kCounters")
    sleep = [f"{n}.{s}" for n in table("kSleepStats") for s in stats] + table("kSleepCounters")
    return sorted(pytorch), sorted(sleep)


def expand(pattern):
    """`a.{x,y}.{p,q}` -> the four keys."""
    m = re.search(r"\{([^}]*)\}", pattern)
    if not m:
        return [pattern]
    return [k for alt in m.group(1).split(",") for k in expand(pattern[:m.start()] + alt + pattern[m.end():])]


def readme_table(path):
    """[(key pattern, metric, type, labels)] of python/README.md's "Metrics" table."""
    text = open(path).read()
    section = text.split("## Metrics (Prometheus)", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0].startswith("`") and cells[1].startswith("`cachet_"):
            rows.append((cells[0].strip("`"), cells[1].strip("`"), cells[2].split()[0],
                         [x.strip() for x in cells[3].split(",")]))
    return rows


def parse(text):
    """{(name, frozenset(labels)): float}, and the TYPE of each family; duplicates are failures."""
    samples, types, dups = {}, {}, []
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            types[name] = kind
            continue
        if not line or line.startswith("#"):
            continue
        m = SAMPLE_RE.match(line)
        if not m:
            dups.append(f"unparsable: {line}")
            continue
        labels = frozenset(LABEL_RE.findall(m.group(2) or ""))
        key = (m.group(1), labels)
        if key in samples:
            dups.append(f"duplicate: {line}")
        samples[key] = float(m.group(3))
    return samples, types, dups


def expected(stats_by_device):
    out = {}
    for dev, st in stats_by_device.items():
        for k, v in st.items():
            name, _, _, labels = metrics.metric_for_key(k, dev)
            out[(name, frozenset(labels))] = float(v)
    return out


def compare(label, text, stats_by_device):
    samples, _, bad = parse(text)
    want = expected(stats_by_device)
    missing = [k for k in want if k not in samples]
    wrong = [(k, samples[k], v) for k, v in want.items() if k in samples and samples[k] != v]
    check(not bad and not missing and not wrong,
          f"{label}: {len(want)} keys, each once with its value ({len(missing)} missing, {len(wrong)} wrong, "
          f"{bad[:3]} {missing[:3]} {wrong[:3]})")
    return samples


def get(url, accept=None):
    req = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.status, r.headers.get("Content-Type", ""), r.read().decode()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def replay_stats(cachet, trace):
    r = subprocess.run([cachet, "replay", trace, "--json"], capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        return None, f"cachet replay exited {r.returncode}: {r.stderr[-500:]}"
    rows = json.loads(r.stdout)
    row = rows[0] if isinstance(rows, list) else rows
    return row.get("final_stats"), ""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--stats-cpp", required=True)
    ap.add_argument("--readme", required=True)
    ap.add_argument("--cachet")
    ap.add_argument("--trace")
    ap.add_argument("--lib")
    a = ap.parse_args()

    # 1. The keys and the mapping.
    pytorch, sleep = keys_from_stats_cpp(a.stats_cpp)
    check(len(pytorch) == 122 and len(sleep) == 21 and all(k.startswith("sleep.") for k in sleep),
          f"common/src/stats.cpp names PyTorch's 122 keys and 21 sleep.* keys ({len(pytorch)}, {len(sleep)})")
    keys = pytorch + sleep
    mapped = {k: metrics.metric_for_key(k, 0) for k in keys}
    unmapped = [k for k, m in mapped.items() if m[0] == "cachet_unmapped_stat"]
    check(not unmapped, f"every key has a metric of its own ({unmapped})")
    ids = {(m[0], m[3]) for m in mapped.values()}
    check(len(ids) == len(keys), f"the mapping is one-to-one: {len(ids)} samples for {len(keys)} keys")
    kinds = {}
    for k, (name, kind, _, labels) in mapped.items():
        kinds.setdefault(name, set()).add(kind)
        lab = dict(labels)
        ok = (NAME_RE.match(name) and name.startswith("cachet_")
              and (kind == "counter") == name.endswith("_total")
              and (kind == "counter") == k.split(".")[-1].startswith("num_")
              and ("bytes" in k or k == "max_split_size") == ("_bytes" in name)
              and lab.get("device") == "0"
              and lab.get("pool", "all") in ("all", "small", "large")
              and (lab.get("stat") == k.split(".")[-1] if "stat" in lab else k.split(".")[-1] not in
                   ("current", "peak", "allocated", "freed"))
              and ("pool" in lab) == (len(k.split(".")) == 3 and not k.startswith("sleep.")))
        if not ok:
            check(False, f"{k} -> {name} {kind} {lab}: breaks the naming rules")
    check(all(len(v) == 1 for v in kinds.values()), "each metric name has one type")
    check(len(ids) == len(keys) and not unmapped,
          "names: cachet_ prefix, _bytes exactly for sizes, _total exactly for counts (num_*); labels device, pool, stat")

    rows = readme_table(a.readme)
    from_readme = {}
    for pattern, name, kind, labels in rows:
        for k in expand(pattern):
            from_readme[k] = (name, kind, labels)
    check(sorted(from_readme) == sorted(keys),
          f"python/README.md's table covers exactly the {len(keys)} keys "
          f"(extra {sorted(set(from_readme) - set(keys))[:3]}, missing {sorted(set(keys) - set(from_readme))[:3]})")
    differ = [k for k, (name, kind, labels) in from_readme.items() if k in mapped and
              (mapped[k][0], mapped[k][1], [n for n, _ in mapped[k][3]]) != (name, kind, labels)]
    check(not differ, f"python/README.md's table says what the code does ({differ[:3]})")

    # 2. The values: cachet's own statistics.
    st = None
    if a.cachet and a.trace:
        st, why = replay_stats(a.cachet, a.trace)
        check(st is not None and sorted(st) == pytorch,
              f"cachet replay --json gives the 122 keys of cachet's statistics {why}")
    if st is None:
        print("note: no --cachet: made-up statistics")
        st = {k: i * 1000003 for i, k in enumerate(pytorch)}
    st = dict(st)
    st.update({k: (i + 1) * 4096 + 7 for i, k in enumerate(sleep)})
    st["max_split_size"] = st.get("max_split_size", -1)
    big = dict(st)
    big["allocated_bytes.all.allocated"] = 2**53 - 1  # exact in the text, and as a float
    by_device = {0: st, 3: big}
    check(sum(1 for v in st.values() if v) > 20, f"the statistics are not all zero ({sum(1 for v in st.values() if v)} non-zero)")

    text = cachet_torch.metrics_text(by_device)
    compare("metrics_text({0: ..., 3: ...})", text, by_device)
    check('cachet_allocated_bytes{device="3",pool="all",stat="allocated"} 9007199254740991\n' in text,
          "integers are written exactly")
    _, types, _ = parse(text)
    check(all(types.get(m[0]) == m[1] for m in mapped.values()), "every family has its # TYPE line")
    check(text.count("# HELP cachet_reserved_bytes ") == 1 and text.count("# TYPE cachet_reserved_bytes gauge") == 1,
          "one # HELP and # TYPE line a family, the devices' samples under it")
    compare("metrics_text(one dict): device 0", cachet_torch.metrics_text(st), {0: st})
    compare("metrics_text(callable)", cachet_torch.metrics_text(lambda: by_device), by_device)
    check('cachet_backend_info{backend="none"} 1\n' in text and "cachet_sleep_calls_total 0\n" in text,
          "cachet_backend_info and the sleep/wake call counts")

    calls = []

    def moving():  # every read returns new values: a scrape must read once
        calls.append(1)
        n = len(calls)
        return {0: {k: n for k in st}}

    # 3. Over loopback, the standard library's server.
    with cachet_torch.serve_metrics(0, "127.0.0.1", stats=by_device, use_prometheus_client=False) as srv:
        check(srv.port > 0 and srv.via == "http.server", f"port 0 picked port {srv.port} ({srv.via})")
        status, ctype, body = get(srv.url)
        check(status == 200 and ctype == metrics.CONTENT_TYPE, f"GET {srv.url}: {status} {ctype}")
        compare("http.server over loopback", body, by_device)
        try:
            get(srv.url.replace("/metrics", "/other"))
            check(False, "another path is 404")
        except urllib.error.HTTPError as e:
            check(e.code == 404, f"another path is 404 ({e.code})")
    with cachet_torch.serve_metrics(0, "127.0.0.1", stats=moving, use_prometheus_client=False) as srv:
        body = get(srv.url)[2]
        want = expected({0: st})
        vals = {v for k, v in parse(body)[0].items() if k in want}
        check(len(calls) == 1 and vals == {1.0}, f"one read of the statistics per scrape ({len(calls)} reads, values {sorted(vals)[:4]})")

    # The per-rank port.
    p = free_port()
    os.environ["LOCAL_RANK"] = "2"
    try:
        with cachet_torch.serve_metrics(p - 2, "127.0.0.1", stats=st, use_prometheus_client=False) as srv:
            check(srv.port == p and get(srv.url)[0] == 200, f"LOCAL_RANK=2: serve_metrics({p - 2}) serves {srv.port}")
        p = free_port()
        with cachet_torch.serve_metrics(p, "127.0.0.1", stats=st, rank_offset=False, use_prometheus_client=False) as srv:
            check(srv.port == p, f"rank_offset=False: the port as given ({srv.port})")
    finally:
        del os.environ["LOCAL_RANK"]

    # 4. prometheus_client, both formats.
    try:
        import prometheus_client  # noqa: F401
        have = True
    except ImportError:
        have = False
    if not have:
        if os.environ.get("CACHET_REQUIRE_PROMETHEUS") == "1":
            check(False, f"prometheus_client is importable in {sys.executable} (CACHET_REQUIRE_PROMETHEUS=1)")
        print(f"note: no prometheus_client in {sys.executable}: its endpoint is not checked here")
    else:
        with cachet_torch.serve_metrics(0, "127.0.0.1", stats=by_device) as srv:
            check(srv.via == "prometheus_client", f"served through {srv.via}")
            status, ctype, body = get(srv.url)
            check(status == 200 and "version=0.0.4" in ctype, f"prometheus_client: {status} {ctype}")
            compare("prometheus_client over loopback (text 0.0.4)", body, by_device)
            status, ctype, body = get(srv.url, "application/openmetrics-text; version=0.0.1; charset=utf-8")
            check("openmetrics" in ctype and body.rstrip().endswith("# EOF"), f"prometheus_client: {ctype}")
            compare("prometheus_client over loopback (OpenMetrics)", body, by_device)
        calls.clear()
        with cachet_torch.serve_metrics(0, "127.0.0.1", stats=moving) as srv:
            get(srv.url)
            check(len(calls) == 1, f"prometheus_client: one read of the statistics per scrape ({len(calls)})")

    # 5. With the plug-in: no allocator before the first allocation, none created by a scrape; the
    # sleep/wake calls counted.
    if a.lib:
        env = preamble.child_env(a.lib)
        env["CACHET_ALLOC_CONF"] = "cachet_sleep:True"
        code = textwrap.dedent("""
            import sys, cachet_torch
            t = cachet_torch.metrics_text()
            lib = cachet_torch.load()
            print("devices", lib.cachet_torch_device_count(), "device samples", t.count('device="'))
            cachet_torch.sleep(); cachet_torch.wake(); cachet_torch.sleep()
            t = cachet_torch.metrics_text()
            print([l for l in t.splitlines() if l.startswith(("cachet_sleep_calls_total", "cachet_wake_calls_total"))])
            print("torch" in sys.modules)
        """)
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
        check(r.returncode == 0 and "devices 0 device samples 0" in r.stdout,
              f"plug-in: no device samples before an allocation, no allocator created: {r.stdout.strip()} {r.stderr[-800:]}")
        check("['cachet_sleep_calls_total 2', 'cachet_wake_calls_total 1']" in r.stdout and r.stdout.strip().endswith("False"),
              f"plug-in: two sleeps and a wake counted, no torch imported: {r.stdout.strip()}")

    print(f"\n{len(check.failures)} failure(s)")
    return 1 if check.failures else 0


if __name__ == "__main__":
    sys.exit(main())
