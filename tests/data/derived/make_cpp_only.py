"""Makes gpt2_oom_cpp_only.pickle.gz from tests/data/oracle/snapshots/gpt2_train_oom_cap12g.pickle.gz:
the same snapshot with every stack replaced by PyTorch's own C++ frames only (torch::unwind, the
caching allocator's malloc, ATen's empty_cuda, an unsymbolised ??), as a stacks="cpp" recording on
a build without symbols has them. Not a recording: it exercises what explain says when no frame
names user or library code (issue 35). Run from the repository root:
python3 tests/data/derived/make_cpp_only.py"""
import gzip
import pickle

SRC = "tests/data/oracle/snapshots/gpt2_train_oom_cap12g.pickle.gz"
DST = "tests/data/derived/gpt2_oom_cpp_only.pickle.gz"

CPP = [
    {"name": "torch::unwind::unwind()", "filename": "??", "line": 0},
    {"name": "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(signed char, unsigned long, "
             "CUstream_st*)", "filename": "CUDACachingAllocator.cpp", "line": 0},
    {"name": "at::detail::empty_cuda(c10::ArrayRef<long>, c10::TensorOptions const&)", "filename": "??", "line": 0},
    {"name": "??", "filename": "??", "line": 0},
]

d = pickle.load(gzip.open(SRC))
for e in d["device_traces"][0]:
    if e.get("frames"):
        e["frames"] = list(CPP)
for seg in d["segments"]:
    for b in seg.get("blocks", []):
        if b.get("frames"):
            b["frames"] = list(CPP)
with gzip.open(DST, "wb", compresslevel=9) as f:
    pickle.dump(d, f, protocol=4)
