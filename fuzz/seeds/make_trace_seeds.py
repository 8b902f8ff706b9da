#!/usr/bin/env python3
"""Writes fuzz/corpus/fuzz_trace: small real inputs for the trace and snapshot readers.

  - the mlp_train snapshot pickle, gunzipped and gzipped;
  - small cuts of the gpt2 workload trace JSON (first N events, plain and gzipped);
  - a small oracle recording (res_small_default cut to 40 steps / 60 trace rows).
Run from anywhere: python3 fuzz/seeds/make_trace_seeds.py
"""
import gzip, json, os, pathlib

root = pathlib.Path(__file__).resolve().parents[2]
data = root / "tests/data/oracle"
out = root / "fuzz/corpus/fuzz_trace"
out.mkdir(parents=True, exist_ok=True)


def write(name, raw: bytes):
    (out / name).write_bytes(raw)


def gz(raw: bytes) -> bytes:
    return gzip.compress(raw, compresslevel=9, mtime=0)


pickle = gzip.decompress((data / "snapshots/mlp_train.pickle.gz").read_bytes())
write("mlp_train.pickle", pickle)
write("mlp_train.pickle.gz", gz(pickle))

trace = json.loads(gzip.decompress((data / "workloads/gpt2_train.trace.json.gz").read_bytes()))
for n in (8, 40):
    cut = dict(trace)
    cut["device_traces"] = [t[:n] for t in trace["device_traces"]]
    raw = json.dumps(cut, separators=(",", ":")).encode()
    write(f"gpt2_train_{n}.json", raw)
    if n == 40:
        write(f"gpt2_train_{n}.json.gz", gz(raw))
stats = (data / "workloads/gpt2_train.stats.json").read_bytes()
write("gpt2_train.stats.json", stats)

rec = json.loads(gzip.decompress((data / "results/res_small_default.json.gz").read_bytes()))
rec["steps"] = rec["steps"][:40]
rec["trace"] = rec["trace"][:60]
rec["segments"] = rec["segments"][:2]
rec["summary"] = rec["summary"][:200]
raw = json.dumps(rec, separators=(",", ":")).encode()
write("res_small_cut.json", raw)
write("res_small_cut.json.gz", gz(raw))
write("empty_snapshot.json", b'{"segments":[],"device_traces":[],"allocator_settings":{}}')
print(f"fuzz_trace seeds: {len(os.listdir(out))} files in {out}")
