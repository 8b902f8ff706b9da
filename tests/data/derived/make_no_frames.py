"""Makes gpt2_oom_no_frames.pickle.gz from tests/data/oracle/snapshots/gpt2_train_oom_cap12g.pickle.gz:
the same snapshot with every trace event's and block's frames emptied, as a run recorded with
_record_memory_history(context=None) has them (no stacks), and as the autograd thread's requests
have them in any run (backward records no Python frames). Not a recording: it exercises how the
size of a failed request with no stack is found (a repeated step's allocation at the same place in
the allocation sequence). Run from the repository root: python3 tests/data/derived/make_no_frames.py"""
import gzip
import pickle

SRC = "tests/data/oracle/snapshots/gpt2_train_oom_cap12g.pickle.gz"
DST = "tests/data/derived/gpt2_oom_no_frames.pickle.gz"

d = pickle.load(gzip.open(SRC))
for e in d["device_traces"][0]:
    if "frames" in e:
        e["frames"] = []
for seg in d["segments"]:
    for b in seg.get("blocks", []):
        if "frames" in b:
            b["frames"] = []
with gzip.open(DST, "wb", compresslevel=9) as f:
    pickle.dump(d, f, protocol=4)
