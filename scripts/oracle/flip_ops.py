"""Op sequences that pin the rules no other recording decides (docs/verification.md, "Flips waiting
for a recording"). Each case is one short sequence in the format of tests/data/oracle (["a", id,
size, stream], ["f", id], ["e"], and the private-pool ops ["pb", k], ["pe", k], ["pr", k]), with
the PYTORCH_CUDA_ALLOC_CONF and the cap it needs, and the rule flip (cachet/rule_flip.h) it is made
to kill. Run by scripts/record-flips on a GPU machine with PyTorch 2.11. § numbers refer to
docs/pytorch-allocator.md.

Usage: python3 flip_ops.py TOTAL_MEMORY OUTDIR
writes OUTDIR/ops/ops_flip_<case>.json and prints one line per case: "<case> <cap> <conf>".
"""
import json, os, sys

MiB = 1 << 20


def cases(total):
    out = {}
    # non_split_rounding_inclusive (§2.2 step 4, §13.7): with max_split_size_mb:40 a cached 100 MiB
    # block is refused by a request of 80 MiB (100 >= 80 + 20: a new segment) and taken by 81 MiB.
    out["nonsplit_edge"] = ("max_split_size_mb:40", 0, [
        ["a", 0, 100 * MiB, 0], ["f", 0],
        ["a", 1, 80 * MiB, 0], ["f", 1],
        ["a", 2, 81 * MiB, 0], ["f", 2], ["e"]])
    # empty_cache_ignores_active_pools (§3.4, §14.6): empty_cache inside use_mem_pool leaves the
    # default pools (and num_sync_all_streams) alone; outside it releases them.
    out["pool_empty_cache"] = ("", 0, [
        ["a", 0, 5 * MiB, 0], ["a", 1, 1000, 0], ["f", 0], ["f", 1],
        ["pb", 0], ["a", 2, 3000, 0], ["e"], ["pe", 0],
        ["a", 3, 5 * MiB, 0], ["f", 3], ["f", 2], ["e"], ["pr", 0], ["e"]])
    # retry_inside_pool (§14.6): inside use_mem_pool a request the cap refuses runs out of memory
    # without the last retry (num_alloc_retries unchanged); outside it the retry frees the cache.
    out["pool_retry"] = ("", 60 * MiB, [
        ["a", 0, 30 * MiB, 0], ["f", 0],
        ["pb", 0], ["a", 1, 40 * MiB, 0], ["pe", 0],
        ["a", 2, 40 * MiB, 0], ["f", 2], ["pr", 0], ["e"]])
    return out


if __name__ == "__main__":
    total, outdir = int(sys.argv[1]), sys.argv[2]
    os.makedirs(os.path.join(outdir, "ops"), exist_ok=True)
    for name, (conf, cap, ops) in cases(total).items():
        with open(os.path.join(outdir, "ops", f"ops_flip_{name}.json"), "w") as f:
            json.dump(ops, f)
        print(name, cap, conf or "-")
