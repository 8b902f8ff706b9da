"""Project issue 23: props_gpu_test's shrunk failure, run through PyTorch 2.11 on the GPU.

The case (props/regressions/deferred_free_events_complete_when_recorded.ops):
  config expandable_segments:True,max_non_split_rounding_mb:22,garbage_collection_threshold:0.3
  alloc 1073741824 s1; record #0 s0; capture_begin g1 s1 pool new; free #0; capture_end g1;
  alloc 1048577 s1
cachet's answer (gpu/ and, since issue 23, the model): the last allocation takes the 1 GiB block's
start, offset 0x0 from the first segment, because the event that malloc's process_events records on
stream 0 for the deferred free is already complete when the same malloc queries it. The model
before the fix said offset 0x40000000 (a new block after the 1 GiB one).

Usage (on the GPU machine, torch 2.11):
  python3 scripts/oracle/issue23_deferred_free.py [--busy-s0] [OUT.json]
--busy-s0 queues a long kernel on stream 0 just before the last allocation, so the event is not
complete when queried: PyTorch then keeps the 1 GiB block waiting (offset 0x40000000), which is what
cachet's model says when events complete only at `complete` ops (the host simulation).
Allocations are tensors (torch.empty of N uint8 on the stream): Tensor.record_stream needs one;
the allocator sees the same malloc(N, stream) as torch.cuda.caching_allocator_alloc makes.
"""
import json
import os
import sys

os.environ.setdefault(
    "PYTORCH_CUDA_ALLOC_CONF",
    "expandable_segments:True,max_non_split_rounding_mb:22,garbage_collection_threshold:0.3")
import torch  # noqa: E402  (after the configuration is set)

args = [a for a in sys.argv[1:] if not a.startswith("--")]
busy = "--busy-s0" in sys.argv
dev = 0
s0 = torch.cuda.default_stream(dev)
s1 = torch.cuda.Stream(dev)
torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python")

with torch.cuda.stream(s1):
    t0 = torch.empty(1073741824, dtype=torch.uint8, device="cuda")   # alloc 1073741824 s1
first = t0.data_ptr()
t0.record_stream(s0)                                                  # record #0 s0
g = torch.cuda.CUDAGraph()
torch.cuda.set_stream(s1)
g.capture_begin()                                                     # capture_begin g1 s1 pool new
torch.cuda._sleep(1000)
del t0                                                                # free #0 (deferred: a capture)
g.capture_end()                                                       # capture_end g1
torch.cuda.set_stream(s0)
if busy:
    torch.cuda._sleep(2_000_000_000)                                  # stream 0 busy for about a second
last = torch.cuda.caching_allocator_alloc(1048577, dev, s1)           # alloc 1048577 s1
stats = torch.cuda.memory_stats(dev)
snap = torch.cuda.memory._snapshot()
torch.cuda.synchronize()

base = first  # the first segment's base: the 1 GiB block starts its expandable segment
out = {
    "torch": torch.__version__, "device": torch.cuda.get_device_name(dev),
    "conf": os.environ["PYTORCH_CUDA_ALLOC_CONF"], "busy_s0": busy,
    "first_ptr": hex(first), "last_ptr": hex(last),
    "first_offset": hex(first - base), "last_offset": hex(last - base),
    "reused_1gib_block_start": last == first,
    "active_bytes": stats["active_bytes.all.current"], "reserved_bytes": stats["reserved_bytes.all.current"],
    "allocated_bytes": stats["allocated_bytes.all.current"],
    "trace": [[e.get("action"), hex(e.get("addr", 0) - base) if e.get("addr") else 0, e.get("size"),
               e.get("stream")] for e in snap["device_traces"][dev]],
}
print(f"torch {out['torch']} on {out['device']} busy_s0={busy}")
print(f"first allocation at offset {out['first_offset']}, last allocation at offset {out['last_offset']}"
      f" ({'the 1 GiB block reused' if out['reused_1gib_block_start'] else 'a new block after the 1 GiB one'})")
print(f"active_bytes {out['active_bytes']} reserved_bytes {out['reserved_bytes']}")
print("cachet expects: last offset 0x0 without --busy-s0, 0x40000000 with it")
if args:
    with open(args[0], "w") as f:
        json.dump(out, f, indent=1)
