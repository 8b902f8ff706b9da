"""Makes gpt2_oom_cpp_stacks.pickle.gz from tests/data/oracle/snapshots/gpt2_train_oom_cap12g.pickle.gz:
the same snapshot with the C++ frames PyTorch records with _record_memory_history(stacks="all")
put before the Python frames of every trace event that has frames, as PyTorch 2.11 does (the
innermost first: torch::unwind::unwind(), then c10 and ATen frames whose filename is "??" and
line 0, with long template names). Not a recording: it only exercises how frames are shown.
Run from the repository root: python3 tests/data/derived/make_cpp_stacks.py"""
import gzip
import pickle

SRC = "tests/data/oracle/snapshots/gpt2_train_oom_cap12g.pickle.gz"
DST = "tests/data/derived/gpt2_oom_cpp_stacks.pickle.gz"

long_name = ("at::native::(anonymous namespace)::structured_log_softmax_cuda_out_functional<"
             + ", ".join(["c10::ArrayRef<long>"] * 40) + ">::operator()")
cpp = [{"name": "torch::unwind::unwind()", "filename": "??", "line": 0},
       {"name": "torch::CapturedTraceback::gather(bool, bool, bool)", "filename": "??", "line": 0}]
cpp += [{"name": long_name if i % 3 == 0 else f"c10::cuda::CUDACachingAllocator::Native::frame{i}()",
         "filename": "??", "line": 0} for i in range(27)]

d = pickle.load(gzip.open(SRC))
for e in d["device_traces"][0]:
    if e.get("frames"):
        e["frames"] = cpp + e["frames"]
with gzip.open(DST, "wb", compresslevel=9) as f:
    pickle.dump(d, f, protocol=4)
