#!/usr/bin/env python3
"""The plug-in without a GPU and without torch (ctest cachet_torch_plugin, label unit).

  * libcachet_torch.so exports cachet_malloc and cachet_free (nm -D), the private-pool callbacks
    with PyTorch's C++ types (nm -DC), and does not need libcuda;
  * it dlopens on a machine without a driver;
  * with a bad CACHET_ALLOC_CONF the library alone prints the parser's message once and every
    cachet_malloc returns NULL (no abort); cachet-only keys are refused in PYTORCH_CUDA_ALLOC_CONF;
  * cachet_torch.install() raises ValueError with that message before it imports torch;
  * a good configuration is accepted and reported by cachet_torch.settings().

Each case runs in a fresh interpreter: the plug-in reads the environment once.

usage: test_plugin.py --lib path/to/libcachet_torch.so [--nm nm]
"""
import argparse
import os
import shutil
import subprocess
import sys
import textwrap

import preamble

check = preamble.Checks()
failures = check.failures


def run_py(code, env_extra, lib):
    env = preamble.child_env(lib)
    env.update(env_extra)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=60)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--nm", default="nm")
    a = ap.parse_args()
    lib = os.path.abspath(a.lib)

    # 1. exported symbols
    syms = preamble.library_symbols(lib, a.nm)
    if syms is not None:
        nm = a.nm if a.nm and shutil.which(a.nm) else shutil.which("nm")
        for s in ("cachet_malloc", "cachet_free", "cachet_torch_record_stream",
                  "cachet_torch_empty_cache", "cachet_torch_set_memory_fraction",
                  "cachet_torch_stats_json", "cachet_torch_snapshot_json", "cachet_torch_trace_json",
                  "cachet_torch_set_tag", "cachet_torch_current_tag", "cachet_torch_sleep",
                  "cachet_torch_wake", "cachet_torch_sleeping_json", "cachet_torch_sleep_stats_json",
                  "cachet_torch_sleep_summary", "cachet_torch_release_backup_buffers",
                  "cachet_torch_begin_thread_pool", "cachet_torch_end_thread_pool"):
            check(syms.get(s) == "T", f"nm -D: {s} is an exported function")
        # The private-pool callbacks: C++ linkage, PyTorch's types (python/README.md, "ABI").
        demangled = subprocess.run([nm, "-DC", "--defined-only", lib], capture_output=True, text=True).stdout
        pool_id = "std::pair<unsigned long long, unsigned long long>"
        for sig in (f"cachet_begin_allocate_to_pool(int, {pool_id}, std::function<bool (CUstream_st*)>)",
                    f"cachet_end_allocate_to_pool(int, {pool_id})",
                    f"cachet_release_pool(int, {pool_id})"):
            check(f" T {sig}\n" in demangled, f"nm -DC: {sig} is an exported function")
        leaked = preamble.leaked_cxx_symbols(syms)
        check(not leaked, f"nm -D: no C++ symbols of cachet or fmt exported ({len(leaked)} found)")
    else:
        check(False, "nm not found")
    dyn = preamble.dynamic_section(lib)
    if dyn is not None:
        check("libcuda.so" not in dyn, "readelf -d: libcuda is not a dependency")
        check("libcudart" in dyn, "readelf -d: linked against the CUDA runtime (libcudart)")

    # 2. dlopen without a GPU, a good (default) configuration
    r = run_py("""
        import ctypes, cachet_torch
        lib = cachet_torch.load()
        assert lib.cachet_torch_init() == 0
        cachet_torch.check_config()
        s = cachet_torch.settings()
        print("variable=%r canonical=%r max_split=%d" % (s["variable"], s["canonical"], s["max_split_size"]))
        print("zero:", lib.cachet_malloc(0, 0, None))
        print("pool callbacks:", [bool(lib.cachet_torch_pool_callback(n)) for n in
              (b"set_begin_allocate_to_pool", b"set_end_allocate_to_pool_fn", b"set_release_pool",
               b"set_reset_fn", None)])
        lib.cachet_free(None, 0, 0, None)
        print("snapshot devices:", len(cachet_torch.snapshot()["device_traces"]))
        """, {}, lib)
    check(r.returncode == 0, f"dlopen + default configuration (rc {r.returncode}) {r.stderr.strip()[-300:]}")
    check("variable='' canonical=''" in r.stdout and "max_split=-1" in r.stdout,
          f"defaults reported: {r.stdout.strip()[:200]}")
    check("zero: None" in r.stdout, "cachet_malloc(0) returns NULL")
    check("pool callbacks: [True, True, True, False, False]" in r.stdout,
          f"cachet_torch_pool_callback gives the three pool setters' functions, NULL otherwise: {r.stdout.strip()[-200:]}")

    # 3. good configuration from PYTORCH_CUDA_ALLOC_CONF; CACHET_ALLOC_CONF wins over it
    r = run_py("""
        import cachet_torch
        s = cachet_torch.settings()
        print(s["variable"], s["max_split_size"], s["expandable_segments"])
        """, {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128,expandable_segments:True"}, lib)
    check(r.returncode == 0 and "PYTORCH_CUDA_ALLOC_CONF 134217728 True" in r.stdout,
          f"PYTORCH_CUDA_ALLOC_CONF read: {r.stdout.strip()} {r.stderr.strip()[-200:]}")
    r = run_py("""
        import cachet_torch
        s = cachet_torch.settings()
        print(s["variable"], s["max_split_size"])
        """, {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128",
              "CACHET_ALLOC_CONF": "max_split_size_mb:256,cachet_validate:True"}, lib)
    check(r.returncode == 0 and "CACHET_ALLOC_CONF 268435456" in r.stdout,
          f"CACHET_ALLOC_CONF first, cachet keys accepted there: {r.stdout.strip()} {r.stderr.strip()[-200:]}")

    # 4. the library alone with a bad configuration: printed once, every allocation fails
    r = run_py("""
        import ctypes
        lib = ctypes.CDLL(__import__("os").environ["CACHET_TORCH_LIB"])
        lib.cachet_malloc.restype = ctypes.c_void_p
        lib.cachet_malloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
        lib.cachet_free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
        ps = [lib.cachet_malloc(1 << 20, 0, None) for _ in range(5)]
        lib.cachet_free(None, 0, 0, None)
        print("results:", ps)
        """, {"CACHET_ALLOC_CONF": "max_split_size_mb:banana"}, lib)
    check(r.returncode == 0, f"bad configuration: no abort (rc {r.returncode})")
    check("results: [None, None, None, None, None]" in r.stdout, f"every cachet_malloc returns NULL: {r.stdout.strip()}")
    n = r.stderr.count("cachet: configuration refused")
    check(n == 1, f"the parser's message is printed once (printed {n} times): {r.stderr.strip()[:300]}")
    check("max_split_size_mb" in r.stderr, "the message names the key")

    # 5. cachet-only keys are refused in PYTORCH_CUDA_ALLOC_CONF
    r = run_py("""
        import ctypes
        lib = ctypes.CDLL(__import__("os").environ["CACHET_TORCH_LIB"])
        lib.cachet_malloc.restype = ctypes.c_void_p
        lib.cachet_malloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
        print("result:", lib.cachet_malloc(4096, 0, None))
        """, {"PYTORCH_CUDA_ALLOC_CONF": "cachet_validate:True"}, lib)
    check(r.returncode == 0 and "result: None" in r.stdout and
          r.stderr.count("cachet: configuration refused") == 1,
          f"cachet_validate refused in PYTORCH_CUDA_ALLOC_CONF: {r.stderr.strip()[:300]}")

    # 6. cachet_torch.install(): ValueError with the parser's message, before torch is imported
    r = run_py("""
        import sys, cachet_torch
        try:
            cachet_torch.install()
        except ValueError as e:
            print("ValueError:", e)
        print("torch imported:", "torch" in sys.modules)
        """, {"PYTORCH_CUDA_ALLOC_CONF": "garbage_collection_threshold:1.5"}, lib)
    check(r.returncode == 0 and "ValueError:" in r.stdout and "garbage_collection_threshold" in r.stdout,
          f"install() raises ValueError with the parser's message: {r.stdout.strip()[:300]} {r.stderr.strip()[-300:]}")
    check("torch imported: False" in r.stdout, "install() refuses before importing torch")
    check("configuration refused" not in r.stderr, "install() raises instead of printing as well")

    # 7. tags and sleep without a GPU (docs/sleep-wake.md): the thread's tag, a bad tag refused by
    # name, sleep refused without cachet_sleep:True, and with it nothing to sleep (no allocator).
    code = """
        import cachet_torch, threading
        print("tag0:", cachet_torch.current_tag())
        with cachet_torch.tag("weights"):
            with cachet_torch.tag("kv_cache"):
                print("nested:", cachet_torch.current_tag())
            print("inner done:", cachet_torch.current_tag())
            seen = []
            t = threading.Thread(target=lambda: seen.append(cachet_torch.current_tag()))
            t.start(); t.join()
            print("other thread:", seen[0])
        print("tag1:", cachet_torch.current_tag())
        for bad in ("no way", "all", "x" * 65):
            try:
                with cachet_torch.tag(bad):
                    pass
                print("accepted:", bad)
            except ValueError as e:
                print("refused:", str(e)[:120])
        print("tag2:", cachet_torch.current_tag())
        try:
            print("slept:", cachet_torch.sleep())
            print("sleeping:", cachet_torch.sleeping())
            cachet_torch.wake()
            print("woke")
        except RuntimeError as e:
            print("sleep refused:", e)
        print("released:", cachet_torch.release_backup_buffers(), cachet_torch.release_backup_buffers(0))
        """
    r = run_py(code, {}, lib)
    out = r.stdout
    check(r.returncode == 0, f"tags and sleep without a GPU (rc {r.returncode}) {r.stderr.strip()[-300:]}")
    check("tag0: default" in out and "nested: kv_cache" in out and "inner done: weights" in out and
          "other thread: default" in out and "tag1: default" in out and "tag2: default" in out,
          f"tag() nests, restores and is per thread: {out.strip()[:400]}")
    check(out.count("refused: cachet_torch.tag(") == 3 and "accepted:" not in out and "'no way'" in out,
          f"bad tags refused by name: {out.strip()[-600:]}")
    check("sleep refused:" in out and "cachet_sleep:True" in out,
          f"sleep without cachet_sleep:True refused, naming the key: {out.strip()[-300:]}")
    r = run_py(code, {"CACHET_ALLOC_CONF": "cachet_sleep:True"}, lib)
    check("released: 0 0" in out, f"release_backup_buffers() with no allocator: 0 bytes, none created: {out.strip()[-200:]}")
    check(r.returncode == 0 and "slept: 0" in r.stdout and "sleeping: []" in r.stdout and "woke" in r.stdout,
          f"with cachet_sleep:True and no allocator: sleep gives back 0 bytes, wake does nothing: "
          f"{r.stdout.strip()[-300:]} {r.stderr.strip()[-300:]}")

    print(f"\n{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
